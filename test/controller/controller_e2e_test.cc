// The controller end to end: real arachne-agent processes with virtual
// GPUs that register themselves (--controller) and renew their leases, a
// real arachne-controller process (embedded planner, SQLite store, the
// job's TCPStore) on 127.0.0.1, all driven through their gRPC services.
// Two agents register and training starts; a third registers (a join); the
// controller replans, decides and — by the rule of docs/controller.md —
// switches live or keeps the plan. Training must go on as if nothing had
// happened: the loss of every iteration equals that of a run without the
// switch (RunPlan, in process) within 1e-4.
#include <map>
#include <set>
#include <string>
#include <vector>

#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "test/controller/controller_harness.h"

namespace arachne::controller {
namespace {

using agent::testing::AgentProcess;
using agent::testing::NamedCluster;
using agent::testing::RunPlan;
using testing::ControllerProcess;
using testing::LossRecorder;
using testing::PlanNodes;
using testing::PlanOf;
using testing::StartAgent;
using testing::TempDir;
using testing::TinyJob32;
using testing::WaitFor;

constexpr int kIterations = 8;

struct JoinRun {
  v1::GetStatusResponse before, after;
  std::map<int64_t, double> losses;
  Plan first_plan;
  Cluster first_cluster;
};

// a (2 GPUs) and b (1) train; c (1) joins at iteration >= 2. Each agent
// registers itself as it starts.
void RunJoin(const std::string& name, double horizon_s, JoinRun* run,
             bool expect_switch) {
  const std::string dir = TempDir(name);
  ControllerProcess controller(dir);
  ASSERT_TRUE(controller
                  .Start(testing::JobYaml(testing::JobOptions()
                                              .Iterations(kIterations)
                                              .Horizon(horizon_s)
                                              .Lease(5)))
                  .ok());
  std::unique_ptr<AgentProcess> a = StartAgent("a", 2, dir, controller);
  std::unique_ptr<AgentProcess> b = StartAgent("b", 1, dir, controller);
  std::unique_ptr<AgentProcess> c;  // the joiner; outlives the recorder
  LossRecorder recorder({a.get(), b.get()});

  absl::StatusOr<v1::GetStatusResponse> st = WaitFor(
      controller,
      [](const v1::GetStatusResponse& s) {
        return s.generation() == 1 && s.iteration() >= 2;
      },
      absl::Seconds(40), "generation 1 training");
  ASSERT_TRUE(st.ok()) << st.status();
  run->before = *st;
  EXPECT_EQ(PlanNodes(st->plan()), (std::set<std::string>{"a", "b"}));
  // The agents registered what they are, at the address they serve on.
  ASSERT_EQ(st->members_size(), 2);
  EXPECT_EQ(st->members(0).node(), "a");
  EXPECT_EQ(st->members(0).gpus(), 2);
  EXPECT_EQ(st->members(0).gpu_type(), "A6000");
  EXPECT_EQ(st->members(0).address(), a->client().address());
  EXPECT_GT(st->members(0).memory_gib(), 0);
  run->first_cluster = NamedCluster({{"a", 2}, {"b", 1}});
  absl::StatusOr<Plan> first = PlanOf(st->plan(), run->first_cluster);
  ASSERT_TRUE(first.ok()) << first.status();
  run->first_plan = *first;

  c = StartAgent("c", 1, dir, controller);
  recorder.Add(c.get());
  st = WaitFor(
      controller,
      [](const v1::GetStatusResponse& s) { return s.decisions_size() > 0; },
      absl::Seconds(30), "a decision on the join");
  ASSERT_TRUE(st.ok()) << st.status();
  if (expect_switch) {
    st = WaitFor(
        controller,
        [](const v1::GetStatusResponse& s) {
          return s.generation() == 2 && s.phase() != "" &&
                 s.phase().rfind("switching", 0) != 0;
        },
        absl::Seconds(40), "generation 2");
    ASSERT_TRUE(st.ok()) << st.status();
  }
  st = WaitFor(
      controller,
      [](const v1::GetStatusResponse& s) { return s.iteration() >= kIterations; },
      absl::Seconds(50), "the last iteration");
  ASSERT_TRUE(st.ok()) << st.status();
  run->after = *st;
  absl::SleepFor(absl::Milliseconds(50));  // the recorder's last poll
  run->losses = recorder.losses();
}

void ExpectLossesMatchTheUnswitchedRun(const JoinRun& run, double rel) {
  auto reference = RunPlan(TinyJob32(), run.first_plan, run.first_cluster,
                           kIterations);
  ASSERT_TRUE(reference.ok()) << reference.status();
  // Polled every 20 ms, iterations of ~1 s: every one is seen, or nearly.
  ASSERT_GE(run.losses.size(), size_t{kIterations} - 1);
  EXPECT_EQ(run.losses.rbegin()->first, kIterations);
  for (const auto& [i, loss] : run.losses) {
    ASSERT_LE(i, kIterations);
    EXPECT_NEAR(loss, reference->losses[i - 1], rel * std::abs(loss))
        << "iteration " << i;
  }
}

TEST(ControllerE2E, AJoinIsPlannedDecidedAndSwitchedLive) {
  JoinRun run;
  ASSERT_NO_FATAL_FAILURE(RunJoin("join", 3600, &run, /*expect_switch=*/true));
  const v1::GetStatusResponse& s = run.after;
  EXPECT_EQ(s.generation(), 2);
  EXPECT_TRUE(PlanNodes(s.plan()).count("c") > 0) << s.plan().ShortDebugString();
  ASSERT_GE(s.decisions_size(), 1);
  const v1::Decision& d = s.decisions(0);
  EXPECT_EQ(d.verdict(), "switch") << d.ShortDebugString();
  EXPECT_EQ(d.generation(), 2);
  EXPECT_THAT(d.trigger(), ::testing::HasSubstr("join c"));
  EXPECT_GT(d.new_throughput(), d.old_throughput());
  EXPECT_DOUBLE_EQ(d.horizon_s(), 3600);
  EXPECT_GT(d.gain_s(), d.downtime_estimate_s());
  // The decision's own timings: the planner call is part of it.
  EXPECT_GT(d.planning_s(), 0);
  EXPECT_GE(d.decision_s(), d.planning_s());
  EXPECT_EQ(s.last_switch().outcome(), "committed");
  EXPECT_GT(s.last_switch().bytes_stage1() + s.last_switch().bytes_stage2(), 0);
  EXPECT_EQ(s.last_switch().bytes_stage1() + s.last_switch().bytes_stage2(),
            s.last_switch().bytes_moved());
  EXPECT_GT(s.last_switch().downtime_s(), 0);
  EXPECT_GT(s.last_switch().paused_at_iteration(), 0);
  EXPECT_LT(s.last_switch().paused_at_iteration(), kIterations)
      << "the join came after training ended: nothing was switched live";
  ExpectLossesMatchTheUnswitchedRun(run, 1e-4);
}

TEST(ControllerE2E, AJoinThatGainsTooLittleKeepsThePlan) {
  // The same join over a 1 s horizon: the new plan saves ~0.006 s, the
  // switch would cost the 2 s prior.
  JoinRun run;
  ASSERT_NO_FATAL_FAILURE(RunJoin("keep", 1, &run, /*expect_switch=*/false));
  const v1::GetStatusResponse& s = run.after;
  EXPECT_EQ(s.generation(), 1);
  EXPECT_EQ(PlanNodes(s.plan()), (std::set<std::string>{"a", "b"}));
  ASSERT_GE(s.decisions_size(), 1);
  const v1::Decision& d = s.decisions(0);
  EXPECT_EQ(d.verdict(), "keep") << d.ShortDebugString();
  EXPECT_EQ(d.generation(), 0);
  EXPECT_GT(d.new_throughput(), d.old_throughput());
  EXPECT_LT(d.gain_s(), d.downtime_estimate_s());
  EXPECT_THAT(d.reason(), ::testing::HasSubstr("does not beat"));
  EXPECT_GT(d.planning_s(), 0);
  EXPECT_GE(d.decision_s(), d.planning_s());
  // Nothing switched: the losses are the unswitched run's, exactly.
  ExpectLossesMatchTheUnswitchedRun(run, 0);
}

}  // namespace
}  // namespace arachne::controller
