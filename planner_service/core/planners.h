// Planner registry: the planners `arachne plan --planner` and the service
// can run, by name.
#ifndef ARACHNE_PLANNER_SERVICE_CORE_PLANNERS_H_
#define ARACHNE_PLANNER_SERVICE_CORE_PLANNERS_H_

#include <memory>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "planner_service/core/planner.h"

namespace arachne {

// The planners MakePlanner builds that can run in this process, in display
// order (what `arachne bench` runs by default): the search-based ones, then
// "learned" (learned_planner.h) when a policy factory is registered.
// MakePlanner builds "learned" either way; without a factory it fails with
// FailedPrecondition when run.
std::vector<std::string> PlannerNames();
// InvalidArgument naming the value and the known planners when unknown.
absl::StatusOr<std::unique_ptr<Planner>> MakePlanner(absl::string_view name);

// Why no plan can fit, for error messages: the memory one layer needs per
// GPU at the largest TP degree and micro-batch 1 on each GPU type, against
// what the type offers.
std::string ExplainNoFit(const CostModel& cost_model);

}  // namespace arachne

#endif  // ARACHNE_PLANNER_SERVICE_CORE_PLANNERS_H_
