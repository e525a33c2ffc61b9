// Benchmark scenario files (bench/scenarios/*.yaml): one panel of the
// paper's evaluation — a model, its training config and the cluster
// compositions every planner is run on — for `arachne bench`.
//
//   name: fig07a-llama3-8b          # unique in the suite
//   figure: "7a"                    # the paper figure (panel) it reproduces
//   description: LLaMA-3-8B on A100-40GB + H100 1:1
//   kind: compare                   # compare | search_curve | growth | scatter
//   model: llama3-8b                # catalog id (arachne models)
//   training: {seq_len: 2048, global_batch: 2048, precision: bf16,
//              optimizer: adam, recompute: none,
//              framework: megatron-core}   # or {preset: ..., <field>: ...}
//   compositions:
//     - label: "32+32 (64 GPUs)"
//       gpus: 64                      # must equal the cluster's GPU count
//       cluster:                      # inline cluster spec (cluster_io.h)
//         inter_node_gbps: 100
//         node_groups:
//           - {gpu: A100-40GB, gpus_per_node: 4, count: 8}
//           - {gpu: H100-80GB, gpus_per_node: 4, count: 8}
//
// Kinds: `compare` runs every planner on every composition (bars);
// `search_curve` also records each planner's best-so-far throughput against
// plan evaluations (`max_evaluations` caps the search; Figure 11);
// `growth` is a composition sequence as nodes join one at a time (the
// testbed, Figure 8); `scatter` adds `samples` random plan structures per
// composition to compare each planner's plan against (Figure 4).
//
// Parsing is strict like every other io format: unknown fields, wrong types
// and out-of-range values are InvalidArgument
// "<file>: <field path>: <what>, got <value>".
#ifndef ARACHNE_PLANNER_SERVICE_IO_SCENARIO_IO_H_
#define ARACHNE_PLANNER_SERVICE_IO_SCENARIO_IO_H_

#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "planner_service/core/model/cluster.h"
#include "planner_service/core/model/gpu_catalog.h"
#include "planner_service/core/model/model.h"
#include "planner_service/io/json_yaml.h"

namespace arachne {

enum class ScenarioKind { kCompare, kSearchCurve, kGrowth, kScatter };

// "compare", "search_curve", "growth", "scatter".
absl::string_view ScenarioKindName(ScenarioKind kind);

struct Composition {
  std::string label;  // e.g. "LS3 (160 GPUs)"
  int gpus = 0;       // stated GPU count; equals cluster.total_gpus()
  Cluster cluster;
};

struct Scenario {
  std::string source;  // file it was read from (for messages)
  std::string name;
  std::string figure;
  std::string description;
  ScenarioKind kind = ScenarioKind::kCompare;
  std::string model;  // catalog id as written
  ModelSpec model_spec;
  TrainingConfig training;
  // search_curve: plan evaluations each planner may spend (0: the bench's
  // --max-evaluations applies).
  int64_t max_evaluations = 0;
  // scatter: random plan structures drawn per composition.
  int samples = 0;
  std::vector<Composition> compositions;
};

// The `training` mapping of `parent` (a scenario, a measured-runs file):
// seq_len, global_batch, precision, recompute, distributed_optimizer,
// optimizer (adam only) and framework (framework_io.h, ReadFramework).
// Absent fields, or no `training` at all, keep TrainingConfig's defaults;
// errors name the field and the value.
absl::StatusOr<TrainingConfig> ReadTrainingConfig(const ObjectReader& parent);

// Parses one scenario (YAML or JSON) named `source` in messages. The model
// is resolved against the catalog of `profiles_dir` ("" = built in); an
// unknown model is InvalidArgument "<source>: model: unknown model ...".
// `gpus` of every composition must equal its cluster's GPU count; composition
// labels must be unique within the file.
absl::StatusOr<Scenario> ParseScenario(absl::string_view text,
                                       absl::string_view source,
                                       const GpuCatalog& catalog,
                                       const std::string& profiles_dir = "");

// Reads and parses the file at `path` (NotFound naming it when unreadable).
absl::StatusOr<Scenario> LoadScenarioFile(const std::string& path,
                                          const GpuCatalog& catalog,
                                          const std::string& profiles_dir = "");

// Loads every *.yaml, *.yml and *.json file of `dir`, in file-name order.
// When `patterns` is non-empty, keeps the scenarios whose name matches one of
// the shell globs (fnmatch), e.g. {"fig07*", "testbed-gpt-neo-2.7b"}.
// NotFound when `dir` is not a directory or holds no scenario file;
// InvalidArgument when a pattern matches nothing (listing the names), or two
// files share a scenario name; a bad file's error as ParseScenario gives it.
absl::StatusOr<std::vector<Scenario>> LoadScenarioSuite(
    const std::string& dir, const std::vector<std::string>& patterns,
    const GpuCatalog& catalog, const std::string& profiles_dir = "");

}  // namespace arachne

#endif  // ARACHNE_PLANNER_SERVICE_IO_SCENARIO_IO_H_
