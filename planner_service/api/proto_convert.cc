#include "planner_service/api/proto_convert.h"

#include <string>

#include "absl/strings/str_cat.h"
#include "glog/logging.h"
#include "planner_service/io/gpu_catalog_io.h"
#include "planner_service/io/message_json.h"
#include "planner_service/io/model_io.h"

namespace arachne {
namespace {

// A tree this process wrote (PlanToJson, ModelToJson, GpuTypeToJson) as a
// message. The trees and the messages are one schema, so a failure is a bug
// here, reported as Internal rather than blamed on the client.
absl::Status FromOwnJson(const nlohmann::json& j,
                         google::protobuf::Message* message) {
  absl::Status s = MessageFromJson(j, "", "", message);
  if (!s.ok()) {
    return absl::InternalError(absl::StrCat(
        "JSON -> ", message->GetTypeName(), ": ", s.message()));
  }
  return absl::OkStatus();
}

}  // namespace

ModelRef ModelRefFromProto(const v1::ModelRef& model) {
  return {model.name(), model.hf_config_json()};
}

TrainingSpec TrainingFromProto(const v1::TrainingConfig& t) {
  return {t.seq_len(),   t.global_batch(),          t.precision(),
          t.recompute(), t.distributed_optimizer(), t.framework()};
}

PlanningOptionsInput PlanningOptionsFromProto(const v1::PlannerOptions& o) {
  PlanningOptionsInput in;
  in.planner = o.planner();
  in.budget_s = o.budget_s();
  in.max_evaluations = o.max_evaluations();
  in.max_depth = o.max_depth();
  in.max_templates = o.max_templates();
  in.objective = o.objective();
  if (o.has_policy_rollouts()) in.policy_rollouts = o.policy_rollouts();
  return in;
}

absl::Status PlanJsonToProto(const nlohmann::json& cli, v1::Plan* plan,
                             v1::Prediction* prediction) {
  v1::PlanDocument document;
  if (absl::Status s = FromOwnJson(cli, &document); !s.ok()) return s;
  plan->Clear();
  *plan->mutable_templates() = document.templates();
  plan->set_unused_gpus(document.unused_gpus());
  if (prediction == nullptr) return absl::OkStatus();
  prediction->Clear();
  prediction->set_iteration_time_s(document.iteration_time_s());
  prediction->set_throughput_iters_per_s(document.throughput_iters_per_s());
  prediction->set_tokens_per_s(document.tokens_per_s());
  prediction->set_mfu(document.mfu());
  prediction->set_usd_per_hour(document.usd_per_hour());
  prediction->set_max_memory_gib(document.max_memory_gib());
  *prediction->mutable_breakdown() = document.breakdown();
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
  return MessageToJson(plan);
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
  *out.mutable_framework() = t.framework;
  return out;
}

nlohmann::json PlanProtoToCliJson(const v1::Plan& plan,
                                  const v1::Prediction& prediction) {
  v1::PlanDocument document;
  *document.mutable_templates() = plan.templates();
  for (const v1::StageMemory& m : prediction.stage_memory()) {
    if (m.template_index() < 0 ||
        m.template_index() >= document.templates_size()) {
      continue;
    }
    v1::Template* t = document.mutable_templates(m.template_index());
    if (m.stage_index() < 0 || m.stage_index() >= t->stages_size()) continue;
    t->mutable_stages(m.stage_index())->set_memory_gib(m.memory_gib());
  }
  document.set_unused_gpus(plan.unused_gpus());
  document.set_iteration_time_s(prediction.iteration_time_s());
  document.set_throughput_iters_per_s(prediction.throughput_iters_per_s());
  document.set_tokens_per_s(prediction.tokens_per_s());
  document.set_mfu(prediction.mfu());
  document.set_usd_per_hour(prediction.usd_per_hour());
  document.set_max_memory_gib(prediction.max_memory_gib());
  *document.mutable_breakdown() = prediction.breakdown();
  nlohmann::json j = MessageToJson(document);
  // Not known from a Plan and Prediction; the caller's own inputs.
  j.erase("model");
  j.erase("training");
  return j;
}

v1::GpuType GpuTypeToProto(const GpuType& type) {
  v1::GpuType out;
  absl::Status s = FromOwnJson(GpuTypeToJson(type), &out);
  CHECK(s.ok()) << s;
  return out;
}

v1::Model ModelToProto(const ModelSpec& model) {
  v1::Model out;
  absl::Status s = FromOwnJson(ModelToJson(model), &out);
  CHECK(s.ok()) << s;
  if (out.profile_name().empty()) out.set_profile_name(model.name);
  out.set_total_params(model.TotalParams());
  return out;
}

}  // namespace arachne
