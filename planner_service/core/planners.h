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
// Planners MakePlanner also builds that run only when named (`--planner`,
// `arachne bench --planners`): "template-search", the learned planner's
// search (rollouts, refinement, iterated local search) driven by a uniform
// policy instead of the trained one. It needs no LibTorch and no
// checkpoint; it is the ablation that measures what the trained policy
// adds (docs/planners.md).
std::vector<std::string> AblationPlannerNames();
// PlannerNames() then AblationPlannerNames(): every name MakePlanner takes
// here.
std::vector<std::string> KnownPlannerNames();
// InvalidArgument naming the value and the known planners when unknown.
absl::StatusOr<std::unique_ptr<Planner>> MakePlanner(absl::string_view name);

// Why no plan can fit, for error messages: the memory one layer needs per
// GPU at the largest TP degree and micro-batch 1 on each GPU type, against
// what the type offers.
std::string ExplainNoFit(const CostModel& cost_model);

// False when on every GPU type of the cluster even one layer at the largest
// TP degree and micro-batch 1 exceeds the usable memory (or has no
// profile): then no plan can fit, however long a search runs.
bool SomeLayerFits(const CostModel& cost_model);

}  // namespace arachne

#endif  // ARACHNE_PLANNER_SERVICE_CORE_PLANNERS_H_
