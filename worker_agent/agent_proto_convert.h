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

#include <utility>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "absl/time/time.h"
#include "arachne/v1/agent.pb.h"
#include "migration/core/diff.h"
#include "migration/core/schedule.h"
#include "migration/core/state_layout.h"
#include "planner_service/core/model/gpu_catalog.h"
#include "planner_service/core/model/model.h"
#include "worker_agent/node_ranks.h"

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

// What a job trains, from the fields of PrepareRequest (and of the Engine
// service's DescribeRequest) of the same names: exactly one of `model` and
// `model_spec` (null: not given), the training settings with their
// defaults filled in, the engine's hyper-parameters.
absl::StatusOr<JobSpec> JobSpecFromProto(const v1::ModelRef& model,
                                         const v1::Model* model_spec,
                                         const v1::TrainingConfig& training,
                                         const v1::EngineConfig& engine,
                                         const std::vector<ModelSpec>& models);

// The job of `job` as the fields model_spec, training and engine that
// PrepareRequest, DescribeStateRequest and the Engine service's
// DescribeRequest share; JobSpecFromProto reads them back as `job`.
struct JobMessages {
  v1::Model model_spec;
  v1::TrainingConfig training;
  v1::EngineConfig engine;
};
JobMessages JobSpecToProto(const JobSpec& job);
template <typename Request>
void SetJob(const JobSpec& job, Request* request) {
  JobMessages m = JobSpecToProto(job);
  *request->mutable_model_spec() = std::move(m.model_spec);
  *request->mutable_training() = std::move(m.training);
  *request->mutable_engine() = std::move(m.engine);
}

// A state's tensors as the protocol lists them, and back: ModelStateFromProto
// checks each (migration::ModelState::FromTensors, and bytes_per_element
// against the kind), naming "tensors[i].<field>".
void ModelStateToProto(
    const migration::ModelState& state,
    google::protobuf::RepeatedPtrField<v1::TensorDescription>* tensors);
absl::StatusOr<migration::ModelState> ModelStateFromProto(
    const ModelSpec& model,
    const google::protobuf::RepeatedPtrField<v1::TensorDescription>& tensors);

// A plan's layout as PrepareRequest.layout carries it: every GPU of the
// plan in plan-rank order (layout.gpus()), with its role and holdings.
void PlanLayoutToProto(const migration::PlanLayout& layout,
                       v1::StateLayout* out);

// Migration rank `rank`'s part of a switch (PrepareRequest.migration): the
// ranges it keeps and its transfers of `schedule`, built from `diff`, in
// round order.
void RankMigrationToProto(const migration::StateDiff& diff,
                          const migration::MigrationSchedule& schedule,
                          int rank, v1::RankMigration* out);

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
