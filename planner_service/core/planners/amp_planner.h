// AMP (Li et al., NeurIPS 2022) as the paper's §3.1 describes it: enumerate
// the TP degree, the DP degree and the micro-batch size (pipeline depth =
// GPUs / (TP x DP)); partition layers into stages by dynamic
// programming on per-layer costs averaged across the cluster's GPU types
// (blind to which type a stage lands on); then assign stages to GPUs in
// device order, stage s taking the s-th block of TP x DP GPUs. Stage-to-GPU
// assignment tries every order of the GPU types. A stage has one GPU type
// here, so a block cannot span two types: GPUs of a type that do not fill a
// whole block stay idle (AMP proper would run a mixed block at its slowest
// GPU's speed).
#ifndef ARACHNE_PLANNER_SERVICE_CORE_PLANNERS_AMP_PLANNER_H_
#define ARACHNE_PLANNER_SERVICE_CORE_PLANNERS_AMP_PLANNER_H_

#include <string>
#include <vector>

#include "planner_service/core/planners/planner.h"

namespace arachne {

class AmpPlanner : public Planner {
 public:
  std::string name() const override { return "amp"; }
  absl::StatusOr<PlanResult> Run(const CostModel& cost_model,
                                 const PlannerOptions& options) override;

  // AMP's layer partition: `depth` contiguous stages minimising the slowest
  // stage, where layer i costs layer_cost[i] and the first and last stage
  // add first_extra and last_extra. Exposed for tests.
  static std::vector<int> PartitionLayers(const std::vector<double>& layer_cost,
                                          double first_extra,
                                          double last_extra, int depth);
};

}  // namespace arachne

#endif  // ARACHNE_PLANNER_SERVICE_CORE_PLANNERS_AMP_PLANNER_H_
