#include "planner_service/core/planners/random_planner.h"

#include <algorithm>
#include <random>

#include "absl/random/distributions.h"
#include "planner_service/core/planners/auto_fill.h"
#include "planner_service/core/planners/exact_planner.h"
#include "planner_service/core/planners/search_tracker.h"

namespace arachne {
namespace {

// A structure of `depth` stages drawn uniformly from `choices`; empty when
// a draw asks for more GPUs of a type than `pool` has free (rejected, as a
// uniform draw over the space must be).
std::vector<StageChoice> DrawStructure(const std::vector<StageChoice>& choices,
                                       int depth, const NodePool& pool,
                                       int num_types, std::mt19937_64& rng) {
  std::vector<StageChoice> s;
  std::vector<int> used(num_types, 0);
  for (int i = 0; i < depth; ++i) {
    const StageChoice& c =
        choices[absl::Uniform<size_t>(rng, 0, choices.size())];
    used[c.gpu_type] += c.tp;
    if (used[c.gpu_type] > pool.FreeOfType(c.gpu_type)) return {};
    s.push_back(c);
  }
  return s;
}

}  // namespace

absl::StatusOr<PlanResult> RandomPlanner::Run(const CostModel& cm,
                                              const PlannerOptions& options) {
  SearchTracker tracker(cm, options);
  const AutoFill fill(cm);
  const std::vector<StageChoice> choices = ExactPlanner::StageOptions(cm);
  const int max_depth = std::min(options.max_depth, cm.model().num_layers);
  const int max_templates = std::max(options.max_templates, 1);
  // A standard engine, not absl::BitGen: BitGen salts every seed with
  // per-process OS entropy, so a seeded BitGen draws a different sequence in
  // each run. A run must be reproducible from its --seed.
  std::mt19937_64 rng(options.seed);
  if (choices.empty()) return tracker.Finish(name(), /*exhaustive=*/false);
  while (!tracker.OutOfBudget()) {
    const int templates = absl::Uniform<int>(absl::IntervalClosed, rng, 1,
                                             max_templates);
    Plan plan;
    NodePool pool(cm.cluster());
    double time = kInfeasible;
    for (int k = 0; k < templates && pool.TotalFree() > 0; ++k) {
      const int depth =
          absl::Uniform<int>(absl::IntervalClosed, rng, 1, max_depth);
      const std::vector<StageChoice> s = DrawStructure(
          choices, depth, pool, cm.catalog().size(), rng);
      if (s.empty()) {
        // Rejected draws still cost a (trivial) evaluation so a cluster
        // where nothing fits cannot spin forever on an evaluation budget.
        ++*tracker.evaluation_counter();
        break;
      }
      // Under usd_per_token the exact planner also fills each template with
      // fewer replicas (AutoFill::ReplicaCaps); drawing the cap from the same
      // list keeps this a uniform draw over its space. Under throughput no
      // draw is made, so its sequence of plans is unchanged.
      int cap = 0;
      if (options.objective == PlannerObjective::kUsdPerToken) {
        const std::vector<int> caps = AutoFill::ReplicaCaps(pool, s);
        cap = caps[absl::Uniform<size_t>(rng, 0, caps.size())];
      }
      tracker.CountTemplate();
      absl::StatusOr<FillResult> r =
          fill.Extend(plan, pool, s, tracker.evaluation_counter(), cap);
      if (!r.ok()) {
        tracker.NoteFailure(std::string(r.status().message()));
        break;
      }
      plan = std::move(r->plan);
      pool = std::move(r->pool);
      time = r->iteration_time_s;
    }
    if (!plan.templates.empty()) tracker.Offer(plan, time);
  }
  return tracker.Finish(name(), /*exhaustive=*/false);
}

std::vector<PlanSample> SamplePlanStructures(const CostModel& cm, int count,
                                             uint64_t seed, int max_depth) {
  const AutoFill fill(cm);
  const std::vector<StageChoice> choices = ExactPlanner::StageOptions(cm);
  const int depth_limit = std::min(max_depth, cm.model().num_layers);
  std::mt19937_64 rng(seed);
  const NodePool pool(cm.cluster());
  std::vector<PlanSample> out;
  if (choices.empty()) return out;
  for (int i = 0; i < count; ++i) {
    const int depth =
        absl::Uniform<int>(absl::IntervalClosed, rng, 1, depth_limit);
    const std::vector<StageChoice> s =
        DrawStructure(choices, depth, pool, cm.catalog().size(), rng);
    if (s.empty()) continue;
    absl::StatusOr<FillResult> r = fill.Extend(Plan{}, pool, s);
    if (!r.ok()) continue;
    out.push_back(PlanSample{depth, 1, 1.0 / r->iteration_time_s});
  }
  return out;
}

}  // namespace arachne
