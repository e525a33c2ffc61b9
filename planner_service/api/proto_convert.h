// Conversions between arachne.v1 messages and the handler's project types
// (planner_handler.h). Clusters need none (the handler takes the schema's
// Cluster and resolves it with ClusterFromMessage, as files are); plans
// cross the handler as plan files (PlanDocument's JSON mapping), so they
// convert through message_json.
#ifndef ARACHNE_PLANNER_SERVICE_API_PROTO_CONVERT_H_
#define ARACHNE_PLANNER_SERVICE_API_PROTO_CONVERT_H_

#include "absl/status/statusor.h"
#include "arachne/v1/planner.pb.h"
#include "nlohmann/json.hpp"
#include "planner_service/api/planner_handler.h"
#include "planner_service/core/model/gpu_catalog.h"
#include "planner_service/core/model/model.h"
#include "planner_service/core/planning_options.h"

namespace arachne {

ModelRef ModelRefFromProto(const v1::ModelRef& model);
TrainingSpec TrainingFromProto(const v1::TrainingConfig& training);
// The options exactly as the message gives them (the objective's raw enum
// value, policy_rollouts only when present), for ValidatePlanningOptions.
PlanningOptionsInput PlanningOptionsFromProto(const v1::PlannerOptions& o);

// A plan file tree (PlanDocument's mapping, as the handler answers) as a
// Plan message; with `prediction`, also its top-level prediction fields and
// per-stage memory. Internal when the JSON does not map (a bug: the handler
// produced it).
absl::Status PlanJsonToProto(const nlohmann::json& cli_json, v1::Plan* plan,
                             v1::Prediction* prediction);

// A Plan message as a tree, for PlanFromJson.
nlohmann::json PlanProtoToJson(const v1::Plan& plan);

// The other direction, for clients (planner_service/client).
v1::ModelRef ModelRefToProto(const ModelRef& model);
v1::TrainingConfig TrainingToProto(const TrainingSpec& training);

// A Plan and Prediction message as the plan file PlanToJson writes (without
// its `model` and `training`): `memory_gib` per stage (from
// `prediction.stage_memory`), `unused_gpus`, and the prediction's fields at
// the top level. Doubles pass unchanged, so a client prints what an
// in-process run prints.
nlohmann::json PlanProtoToCliJson(const v1::Plan& plan,
                                  const v1::Prediction& prediction);

v1::GpuType GpuTypeToProto(const GpuType& type);
v1::Model ModelToProto(const ModelSpec& model);

}  // namespace arachne

#endif  // ARACHNE_PLANNER_SERVICE_API_PROTO_CONVERT_H_
