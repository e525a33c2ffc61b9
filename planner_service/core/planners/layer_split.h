// Splitting a model's layers over the stages of a template: the per-stage
// costs the split rules need, the memory cap of each stage, and the split
// rules themselves (balanced by speed, even, greedy). Shared by auto-fill and
// the baseline planners, which differ in which rule they apply.
#ifndef ARACHNE_PLANNER_SERVICE_CORE_PLANNERS_LAYER_SPLIT_H_
#define ARACHNE_PLANNER_SERVICE_CORE_PLANNERS_LAYER_SPLIT_H_

#include <vector>

#include "planner_service/core/cost/cost_model.h"
#include "planner_service/core/model/plan.h"

namespace arachne {

// Per stage of a template at its micro-batch size: the time of one
// transformer block (compute + TP communication, experts at the stage's
// ETP) and the fixed extra time (embedding on the first stage, LM head on
// the last).
struct StageCosts {
  std::vector<double> per_layer_s;
  std::vector<double> fixed_s;
};
StageCosts StageCostsOf(const CostModel& cost_model, const Template& t);

// Most layers each stage of template `t` of `plan` can hold in memory
// (0..num_layers). Stage memory is linear in its layer count, so two probes
// give the cap; probed with the deepest in-flight count and MoE layers where
// the model has them (the larger case).
std::vector<int> LayerCaps(const CostModel& cost_model, const Plan& plan,
                           int t);

// Layers per stage so every stage takes about the same time
// (n[s] * per_layer[s] + fixed[s] equal), each stage holding 1..cap[s]
// layers. Empty when the caps cannot hold the model.
std::vector<int> BalancedSplit(int layers, const std::vector<double>& per_layer,
                               const std::vector<double>& fixed,
                               const std::vector<int>& cap);

// layers / depth per stage, the first layers % depth stages one more.
std::vector<int> EvenSplit(int layers, int depth);

// One layer per stage, then each further layer to the stage whose time
// grows least, within its cap (Espresso's greedy placement). Empty when the
// caps cannot hold the model.
std::vector<int> GreedySplit(int layers, const std::vector<double>& per_layer,
                             const std::vector<double>& fixed,
                             const std::vector<int>& cap);

// Sets the stages' layer ranges from per-stage counts (contiguous, in order).
void ApplySplit(Template& t, const std::vector<int>& split);

}  // namespace arachne

#endif  // ARACHNE_PLANNER_SERVICE_CORE_PLANNERS_LAYER_SPLIT_H_
