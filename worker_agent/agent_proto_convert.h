// Conversions between the arachne.v1 Agent messages (proto/arachne/v1/
// agent.proto) and the runtime's types (worker_agent/node_runtime.h), shared
// by the service (agent_service.h) and its client (agent_client.h). Only
// the runtime's plain structs are used here, so this library links without
// the runtime.
//
// Requests are read by the readers of files and of the planner service
// (ClusterFromMessage, PlanFromMessage, ModelFromMessage, ResolveModelRef,
// ResolveTraining), so an agent reads a cluster or plan exactly as
// `arachne evaluate` and arachne-planner do. Errors are InvalidArgument
// naming the request field: "plan.templates[0].placement[1].stages[0].node:
// unknown node \"x\" (not in the cluster)", "lost[2].index: ...".
#ifndef ARACHNE_WORKER_AGENT_AGENT_PROTO_CONVERT_H_
#define ARACHNE_WORKER_AGENT_AGENT_PROTO_CONVERT_H_

#include <vector>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "absl/time/time.h"
#include "arachne/v1/agent.pb.h"
#include "planner_service/core/gpu_catalog.h"
#include "planner_service/core/model.h"
#include "worker_agent/node_runtime.h"

namespace arachne::agent {

// Phase timeout of Pause, Migrate and Rebuild when a request gives 0.
inline constexpr absl::Duration kDefaultPhaseTimeout = absl::Seconds(60);

// `generation` of a request that changes state: >= 1, else
// InvalidArgument "generation: must be an integer >= 1, got 0" (0 is also
// what a request that left the field out carries).
absl::Status CheckGeneration(int64_t generation);

// A request's timeout_s: 0 = kDefaultPhaseTimeout; negative, NaN or
// infinite is InvalidArgument naming `field`.
absl::StatusOr<absl::Duration> PhaseTimeoutFromProto(double timeout_s,
                                                     absl::string_view field);

// The engine's settings: a field left out keeps EngineConfig's default.
// Range checks are EngineConfig::Validate's (the runtime's).
EngineConfig EngineConfigFromProto(const v1::EngineConfig& engine);
v1::EngineConfig EngineConfigToProto(const EngineConfig& engine);

// Every field of a PrepareRequest resolved against the agent's catalogs
// (`models` is the model catalog for model.name). Checks what the request's
// shape decides: the generation, exactly one of model / model_spec, cluster
// and plan present, old_cluster and old_plan both or neither, lost GPUs only
// with old_plan and each on a node of old_cluster. The feasibility of the
// plan and whether this node's GPUs match are the runtime's checks.
absl::StatusOr<PrepareArgs> PrepareArgsFromProto(
    const v1::PrepareRequest& request, const GpuCatalog& catalog,
    const std::vector<ModelSpec>& models);

// The request of `args` (the model as model_spec, GPU types by canonical
// id, nodes by name), for clients holding the runtime's types;
// PrepareArgsFromProto reads it back as `args`.
v1::PrepareRequest PrepareRequestFromArgs(const PrepareArgs& args,
                                          const GpuCatalog& catalog);

v1::PrepareResponse PrepareResultToProto(const PrepareResult& result);
PrepareResult PrepareResultFromProto(const v1::PrepareResponse& response);

v1::Phase PhaseToProto(Phase phase);
// PHASE_UNSPECIFIED and values this build does not know are
// InvalidArgument (an agent newer than its client).
absl::StatusOr<Phase> PhaseFromProto(v1::Phase phase);

// The status with the agent's own GPUs (node, canonical GPU type id,
// count, virtual).
v1::StatusResponse NodeStatusToProto(const NodeStatus& status,
                                     const NodeGpus& gpus,
                                     const GpuCatalog& catalog);
absl::StatusOr<NodeStatus> NodeStatusFromProto(
    const v1::StatusResponse& response);

}  // namespace arachne::agent

#endif  // ARACHNE_WORKER_AGENT_AGENT_PROTO_CONVERT_H_
