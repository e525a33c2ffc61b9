// The live switch end to end: real arachne-agent processes with virtual
// GPUs on 127.0.0.1, a real TCPStore, the driver in this process playing
// the controller through the agents' RPCs. Each switch checks that the
// whole state gathered right after it equals the state right before it,
// bit for bit, and training goes on as if nothing had happened.
#include <cmath>
#include <cstring>
#include <filesystem>
#include <string>
#include <vector>

#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "test/agent/agent_harness.h"

namespace arachne::agent {
namespace {

using testing::Driver;
using testing::NamedCluster;
using testing::RunPlan;
using testing::SwitchStep;
using testing::TinyJob;
using ::testing::HasSubstr;
using testing::Place;

std::string TempDir(const std::string& name) {
  std::string d = std::string(::testing::TempDir()) + "arachne-live-" + name +
                  "-" + std::to_string(getpid());
  std::filesystem::remove_all(d);
  std::filesystem::create_directories(d);
  return d;
}

// PP 2 x DP 2 on nodes a, b (2 GPUs each): stage 0 on a, stage 1 on b.
Plan PlanA(const Cluster& c) {
  (void)c;
  return Plan{{Place({{1, 0, 2}, {1, 2, 4}}, 2, 2, 8,
                     {{0, 0}, {1, 0}, {0, 1}, {1, 1}})}};
}

TEST(LiveSwitch, JoinTpDepthAndTemplateChangesThenDrainLoseNothing) {
  const std::string dir = TempDir("chain");
  Driver d(TinyJob(), dir);
  d.Agent("a", 2);
  d.Agent("b", 2);
  const Cluster ab = NamedCluster({{"a", 2}, {"b", 2}});
  ASSERT_TRUE(d.Start(PlanA(ab), ab).ok());
  ASSERT_TRUE(d.TrainUntil(2).ok());

  struct Step {
    std::string what;
    Plan plan;
    Cluster cluster;
  };
  const Cluster abc = NamedCluster({{"a", 2}, {"b", 2}, {"c", 2}});
  std::vector<Step> steps = {
      // A join: node c adds a third replica.
      {"join", Plan{{Place({{1, 0, 2}, {1, 2, 4}}, 3, 2, 8,
                           {{0, 0}, {1, 0}, {0, 1}, {1, 1}, {2, 0}, {2, 1}})}},
       abc},
      // A TP change: stage 0 at TP 2 on a, stage 1 at TP 2 on c.
      {"tp change", Plan{{Place({{2, 0, 2}, {2, 2, 4}}, 1, 2, 8,
                                {{0, 0}, {0, 1}, {2, 0}, {2, 1}})}},
       abc},
      // A depth and template-count change: a one-stage TP 2 template on b
      // and a PP 2 template over a and c.
      {"depth + templates",
       Plan{{Place({{2, 0, 4}}, 1, 4, 2, {{1, 0}, {1, 1}}),
             Place({{1, 0, 1}, {1, 1, 4}}, 1, 2, 4, {{0, 0}, {2, 1}})}},
       abc},
      // A graceful leave: c drains (it stays in the cluster during the
      // switch, the new plan does not use it).
      {"drain c", Plan{{Place({{1, 0, 3}, {1, 3, 4}}, 2, 2, 8,
                              {{0, 0}, {1, 0}, {0, 1}, {1, 1}})}},
       abc},
  };
  int64_t it = 2;
  for (const Step& s : steps) {
    SCOPED_TRACE(s.what);
    if (s.what == "join") d.Agent("c", 2);
    absl::StatusOr<FullState> before = d.Gather("before-" + std::to_string(it));
    ASSERT_TRUE(before.ok()) << before.status();
    absl::Status sw = d.Switch(s.plan, s.cluster);
    ASSERT_TRUE(sw.ok()) << sw;
    absl::StatusOr<FullState> after = d.Gather("after-" + std::to_string(it));
    ASSERT_TRUE(after.ok()) << after.status();
    EXPECT_TRUE(*before == *after)
        << FirstDifference(*ReferenceModelState(TinyJob()), *before, *after);
    it += 2;
    ASSERT_TRUE(d.TrainUntil(it).ok());
  }
  // The same iterations without any switch.
  auto reference = RunPlan(TinyJob(), PlanA(ab), ab, it);
  ASSERT_TRUE(reference.ok()) << reference.status();
  for (const auto& [i, loss] : d.losses()) {
    EXPECT_NEAR(loss, reference->losses[i - 1], 1e-4 * loss) << "iteration " << i;
  }
  absl::StatusOr<FullState> end = d.Gather("end");
  ASSERT_TRUE(end.ok());
  EXPECT_LE(testing::MaxMasterDifference(TinyJob(), *end, reference->state), 1e-5);
}

TEST(LiveSwitch, MoeRetilingLosesNothing) {
  JobSpec job = TinyJob();
  job.model = *ResolveModel("tiny-moe");
  const std::string dir = TempDir("moe");
  Driver d(job, dir);
  d.Agent("a", 2);
  d.Agent("b", 2);
  const Cluster ab = NamedCluster({{"a", 2}, {"b", 2}});
  // EP 2 over two one-GPU replicas on a and b ...
  Plan ep2{{Place({{1, 0, 4}}, 2, 4, 4, {{0, 0}, {1, 0}})}};
  ep2.templates[0].stages[0].tiling = {2, 1, 1};
  // ... retiled to one TP 2 replica on b with every expert sliced in two
  // (ETP 2): experts move from a to b and are re-cut.
  Plan etp2{{Place({{2, 0, 4}}, 1, 4, 4, {{1, 0}, {1, 1}})}};
  etp2.templates[0].stages[0].tiling = {1, 2, 1};
  ASSERT_TRUE(d.Start(ep2, ab).ok());
  ASSERT_TRUE(d.TrainUntil(3).ok());
  absl::StatusOr<FullState> before = d.Gather("before");
  ASSERT_TRUE(before.ok());
  absl::Status sw = d.Switch(etp2, ab);
  ASSERT_TRUE(sw.ok()) << sw;
  absl::StatusOr<FullState> after = d.Gather("after");
  ASSERT_TRUE(after.ok());
  EXPECT_TRUE(*before == *after)
      << FirstDifference(*ReferenceModelState(job), *before, *after);
  ASSERT_TRUE(d.TrainUntil(6).ok());
  auto reference = RunPlan(job, ep2, ab, 6);
  ASSERT_TRUE(reference.ok()) << reference.status();
  for (const auto& [i, loss] : d.losses()) {
    EXPECT_NEAR(loss, reference->losses[i - 1], 1e-4 * loss) << "iteration " << i;
  }
}

TEST(LiveSwitch, RelocationContinuesBitIdentically) {
  const std::string dir = TempDir("relocate");
  Driver d(TinyJob(), dir);
  d.Agent("a", 2);
  d.Agent("b", 2);
  d.Agent("c", 2);
  const Cluster abc = NamedCluster({{"a", 2}, {"b", 2}, {"c", 2}});
  // The same structure as PlanA, moved from a, b to b, c.
  const Plan on_ab = Plan{{Place({{1, 0, 2}, {1, 2, 4}}, 2, 2, 8,
                                 {{0, 0}, {1, 0}, {0, 1}, {1, 1}})}};
  const Plan on_bc = Plan{{Place({{1, 0, 2}, {1, 2, 4}}, 2, 2, 8,
                                 {{1, 0}, {2, 0}, {1, 1}, {2, 1}})}};
  ASSERT_TRUE(d.Start(on_ab, abc).ok());
  ASSERT_TRUE(d.TrainUntil(3).ok());
  ASSERT_TRUE(d.Switch(on_bc, abc).ok());
  ASSERT_TRUE(d.TrainUntil(6).ok());
  auto reference = RunPlan(TinyJob(), on_ab, abc, 6);
  ASSERT_TRUE(reference.ok());
  ASSERT_EQ(d.losses().size(), 6u);
  for (const auto& [i, loss] : d.losses()) {
    EXPECT_EQ(loss, reference->losses[i - 1]) << "iteration " << i;
  }
  absl::StatusOr<FullState> end = d.Gather("end");
  ASSERT_TRUE(end.ok());
  EXPECT_TRUE(*end == reference->state);
}

class LiveSwitchFault : public ::testing::TestWithParam<SwitchStep> {};

TEST_P(LiveSwitchFault, KilledJoinerAbortsAndTheOldPlanResumesIntact) {
  const std::string dir = TempDir("fault");
  Driver d(TinyJob(), dir);
  d.Agent("a", 2);
  d.Agent("b", 2);
  const Cluster ab = NamedCluster({{"a", 2}, {"b", 2}});
  ASSERT_TRUE(d.Start(PlanA(ab), ab).ok());
  ASSERT_TRUE(d.TrainUntil(2).ok());
  absl::StatusOr<FullState> before = d.Gather("before");
  ASSERT_TRUE(before.ok());
  testing::AgentProcess* c = d.Agent("c", 2);
  const Cluster abc = NamedCluster({{"a", 2}, {"b", 2}, {"c", 2}});
  const Plan joined{{Place({{1, 0, 2}, {1, 2, 4}}, 3, 2, 8,
                           {{0, 0}, {1, 0}, {0, 1}, {1, 1}, {2, 0}, {2, 1}})}};
  absl::Status sw = d.Switch(joined, abc, GetParam(), [&]() { c->Kill(); });
  EXPECT_FALSE(sw.ok());
  EXPECT_EQ(d.generation(), 1);
  // The old plan's state is what it was before the attempt, and training
  // goes on under it.
  absl::StatusOr<FullState> after = d.Gather("after");
  ASSERT_TRUE(after.ok()) << after.status();
  EXPECT_TRUE(*before == *after);
  ASSERT_TRUE(d.TrainUntil(4).ok());
  auto reference = RunPlan(TinyJob(), PlanA(ab), ab, 4);
  ASSERT_TRUE(reference.ok());
  for (const auto& [i, loss] : d.losses()) {
    EXPECT_EQ(loss, reference->losses[i - 1]) << "iteration " << i;
  }
}

INSTANTIATE_TEST_SUITE_P(Steps, LiveSwitchFault,
                         ::testing::Values(SwitchStep::kBeforeStage1,
                                           SwitchStep::kBeforeStage2,
                                           SwitchStep::kBeforeRebuild),
                         [](const auto& info) {
                           switch (info.param) {
                             case SwitchStep::kBeforeStage1:
                               return std::string("InStage1");
                             case SwitchStep::kBeforeStage2:
                               return std::string("InStage2");
                             default:
                               return std::string("InRebuild");
                           }
                         });

TEST(LiveSwitch, CorruptedTransferIsDataLossAndAborts) {
  const std::string dir = TempDir("corrupt");
  Driver d(TinyJob(), dir);
  d.Agent("a", 2);
  d.Agent("b", 2);
  const Cluster ab = NamedCluster({{"a", 2}, {"b", 2}});
  ASSERT_TRUE(d.Start(PlanA(ab), ab).ok());
  ASSERT_TRUE(d.TrainUntil(2).ok());
  absl::StatusOr<FullState> before = d.Gather("before");
  ASSERT_TRUE(before.ok());
  // The joiner's replica receives everything from other pipelines (stage 2).
  d.Agent("c", 2, {"--failpoint", "corrupt-migration-stage-2"});
  const Cluster abc = NamedCluster({{"a", 2}, {"b", 2}, {"c", 2}});
  const Plan joined{{Place({{1, 0, 2}, {1, 2, 4}}, 3, 2, 8,
                           {{0, 0}, {1, 0}, {0, 1}, {1, 1}, {2, 0}, {2, 1}})}};
  absl::Status sw = d.Switch(joined, abc);
  EXPECT_EQ(sw.code(), absl::StatusCode::kDataLoss) << sw;
  EXPECT_THAT(sw.message(), HasSubstr("checksum of the received bytes differs"));
  EXPECT_EQ(d.generation(), 1);
  absl::StatusOr<FullState> after = d.Gather("after");
  ASSERT_TRUE(after.ok());
  EXPECT_TRUE(*before == *after);
  ASSERT_TRUE(d.TrainUntil(3).ok());
}

TEST(LiveSwitch, CheckpointRestoreEqualsLiveMigration) {
  const std::string dir = TempDir("ckpt");
  Driver d(TinyJob(), dir);
  d.Agent("a", 2);
  d.Agent("b", 2);
  const Cluster ab = NamedCluster({{"a", 2}, {"b", 2}});
  ASSERT_TRUE(d.Start(PlanA(ab), ab).ok());
  ASSERT_TRUE(d.TrainUntil(2).ok());
  ASSERT_TRUE(d.Gather("ckpt-gen1").ok());
  const Plan tp2{{Place({{2, 0, 4}}, 2, 2, 8, {{0, 0}, {0, 1}, {1, 0}, {1, 1}})}};
  ASSERT_TRUE(d.Switch(tp2, ab).ok());
  absl::StatusOr<FullState> live = d.Gather("live");
  ASSERT_TRUE(live.ok());
  // Generation 3 restored from generation 1's checkpoint on another plan.
  const Plan pp4{{Place({{1, 0, 1}, {1, 1, 2}, {1, 2, 3}, {1, 3, 4}}, 1, 2, 8,
                        {{0, 0}, {0, 1}, {1, 0}, {1, 1}})}};
  ASSERT_TRUE(d.Switch(pp4, ab, SwitchStep::kNone, nullptr, dir + "/ckpt-gen1").ok());
  absl::StatusOr<FullState> restored = d.Gather("restored");
  ASSERT_TRUE(restored.ok());
  EXPECT_TRUE(*live == *restored);
}

TEST(LiveSwitch, BadRpcsAreRefusedPrecisely) {
  const std::string dir = TempDir("bad");
  Driver d(TinyJob(), dir);
  testing::AgentProcess* a = d.Agent("a", 2);
  d.Agent("b", 2);
  const Cluster ab = NamedCluster({{"a", 2}, {"b", 2}});
  ASSERT_TRUE(d.Start(PlanA(ab), ab).ok());
  // Stale and future generations.
  absl::Status s = a->client().Commit(7);
  EXPECT_EQ(s.code(), absl::StatusCode::kFailedPrecondition) << s;
  EXPECT_THAT(s.message(), HasSubstr("generation 7 is not prepared on node a"));
  s = a->client().Migrate(1, 1, absl::Seconds(1));
  EXPECT_EQ(s.code(), absl::StatusCode::kFailedPrecondition) << s;
  // A transfer-round timeout that cannot be.
  s = a->client().Migrate(1, 1, absl::Seconds(1), absl::Seconds(-2));
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument) << s;
  EXPECT_THAT(s.message(), HasSubstr("round_timeout_s: must be >= 0 seconds "
                                     "(0 = the phase timeout), got -2"));
  s = a->client().Resume(2, 0);
  EXPECT_EQ(s.code(), absl::StatusCode::kFailedPrecondition) << s;
  EXPECT_THAT(s.message(), HasSubstr("generation 2 is not current on node a (current 1)"));
  // A cluster naming GPUs this node lacks.
  PrepareArgs args;
  args.generation = 2;
  args.job = TinyJob();
  args.cluster = NamedCluster({{"a", 4}, {"b", 2}});
  args.plan = PlanA(args.cluster);
  args.old_plan = PlanA(ab);
  args.old_cluster = ab;
  args.store_address = "127.0.0.1:1";
  absl::StatusOr<PrepareResult> p = a->client().Prepare(args, testing::Catalog());
  EXPECT_EQ(p.status().code(), absl::StatusCode::kInvalidArgument) << p.status();
  EXPECT_THAT(p.status().message(),
              HasSubstr("cluster.nodes[0] (a): 4 GPUs of type A6000, but this "
                        "agent has 2 of type A6000"));
  // A stale generation to prepare.
  args.cluster = ab;
  args.generation = 1;
  p = a->client().Prepare(args, testing::Catalog());
  EXPECT_EQ(p.status().code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_THAT(p.status().message(), HasSubstr("generation 1 is not newer"));
  // Nothing changed: training runs on.
  ASSERT_TRUE(d.TrainUntil(2).ok());
}

}  // namespace
}  // namespace arachne::agent
