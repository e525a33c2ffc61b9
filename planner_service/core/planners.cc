#include "planner_service/core/planners.h"

#include <memory>
#include <utility>

#include "absl/strings/ascii.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "planner_service/core/planners/amp_planner.h"
#include "planner_service/core/planners/espresso_planner.h"
#include "planner_service/core/planners/exact_planner.h"
#include "planner_service/core/planners/hexiscale_planner.h"
#include "planner_service/core/learned/learned_planner.h"
#include "planner_service/core/planners/metis_planner.h"
#include "planner_service/core/planners/random_planner.h"
#include "planner_service/core/planners/sailor_planner.h"

namespace arachne {

std::vector<std::string> PlannerNames() {
  std::vector<std::string> names = {"exact", "amp",    "espresso", "hexiscale",
                                    "metis", "sailor", "random"};
  // Listed only where it can plan: a process that registered a policy
  // factory (binaries built with LibTorch do at start-up).
  if (HasLearnedPolicyFactory()) names.push_back("learned");
  return names;
}

std::vector<std::string> AblationPlannerNames() {
  return {kTemplateSearchPlannerName};
}

std::vector<std::string> KnownPlannerNames() {
  std::vector<std::string> known = PlannerNames();
  for (std::string& name : AblationPlannerNames())
    known.push_back(std::move(name));
  return known;
}

absl::StatusOr<std::unique_ptr<Planner>> MakePlanner(absl::string_view name) {
  const std::string lower = absl::AsciiStrToLower(name);
  if (lower == "exact") return std::make_unique<ExactPlanner>();
  if (lower == "amp") return std::make_unique<AmpPlanner>();
  if (lower == "espresso") return std::make_unique<EspressoPlanner>();
  if (lower == "hexiscale") return std::make_unique<HexiScalePlanner>();
  if (lower == "metis") return std::make_unique<MetisPlanner>();
  if (lower == "sailor") return std::make_unique<SailorPlanner>();
  if (lower == "random") return std::make_unique<RandomPlanner>();
  // Built even without a registered policy (then not in PlannerNames()): it
  // answers FailedPrecondition naming the fallback planner.
  if (lower == "learned") return std::make_unique<LearnedPlanner>();
  if (lower == kTemplateSearchPlannerName) {
    return std::make_unique<LearnedPlanner>(LearnedPlannerConfig{},
                                            UniformPolicyFactory(),
                                            kTemplateSearchPlannerName);
  }
  return absl::InvalidArgumentError(
      absl::StrCat("planner: unknown planner \"", name,
                   "\"; known: ", absl::StrJoin(KnownPlannerNames(), ", ")));
}

DefaultPlannerChoice ChooseDefaultPlanner(const CostModel& cost_model) {
  // A search planner in place of the learned one, and why, in one line.
  auto fallback = [](const char* name, std::string reason) {
    for (char& c : reason)
      if (c == '\n' || c == '\r') c = ' ';
    return DefaultPlannerChoice{*MakePlanner(name), name, std::move(reason)};
  };
  const int types =
      static_cast<int>(cost_model.cluster().types_present().size());
  if (types > kEnvDeviceSlots) {
    // Neither the policy nor template-search can act on this cluster (the
    // device head's slots); a baseline search takes any number of types.
    return fallback(
        kManyTypesFallbackPlanner,
        absl::StrCat("the cluster has ", types,
                     " GPU types; the learned planner and template-search "
                     "take at most ",
                     kEnvDeviceSlots));
  }
  absl::StatusOr<std::unique_ptr<PolicyModel>> policy =
      MakeLearnedPolicy(cost_model);
  if (!policy.ok()) {
    const std::string& model = cost_model.model().name;
    return fallback(
        kLearnedFallbackPlanner,
        absl::StrCat("no learned policy serves model \"", model, "\": ",
                     NoPolicyReason(model, policy.status().message())));
  }
  if (const int trained = (*policy)->MostGpuTypesTrainedOn();
      types > trained) {
    // More types than any training composition: the state groups them in
    // a way this policy never saw (docs/learned-policy.md, State), and on
    // bench/many-types the uniform search beat such a policy (docs/
    // planners.md, Clusters of many GPU types).
    return fallback(kLearnedFallbackPlanner,
                    absl::StrCat("the cluster has ", types,
                                 " GPU types; the learned policy for model \"",
                                 cost_model.model().name,
                                 "\" was trained on at most ", trained));
  }
  // The probe's policy serves the run on this cost model; a later run on
  // another (or a second run) asks the registered factory again.
  auto held =
      std::make_shared<std::unique_ptr<PolicyModel>>(*std::move(policy));
  const CostModel* probed = &cost_model;
  PolicyModelFactory factory = [held, probed](const CostModel& cm)
      -> absl::StatusOr<std::unique_ptr<PolicyModel>> {
    if (&cm == probed && *held != nullptr) return std::move(*held);
    return MakeLearnedPolicy(cm);
  };
  DefaultPlannerChoice choice;
  choice.planner =
      std::make_unique<LearnedPlanner>(LearnedPlannerConfig{}, factory);
  choice.name = "learned";
  return choice;
}

std::string DefaultPlannerLine(const std::string& name,
                               const std::string& fallback_reason) {
  if (fallback_reason.empty()) return absl::StrCat("planner: ", name);
  return absl::StrCat("planner: ", name, " (", fallback_reason, ")");
}

bool IsLatencyBudgeted(absl::string_view planner) {
  const std::string lower = absl::AsciiStrToLower(planner);
  return lower.empty() || lower == "learned" ||
         lower == kTemplateSearchPlannerName;
}

absl::Duration DefaultBudget(absl::string_view planner,
                             absl::Duration search_default) {
  return IsLatencyBudgeted(planner) ? LearnedPlannerConfig{}.latency_budget
                                    : search_default;
}

}  // namespace arachne
