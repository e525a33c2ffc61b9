// Metis (Um et al., USENIX ATC 2024) as the paper's §3.1 describes it: the
// outer loop searches stage-to-GPU mappings together with the micro-batch
// size; each stage is a power-of-two device group of one GPU type; inside a
// multi-GPU stage it prefers data parallelism over TP (TP grows from 1 only
// when a stage does not fit in memory); layers are allocated by a one-shot
// balancing heuristic (proportional to each stage's speed, one pass, no
// search). One pipeline template, its device groups = replicas x TP.
// Enumerating device-group mappings is what exhausts its budget on large
// clusters.
#ifndef ARACHNE_PLANNER_SERVICE_CORE_PLANNERS_METIS_PLANNER_H_
#define ARACHNE_PLANNER_SERVICE_CORE_PLANNERS_METIS_PLANNER_H_

#include <string>

#include "planner_service/core/planners/planner.h"

namespace arachne {

class MetisPlanner : public Planner {
 public:
  std::string name() const override { return "metis"; }
  absl::StatusOr<PlanResult> Run(const CostModel& cost_model,
                                 const PlannerOptions& options) override;
};

}  // namespace arachne

#endif  // ARACHNE_PLANNER_SERVICE_CORE_PLANNERS_METIS_PLANNER_H_
