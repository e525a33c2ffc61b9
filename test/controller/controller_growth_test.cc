// Keep-or-switch decisions end to end (issue 35, item 4): in the paper's
// Figure 8 growth sequence, with real controller and agent processes on
// 127.0.0.1, the controller never switches to a plan whose measured
// throughput then falls below that of the plan it left.
#include <string>

#include "gtest/gtest.h"
#include "test/controller/growth_sequence.h"

namespace arachne::controller::testing {
namespace {

TEST(ControllerGrowth, NoSwitchLowersTheMeasuredThroughput) {
  GrowthResult growth;
  const std::string dir = TempDir("controller-growth");
  ASSERT_TRUE(RunGrowth(dir, &growth).ok()) << "logs in " << dir;
  ASSERT_EQ(growth.joins.size(), 4u);
  // Figure 8's point: a 4-GPU A6000 node joining 3 GPUs is worth a switch
  // (a test that saw no switch would check nothing).
  EXPECT_EQ(growth.joins[0].decision.verdict(), "switch")
      << growth.joins[0].decision.reason();
  for (const GrowthJoin& j : growth.joins) {
    SCOPED_TRACE(j.node);
    ASSERT_GT(j.tokens_per_s_before, 0);
    ASSERT_GT(j.tokens_per_s_after, 0);
    if (j.decision.verdict() != "switch") {
      EXPECT_EQ(j.generation_after, j.generation_before);
      continue;
    }
    EXPECT_EQ(j.generation_after, j.decision.generation());
    EXPECT_GE(j.tokens_per_s_after, j.tokens_per_s_before)
        << "switch to generation " << j.decision.generation() << ": "
        << j.decision.reason();
  }
}

}  // namespace
}  // namespace arachne::controller::testing
