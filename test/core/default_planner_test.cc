// The default planner (planners.h, ChooseDefaultPlanner): "learned" when
// the registered policy factory serves the model, else "template-search"
// with a one-line reason naming the model; the default budgets
// (DefaultBudget) and the no-policy message's fallback.
#include <atomic>
#include <memory>
#include <string>

#include "absl/status/status.h"
#include "absl/time/time.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "planner_service/core/cost/cost_model.h"
#include "planner_service/core/learned/learned_planner.h"
#include "planner_service/core/cost/plan_validation.h"
#include "planner_service/core/planners.h"
#include "test/core/toy_fixture.h"
#include "test/policy/policy_test_fixture.h"

namespace arachne {
namespace {

using ::testing::HasSubstr;
using ::testing::Not;

class DefaultPlannerTest : public ::testing::Test {
 protected:
  void TearDown() override { RegisterLearnedPolicyFactory(nullptr); }

  static PlannerOptions Options() {
    PlannerOptions o;
    o.budget = absl::Seconds(30);
    o.policy_rollouts = 4;
    return o;
  }

  // Registers a factory that serves every model with the uniform policy
  // and counts its calls.
  void RegisterCountingFactory() {
    RegisterLearnedPolicyFactory(
        [calls = calls_](
            const CostModel&) -> absl::StatusOr<std::unique_ptr<PolicyModel>> {
          ++*calls;
          return std::unique_ptr<PolicyModel>(
              std::make_unique<UniformPolicyModel>());
        });
  }

  // 4 FAST + 4 SLOW GPUs.
  testing::ToyComposition toy_{{{testing::kFast, 4}, {testing::kSlow, 4}}};
  const CostModel& cm_ = toy_.cost_model();
  std::shared_ptr<std::atomic<int>> calls_ =
      std::make_shared<std::atomic<int>>(0);
};

TEST_F(DefaultPlannerTest, LearnedWhenThePolicyServesTheModel) {
  RegisterCountingFactory();
  EXPECT_TRUE(LearnedPolicyServes(cm_).ok());
  *calls_ = 0;
  DefaultPlannerChoice choice = ChooseDefaultPlanner(cm_);
  EXPECT_EQ(choice.name, "learned");
  EXPECT_EQ(choice.fallback_reason, "");
  ASSERT_NE(choice.planner, nullptr);
  EXPECT_EQ(choice.planner->name(), "learned");
  EXPECT_EQ(DefaultPlannerLine(choice.name, choice.fallback_reason),
            "planner: learned");
  auto r = choice.planner->Run(cm_, Options());
  ASSERT_TRUE(r.ok()) << r.status();
  EXPECT_EQ(r->planner, "learned");
  EXPECT_TRUE(ValidatePlan(r->plan, cm_).ok());
  // The probe's policy is the one the run plans with: one factory call.
  EXPECT_EQ(*calls_, 1);
  // A second run asks the factory again rather than failing.
  ASSERT_TRUE(choice.planner->Run(cm_, Options()).ok());
  EXPECT_EQ(*calls_, 2);
}

TEST_F(DefaultPlannerTest, TemplateSearchWithTheFactorysReasonInOneLine) {
  RegisterLearnedPolicyFactory(
      [](const CostModel& cm) -> absl::StatusOr<std::unique_ptr<PolicyModel>> {
        return absl::FailedPreconditionError(
            NoPolicyMessage(cm.model().name,
                            "/p/toy.pt does not exist;\n/p/general.pt "
                            "does not exist"));
      });
  absl::Status serves = LearnedPolicyServes(cm_);
  EXPECT_EQ(serves.code(), absl::StatusCode::kFailedPrecondition);
  DefaultPlannerChoice choice = ChooseDefaultPlanner(cm_);
  EXPECT_EQ(choice.name, "template-search");
  // The factory's <why> without NoPolicyMessage's frame, on one line.
  EXPECT_EQ(choice.fallback_reason,
            "no learned policy serves model \"toy\": /p/toy.pt does not "
            "exist; /p/general.pt does not exist");
  EXPECT_EQ(DefaultPlannerLine(choice.name, choice.fallback_reason),
            "planner: template-search (no learned policy serves model "
            "\"toy\": /p/toy.pt does not exist; /p/general.pt does not "
            "exist)");
  ASSERT_NE(choice.planner, nullptr);
  auto r = choice.planner->Run(cm_, Options());
  ASSERT_TRUE(r.ok()) << r.status();
  EXPECT_EQ(r->planner, "template-search");
  EXPECT_TRUE(ValidatePlan(r->plan, cm_).ok());
}

TEST_F(DefaultPlannerTest, TemplateSearchWithoutAFactory) {
  RegisterLearnedPolicyFactory(nullptr);
  absl::Status serves = LearnedPolicyServes(cm_);
  EXPECT_EQ(serves.code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_THAT(serves.message(), HasSubstr("this build has no LibTorch policy"));
  DefaultPlannerChoice choice = ChooseDefaultPlanner(cm_);
  EXPECT_EQ(choice.name, "template-search");
  EXPECT_EQ(choice.fallback_reason,
            "no learned policy serves model \"toy\": this build has no "
            "LibTorch policy");
  auto r = choice.planner->Run(cm_, Options());
  ASSERT_TRUE(r.ok()) << r.status();
  EXPECT_EQ(r->planner, "template-search");
}

TEST(DefaultBudgetTest,
     LearnedPlannersGetTheirLatencyBudgetOthersTheSearchDefault) {
  const absl::Duration search = absl::Seconds(60);
  const absl::Duration latency = LearnedPlannerConfig{}.latency_budget;
  EXPECT_EQ(latency, absl::Milliseconds(900));
  for (const char* name : {"", "learned", "template-search", "Learned"}) {
    EXPECT_TRUE(IsLatencyBudgeted(name)) << name;
    EXPECT_EQ(DefaultBudget(name, search), latency) << name;
  }
  for (const char* name :
       {"exact", "amp", "espresso", "hexiscale", "metis", "sailor", "random"}) {
    EXPECT_FALSE(IsLatencyBudgeted(name)) << name;
    EXPECT_EQ(DefaultBudget(name, search), search) << name;
  }
}

TEST(NoPolicyMessageTest, PointsToTemplateSearchAndItsReasonIsRecovered) {
  const std::string m = NoPolicyMessage("qwen3-8b", "no checkpoint");
  EXPECT_EQ(m,
            "learned planner: no policy for model \"qwen3-8b\": no "
            "checkpoint; plan with --planner template-search instead "
            "(docs/learned-policy.md, Inference)");
  EXPECT_THAT(m, Not(HasSubstr("exact")));
  EXPECT_EQ(NoPolicyReason("qwen3-8b", m), "no checkpoint");
  // Another model's message, or any other text, is kept whole.
  EXPECT_EQ(NoPolicyReason("llama3-8b", m), m);
  EXPECT_EQ(NoPolicyReason("qwen3-8b", "disk on fire"), "disk on fire");
}

}  // namespace
}  // namespace arachne
