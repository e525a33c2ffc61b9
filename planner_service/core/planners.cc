#include "planner_service/core/planners.h"

#include <memory>
#include <utility>

#include "absl/strings/ascii.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "planner_service/core/amp_planner.h"
#include "planner_service/core/espresso_planner.h"
#include "planner_service/core/exact_planner.h"
#include "planner_service/core/hexiscale_planner.h"
#include "planner_service/core/learned_planner.h"
#include "planner_service/core/metis_planner.h"
#include "planner_service/core/random_planner.h"
#include "planner_service/core/sailor_planner.h"

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
  if (types > kEnvTypeSlots) {
    // The policies never saw the grouped view of more types than type
    // slots; on bench/many-types the uniform search did better (geomean
    // 1.050 of the best baseline against the policy's 1.018: docs/
    // planners.md).
    return fallback(kLearnedFallbackPlanner,
                    absl::StrCat("the cluster has ", types,
                                 " GPU types; no learned policy was trained "
                                 "on more than ",
                                 kEnvTypeSlots));
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

namespace {

// The least memory one stage can need on `type`: a middle stage of one layer
// (MoE where the model has them) at `tp`, one micro-batch in flight.
StageMemory LeastStageMemory(const CostModel& cm, int type, int tp) {
  const ModelSpec& model = cm.model();
  Plan plan;
  Template t;
  for (int s = 0; s < 3; ++s) {
    Stage st;
    st.gpu_type = type;
    st.tp = tp;
    t.stages.push_back(st);
  }
  const int L = model.num_layers;
  t.stages[0].layer_end = L - 2;
  t.stages[1].layer_begin = L - 2;
  t.stages[1].layer_end = L - 1;
  t.stages[2].layer_begin = L - 1;
  t.stages[2].layer_end = L;
  if (model.is_moe()) {
    int ep = tp;
    while (model.moe.num_experts % ep != 0) ep /= 2;
    t.stages[1].tiling = ExpertTiling{ep, 1, tp / ep};
  }
  t.replicas = 1;
  t.total_micro_batches = 1;
  plan.templates.push_back(t);
  return cm.StageMemoryOf(plan, 0, 1);
}

// The largest TP degree `type` supports at micro-batch 1; 0 for none.
int LargestTp(const CostModel& cm, int type) {
  int tp = 0;
  for (int t = 1; t <= cm.cluster().MaxNodeSizeOfType(type); t *= 2)
    if (cm.Supports(type, t, 1)) tp = t;
  return tp;
}

}  // namespace

bool SomeLayerFits(const CostModel& cm) {
  // Too few layers for the three-stage probe: assume it may fit.
  if (cm.model().num_layers < 3) return true;
  for (int type : cm.cluster().types_present()) {
    const int tp = LargestTp(cm, type);
    if (tp == 0) continue;
    if (LeastStageMemory(cm, type, tp).total_gib() <= cm.UsableMemoryGib(type))
      return true;
  }
  return false;
}

std::string ExplainNoFit(const CostModel& cm) {
  const ModelSpec& model = cm.model();
  if (model.num_layers < 3) return "";
  std::vector<std::string> parts;
  for (int type : cm.cluster().types_present()) {
    const int tp = LargestTp(cm, type);
    if (tp == 0) {
      parts.push_back(absl::StrCat(cm.catalog().type(type).id,
                                   ": no profile entry at micro-batch 1"));
      continue;
    }
    const StageMemory m = LeastStageMemory(cm, type, tp);
    parts.push_back(absl::StrFormat(
        "%s: one layer needs %.1f GiB per GPU at tp=%d, micro-batch 1 "
        "(%.1f GiB usable)",
        cm.catalog().type(type).id, m.total_gib(), tp,
        cm.UsableMemoryGib(type)));
  }
  return absl::StrJoin(parts, "; ");
}

}  // namespace arachne
