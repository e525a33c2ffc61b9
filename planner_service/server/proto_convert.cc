#include "planner_service/server/proto_convert.h"

#include <string>

#include "absl/strings/str_cat.h"
#include "glog/logging.h"
#include "google/protobuf/util/json_util.h"
#include "planner_service/io/gpu_catalog_io.h"
#include "planner_service/io/model_io.h"

namespace arachne {
namespace {

// Parses JSON into `message`, skipping fields the message does not have
// (the CLI JSON carries outputs such as "planner" next to the plan).
absl::Status FromJson(const nlohmann::json& j,
                      google::protobuf::Message* message) {
  google::protobuf::util::JsonParseOptions options;
  options.ignore_unknown_fields = true;
  auto s =
      google::protobuf::util::JsonStringToMessage(j.dump(), message, options);
  if (!s.ok()) {
    return absl::InternalError(
        absl::StrCat("JSON -> ", message->GetTypeName(), ": ", s.ToString()));
  }
  return absl::OkStatus();
}

}  // namespace

ClusterSpec ClusterFromProto(const v1::Cluster& cluster) {
  ClusterSpec spec;
  spec.inter_node_gbps = cluster.inter_node_gbps();
  for (const v1::Node& n : cluster.nodes()) {
    spec.nodes.push_back({n.name(), n.gpu(), n.gpus(), n.nic_gbps()});
  }
  return spec;
}

ModelRef ModelRefFromProto(const v1::ModelRef& model) {
  return {model.name(), model.hf_config_json()};
}

TrainingSpec TrainingFromProto(const v1::TrainingConfig& t) {
  return {t.seq_len(), t.global_batch(), t.precision(), t.recompute(),
          t.distributed_optimizer()};
}

absl::Status PlanJsonToProto(const nlohmann::json& cli, v1::Plan* plan,
                             v1::Prediction* prediction) {
  nlohmann::json p = {{"templates", nlohmann::json::array()}};
  if (cli.contains("unused_gpus")) p["unused_gpus"] = cli["unused_gpus"];
  if (cli.contains("templates")) {
    for (nlohmann::json t : cli["templates"]) {
      if (t.contains("placement")) {
        nlohmann::json replicas = nlohmann::json::array();
        for (const nlohmann::json& stages : t["placement"]) {
          replicas.push_back({{"stages", stages}});
        }
        t["placement"] = replicas;
      }
      p["templates"].push_back(std::move(t));
    }
  }
  plan->Clear();
  if (absl::Status s = FromJson(p, plan); !s.ok()) return s;
  if (prediction == nullptr) return absl::OkStatus();
  prediction->Clear();
  if (absl::Status s = FromJson(cli, prediction); !s.ok()) return s;
  for (int t = 0; t < plan->templates_size(); ++t) {
    const v1::Template& tmpl = plan->templates(t);
    for (int s = 0; s < tmpl.stages_size(); ++s) {
      v1::StageMemory* m = prediction->add_stage_memory();
      m->set_template_index(t);
      m->set_stage_index(s);
      m->set_memory_gib(tmpl.stages(s).memory_gib());
    }
  }
  return absl::OkStatus();
}

nlohmann::json PlanProtoToJson(const v1::Plan& plan) {
  nlohmann::json j = {{"templates", nlohmann::json::array()}};
  for (const v1::Template& t : plan.templates()) {
    nlohmann::json tj = {{"replicas", t.replicas()},
                         {"micro_batch_size", t.micro_batch_size()}};
    // Zero means "not given": PlanFromJson derives one from the other.
    if (t.micro_batches() != 0) tj["micro_batches"] = t.micro_batches();
    if (t.total_micro_batches() != 0) {
      tj["total_micro_batches"] = t.total_micro_batches();
    }
    nlohmann::json stages = nlohmann::json::array();
    for (const v1::Stage& s : t.stages()) {
      nlohmann::json sj = {
          {"gpu_type", s.gpu_type()},
          {"tp", s.tp()},
          {"layers", nlohmann::json(std::vector<int>(s.layers().begin(),
                                                     s.layers().end()))}};
      if (s.has_expert_tiling()) {
        sj["expert_tiling"] = {{"ep", s.expert_tiling().ep()},
                               {"etp", s.expert_tiling().etp()},
                               {"edp", s.expert_tiling().edp()}};
      }
      stages.push_back(std::move(sj));
    }
    tj["stages"] = std::move(stages);
    nlohmann::json placement = nlohmann::json::array();
    for (const v1::ReplicaPlacement& r : t.placement()) {
      nlohmann::json rj = nlohmann::json::array();
      for (const v1::StagePlacement& sp : r.stages()) {
        rj.push_back({{"node", sp.node()},
                      {"gpus", nlohmann::json(std::vector<int>(
                                   sp.gpus().begin(), sp.gpus().end()))}});
      }
      placement.push_back(std::move(rj));
    }
    tj["placement"] = std::move(placement);
    j["templates"].push_back(std::move(tj));
  }
  return j;
}

v1::Cluster ClusterToProto(const ClusterSpec& spec) {
  v1::Cluster out;
  out.set_inter_node_gbps(spec.inter_node_gbps);
  for (const NodeSpec& n : spec.nodes) {
    v1::Node* node = out.add_nodes();
    node->set_name(n.name);
    node->set_gpu(n.gpu);
    node->set_gpus(n.gpus);
    node->set_nic_gbps(n.nic_gbps);
  }
  return out;
}

v1::ModelRef ModelRefToProto(const ModelRef& model) {
  v1::ModelRef out;
  out.set_name(model.name);
  out.set_hf_config_json(model.hf_config_json);
  return out;
}

v1::TrainingConfig TrainingToProto(const TrainingSpec& t) {
  v1::TrainingConfig out;
  out.set_seq_len(t.seq_len);
  out.set_global_batch(t.global_batch);
  out.set_precision(t.precision);
  out.set_recompute(t.recompute);
  out.set_distributed_optimizer(t.distributed_optimizer);
  return out;
}

nlohmann::json PlanProtoToCliJson(const v1::Plan& plan,
                                  const v1::Prediction& prediction) {
  nlohmann::json j = PlanProtoToJson(plan);
  for (const v1::StageMemory& m : prediction.stage_memory()) {
    if (m.template_index() < 0 ||
        m.template_index() >= static_cast<int>(j["templates"].size())) {
      continue;
    }
    nlohmann::json& stages = j["templates"][m.template_index()]["stages"];
    if (m.stage_index() < 0 ||
        m.stage_index() >= static_cast<int>(stages.size())) {
      continue;
    }
    stages[m.stage_index()]["memory_gib"] = m.memory_gib();
  }
  j["unused_gpus"] = plan.unused_gpus();
  j["iteration_time_s"] = prediction.iteration_time_s();
  j["throughput_iters_per_s"] = prediction.throughput_iters_per_s();
  j["tokens_per_s"] = prediction.tokens_per_s();
  j["mfu"] = prediction.mfu();
  j["usd_per_hour"] = prediction.usd_per_hour();
  j["max_memory_gib"] = prediction.max_memory_gib();
  const v1::TimeBreakdown& b = prediction.breakdown();
  j["breakdown"] = {{"compute_s", b.compute_s()},
                    {"tp_comm_s", b.tp_comm_s()},
                    {"p2p_s", b.p2p_s()},
                    {"bubble_s", b.bubble_s()},
                    {"dp_sync_s", b.dp_sync_s()},
                    {"all_to_all_s", b.all_to_all_s()},
                    {"optimizer_s", b.optimizer_s()}};
  return j;
}

v1::GpuType GpuTypeToProto(const GpuType& type) {
  v1::GpuType out;
  // Catalog rows and the message share field names; a mismatch would be a
  // schema bug caught by the service tests.
  absl::Status s = FromJson(GpuTypeToJson(type), &out);
  CHECK(s.ok()) << s;
  return out;
}

v1::Model ModelToProto(const ModelSpec& model) {
  v1::Model out;
  absl::Status s = FromJson(ModelToJson(model), &out);
  CHECK(s.ok()) << s;
  if (out.profile_name().empty()) out.set_profile_name(model.name);
  out.set_total_params(model.TotalParams());
  return out;
}

}  // namespace arachne
