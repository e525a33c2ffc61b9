// Measured-runs files: training runs with the iteration time (and peak
// memory) they were measured at, for `arachne calibrate`
// (core/calibration/run_corrections.h).
//
//   source: "optional free text"            # where the runs come from
//   runs:
//     - label: "gpt-2.7b pp4 16 nodes"       # required, unique
//       source: "paper/table/row"            # required
//       model: gpt-neo-2.7b                  # catalog id, or an inline
//                                            # models.yaml entry (mapping)
//       cluster: {inter_node_gbps: 200,
//                 node_groups: [{gpu: H100-80GB, gpus_per_node: 4,
//                                count: 16}]}
//       # or cluster_file: path              (relative to the runs file)
//       training: {seq_len: 2048, global_batch: 512, precision: fp16,
//                  framework: megatron-deepspeed}
//       plan: {tp: 1, pp: 4, dp: 16, micro_batch: 4}
//       # or plan_file: path                 (an `arachne plan` JSON)
//       measured: {iteration_s: 3.21, peak_memory_gib: 41.5}
//
// `plan` is Megatron's uniform layout (MegatronUniformPlan): tp * pp * dp
// must be the cluster's GPU count, and micro_batch * dp must divide the
// global batch (Megatron's own rule). Errors are InvalidArgument
// "<file>: runs[2] (\"label\"): <field>: <what>, got <value>".
#ifndef ARACHNE_PLANNER_SERVICE_IO_MEASURED_RUNS_IO_H_
#define ARACHNE_PLANNER_SERVICE_IO_MEASURED_RUNS_IO_H_

#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "planner_service/core/model/cluster.h"
#include "planner_service/core/model/gpu_catalog.h"
#include "planner_service/core/model/model.h"
#include "planner_service/core/model/plan.h"
#include "planner_service/core/calibration/run_corrections.h"

namespace arachne {

struct MeasuredRunsFile {
  std::string source;  // the file's `source` text ("" when absent)
  std::vector<MeasuredRun> runs;
};

// Megatron's uniform layout of tp x pp x dp GPUs on `cluster`, in its
// default rank order (tp fastest, then dp, then pp: Megatron-Core's
// "tp-cp-ep-dp-pp" without cp / ep): GPU ranks are the cluster's GPUs in
// node order, stage s of replica r takes ranks (s * dp + r) * tp ..+tp.
// Layers are split evenly, the first num_layers % pp stages taking one
// more (Megatron itself requires an even split unless told otherwise; the
// split it would use for an uneven count is not fixed, so this one is
// documented). MoE stages shard experts by TP (ShardExpertsByTp).
// total_micro_batches = global_batch / micro_batch. InvalidArgument naming
// the field (tp, pp, dp, micro_batch) when tp * pp * dp is not the
// cluster's GPU count, micro_batch * dp does not divide the global batch,
// pp exceeds the layers, a TP group would cross a node or a stage would
// mix GPU types.
absl::StatusOr<Plan> MegatronUniformPlan(const ModelSpec& model,
                                         const TrainingConfig& training,
                                         const Cluster& cluster, int tp, int pp,
                                         int dp, int micro_batch);

// Parses a runs file named `source` (relative cluster_file / plan_file
// paths resolve against `base_dir`). Models resolve against the catalog of
// `profiles_dir` ("" = built in). Each run's plan is checked structurally
// here; PredictRun validates it against the cost model.
absl::StatusOr<MeasuredRunsFile> ParseMeasuredRuns(
    absl::string_view text, absl::string_view source,
    const std::string& base_dir, const GpuCatalog& catalog,
    const std::string& profiles_dir = "");

// Reads and parses the file at `path` (NotFound naming it when unreadable).
absl::StatusOr<MeasuredRunsFile> LoadMeasuredRunsFile(
    const std::string& path, const GpuCatalog& catalog,
    const std::string& profiles_dir = "");

}  // namespace arachne

#endif  // ARACHNE_PLANNER_SERVICE_IO_MEASURED_RUNS_IO_H_
