// The learned planner's split of its budget between sampled rollouts and
// refinement (LearnedPlannerConfig::sampling_share, refinement_reserve):
// bad settings are named, and a budget too short for the configured
// rollouts still reaches the refinement, which only improves the best
// sampled plan.
#include <algorithm>
#include <memory>

#include "absl/time/time.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "planner_service/core/learned_planner.h"
#include "planner_service/core/plan_validation.h"
#include "test/core/toy_fixture.h"
#include "test/policy/policy_test_fixture.h"

namespace arachne {
namespace {

using ::testing::HasSubstr;

class LearnedBudgetTest : public ::testing::Test {
 protected:
  absl::StatusOr<PlanResult> Run(LearnedPlannerConfig config,
                                 absl::Duration budget) {
    PlannerOptions options;
    options.seed = 3;
    options.budget = budget;
    return LearnedPlanner(config, UniformPolicyFactory(), "template-search")
        .Run(cm_, options);
  }
  // 4 FAST + 4 SLOW GPUs.
  testing::ToyComposition toy_{{{testing::kFast, 4}, {testing::kSlow, 4}}};
  const CostModel& cm_ = toy_.cost_model();
};

TEST_F(LearnedBudgetTest, BadSplitSettingsAreNamed) {
  LearnedPlannerConfig c;
  c.sampling_share = 0;
  auto r = Run(c, absl::Seconds(1));
  EXPECT_EQ(r.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(r.status().message(),
              HasSubstr("sampling_share must be in (0, 1], got 0"));
  c.sampling_share = 1.5;
  EXPECT_THAT(Run(c, absl::Seconds(1)).status().message(),
              HasSubstr("sampling_share must be in (0, 1], got 1.5"));
  c = {};
  c.refinement_reserve = absl::Milliseconds(-1);
  EXPECT_THAT(Run(c, absl::Seconds(1)).status().message(),
              HasSubstr("refinement_reserve must be >= 0, got -1ms"));
}

// A clock that advances 100 us each time it is read: the run's own reads
// (one per rollout and per refinement step) make its time, so where the
// sampling stops is deterministic.
class TickingClock : public Clock {
 public:
  absl::Time Now() const override {
    now_ += absl::Microseconds(100);
    return now_;
  }

 private:
  mutable absl::Time now_ = absl::UnixEpoch();
};

// Ten million sampled rollouts cannot finish in 0.2 s: sampling stops at
// 0.2 - min(0.2, 0.9 x 0.2) = 0.02 s and the refinement runs, which on the
// toy cluster (without the iterated local search) ends by itself long
// before the budget; with sampling_share 1
// and no reserve the rollouts take the whole budget.
TEST_F(LearnedBudgetTest, RolloutsBeyondTheBudgetStopAtTheirShare) {
  auto run = [&](LearnedPlannerConfig c) {
    c.sampled_rollouts = 10'000'000;
    c.perturbation_rounds = 0;  // refinement then ends by itself
    TickingClock clock;
    PlannerOptions options;
    options.seed = 3;
    options.budget = absl::Milliseconds(200);
    options.clock = &clock;
    auto r = LearnedPlanner(c, UniformPolicyFactory(), "template-search")
                 .Run(cm_, options);
    CHECK(r.ok()) << r.status();
    EXPECT_TRUE(ValidatePlan(r->plan, cm_).ok());
    return r->stats.wall_s;
  };
  const double split = run({});
  EXPECT_GE(split, 0.02);
  EXPECT_LT(split, 0.2);
  LearnedPlannerConfig all_sampling;
  all_sampling.sampling_share = 1;
  all_sampling.refinement_reserve = absl::ZeroDuration();
  EXPECT_GE(run(all_sampling), 0.2);
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
