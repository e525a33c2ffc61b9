#include "planner_service/core/learned/learned_planner.h"

#include <algorithm>
#include <array>
#include <optional>
#include <random>
#include <string>
#include <utility>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/container/flat_hash_map.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/strip.h"
#include "absl/synchronization/mutex.h"
#include "glog/logging.h"
#include "planner_service/core/learned/episode_moves.h"
#include "planner_service/core/planners/search_tracker.h"

namespace arachne {
namespace {

absl::Mutex factory_mu;
PolicyModelFactory& RegisteredFactory() ABSL_EXCLUSIVE_LOCKS_REQUIRED(
    factory_mu) {
  static auto* factory = new PolicyModelFactory();
  return *factory;
}

// The most actions a head has (the depth head: STOP and 1..16).
constexpr int kMaxActions = std::max(kEnvDepthActions, kEnvDeviceSlots);

// Greedy decisions remembered per run (keyed by the action prefix, ~200
// bytes each); the memo starts over when full.
constexpr size_t kGreedyMemoEntries = 1 << 16;
// Sampled rollouts whose best episodes are refined first, before the rest
// of LearnedPlannerConfig::sampled_rollouts are sampled (see Run).
constexpr int kFirstRoundRollouts = 16;
// Type-pure templates per GPU type the grown seed may append: its fastest
// few alone. With one (the fastest alone), the template a type adds best
// beside the others is often missed; 3 is the one value measured.
constexpr size_t kGrownSeedCandidates = 3;

// Index of the largest probability (the first on ties: deterministic).
int Greedy(absl::Span<const float> p) {
  return static_cast<int>(std::max_element(p.begin(), p.end()) - p.begin());
}

// An action drawn from `p` with a uniform double built from the generator's
// bits (the same draw on every platform, unlike std distributions); never a
// zero-probability action.
int Sample(absl::Span<const float> p, std::mt19937_64& rng) {
  const double u = static_cast<double>(rng() >> 11) * 0x1.0p-53;
  double total = 0;
  for (float x : p) total += x;
  double acc = 0;
  int last = -1;
  for (int a = 0; a < static_cast<int>(p.size()); ++a) {
    if (p[a] <= 0) continue;
    acc += p[a];
    last = a;
    if (u * total < acc) return a;
  }
  CHECK_GE(last, 0) << "policy gave no action a positive probability";
  return last;
}

// How an episode's free decisions are taken: the policy's most likely
// action, one drawn from the policy, or one drawn uniformly over the legal
// actions (an exploration rollout).
enum class Pick { kGreedy, kSample, kUniform };

// The action `policy` takes on `env` (not done) by `pick`; `probabilities`
// is scratch of at least the acting head's action count.
int PolicyAction(PolicyModel& policy, const ConstructionEnv& env, Pick pick,
                 std::mt19937_64& rng, absl::Span<float> probabilities) {
  absl::Span<const uint8_t> mask = env.LegalMask();
  const int actions = static_cast<int>(mask.size());
  absl::Span<float> p = probabilities.subspan(0, actions);
  policy.ActionProbabilities(env, p);
  // The contract says masked actions get 0; enforcing it here keeps a
  // faulty model from reaching Step's CHECK.
  float total = 0;
  for (int a = 0; a < actions; ++a) {
    if (!mask[a]) p[a] = 0;
    total += p[a];
  }
  if (pick == Pick::kUniform) total = 0;
  if (!(total > 0)) {  // degenerate output: uniform over legal actions
    for (int a = 0; a < actions; ++a) p[a] = mask[a];
  }
  return pick == Pick::kGreedy ? Greedy(p) : Sample(p, rng);
}

}  // namespace

void RegisterLearnedPolicyFactory(PolicyModelFactory factory) {
  absl::MutexLock lock(&factory_mu);
  RegisteredFactory() = std::move(factory);
}

void UniformPolicyModel::ActionProbabilities(const ConstructionEnv& env,
                                             absl::Span<float> probabilities) {
  absl::Span<const uint8_t> mask = env.LegalMask();
  float legal = 0;
  for (uint8_t m : mask) legal += m;
  for (size_t a = 0; a < probabilities.size(); ++a)
    probabilities[a] = mask[a] ? 1.0f / legal : 0.0f;
}

PolicyModelFactory UniformPolicyFactory() {
  return [](const CostModel&) -> absl::StatusOr<std::unique_ptr<PolicyModel>> {
    return std::unique_ptr<PolicyModel>(std::make_unique<UniformPolicyModel>());
  };
}

bool HasLearnedPolicyFactory() {
  absl::MutexLock lock(&factory_mu);
  return static_cast<bool>(RegisteredFactory());
}

namespace {

constexpr absl::string_view kNoPolicySuffix =
    " instead (docs/learned-policy.md, Inference)";

std::string NoPolicyPrefix(const std::string& model) {
  return absl::StrCat("learned planner: no policy for model \"", model, "\": ");
}

std::string NoPolicyTail() {
  return absl::StrCat("; plan with --planner ", kLearnedFallbackPlanner,
                      kNoPolicySuffix);
}

}  // namespace

std::string NoPolicyMessage(const std::string& model, const std::string& why) {
  return absl::StrCat(NoPolicyPrefix(model), why, NoPolicyTail());
}

std::string NoPolicyReason(const std::string& model,
                           absl::string_view message) {
  absl::string_view why = message;
  if (absl::ConsumePrefix(&why, NoPolicyPrefix(model)) &&
      absl::ConsumeSuffix(&why, NoPolicyTail())) {
    return std::string(why);
  }
  return std::string(message);
}

absl::StatusOr<std::unique_ptr<PolicyModel>> MakeLearnedPolicy(
    const CostModel& cm) {
  PolicyModelFactory factory;
  {
    absl::MutexLock lock(&factory_mu);
    factory = RegisteredFactory();
  }
  if (!factory) {
    return absl::FailedPreconditionError(
        NoPolicyMessage(cm.model().name, "this build has no LibTorch policy"));
  }
  absl::StatusOr<std::unique_ptr<PolicyModel>> policy = factory(cm);
  if (policy.ok() && *policy == nullptr) {
    return absl::InternalError(absl::StrCat(
        "learned planner: the policy factory returned no policy for model \"",
        cm.model().name, "\""));
  }
  return policy;
}

absl::Status LearnedPolicyServes(const CostModel& cm) {
  return MakeLearnedPolicy(cm).status();
}

absl::StatusOr<PlanResult> LearnedPlanner::Run(const CostModel& cm,
                                               const PlannerOptions& options) {
  if (config_.sampled_rollouts < 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("learned planner: sampled_rollouts must be >= 0, got ",
                     config_.sampled_rollouts));
  }
  for (const auto& [field, value] :
       {std::pair<const char*, int>{"refined_episodes",
                                    config_.refined_episodes},
        {"refinement_passes", config_.refinement_passes},
        {"exploration_interval", config_.exploration_interval},
        {"exploration_elites", config_.exploration_elites},
        {"foreign_exploration_interval", config_.foreign_exploration_interval},
        {"foreign_exploration_elites", config_.foreign_exploration_elites},
        {"perturbation_rounds", config_.perturbation_rounds}}) {
    if (value < 0) {
      return absl::InvalidArgumentError(absl::StrCat(
          "learned planner: ", field, " must be >= 0, got ", value));
    }
  }
  // Below 1 every kick slower than the best would go undescended; NaN none.
  if (!(config_.perturbation_cutoff >= 1.0)) {
    return absl::InvalidArgumentError(
        absl::StrCat("learned planner: perturbation_cutoff must be >= 1, got ",
                     config_.perturbation_cutoff));
  }
  PolicyModelFactory factory = factory_;
  if (!factory) {
    absl::MutexLock lock(&factory_mu);
    factory = RegisteredFactory();
  }
  if (!factory) {
    return absl::FailedPreconditionError(NoPolicyMessage(
        cm.model().name,
        "this build has no policy support (LibTorch was not found at "
        "configure time: -DARACHNE_WITH_TORCH=ON needs libtorch-dev)"));
  }
  absl::StatusOr<std::unique_ptr<PolicyModel>> policy = factory(cm);
  if (!policy.ok()) return policy.status();
  CHECK(*policy != nullptr);

  ConstructionEnvConfig env_config;
  env_config.max_depth = std::clamp(options.max_depth, 1, kEnvMaxDepth);
  env_config.max_templates = std::max(options.max_templates, 1);
  absl::StatusOr<ConstructionEnv> env = ConstructionEnv::Create(cm, env_config);
  if (!env.ok()) {
    return absl::Status(
        env.status().code(),
        // template-search shares the environment and its limits.
        absl::StrCat("learned planner: ", env.status().message(),
                     "; plan with --planner exact instead"));
  }

  const int sampled_rollouts = options.policy_rollouts >= 0
                                   ? options.policy_rollouts
                                   : config_.sampled_rollouts;
  PlannerOptions run_options = options;
  run_options.budget = std::min(options.budget, config_.latency_budget);
  SearchTracker tracker(cm, run_options);
  std::mt19937_64 rng(options.seed);
  std::array<float, kMaxActions> probabilities{};
  int64_t counted = env->evaluations();
  auto count_evaluations = [&] {
    *tracker.evaluation_counter() += env->evaluations() - counted;
    counted = env->evaluations();
  };
  // Plays one episode: the actions of `script` first, then the policy's
  // (`pick`); the actions taken end in `taken`. Returns whether its plan
  // became the best.
  std::vector<int> taken;
  absl::flat_hash_map<std::string, int> greedy_memo;  // action prefix -> action
  // After `script`, the actions of `tail` are taken in order while legal;
  // the first illegal one hands over to the policy.
  auto play = [&](absl::Span<const int> script, Pick pick,
                  absl::Span<const int> tail = {}) {
    env->Reset();
    taken.clear();
    size_t next_tail = 0;
    while (!env->done()) {
      int action;
      if (taken.size() < script.size()) {
        action = script[taken.size()];
      } else if (next_tail < tail.size() &&
                 tail[next_tail] <
                     static_cast<int>(env->LegalMask().size()) &&
                 env->LegalMask()[tail[next_tail]]) {
        action = tail[next_tail++];
      } else {
        next_tail = tail.size();
        // The environment is a function of the actions taken, so the
        // policy's greedy choice after a prefix is too: refinement replays
        // the same prefixes again and again (two greedy decisions in three
        // on Figure 7(c)'s 416 GPUs), and each costs a forward pass.
        if (pick == Pick::kGreedy) {
          std::string key(reinterpret_cast<const char*>(taken.data()),
                          taken.size() * sizeof(int));
          auto memo = greedy_memo.find(key);
          if (memo == greedy_memo.end()) {
            if (greedy_memo.size() >= kGreedyMemoEntries) greedy_memo.clear();
            memo = greedy_memo
                       .emplace(std::move(key),
                                PolicyAction(**policy, *env, pick, rng,
                                             absl::MakeSpan(probabilities)))
                       .first;
          }
          action = memo->second;
        } else {
          action = PolicyAction(**policy, *env, pick, rng,
                                absl::MakeSpan(probabilities));
        }
      }
      taken.push_back(action);
      const StepOutcome step = env->Step(action);
      if (step.template_completed) tracker.CountTemplate();
    }
    count_evaluations();
    if (env->plan().templates.empty()) {
      tracker.NoteFailure("the policy's first template did not fit");
      return false;
    }
    return tracker.Offer(env->plan(), env->iteration_time_s());
  };

  // The best few distinct episodes (by iteration time), for refinement.
  struct Episode {
    double iteration_time_s;
    std::vector<int> actions;
  };
  std::vector<Episode> elite, explored;
  auto remember = [&](std::vector<Episode>& kept, int limit) {
    if (env->plan().templates.empty() || limit == 0) return;
    const double t = env->iteration_time_s();
    for (const Episode& e : kept) {
      if (e.actions == taken) return;
    }
    if (static_cast<int>(kept.size()) == limit &&
        t >= kept.back().iteration_time_s) {
      return;
    }
    if (static_cast<int>(kept.size()) == limit) kept.pop_back();
    Episode e{t, taken};
    kept.insert(std::upper_bound(kept.begin(), kept.end(), e,
                                 [](const Episode& a, const Episode& b) {
                                   return a.iteration_time_s <
                                          b.iteration_time_s;
                                 }),
                std::move(e));
  };
  // A policy outside its training set is trusted less: more of the
  // rollouts explore, and more explored episodes are refined.
  const bool foreign = (*policy)->PlansAModelItWasNotTrainedOn();
  const int exploration_interval = foreign
                                       ? config_.foreign_exploration_interval
                                       : config_.exploration_interval;
  const int exploration_elites = foreign ? config_.foreign_exploration_elites
                                         : config_.exploration_elites;
  // Rollout 0 is the greedy one; it runs whatever the budget so a tight
  // budget still plans (a cancelled run stops before it, as every planner
  // does). Later rollouts sample (or, every exploration_interval-th,
  // explore) while the budget lasts.
  int rollouts_done = 0;
  auto roll_out_to = [&](int last) {
    for (; rollouts_done <= last; ++rollouts_done) {
      const int rollout = rollouts_done;
      const bool cancelled =
          options.cancelled != nullptr && options.cancelled->load();
      if ((rollout > 0 || cancelled) && tracker.OutOfBudget()) return false;
      const bool exploring = exploration_interval > 0 && rollout > 0 &&
                             rollout % exploration_interval == 0;
      play({}, rollout == 0 ? Pick::kGreedy
               : exploring  ? Pick::kUniform
                            : Pick::kSample);
      if (exploring) {
        remember(explored, exploration_elites);
      } else {
        remember(elite, std::max(1, config_.refined_episodes));
      }
    }
    return true;
  };
  // Local refinement of each elite episode (descend: the passes of
  // LearnedPlannerConfig::refinement_passes). Deterministic for a seed: the
  // structural moves are shuffled with the run's generator.
  std::array<uint8_t, kMaxActions> legal{};
  std::vector<int> present_slots;
  for (int slot = 0; slot < kEnvDeviceSlots; ++slot)
    if (env->SlotType(slot) >= 0) present_slots.push_back(slot);
  auto descend = [&](std::vector<int>& current, double& current_time) {
    for (int pass = 0; pass < config_.refinement_passes; ++pass) {
      bool improved = false;
      for (size_t pos = 0; pos < current.size() && !tracker.OutOfBudget();
           ++pos) {
        env->Reset();
        for (size_t i = 0; i < pos; ++i) env->Step(current[i]);
        absl::Span<const uint8_t> mask = env->LegalMask();
        const size_t actions = mask.size();
        std::copy(mask.begin(), mask.end(), legal.begin());
        count_evaluations();
        std::vector<int> script(current.begin(), current.begin() + pos + 1);
        // The best of every alternative at this decision, completed by the
        // episode's own later decisions while they stay legal (then the
        // policy's greedy ones). Completing by the policy alone as well
        // doubled the scan's cost for less: on the bench suite, 3 seeds,
        // both quality bars on 42.3 of 50 compositions with both
        // completions, 46.0 with this one (docs/learned-policy.md).
        std::vector<int> best_here;
        double best_here_time = current_time;
        for (size_t a = 0; a < actions; ++a) {
          if (!legal[a] || static_cast<int>(a) == current[pos]) continue;
          if (tracker.OutOfBudget()) break;
          script.back() = static_cast<int>(a);
          play(script, Pick::kGreedy,
               absl::MakeConstSpan(current).subspan(pos + 1));
          if (!env->plan().templates.empty() &&
              env->iteration_time_s() < best_here_time) {
            best_here = taken;
            best_here_time = env->iteration_time_s();
          }
        }
        if (!best_here.empty()) {
          current = std::move(best_here);
          current_time = best_here_time;
          improved = true;
        }
      }
      // Structural moves: several decisions changed together (a template's
      // types or TPs, its depth, its presence or order), which the
      // one-decision scan above cannot reach through worse intermediate
      // plans. Each neighbour is replayed as far as its actions are legal,
      // then completed by the policy's greedy choices.
      if (config_.structural_moves) {
        // First improvement in a shuffled order (seeded): each accepted
        // move starts a new scan of the new episode's neighbours, until a
        // whole scan finds nothing.
        bool moved = true;
        while (moved && !tracker.OutOfBudget()) {
          moved = false;
          std::vector<std::vector<TemplateActions>> neighbours =
              StructuralNeighbours(ReadTemplates(current), present_slots);
          std::shuffle(neighbours.begin(), neighbours.end(), rng);
          for (const std::vector<TemplateActions>& n : neighbours) {
            if (tracker.OutOfBudget()) break;
            const std::vector<int> actions = WriteTemplates(n);
            if (actions == current) continue;
            play({}, Pick::kGreedy, actions);
            if (!env->plan().templates.empty() &&
                env->iteration_time_s() < current_time) {
              current = taken;
              current_time = env->iteration_time_s();
              improved = moved = true;
              break;
            }
          }
        }
      }
      if (!improved) break;
    }
  };
  // Template-wise descent through the regular structures (see
  // LearnedPlannerConfig::regular_descent). Priced with the rest of the
  // episode, the regular template the exact planner finds is often several
  // single changes from the policy's, each slower alone; priced with only
  // the templates before it (the step's own reward) and with two runs
  // changed at once, it is reachable (docs/learned-policy.md, Inference).
  // The plan of exactly `templates` (kInfeasible when the cluster cannot
  // hold them as written: a neighbour the policy would have to change).
  auto price_exactly = [&](const std::vector<TemplateActions>& templates) {
    const std::vector<int> actions = WriteTemplates(templates);
    play({}, Pick::kGreedy, actions);
    const bool as_written =
        taken.size() + 1 >= actions.size() &&
        std::equal(actions.begin(), actions.end() - 1, taken.begin());
    return as_written && env->plan().templates.size() == templates.size()
               ? env->iteration_time_s()
               : kInfeasible;
  };
  auto regular_descent = [&](Episode& episode) {
    std::vector<TemplateActions> templates = ReadTemplates(episode.actions);
    for (size_t k = 0; k < templates.size() && !tracker.OutOfBudget(); ++k) {
      std::vector<TemplateActions> prefix(templates.begin(),
                                          templates.begin() + k + 1);
      double best = price_exactly(prefix);
      // Best improvement among the single-run moves until none improves,
      // then among the two-run moves; after a two-run move, single again.
      bool pairs = false;
      while (!tracker.OutOfBudget()) {
        const TemplateActions from = prefix[k];
        std::optional<TemplateActions> better;
        for (TemplateActions& n : RunNeighbours(from, present_slots, pairs)) {
          if (tracker.OutOfBudget()) break;
          if (n == from) continue;
          prefix[k] = std::move(n);
          const double t = price_exactly(prefix);
          if (t < best) {
            best = t;
            better = prefix[k];
          }
        }
        prefix[k] = better ? *std::move(better) : from;
        if (better) {
          pairs = false;
        } else if (!pairs) {
          pairs = true;
        } else {
          break;
        }
      }
      templates[k] = std::move(prefix[k]);
    }
    std::vector<int> tail = WriteTemplates(templates);
    tail.pop_back();  // the policy decides whether to stop
    play({}, Pick::kGreedy, tail);
    if (!env->plan().templates.empty() &&
        env->iteration_time_s() < episode.iteration_time_s) {
      episode = {env->iteration_time_s(), taken};
    }
  };
  // The device slots (of present_slots, in order) with a free node after
  // `templates`, replayed as written (they were priced as written).
  auto slots_with_free_nodes =
      [&](const std::vector<TemplateActions>& templates) {
        std::vector<int> free;
        std::vector<int> actions = WriteTemplates(templates);
        actions.pop_back();  // STOP
        env->Reset();
        for (const int action : actions) {
          const absl::Span<const uint8_t> mask = env->LegalMask();
          if (action >= static_cast<int>(mask.size()) || !mask[action])
            return free;
          env->Step(action);
        }
        count_evaluations();
        // A one-stage template's device head says which types have a node free.
        if (env->head() != EnvHead::kDepth || !env->DepthMask()[1]) return free;
        env->Step(1);
        for (const int slot : present_slots)
          if (env->DeviceMask()[slot]) free.push_back(slot);
        return free;
      };
  // The grown seed (LearnedPlannerConfig::grown_seed), after the greedy
  // rollout. Each GPU type's type-pure templates are priced alone (every TP
  // action, depths 1, 2, 4, ...) and the kGrownSeedCandidates fastest kept.
  // Then, from no template, while the seed has fewer than the most: the
  // template that makes it fastest is appended, among the kept ones of the
  // types it does not use yet and, at each TP action, one stage of every
  // type with a free node left (fastest type first). The plan of every
  // type's fastest alone side by side seeds instead when it is faster.
  // Refined after the first round's elites.
  std::optional<Episode> seeded;
  if (config_.grown_seed && config_.refinement_passes > 0 && roll_out_to(0)) {
    struct Priced {
      double time;
      TemplateActions t;
    };
    std::vector<std::vector<Priced>> fastest_alone(present_slots.size());
    for (size_t i = 0; i < present_slots.size(); ++i) {
      std::vector<Priced>& kept = fastest_alone[i];
      for (int tp = 0; tp < kEnvTpSlots; ++tp) {
        for (int depth = 1; depth <= env->depth_limit(); depth *= 2) {
          if (tracker.OutOfBudget()) break;
          TemplateActions t(depth, StageActions{present_slots[i], tp});
          const double time = price_exactly({t});
          if (time < kInfeasible) kept.push_back({time, std::move(t)});
        }
      }
      std::stable_sort(
          kept.begin(), kept.end(),
          [](const Priced& a, const Priced& b) { return a.time < b.time; });
      if (kept.size() > kGrownSeedCandidates) kept.resize(kGrownSeedCandidates);
    }
    std::vector<TemplateActions> seed;
    std::vector<bool> used(present_slots.size(), false);
    double seed_time = kInfeasible;
    while (static_cast<int>(seed.size()) < env_config.max_templates &&
           !tracker.OutOfBudget()) {
      const std::vector<int> free = slots_with_free_nodes(seed);
      seed.emplace_back();
      std::optional<TemplateActions> chosen;
      int chosen_type = -1;  // index into present_slots; -1: the mixed one
      auto consider = [&](const TemplateActions& t, double time, int type) {
        if (seed.size() > 1 || time >= kInfeasible) {
          seed.back() = t;
          time = price_exactly(seed);
        }
        if (time < seed_time) {
          seed_time = time;
          chosen = t;
          chosen_type = type;
        }
      };
      for (size_t i = 0; i < present_slots.size(); ++i) {
        if (used[i]) continue;
        for (const Priced& p : fastest_alone[i]) {
          if (tracker.OutOfBudget()) break;
          consider(p.t, p.time, static_cast<int>(i));
        }
      }
      for (int tp = 0; free.size() > 1 && tp < kEnvTpSlots; ++tp) {
        if (tracker.OutOfBudget()) break;
        TemplateActions t;
        for (const int slot : free) {
          if (static_cast<int>(t.size()) == env->depth_limit()) break;
          t.push_back(StageActions{slot, tp});
        }
        consider(t, kInfeasible, -1);
      }
      if (!chosen) {
        seed.pop_back();
        break;
      }
      seed.back() = *std::move(chosen);
      if (chosen_type >= 0) used[chosen_type] = true;
    }
    // Growing from the fastest template alone can miss every type's
    // fastest side by side (DeepSeek-V3 on 256 A100-80GB + 256 H100: 120.2
    // s an iteration grown, 102.8 s side by side): the faster one seeds.
    std::vector<TemplateActions> side_by_side;
    for (const std::vector<Priced>& kept : fastest_alone)
      if (!kept.empty()) side_by_side.push_back(kept.front().t);
    for (const std::vector<TemplateActions>* candidate :
         {&seed, &side_by_side}) {
      if (candidate->empty() || tracker.OutOfBudget()) continue;
      if (candidate == &side_by_side && side_by_side == seed) continue;
      play({}, Pick::kGreedy, WriteTemplates(*candidate));
      if (!env->plan().templates.empty() &&
          (!seeded || env->iteration_time_s() < seeded->iteration_time_s))
        seeded = Episode{env->iteration_time_s(), taken};
    }
  }
  // Two rounds: kFirstRoundRollouts sampled rollouts, their best episodes
  // refined (the policy's and the explored, alternately); then the rest of
  // the rollouts, and their best episodes not refined yet. What the search
  // prices, in order, does not depend on the budget, which only ends it: a
  // larger budget runs the same search further, so its plan is never worse
  // than a smaller one's (same seed; test/core/budget_monotonicity_test.cc).
  // The split this replaces (sampling stopped at a share of the budget to
  // leave time for refinement) had the 0.1 s plan beat the 0.9 s one in 10
  // of 102 paired runs (17 compositions, learned and template-search).
  std::vector<Episode> refined;
  std::vector<std::vector<int>> refined_from;  // their sampled actions
  for (const int last :
       {std::min(kFirstRoundRollouts, sampled_rollouts), sampled_rollouts}) {
    if (!roll_out_to(last)) break;
    std::vector<Episode> order;
    for (size_t i = 0; i < std::max(elite.size(), explored.size()); ++i) {
      if (i < elite.size()) order.push_back(elite[i]);
      if (i < explored.size()) order.push_back(explored[i]);
    }
    // The seed after the sampled elites, in the first round only: it adds
    // a start and takes none of theirs.
    if (seeded) {
      order.push_back(*std::move(seeded));
      seeded.reset();
    }
    for (Episode& episode : order) {
      if (tracker.OutOfBudget()) break;
      if (std::find(refined_from.begin(), refined_from.end(),
                    episode.actions) != refined_from.end()) {
        continue;
      }
      refined_from.push_back(episode.actions);
      if (config_.regular_descent && config_.refinement_passes > 0) {
        regular_descent(episode);
      }
      descend(episode.actions, episode.iteration_time_s);
      refined.push_back(std::move(episode));
    }
    if (tracker.OutOfBudget()) break;
  }
  elite = std::move(refined);

  // Iterated local search from the best refined episode while the budget
  // lasts: a kick of two random structural moves, a descent from there,
  // kept when faster; perturbation_rounds descents in a row without a gain
  // end it (small clusters finish early). A kick far slower than the best
  // is not descended (see LearnedPlannerConfig::perturbation_cutoff).
  if (config_.perturbation_rounds > 0 && config_.refinement_passes > 0 &&
      !elite.empty()) {
    const Episode* start = &elite.front();
    for (const Episode& e : elite)
      if (e.iteration_time_s < start->iteration_time_s) start = &e;
    std::vector<int> best = start->actions;
    double best_time = start->iteration_time_s;
    // Kicks not descended count too, 8 to a round, so a search whose every
    // kick lands far off still ends.
    int skipped = 0;
    for (int stale = 0; stale < config_.perturbation_rounds &&
                        skipped < 8 * config_.perturbation_rounds &&
                        !tracker.OutOfBudget();) {
      std::vector<TemplateActions> kicked = ReadTemplates(best);
      for (int kick = 0; kick < 2; ++kick) {
        std::vector<std::vector<TemplateActions>> n =
            StructuralNeighbours(kicked, present_slots);
        if (n.empty()) break;
        kicked = std::move(n[rng() % n.size()]);
      }
      play({}, Pick::kGreedy, WriteTemplates(kicked));
      if (env->plan().templates.empty() ||
          env->iteration_time_s() > best_time * config_.perturbation_cutoff) {
        ++skipped;
        continue;
      }
      ++stale;
      std::vector<int> current = taken;
      double current_time = env->iteration_time_s();
      descend(current, current_time);
      if (current_time < best_time) {
        best = std::move(current);
        best_time = current_time;
        stale = 0;
      }
    }
  }
  return tracker.Finish(name(), /*exhaustive=*/false);
}

}  // namespace arachne
