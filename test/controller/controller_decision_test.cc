// Keep-or-switch: the rule with its numbers, including the paper's "keep
// the plan on this join" case.
#include "controller/decision.h"

#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace arachne::controller {
namespace {

using ::testing::HasSubstr;

DecisionInput Join(double old_tp, double new_tp, double horizon_s,
                   double estimate_s, double fixed_s) {
  DecisionInput in;
  in.trigger = "join c";
  in.old_throughput = old_tp;
  in.new_throughput = new_tp;
  in.horizon_s = horizon_s;
  in.migration_estimate_s = estimate_s;
  in.fixed_cost_s = fixed_s;
  return in;
}

TEST(Decision, SwitchesWhenTheGainOverTheHorizonBeatsTheDowntime) {
  // 10 -> 12.5 it/s saves 20% of the time: 720 s over an hour > 5 s.
  Decision d = Decide(Join(10, 12.5, 3600, 1, 4));
  EXPECT_EQ(d.verdict, Verdict::kSwitch);
  EXPECT_DOUBLE_EQ(d.gain_s, 720);
  EXPECT_DOUBLE_EQ(d.downtime_estimate_s, 5);
  EXPECT_EQ(d.trigger, "join c");
  EXPECT_THAT(d.reason, HasSubstr("beats the estimated downtime 5.000 s"));
}

TEST(Decision, KeepsThePlanOnAJoinThatGainsTooLittle) {
  // The same join over a 20 s horizon: 4 s saved < 5 s of downtime.
  Decision d = Decide(Join(10, 12.5, 20, 1, 4));
  EXPECT_EQ(d.verdict, Verdict::kKeep);
  EXPECT_DOUBLE_EQ(d.gain_s, 4);
  EXPECT_THAT(d.reason, HasSubstr("does not beat the estimated downtime"));
  // A slower new plan is never worth it.
  d = Decide(Join(10, 9, 1e9, 0, 0));
  EXPECT_EQ(d.verdict, Verdict::kKeep);
  EXPECT_LT(d.gain_s, 0);
  // Nor the same plan.
  DecisionInput same = Join(10, 10, 3600, 0, 0);
  same.new_plan_same = true;
  EXPECT_EQ(Decide(same).verdict, Verdict::kKeep);
  EXPECT_EQ(Decide(same).reason, "the new plan is the current plan");
}

TEST(Decision, AlwaysSwitchesWhenTheCurrentPlanLostAGpuOrNoLongerFits) {
  DecisionInput in = Join(10, 5, 1, 100, 100);
  in.current_lost_gpu = true;
  Decision d = Decide(in);
  EXPECT_EQ(d.verdict, Verdict::kSwitch);
  EXPECT_THAT(d.reason, HasSubstr("lost a GPU"));
  in.current_lost_gpu = false;
  in.current_feasible = false;
  in.current_reason = "node \"b\" left the cluster";
  d = Decide(in);
  EXPECT_EQ(d.verdict, Verdict::kSwitch);
  EXPECT_THAT(d.reason, HasSubstr("no longer fits: node \"b\" left"));
  in.migration_available = false;
  in.migration_reason = "byte range without a holder";
  d = Decide(in);
  EXPECT_EQ(d.verdict, Verdict::kCannotSwitch);
  EXPECT_THAT(d.reason, HasSubstr("byte range without a holder"));
  in.migration_available = true;
  in.new_plan_found = false;
  in.new_plan_reason = "the model fits nowhere";
  EXPECT_EQ(Decide(in).verdict, Verdict::kCannotSwitch);
}

TEST(Decision, KeepsWhenNoMigrationOrNoNewPlanWhileTheCurrentStillFits) {
  DecisionInput in = Join(10, 20, 3600, 0, 0);
  in.migration_available = false;
  in.migration_reason = "no holder";
  EXPECT_EQ(Decide(in).verdict, Verdict::kKeep);
  in = Join(10, 20, 3600, 0, 0);
  in.new_plan_found = false;
  in.new_plan_reason = "planner unreachable";
  Decision d = Decide(in);
  EXPECT_EQ(d.verdict, Verdict::kKeep);
  EXPECT_THAT(d.reason, HasSubstr("planner unreachable"));
}

TEST(SwitchCostModel, LearnsTheFixedCostFromMeasuredSwitches) {
  SwitchCostModel m(2.0);
  EXPECT_DOUBLE_EQ(m.FixedCostSeconds(), 2.0);
  m.Record(/*measured_downtime_s=*/3.0, /*migration_estimate_s=*/0.5);
  m.Record(1.0, 0.5);
  EXPECT_DOUBLE_EQ(m.FixedCostSeconds(), 1.5);
  m.Record(0.1, 0.5);  // faster than estimated: no negative cost
  EXPECT_DOUBLE_EQ(m.FixedCostSeconds(), 1.0);
  EXPECT_EQ(m.measured(), 3);
}

}  // namespace
}  // namespace arachne::controller
