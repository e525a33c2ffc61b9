// Plan validation: the checks every plan must pass before it is returned by
// a planner or priced for a user (`arachne evaluate`). The error names the
// template, stage or replica and the value that breaks the rule.
#ifndef ARACHNE_PLANNER_SERVICE_CORE_COST_PLAN_VALIDATION_H_
#define ARACHNE_PLANNER_SERVICE_CORE_COST_PLAN_VALIDATION_H_

#include <string>

#include "absl/status/status.h"
#include "planner_service/core/cost/cost_model.h"
#include "planner_service/core/model/plan.h"

namespace arachne {

// Checks, in order: structure (depths, replicas, micro-batch sizes, TP
// degrees as powers of two within the largest node of the type), layers (each
// pipeline covers [0, num_layers) exactly once, in order), expert tiling
// (ep*etp*edp = GPUs of the stage, ep divides the experts, ETP groups inside
// a node; 1x1x1 on dense stages), placement (every GPU exists, has the
// stage's type and is used at most once; TP groups inside one node), the
// batch (micro-batches add up to the global batch) and finally memory and
// profile coverage through the cost model. InvalidArgument for a malformed
// plan, FailedPrecondition for one that is well formed but does not fit.
absl::Status ValidatePlan(const Plan& plan, const CostModel& cost_model);

// Why no plan can fit, for error messages: the memory one layer needs per
// GPU at the largest TP degree and micro-batch 1 on each GPU type, against
// what the type offers.
std::string ExplainNoFit(const CostModel& cost_model);

// False when on every GPU type of the cluster even one layer at the largest
// TP degree and micro-batch 1 exceeds the usable memory (or has no
// profile): then no plan can fit, however long a search runs.
bool SomeLayerFits(const CostModel& cost_model);

}  // namespace arachne

#endif  // ARACHNE_PLANNER_SERVICE_CORE_COST_PLAN_VALIDATION_H_
