// Plan validation: the checks every plan must pass before it is returned by
// a planner or priced for a user (`arachne evaluate`). The error names the
// template, stage or replica and the value that breaks the rule.
#ifndef ARACHNE_PLANNER_SERVICE_CORE_PLAN_VALIDATION_H_
#define ARACHNE_PLANNER_SERVICE_CORE_PLAN_VALIDATION_H_

#include "absl/status/status.h"
#include "planner_service/core/cost_model.h"
#include "planner_service/core/plan.h"

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

}  // namespace arachne

#endif  // ARACHNE_PLANNER_SERVICE_CORE_PLAN_VALIDATION_H_
