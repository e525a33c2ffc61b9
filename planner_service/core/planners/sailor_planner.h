// Sailor (Strati et al., SOSP 2025) as the paper's §3.1 describes it:
// enumerate the pipeline depth and the micro-batch size, not the TP degree;
// split the layers evenly over the stages; for each GPU type compute one TP
// degree per stage, the larger of the smallest that fits the stage in
// memory and the one its speed-up rule picks (keep doubling while doubling
// still speeds the stage up by at least kTpSpeedupThreshold). Data-parallel
// replicas may use different GPU types: the search enumerates how many
// replicas of each type's pipeline to run (which is what makes its time
// grow with the number of types) and packs the GPUs left over into mixed-
// type replicas.
#ifndef ARACHNE_PLANNER_SERVICE_CORE_PLANNERS_SAILOR_PLANNER_H_
#define ARACHNE_PLANNER_SERVICE_CORE_PLANNERS_SAILOR_PLANNER_H_

#include <string>

#include "planner_service/core/planners/planner.h"

namespace arachne {

class SailorPlanner : public Planner {
 public:
  // Doubling the TP degree must make a stage at least this much faster.
  static constexpr double kTpSpeedupThreshold = 1.5;

  std::string name() const override { return "sailor"; }
  absl::StatusOr<PlanResult> Run(const CostModel& cost_model,
                                 const PlannerOptions& options) override;

  // Sailor's TP degree for stage `stage` of a `depth`-stage pipeline with
  // layers split evenly, on `gpu_type` (0 when no degree up to `max_tp`
  // fits). Exposed for tests.
  static int TpDegree(const CostModel& cost_model, int gpu_type, int stage,
                      int depth, int mbs, int max_tp);
};

}  // namespace arachne

#endif  // ARACHNE_PLANNER_SERVICE_CORE_PLANNERS_SAILOR_PLANNER_H_
