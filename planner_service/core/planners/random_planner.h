// Random search (the paper's `random` baseline of Figures 4 and 11): draws
// plan structures uniformly from the template space the exact planner
// searches (depth 1..Dmax, a (GPU type, TP) choice per stage, up to
// max_templates templates) and completes each with auto-fill, for a number
// of evaluations or a time budget.
#ifndef ARACHNE_PLANNER_SERVICE_CORE_PLANNERS_RANDOM_PLANNER_H_
#define ARACHNE_PLANNER_SERVICE_CORE_PLANNERS_RANDOM_PLANNER_H_

#include <cstdint>
#include <string>
#include <vector>

#include "planner_service/core/planners/planner.h"

namespace arachne {

class RandomPlanner : public Planner {
 public:
  std::string name() const override { return "random"; }
  absl::StatusOr<PlanResult> Run(const CostModel& cost_model,
                                 const PlannerOptions& options) override;
};

// One feasible plan drawn at random, for the Figure 4 scatter.
struct PlanSample {
  int max_depth = 0;  // deepest template of the plan
  int templates = 0;
  double throughput_iters_per_s = 0;
};

// Draws `count` structures (single templates of depth 1..Dmax, as Figure 4
// samples pipeline structures) with `seed` and returns the feasible ones
// priced. Deterministic for a seed.
std::vector<PlanSample> SamplePlanStructures(const CostModel& cost_model,
                                             int count, uint64_t seed,
                                             int max_depth = 16);

}  // namespace arachne

#endif  // ARACHNE_PLANNER_SERVICE_CORE_PLANNERS_RANDOM_PLANNER_H_
