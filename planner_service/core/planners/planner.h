// The interface every planner implements (exact search now; baselines and
// the learned policy later), with the options and statistics they share.
#ifndef ARACHNE_PLANNER_SERVICE_CORE_PLANNERS_PLANNER_H_
#define ARACHNE_PLANNER_SERVICE_CORE_PLANNERS_PLANNER_H_

#include <atomic>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "absl/time/clock.h"
#include "absl/time/time.h"
#include "planner_service/core/cost/cost_model.h"
#include "planner_service/core/model/plan.h"

namespace arachne {

// Time source, injected so deadline tests are deterministic.
class Clock {
 public:
  virtual ~Clock() = default;
  virtual absl::Time Now() const = 0;
};
class RealClock : public Clock {
 public:
  absl::Time Now() const override { return absl::Now(); }
};
const Clock& DefaultClock();

// What a planner optimises. Every planner ranks the plans it prices through
// SearchTracker, so the objective changes the choice of all of them alike.
enum class PlannerObjective {
  // Highest throughput (shortest iteration); the default.
  kThroughput,
  // Lowest dollars per token: Prediction::usd_per_hour (the price of the
  // GPUs the plan uses; GPUs it leaves idle are not billed) divided by
  // tokens_per_s * 3600. Ties go to the higher throughput. Every GPU type of
  // the cluster needs a price (GpuType::usd_per_hour > 0).
  kUsdPerToken,
};

// "throughput" or "usd_per_token" (the names the CLI and docs use).
absl::string_view PlannerObjectiveName(PlannerObjective objective);
// The objective named `name` (as PlannerObjectiveName spells it); InvalidArgument
// naming the value and the accepted names otherwise.
absl::StatusOr<PlannerObjective> ParsePlannerObjective(absl::string_view name);

struct PlannerOptions {
  // Wall-clock budget; the planner returns its best plan when it runs out.
  absl::Duration budget = absl::Seconds(600);
  // Stop after this many plan evaluations (0: no limit). Deterministic,
  // unlike the budget. Checked between candidates: the candidate being
  // priced when the limit is reached finishes (auto-fill prices several
  // micro-batch sizes and splits per template), so a run may end a few
  // evaluations past the limit.
  int64_t max_evaluations = 0;
  // Largest pipeline depth a template may have (Dmax); capped by layers.
  int max_depth = 16;
  // Most templates in a plan.
  int max_templates = 3;
  // What "best plan" means (see PlannerObjective).
  PlannerObjective objective = PlannerObjective::kThroughput;
  uint64_t seed = 1;
  // Learned planner only: sampled rollouts after the greedy one; -1 takes
  // its default (LearnedPlannerConfig::sampled_rollouts).
  int policy_rollouts = -1;
  const Clock* clock = nullptr;  // nullptr: real time
  // Set by another thread (a cancelled RPC) to stop the search; the planner
  // then returns its best plan so far like on an exhausted budget. May be
  // null; must outlive the run.
  const std::atomic<bool>* cancelled = nullptr;
};

// One improvement of a planner's best plan under its objective: after
// `evaluations` plans priced (and `wall_s` seconds) the best plan so far runs
// at `throughput` and costs `usd_per_token`. Under the usd_per_token
// objective the curve falls in $/token while throughput may go either way.
struct ProgressPoint {
  int64_t evaluations = 0;
  double wall_s = 0;
  double throughput_iters_per_s = 0;
  // Price of the GPUs the plan uses per token trained; 0 when a GPU type it
  // uses has no price (possible only under the throughput objective).
  double usd_per_token = 0;
};

struct PlannerStats {
  int64_t evaluations = 0;  // plans priced by the cost model
  int64_t templates_tried = 0;
  bool exhaustive = false;  // the whole space was searched
  bool cancelled = false;   // stopped by PlannerOptions::cancelled
  double wall_s = 0;
  // Every improvement of the best plan, in order (Figure 11's curves).
  std::vector<ProgressPoint> progress;
};

struct PlanResult {
  std::string planner;
  Plan plan;
  Prediction prediction;
  PlannerStats stats;
};

class Planner {
 public:
  virtual ~Planner() = default;
  virtual std::string name() const = 0;
  // Best plan found for the cost model's model and cluster. The plan passes
  // ValidatePlan. FailedPrecondition saying why when no plan fits.
  virtual absl::StatusOr<PlanResult> Run(const CostModel& cost_model,
                                         const PlannerOptions& options) = 0;
};

}  // namespace arachne

#endif  // ARACHNE_PLANNER_SERVICE_CORE_PLANNERS_PLANNER_H_
