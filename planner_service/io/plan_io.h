// Plan files: the JSON a planner writes (plan + prediction) and reads back
// (plan only) for simulation, migration and comparison. A plan file is the
// JSON mapping of arachne.v1.PlanDocument (proto/arachne/v1/planner.proto):
//
// {
//   "model": "llama3-8b",
//   "training": {"seq_len": 2048, "global_batch": 2048, "precision": "bf16",
//                "recompute": "none", "distributed_optimizer": false,
//                "framework": {"preset": "megatron-deepspeed",
//                              "attention": "flash"}},  // + overrides
//   "iteration_time_s": 5.1, "throughput_iters_per_s": 0.196,
//   "tokens_per_s": 822000, "mfu": 0.41, "usd_per_hour": 120.5,
//   "max_memory_gib": 37.2, "unused_gpus": 0,
//   "breakdown": {"compute_s": .., "tp_comm_s": .., "p2p_s": ..,
//                 "bubble_s": .., "dp_sync_s": .., "all_to_all_s": ..,
//                 "optimizer_s": ..},
//   "templates": [{
//     "replicas": 2, "micro_batch_size": 1, "micro_batches": 64,
//     "total_micro_batches": 128,
//     "stages": [{"gpu_type": "A100-40GB", "tp": 4, "layers": [0, 16],
//                 "memory_gib": 35.1,
//                 "expert_tiling": {"ep": 4, "etp": 1, "edp": 2}}],  // MoE
//     "placement": [{"stages": [{"node": "a100-40gb-0",
//                                "gpus": [0, 1, 2, 3]}, ...]},  // replica 0
//                   ...]
//   }]
// }
//
// `layers` is the half-open range [begin, end) of transformer blocks.
#ifndef ARACHNE_PLANNER_SERVICE_IO_PLAN_IO_H_
#define ARACHNE_PLANNER_SERVICE_IO_PLAN_IO_H_

#include <string>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "arachne/v1/planner.pb.h"
#include "nlohmann/json.hpp"
#include "planner_service/core/model/cluster.h"
#include "planner_service/core/model/gpu_catalog.h"
#include "planner_service/core/model/model.h"
#include "planner_service/core/model/plan.h"

namespace arachne {

// Bounds on one plan, checked before it is built: far above any plan a
// planner makes for the largest cluster (kMaxClusterNodes nodes), so that
// a malformed file or request is refused quickly and in little memory.
inline constexpr int kMaxPlanTemplates = 64;
// A stage holds at least one layer; no model has more layers than this.
inline constexpr int kMaxPlanStages = 1024;
// A replica uses at least one GPU: 4096 nodes of 64.
inline constexpr int kMaxPlanReplicas = 4096 * 64;

// The plan file message of a plan and its prediction.
v1::PlanDocument PlanToDocument(const Plan& plan, const Prediction& prediction,
                                const Cluster& cluster,
                                const GpuCatalog& catalog,
                                const ModelSpec& model,
                                const TrainingConfig& training);

// Resolves the templates of a plan message against `cluster` (nodes by
// name) and `catalog` (GPU types by id or alias): the one reader of plans,
// for files (PlanFromJson) and the service's requests alike. Checks
// structure only (tp >= 1, 0 <= begin < end, one placement row per replica
// and entry per stage, tp GPUs per entry, known nodes and GPU types, the
// kMaxPlan* bounds above);
// whether the plan is feasible is core's validation. Errors are
// InvalidArgument "<source>: <path>.templates[i].placement[r].stages[s]
// .node: unknown node \"x\" (not in the cluster)" and the like (without
// "<source>: " when `source` is empty).
absl::StatusOr<Plan> PlanFromMessage(
    const google::protobuf::RepeatedPtrField<v1::Template>& templates,
    const Cluster& cluster, const GpuCatalog& catalog,
    absl::string_view source, absl::string_view path = "");

// PlanToDocument as a tree, in the shape above. GPU types are written as
// canonical ids, nodes by name. `memory_gib` is written when `prediction`
// holds stage_memory for the stage; `expert_tiling` only for MoE models. The
// caller adds fields such as "planner" and "planning_time_s".
nlohmann::json PlanToJson(const Plan& plan, const Prediction& prediction,
                          const Cluster& cluster, const GpuCatalog& catalog,
                          const ModelSpec& model,
                          const TrainingConfig& training);

// Reads a plan JSON as a PlanDocument (strictly: unknown fields anywhere are
// errors; the outputs at the top level, such as the prediction and
// `planner`, are read and ignored) and its templates with PlanFromMessage.
// A replica's placement may also be the bare list of its stages (the pre-v1
// shape, [[{node, gpus}, ...], ...]).
absl::StatusOr<Plan> PlanFromJson(const nlohmann::json& json,
                                  const Cluster& cluster,
                                  const GpuCatalog& catalog,
                                  absl::string_view source = "plan");

// The training config a plan JSON records (`training`; TrainingConfig's
// defaults for what it omits, such as a plan without one), its framework
// read back from the preset and overrides PlanToJson wrote. Errors as
// PlanFromJson's, "<source>: training.framework.attention: ...".
absl::StatusOr<TrainingConfig> PlanTrainingFromJson(
    const nlohmann::json& json, absl::string_view source = "plan");

// Reads a plan file (JSON or YAML) at `path`; errors name the path.
absl::StatusOr<Plan> LoadPlanFile(const std::string& path,
                                  const Cluster& cluster,
                                  const GpuCatalog& catalog);

}  // namespace arachne

#endif  // ARACHNE_PLANNER_SERVICE_IO_PLAN_IO_H_
