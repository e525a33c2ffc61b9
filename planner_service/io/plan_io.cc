#include "planner_service/io/plan_io.h"

#include <algorithm>
#include <cstdint>
#include <limits>
#include <utility>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "planner_service/core/model/node_pool.h"
#include "planner_service/io/data_files.h"
#include "planner_service/io/framework_io.h"
#include "planner_service/io/json_yaml.h"
#include "planner_service/io/message_json.h"

namespace arachne {
namespace {

using Json = nlohmann::json;

v1::Stage StageToMessage(const Stage& s, int t, int index,
                         const Prediction& pred, const GpuCatalog& catalog,
                         bool moe) {
  v1::Stage m;
  m.set_gpu_type(catalog.type(s.gpu_type).id);
  m.set_tp(s.tp);
  m.add_layers(s.layer_begin);
  m.add_layers(s.layer_end);
  if (t < static_cast<int>(pred.stage_memory.size()) &&
      index < static_cast<int>(pred.stage_memory[t].size())) {
    m.set_memory_gib(pred.stage_memory[t][index].total_gib());
  }
  if (moe) {
    m.mutable_expert_tiling()->set_ep(s.tiling.ep);
    m.mutable_expert_tiling()->set_etp(s.tiling.etp);
    m.mutable_expert_tiling()->set_edp(s.tiling.edp);
  }
  return m;
}

absl::StatusOr<Stage> StageFromMessage(const v1::Stage& m,
                                       const GpuCatalog& catalog,
                                       const MessageErrors& errors) {
  Stage s;
  absl::StatusOr<int> type = catalog.IndexOf(m.gpu_type());
  if (!type.ok()) {
    return errors.At("gpu_type",
                     AbbreviateQuoted(type.status().message(), m.gpu_type()));
  }
  s.gpu_type = *type;
  if (absl::Status st = errors.IntAtLeast("tp", m.tp(), 1); !st.ok()) {
    return st;
  }
  s.tp = m.tp();
  if (m.layers_size() != 2 || m.layers(0) < 0 || m.layers(0) >= m.layers(1)) {
    std::vector<std::string> values;
    for (int v : m.layers()) values.push_back(absl::StrCat(v));
    return errors.At("layers",
                     absl::StrCat("must be [begin, end] with 0 <= begin < end, "
                                  "got [",
                                  absl::StrJoin(values, ","), "]"));
  }
  s.layer_begin = m.layers(0);
  s.layer_end = m.layers(1);
  // memory_gib is a prediction: accepted for round trips, not read.
  if (m.has_expert_tiling()) {
    const v1::ExpertTiling& et = m.expert_tiling();
    const MessageErrors tiling = errors.Under("expert_tiling");
    // 0 is "not given" (proto3 scalars have no presence): 1.
    for (const auto& [name, value] :
         {std::pair<const char*, int>{"ep", et.ep()}, {"etp", et.etp()},
          {"edp", et.edp()}}) {
      if (absl::Status st = tiling.IntAtLeast(name, value, 0); !st.ok()) {
        return st;
      }
    }
    s.tiling.ep = std::max(1, et.ep());
    s.tiling.etp = std::max(1, et.etp());
    s.tiling.edp = std::max(1, et.edp());
  }
  return s;
}

absl::StatusOr<StagePlacement> PlacementFromMessage(
    const v1::StagePlacement& m, int tp,
    const absl::flat_hash_map<std::string, int>& node_by_name,
    const MessageErrors& errors) {
  StagePlacement p;
  auto it = node_by_name.find(m.node());
  if (it == node_by_name.end()) {
    return errors.At("node",
                     absl::StrCat("unknown node ", QuoteForMessage(m.node()),
                                  " (not in the cluster)"));
  }
  if (m.gpus_size() > kMaxGpusPerNode) {
    return errors.At("gpus",
                     absl::StrCat("must list at most ", kMaxGpusPerNode,
                                  " GPUs (one node's), got ", m.gpus_size()));
  }
  p.node = it->second;
  for (int i = 0; i < m.gpus_size(); ++i) {
    if (m.gpus(i) < 0) {
      return errors.At(IndexFieldPath("gpus", i),
                       absl::StrCat("must be a GPU index >= 0, got ",
                                    m.gpus(i)));
    }
    p.gpus.push_back(m.gpus(i));
  }
  if (static_cast<int>(p.gpus.size()) != tp) {
    return errors.At("gpus", absl::StrCat("must list tp = ", tp, " GPUs, got ",
                                          p.gpus.size()));
  }
  return p;
}

absl::StatusOr<Template> TemplateFromMessage(
    const v1::Template& m, const GpuCatalog& catalog,
    const absl::flat_hash_map<std::string, int>& node_by_name,
    const MessageErrors& errors) {
  Template t;
  if (absl::Status s = errors.IntAtLeast("replicas", m.replicas(), 1);
      !s.ok()) {
    return s;
  }
  t.replicas = m.replicas();
  if (absl::Status s =
          errors.IntAtLeast("micro_batch_size", m.micro_batch_size(), 1);
      !s.ok()) {
    return s;
  }
  t.micro_batch_size = m.micro_batch_size();
  if (m.has_total_micro_batches()) {
    if (absl::Status s = errors.IntAtLeast("total_micro_batches",
                                           m.total_micro_batches(), 1);
        !s.ok()) {
      return s;
    }
    t.total_micro_batches = m.total_micro_batches();
    if (m.has_micro_batches() && m.micro_batches() != t.max_micro_batches()) {
      return errors.At(
          "micro_batches",
          absl::StrCat(m.micro_batches(), " does not match total_micro_batches ",
                       t.total_micro_batches, " over ", t.replicas,
                       " replicas (busiest replica runs ",
                       t.max_micro_batches(), ")"));
    }
  } else if (m.has_micro_batches()) {
    if (absl::Status s =
            errors.IntAtLeast("micro_batches", m.micro_batches(), 1);
        !s.ok()) {
      return s;
    }
    const int64_t total = int64_t{m.micro_batches()} * t.replicas;
    if (total > std::numeric_limits<int>::max()) {
      return errors.At("micro_batches", "micro_batches * replicas is too large");
    }
    t.total_micro_batches = static_cast<int>(total);
  } else {
    return errors.At("", "missing required field \"total_micro_batches\"");
  }

  if (m.stages_size() == 0) return errors.At("stages", "must not be empty");
  // Counts are checked before anything is built, so a huge message is
  // refused in time proportional to its size, not to what it would expand
  // to (a template's placement has replicas x stages entries).
  if (m.stages_size() > kMaxPlanStages) {
    return errors.At("stages",
                     absl::StrCat("must have at most ", kMaxPlanStages,
                                  " stages, got ", m.stages_size()));
  }
  if (t.replicas > kMaxPlanReplicas) {
    return errors.At("replicas",
                     absl::StrCat("must be an integer <= ", kMaxPlanReplicas,
                                  ", got ", t.replicas));
  }
  for (int s = 0; s < m.stages_size(); ++s) {
    absl::StatusOr<Stage> stage = StageFromMessage(
        m.stages(s), catalog, errors.Under(IndexFieldPath("stages", s)));
    if (!stage.ok()) return stage.status();
    t.stages.push_back(*std::move(stage));
  }

  if (m.placement_size() != t.replicas) {
    return errors.At("placement",
                     absl::StrCat("must have one row per replica (", t.replicas,
                                  "), got ", m.placement_size()));
  }
  for (int rep = 0; rep < t.replicas; ++rep) {
    const v1::ReplicaPlacement& row = m.placement(rep);
    const MessageErrors row_errors =
        errors.Under(IndexFieldPath("placement", rep));
    if (row.stages_size() != t.depth()) {
      return row_errors.At("stages",
                           absl::StrCat("must have one entry per stage (",
                                        t.depth(), "), got ",
                                        row.stages_size()));
    }
    for (int s = 0; s < t.depth(); ++s) {
      absl::StatusOr<StagePlacement> p = PlacementFromMessage(
          row.stages(s), t.stages[s].tp, node_by_name,
          row_errors.Under(IndexFieldPath("stages", s)));
      if (!p.ok()) return p.status();
      t.placement.push_back(*std::move(p));
    }
  }
  return t;
}

// Plan files before v1 gave a replica's placement as the bare list of its
// stages; the schema has {stages: [...]} (protobuf has no nested lists).
Json WithReplicaRowsAsMessages(Json json) {
  if (!json.is_object() || !json.contains("templates") ||
      !json["templates"].is_array()) {
    return json;
  }
  for (Json& t : json["templates"]) {
    if (!t.is_object() || !t.contains("placement") ||
        !t["placement"].is_array()) {
      continue;
    }
    for (Json& row : t["placement"]) {
      if (row.is_array()) row = Json{{"stages", std::move(row)}};
    }
  }
  return json;
}

}  // namespace

v1::PlanDocument PlanToDocument(const Plan& plan, const Prediction& prediction,
                                const Cluster& cluster,
                                const GpuCatalog& catalog,
                                const ModelSpec& model,
                                const TrainingConfig& training) {
  v1::PlanDocument d;
  d.set_model(model.name);
  // The framework as its preset and overrides, so the file says what the
  // prediction assumed and reads back to the same config.
  *d.mutable_training() = TrainingToMessage(training);
  d.set_iteration_time_s(prediction.iteration_time_s);
  d.set_throughput_iters_per_s(prediction.throughput_iters_per_s);
  d.set_tokens_per_s(prediction.tokens_per_s);
  d.set_mfu(prediction.mfu);
  d.set_usd_per_hour(prediction.usd_per_hour);
  d.set_max_memory_gib(prediction.max_memory_gib);
  d.set_unused_gpus(cluster.total_gpus() - plan.used_gpus());
  const TimeBreakdown& b = prediction.breakdown;
  v1::TimeBreakdown* mb = d.mutable_breakdown();
  mb->set_compute_s(b.compute_s);
  mb->set_tp_comm_s(b.tp_comm_s);
  mb->set_p2p_s(b.p2p_s);
  mb->set_bubble_s(b.bubble_s);
  mb->set_dp_sync_s(b.dp_sync_s);
  mb->set_all_to_all_s(b.all_to_all_s);
  mb->set_optimizer_s(b.optimizer_s);
  for (int t = 0; t < static_cast<int>(plan.templates.size()); ++t) {
    const Template& tmpl = plan.templates[t];
    v1::Template* mt = d.add_templates();
    mt->set_replicas(tmpl.replicas);
    mt->set_micro_batch_size(tmpl.micro_batch_size);
    mt->set_micro_batches(tmpl.max_micro_batches());
    mt->set_total_micro_batches(tmpl.total_micro_batches);
    for (int s = 0; s < tmpl.depth(); ++s) {
      *mt->add_stages() = StageToMessage(tmpl.stages[s], t, s, prediction,
                                         catalog, model.is_moe());
    }
    for (int r = 0; r < tmpl.replicas; ++r) {
      v1::ReplicaPlacement* row = mt->add_placement();
      for (int s = 0; s < tmpl.depth(); ++s) {
        const int index = r * tmpl.depth() + s;
        if (index >= static_cast<int>(tmpl.placement.size())) break;
        const StagePlacement& p = tmpl.placement[index];
        v1::StagePlacement* mp = row->add_stages();
        // A placement on a node outside the cluster is a caller's bug that
        // validation reports; the file then names no node.
        if (p.node >= 0 && p.node < cluster.num_nodes()) {
          mp->set_node(cluster.node(p.node).name);
        }
        for (int g : p.gpus) mp->add_gpus(g);
      }
    }
  }
  return d;
}

nlohmann::json PlanToJson(const Plan& plan, const Prediction& prediction,
                          const Cluster& cluster, const GpuCatalog& catalog,
                          const ModelSpec& model,
                          const TrainingConfig& training) {
  return MessageToJson(
      PlanToDocument(plan, prediction, cluster, catalog, model, training));
}

absl::StatusOr<Plan> PlanFromMessage(
    const google::protobuf::RepeatedPtrField<v1::Template>& templates,
    const Cluster& cluster, const GpuCatalog& catalog,
    absl::string_view source, absl::string_view path) {
  const MessageErrors errors(source, path);
  if (templates.empty()) return errors.At("templates", "must not be empty");
  if (templates.size() > kMaxPlanTemplates) {
    return errors.At("templates",
                     absl::StrCat("must have at most ", kMaxPlanTemplates,
                                  " templates, got ", templates.size()));
  }
  absl::flat_hash_map<std::string, int> node_by_name;
  for (int i = 0; i < cluster.num_nodes(); ++i) {
    node_by_name.emplace(cluster.node(i).name, i);
  }
  Plan plan;
  for (int t = 0; t < templates.size(); ++t) {
    absl::StatusOr<Template> tmpl =
        TemplateFromMessage(templates[t], catalog, node_by_name,
                            errors.Under(IndexFieldPath("templates", t)));
    if (!tmpl.ok()) return tmpl.status();
    plan.templates.push_back(*std::move(tmpl));
  }
  return plan;
}

absl::StatusOr<Plan> PlanFromJson(const nlohmann::json& json,
                                  const Cluster& cluster,
                                  const GpuCatalog& catalog,
                                  absl::string_view source) {
  v1::PlanDocument document;
  ARACHNE_IO_RETURN_IF_ERROR(MessageFromJson(
      WithReplicaRowsAsMessages(json), source, "", &document));
  return PlanFromMessage(document.templates(), cluster, catalog, source);
}

absl::StatusOr<TrainingConfig> PlanTrainingFromJson(const nlohmann::json& json,
                                                    absl::string_view source) {
  v1::PlanDocument document;
  ARACHNE_IO_RETURN_IF_ERROR(MessageFromJson(
      WithReplicaRowsAsMessages(json), source, "", &document));
  return TrainingFromMessage(document.training(), source, "training");
}

absl::StatusOr<Plan> LoadPlanFile(const std::string& path,
                                  const Cluster& cluster,
                                  const GpuCatalog& catalog) {
  ARACHNE_IO_ASSIGN_OR_RETURN(std::string text, ReadFileToString(path));
  ARACHNE_IO_ASSIGN_OR_RETURN(Json json, ParseJsonOrYaml(text, path));
  return PlanFromJson(json, cluster, catalog, path);
}

}  // namespace arachne
