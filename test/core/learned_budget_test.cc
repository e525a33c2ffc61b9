// The learned planner's budget: the first round of sampled rollouts is
// refined before the rest are sampled, whatever their number, and the
// search a larger budget runs is the smaller one's continued
// (test/core/budget_monotonicity_test.cc checks the plans on real
// clusters).
#include <algorithm>
#include <memory>

#include "absl/time/time.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "planner_service/core/learned/learned_planner.h"
#include "planner_service/core/cost/plan_validation.h"
#include "test/core/planning_fixtures.h"
#include "test/core/toy_fixture.h"
#include "test/policy/policy_test_fixture.h"

namespace arachne {
namespace {

using testing::TickingClock;

// Ten million sampled rollouts cannot finish in 0.2 s; the first 16 are
// refined all the same, before the rest take the budget. With 16 rollouts
// in all, the run is that first round alone and ends by itself (toy
// cluster, no iterated local search); with ten million it runs the same
// round, then samples until the budget ends: its plan is never worse.
TEST(LearnedBudgetTest, TheFirstRoundIsRefinedWhateverTheRolloutCount) {
  testing::ToyComposition toy{{{testing::kFast, 4}, {testing::kSlow, 4}}};
  const CostModel& cm = toy.cost_model();
  auto run = [&](int rollouts) {
    LearnedPlannerConfig c;
    c.sampled_rollouts = rollouts;
    c.perturbation_rounds = 0;  // refinement then ends by itself
    TickingClock clock;
    PlannerOptions options;
    options.seed = 3;
    options.budget = absl::Milliseconds(200);
    options.clock = &clock;
    auto r = LearnedPlanner(c, UniformPolicyFactory(), "template-search")
                 .Run(cm, options);
    CHECK(r.ok()) << r.status();
    EXPECT_TRUE(ValidatePlan(r->plan, cm).ok());
    return *std::move(r);
  };
  // wall_s is the ticking clock's time: deterministic, not the machine's.
  const PlanResult first_round = run(16);
  EXPECT_LT(first_round.stats.wall_s, 0.2);
  const PlanResult all = run(10'000'000);
  EXPECT_GE(all.stats.wall_s, 0.2);
  EXPECT_LE(all.prediction.iteration_time_s,
            first_round.prediction.iteration_time_s);
}

}  // namespace
}  // namespace arachne

namespace arachne {
namespace {

// Puts all its mass on the last legal action: its own episodes are all
// the same, so only exploring (uniform) rollouts can find another plan.
class LastLegalPolicy : public PolicyModel {
 public:
  explicit LastLegalPolicy(bool foreign) : foreign_(foreign) {}
  void ActionProbabilities(const ConstructionEnv& env,
                           absl::Span<float> probabilities) override {
    absl::Span<const uint8_t> mask = env.LegalMask();
    std::fill(probabilities.begin(), probabilities.end(), 0.0f);
    for (size_t a = std::min(mask.size(), probabilities.size()); a-- > 0;) {
      if (mask[a]) {
        probabilities[a] = 1.0f;
        break;
      }
    }
  }
  bool PlansAModelItWasNotTrainedOn() const override { return foreign_; }

 private:
  bool foreign_;
};

// A policy outside its training set explores by the foreign_* settings:
// here every sampled rollout of the foreign one is uniform, none of the
// other's, and with the refinement off only the foreign one leaves the
// policy's plan.
TEST(LearnedExplorationTest, APolicyOnAModelItWasNotTrainedOnExploresMore) {
  testing::ToyComposition toy{{{testing::kFast, 4}, {testing::kSlow, 4}}};
  auto run = [&](bool foreign, int rollouts) {
    LearnedPlannerConfig c;
    c.sampled_rollouts = rollouts;
    c.refinement_passes = 0;
    c.regular_descent = false;
    c.perturbation_rounds = 0;
    c.exploration_interval = 0;
    c.foreign_exploration_interval = 1;
    PolicyModelFactory factory = [foreign](const CostModel&) {
      return absl::StatusOr<std::unique_ptr<PolicyModel>>(
          std::make_unique<LastLegalPolicy>(foreign));
    };
    PlannerOptions options;
    options.seed = 5;
    options.budget = absl::Seconds(10);
    auto r = LearnedPlanner(c, factory, "learned").Run(toy.cost_model(), options);
    CHECK(r.ok()) << r.status();
    return r->prediction.iteration_time_s;
  };
  const double policy_plan = run(false, 0);
  EXPECT_EQ(run(false, 64), policy_plan);
  EXPECT_LT(run(true, 64), policy_plan);
}

}  // namespace
}  // namespace arachne
