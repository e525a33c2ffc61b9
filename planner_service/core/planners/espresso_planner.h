// Espresso (Zhou et al., INFOCOM 2025) as the paper's §3.1 describes it: no
// TP search, TP = 1 on every stage; the stage-to-GPU mapping (which GPU type
// each pipeline stage runs on) found by a bounded tree search, one stage per
// level, pruning a subtree when even its best completion cannot beat the
// incumbent; layers placed greedily (each next layer to the stage whose time
// grows least, within memory); as many data-parallel replicas of the
// pipeline as the GPUs hold.
#ifndef ARACHNE_PLANNER_SERVICE_CORE_PLANNERS_ESPRESSO_PLANNER_H_
#define ARACHNE_PLANNER_SERVICE_CORE_PLANNERS_ESPRESSO_PLANNER_H_

#include <string>

#include "planner_service/core/planners/planner.h"

namespace arachne {

class EspressoPlanner : public Planner {
 public:
  std::string name() const override { return "espresso"; }
  absl::StatusOr<PlanResult> Run(const CostModel& cost_model,
                                 const PlannerOptions& options) override;
};

}  // namespace arachne

#endif  // ARACHNE_PLANNER_SERVICE_CORE_PLANNERS_ESPRESSO_PLANNER_H_
