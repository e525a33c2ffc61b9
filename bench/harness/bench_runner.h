// `arachne bench`: runs planners over the scenario suite (bench/scenarios/)
// and writes the results the paper's evaluation figures are drawn from.
//
// One PlanningContext (and so one CostModel) is built per composition and
// shared read-only by the planner runs on it: CostModel's methods are const
// and keep no caches, so concurrent runs on one model are safe. Each run gets
// its own Planner instance. Runs execute on a pool of `jobs` threads.
//
// Outputs (WriteBenchOutputs), all in the output directory:
//   results.csv       one row per (scenario, composition, planner) run
//   results.md        a table per scenario, grouped by figure, throughput
//                     normalised to the best planner of each composition
//   progress.csv      search_curve scenarios: best-so-far throughput after
//                     each improvement (Figure 11)
//   fig4_samples.csv  scatter scenarios: random plan structures (Figure 4)
//   learned_policies.csv  when the learned planner ran: the offline training
//                     behind each model's policy (rollouts, seconds), so
//                     plots can show it apart from planning time
// and, when python3 with matplotlib is available, the PNG plots that
// bench/plot_results.py draws from those files.
#ifndef ARACHNE_BENCH_HARNESS_BENCH_RUNNER_H_
#define ARACHNE_BENCH_HARNESS_BENCH_RUNNER_H_

#include <cstdint>
#include <ostream>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "planner_service/core/calibration/run_corrections.h"
#include "planner_service/core/model/gpu_catalog.h"
#include "planner_service/core/model/model.h"
#include "planner_service/core/model/plan.h"
#include "planner_service/core/planners/planner.h"
#include "planner_service/io/scenario_io.h"

namespace arachne {

struct BenchOptions {
  std::string suite_dir;
  // Shell globs over scenario names; empty: every scenario of the suite.
  std::vector<std::string> scenario_patterns;
  // Planner names; empty: every registered planner (PlannerNames(): the
  // learned planner when a policy factory is registered). "learned" without
  // a registered factory (a build without LibTorch) is skipped with a note.
  std::vector<std::string> planners;
  double budget_s = 60;         // per planner run
  int64_t max_evaluations = 0;  // per planner run; 0: no limit
  int max_depth = 16;
  int max_templates = 3;
  uint64_t seed = 1;
  int jobs = 0;  // worker threads; 0: the machine's hardware threads
  std::string profiles_dir;  // "" = the data built into the binary
  // When set, each run's results.csv row is appended to this file as soon as
  // the run ends (its directory is created), so an interrupted bench keeps
  // what it measured.
  std::string partial_csv;
  // Where the learned planner's checkpoints and their .json metadata are,
  // read only to report the offline training behind each policy; "" =
  // $ARACHNE_POLICIES_DIR, else (with LibTorch) the source tree's
  // profiles/policies: where the registered factory looks by default.
  std::string policies_dir;
  // A run calibration (--calibration) applied to every scenario's training
  // config and cost parameters.
  RunCorrections calibration;
};

// The learned planner's name in PlannerNames() and results.
inline constexpr char kLearnedPlannerName[] = "learned";

enum class RunStatus { kOk, kNoPlan, kError };
// "ok", "no_plan", "error".
const char* RunStatusName(RunStatus status);

// One planner on one composition.
struct BenchRun {
  int scenario = 0;     // index into BenchResults::scenarios
  int composition = 0;  // index into that scenario's compositions
  std::string planner;
  RunStatus status = RunStatus::kError;
  std::string message;         // why, when not ok
  double planning_time_s = 0;  // wall time of Planner::Run
  // Set when ok:
  Prediction prediction;
  PlannerStats stats;
  int gpus_used = 0;
  int max_depth = 0;  // deepest template
  int templates = 0;
  std::string plan_summary;
};

// One random plan structure of a scatter scenario (Figure 4).
struct BenchSample {
  int scenario = 0;
  int composition = 0;
  int max_depth = 0;
  int templates = 0;
  double throughput_iters_per_s = 0;
};

// A planner left out of a scenario (scenario -1: of every scenario), e.g.
// the learned planner for a model with no policy. Not a run: it has no row
// in results.csv, a note in results.md and the log.
struct BenchSkip {
  int scenario = -1;
  std::string planner;
  std::string reason;
};

// The offline training behind the learned planner's policy for one model
// (from the checkpoint's .json; earlier runs it continued from, kept as
// `<policy>.<stage>.curve.csv` beside it, are added): the plans scored
// before planning time, which Figure 11 shows apart from it.
struct BenchPolicy {
  std::string model;       // the scenario's model
  std::string policy;      // the checkpoint's model: `model` or its relative
  std::string checkpoint;  // path of the .pt
  int training_runs = 0;   // `arachne train` runs (1 + earlier stages)
  // Episodes: each builds one candidate plan, scored by its reward.
  int64_t training_rollouts = 0;
  double training_wall_s = 0;
};

struct BenchResults {
  BenchOptions options;  // as run (planners, jobs and policies_dir resolved)
  std::vector<Scenario> scenarios;
  // Scenario, composition, planner order; a skipped planner has no run.
  std::vector<BenchRun> runs;
  std::vector<BenchSample> samples;
  std::vector<BenchSkip> skipped;
  // One per model the learned planner planned with a policy whose metadata
  // was found in options.policies_dir.
  std::vector<BenchPolicy> policies;
  double wall_s = 0;
};

// The training behind `model`'s policy in `policies_dir`: the first of
// `<model>.pt`, `<policy_relative>.pt` that exists with a `.json` naming
// that model (the order the policy factory tries them). NotFound when
// neither has one; InvalidArgument naming the file for malformed metadata.
absl::StatusOr<BenchPolicy> FindPolicyTraining(const std::string& policies_dir,
                                               const ModelSpec& model);

// Loads the suite and runs it. Progress lines go to `log` as runs finish.
// InvalidArgument / NotFound for bad options or scenario files (the message
// names the flag, file, field and value); a planner's own failure is
// recorded in its BenchRun, not returned.
absl::StatusOr<BenchResults> RunBench(const BenchOptions& options,
                                      std::ostream& log);

// "T1: 12x mbs4 [A100-40GB tp4 L0-3 > H100-80GB tp2 L3-32]; T2: ...": each
// template's replicas, micro-batch size and stages in pipeline order, with
// `ep/etp/edp` where a stage's expert tiling is not all 1.
std::string PlanSummary(const Plan& plan, const GpuCatalog& catalog);

// The file contents, for tests and WriteBenchOutputs.
std::string ResultsCsv(const BenchResults& results);
std::string ResultsMarkdown(const BenchResults& results);
std::string ProgressCsv(const BenchResults& results);
std::string SamplesCsv(const BenchResults& results);
// learned_policies.csv: model, policy, checkpoint, training_runs,
// training_rollouts, training_wall_s.
std::string PoliciesCsv(const BenchResults& results);

// Writes results.csv and results.md, plus progress.csv / fig4_samples.csv
// when the suite has search_curve / scatter scenarios and
// learned_policies.csv when the learned planner ran, into `out_dir`
// (created). PermissionDenied naming the path when a file cannot be written.
absl::Status WriteBenchOutputs(const BenchResults& results,
                               const std::string& out_dir);

// Runs `python3 <plot_script> <out_dir>` when python3 can import matplotlib.
// Returns true when the plots were drawn; otherwise says on `log` why they
// were skipped and the command that draws them later. Never fails the bench.
bool DrawPlots(const std::string& plot_script, const std::string& out_dir,
               std::ostream& log);

}  // namespace arachne

#endif  // ARACHNE_BENCH_HARNESS_BENCH_RUNNER_H_
