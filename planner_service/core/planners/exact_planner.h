// Exhaustive search of the template space: every sequence of templates
// (depth 1..Dmax, a GPU type and TP degree per stage) completed by auto-fill.
// Exact on small clusters; on large ones it searches the most regular
// structures first (uniform, then one contiguous run per GPU type, then all)
// and returns the best plan found when the budget runs out. It is the ground
// truth the other planners are measured against.
#ifndef ARACHNE_PLANNER_SERVICE_CORE_PLANNERS_EXACT_PLANNER_H_
#define ARACHNE_PLANNER_SERVICE_CORE_PLANNERS_EXACT_PLANNER_H_

#include <string>
#include <vector>

#include "planner_service/core/planners/auto_fill.h"
#include "planner_service/core/planners/planner.h"

namespace arachne {

class ExactPlanner : public Planner {
 public:
  std::string name() const override { return "exact"; }
  absl::StatusOr<PlanResult> Run(const CostModel& cost_model,
                                 const PlannerOptions& options) override;

  // The (type, TP) choices a stage may take on `cost_model`'s cluster: TP
  // degrees are powers of two up to the type's largest node (and
  // CostParams::max_tp) with a profile at micro-batch 1.
  static std::vector<StageChoice> StageOptions(const CostModel& cost_model);
};

}  // namespace arachne

#endif  // ARACHNE_PLANNER_SERVICE_CORE_PLANNERS_EXACT_PLANNER_H_
