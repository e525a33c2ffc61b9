#include "planner_service/core/planning_options.h"

#include <cmath>
#include <filesystem>
#include <system_error>

#include "absl/strings/ascii.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/strip.h"
#include "planner_service/core/planners/planner.h"
#include "planner_service/core/planners.h"

namespace arachne {
namespace {

absl::Status OutOfRange(absl::string_view name, absl::string_view rule,
                        bool zero_is_default, const auto& value) {
  return absl::InvalidArgumentError(absl::StrCat(
      name, ": must be ", rule,
      zero_is_default ? " (or 0 for the default)" : "", ", got ", value));
}

}  // namespace

absl::Status ValidatePlanningOptions(const PlanningOptionsInput& o,
                                     const PlanningOptionNames& names) {
  // "": the default planner (ChooseDefaultPlanner), learned or
  // template-search, chosen once the model is known.
  const std::string planner = absl::AsciiStrToLower(o.planner);
  // MakePlanner quotes the name as given, so it is passed unchanged.
  if (absl::StatusOr<std::unique_ptr<Planner>> made =
          o.planner.empty() ? absl::StatusOr<std::unique_ptr<Planner>>(nullptr)
                            : MakePlanner(o.planner);
      !made.ok()) {
    // MakePlanner's message starts with "planner: "; the caller's name
    // replaces it.
    absl::string_view message = made.status().message();
    absl::ConsumePrefix(&message, "planner: ");
    return absl::InvalidArgumentError(
        absl::StrCat(names.planner, ": ", message));
  }
  const bool zero_ok = names.zero_is_default;
  // NaN fails every comparison, so the test is written to let it fail.
  const bool budget_ok = (zero_ok && o.budget_s == 0) ||
                         (o.budget_s > 0 && o.budget_s <= kMaxBudgetSeconds);
  if (!budget_ok) {
    return OutOfRange(names.budget_s,
                      absl::StrCat("seconds in (0, ", kMaxBudgetSeconds, "]"),
                      zero_ok, o.budget_s);
  }
  if (o.max_evaluations < 0) {
    return absl::InvalidArgumentError(
        absl::StrCat(names.max_evaluations,
                     ": must be >= 0 (0: no limit), got ", o.max_evaluations));
  }
  if (!((zero_ok && o.max_depth == 0) ||
        (o.max_depth >= 1 && o.max_depth <= kMaxDepthOption))) {
    return OutOfRange(names.max_depth, absl::StrCat("in 1..", kMaxDepthOption),
                      zero_ok, o.max_depth);
  }
  if (!((zero_ok && o.max_templates == 0) ||
        (o.max_templates >= 1 && o.max_templates <= kMaxTemplatesOption))) {
    return OutOfRange(names.max_templates,
                      absl::StrCat("in 1..", kMaxTemplatesOption), zero_ok,
                      o.max_templates);
  }
  if (o.objective != static_cast<int64_t>(PlannerObjective::kThroughput) &&
      o.objective != static_cast<int64_t>(PlannerObjective::kUsdPerToken)) {
    return absl::InvalidArgumentError(absl::StrCat(
        names.objective, ": must be THROUGHPUT (",
        static_cast<int>(PlannerObjective::kThroughput), ") or USD_PER_TOKEN (",
        static_cast<int>(PlannerObjective::kUsdPerToken), "), got ",
        o.objective));
  }
  if (o.policy_rollouts.has_value()) {
    const int64_t n = *o.policy_rollouts;
    if (n < 0 || n > kMaxPolicyRollouts) {
      return absl::InvalidArgumentError(
          absl::StrCat(names.policy_rollouts, ": must be in 0..",
                       kMaxPolicyRollouts, ", got ", n));
    }
    // The default planner is the learned planner's search either way.
    if (!planner.empty() && planner != "learned") {
      return absl::InvalidArgumentError(absl::StrCat(
          names.policy_rollouts, ": only for planner \"learned\", not \"",
          planner, "\""));
    }
  }
  return absl::OkStatus();
}

absl::Status CheckProfilesDir(const std::string& dir, absl::string_view field) {
  if (dir.empty()) return absl::OkStatus();
  std::error_code ec;
  const std::filesystem::file_status status = std::filesystem::status(dir, ec);
  if (!std::filesystem::exists(status)) {
    return absl::NotFoundError(
        absl::StrCat(field, ": \"", dir,
                     "\" does not exist (give a directory laid out "
                     "like profiles/, or leave it out for the built-in data)"));
  }
  if (!std::filesystem::is_directory(status)) {
    return absl::InvalidArgumentError(
        absl::StrCat(field, ": \"", dir, "\" is not a directory"));
  }
  return absl::OkStatus();
}

}  // namespace arachne
