// Conversions between arachne.v1 messages and the handler's project types
// (planner_handler.h). Plans go through the protobuf JSON mapping: the
// proto's field names are the CLI plan JSON's, so only the placement shape
// ([{stages: [...]}] vs [[...]]) is rewritten here.
#ifndef ARACHNE_PLANNER_SERVICE_SERVER_PROTO_CONVERT_H_
#define ARACHNE_PLANNER_SERVICE_SERVER_PROTO_CONVERT_H_

#include "absl/status/statusor.h"
#include "arachne/v1/planner.pb.h"
#include "nlohmann/json.hpp"
#include "planner_service/core/gpu_catalog.h"
#include "planner_service/core/model.h"
#include "planner_service/server/planner_handler.h"

namespace arachne {

ClusterSpec ClusterFromProto(const v1::Cluster& cluster);
ModelRef ModelRefFromProto(const v1::ModelRef& model);
TrainingSpec TrainingFromProto(const v1::TrainingConfig& training);

// The CLI plan JSON (PlanToJson's shape) as a Plan message; with
// `prediction`, also its top-level prediction fields and per-stage memory.
// Internal when the JSON does not map (a bug: the handler produced it).
absl::Status PlanJsonToProto(const nlohmann::json& cli_json, v1::Plan* plan,
                             v1::Prediction* prediction);

// A Plan message in the CLI plan JSON shape, for PlanFromJson.
nlohmann::json PlanProtoToJson(const v1::Plan& plan);

// The other direction, for clients (planner_service/client).
v1::Cluster ClusterToProto(const ClusterSpec& cluster);
v1::ModelRef ModelRefToProto(const ModelRef& model);
v1::TrainingConfig TrainingToProto(const TrainingSpec& training);

// A Plan and Prediction message in the CLI plan JSON shape PlanToJson
// writes (without its `model` and `training`): placement as [[...]],
// `memory_gib` per stage (from `prediction.stage_memory`), `unused_gpus`,
// and the prediction's fields at the top level. Doubles pass unchanged, so
// a client prints what an in-process run prints.
nlohmann::json PlanProtoToCliJson(const v1::Plan& plan,
                                  const v1::Prediction& prediction);

v1::GpuType GpuTypeToProto(const GpuType& type);
v1::Model ModelToProto(const ModelSpec& model);

}  // namespace arachne

#endif  // ARACHNE_PLANNER_SERVICE_SERVER_PROTO_CONVERT_H_
