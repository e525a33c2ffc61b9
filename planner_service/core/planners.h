// Planner registry: the planners `arachne plan --planner` and the service
// can run, by name.
#ifndef ARACHNE_PLANNER_SERVICE_CORE_PLANNERS_H_
#define ARACHNE_PLANNER_SERVICE_CORE_PLANNERS_H_

#include <memory>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "absl/time/time.h"
#include "planner_service/core/cost/cost_model.h"
#include "planner_service/core/planners/planner.h"

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

// The planner a request that names none runs (`arachne plan` without
// --planner, a Plan or Replan request with options.planner "", a controller
// job without planner.planner): "learned" when a learned policy serves the
// cost model's model (LearnedPolicyServes), else "template-search", the
// same search with a uniform policy, which is also the default on a
// cluster of more GPU types than the state's type slots (no policy was
// trained on those); on a cluster with more GPU types than either takes
// (kEnvDeviceSlots), kManyTypesFallbackPlanner.
inline constexpr char kManyTypesFallbackPlanner[] = "sailor";
struct DefaultPlannerChoice {
  // Runs the choice on this cost model; for "learned" it holds the policy
  // the probe made, so the checkpoint is resolved once.
  std::unique_ptr<Planner> planner;
  std::string name;
  // "" for "learned"; else one line: `no learned policy serves model "M":
  // <why>`, or `the cluster has N GPU types; ...`.
  std::string fallback_reason;
};
DefaultPlannerChoice ChooseDefaultPlanner(const CostModel& cost_model);

// What the output says of a run of the default planner, one line (no
// newline): "planner: learned", or "planner: template-search (<reason>)".
std::string DefaultPlannerLine(const std::string& name,
                               const std::string& fallback_reason);

// Whether `planner` is the learned planner's search: "learned",
// "template-search" or "" (the default planner, one of the two).
bool IsLatencyBudgeted(absl::string_view planner);
// The budget a run gets when the caller gives none. IsLatencyBudgeted
// planners: their latency budget, LearnedPlannerConfig::latency_budget
// (0.9 s), which the CLI and the service count from the start of the call
// (context and policy loading included), so that the whole call stays
// under a second; the search planners: `search_default` (the CLI's 60 s,
// the service's --default-budget-s).
absl::Duration DefaultBudget(absl::string_view planner,
                             absl::Duration search_default);


}  // namespace arachne

#endif  // ARACHNE_PLANNER_SERVICE_CORE_PLANNERS_H_
