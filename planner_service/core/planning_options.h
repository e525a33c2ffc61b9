// The options of one planning request as a caller gives them, checked by
// one function for every caller: the `arachne plan` flags and the
// service's PlannerOptions message (through the handler) must accept and
// reject the same values, each error naming the caller's own spelling of
// the field (`--max-depth`, `options.max_depth`) and the value. Also the
// other inputs both take alike: the profiles directory.
#ifndef ARACHNE_PLANNER_SERVICE_CORE_PLANNING_OPTIONS_H_
#define ARACHNE_PLANNER_SERVICE_CORE_PLANNING_OPTIONS_H_

#include <cstdint>
#include <optional>
#include <string>

#include "absl/status/status.h"
#include "absl/strings/string_view.h"

namespace arachne {

// Bounds on what one request may ask, so that no request can make a planner
// allocate or search without limit.
inline constexpr int kMaxDepthOption = 64;      // max_depth: 1..64
inline constexpr int kMaxTemplatesOption = 16;  // max_templates: 1..16
// Each rollout is one plan built and priced; the budget bounds the time,
// this the request's size.
inline constexpr int kMaxPolicyRollouts = 1 << 20;
// The largest search budget anyone may ask for (a day); the service caps
// budgets further (--max-budget-s).
inline constexpr double kMaxBudgetSeconds = 86400;

// The options as given, before defaults are filled in.
struct PlanningOptionsInput {
  std::string planner;  // "" = the default (planners.h, ChooseDefaultPlanner)
  double budget_s = 0;
  int64_t max_evaluations = 0;  // 0 = no limit
  int64_t max_depth = 0;
  int64_t max_templates = 0;
  // The raw enum value, so a value no PlannerObjective names is caught.
  int64_t objective = 0;
  std::optional<int64_t> policy_rollouts;  // absent = the planner's default
};

// How the caller's user spells each option, and whether 0 means "the
// default" (the service: proto3 numbers have no presence) or is a value to
// check (the CLI, whose flags show their defaults).
struct PlanningOptionNames {
  absl::string_view planner, budget_s, max_evaluations, max_depth,
      max_templates, objective, policy_rollouts;
  bool zero_is_default = false;
};

inline constexpr PlanningOptionNames kCliOptionNames = {
    "--planner",       "--budget",    "--max-evaluations", "--max-depth",
    "--max-templates", "--objective", "--rollouts",        false};
inline constexpr PlanningOptionNames kRequestOptionNames = {
    "options.planner",         "options.budget_s",
    "options.max_evaluations", "options.max_depth",
    "options.max_templates",   "options.objective",
    "options.policy_rollouts", true};

// OK when every option is in range: a known planner; budget_s finite and in
// (0, kMaxBudgetSeconds]; max_evaluations >= 0; max_depth 1..64;
// max_templates 1..16; objective a PlannerObjective; policy_rollouts
// 0..kMaxPolicyRollouts and only for the learned planner or the default
// one (""). With
// names.zero_is_default, 0 is also accepted for budget_s, max_depth and
// max_templates. InvalidArgument "<name>: must be ..., got <value>"
// otherwise.
absl::Status ValidatePlanningOptions(const PlanningOptionsInput& options,
                                     const PlanningOptionNames& names);

// OK for "" (the data built into the binary) or a directory that exists.
// NotFound "<field>: \"<dir>\" does not exist" / InvalidArgument "... is
// not a directory": a mistyped directory must never fall back to the
// built-in data unnoticed.
absl::Status CheckProfilesDir(const std::string& dir, absl::string_view field);

}  // namespace arachne

#endif  // ARACHNE_PLANNER_SERVICE_CORE_PLANNING_OPTIONS_H_
