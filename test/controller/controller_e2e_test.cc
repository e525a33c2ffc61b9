// The controller end to end: real arachne-agent processes with virtual
// GPUs that register themselves (--controller) and renew their leases, a
// real arachne-controller process (embedded planner, SQLite state database, the
// job's TCPStore) on 127.0.0.1, all driven through their gRPC services.
// Two agents register and training starts; a third registers (a join); the
// controller replans, decides and — by the rule of docs/controller.md —
// switches live or keeps the plan. Training must go on as if nothing had
// happened: the loss of every iteration equals that of a run without the
// switch (RunPlan, in process) within 1e-4.
#include <cmath>
#include <cstdio>
#include <map>
#include <set>
#include <string>
#include <vector>

#include "absl/strings/match.h"
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

// The calibration loop live: the controller measures each generation's
// iteration time on the agents (CPU ranks, so ~500 times slower than the
// A6000 the cost model prices), fits the corrections on what it measured,
// shows measured, raw and corrected predictions, keeps them across its own
// restart and decides the join on corrected throughputs.
TEST(ControllerE2E, MeasuredIterationTimesCorrectThePredictions) {
  const std::string dir = TempDir("measure");
  ControllerProcess controller(dir);
  const std::string job = testing::JobYaml(
      testing::JobOptions().Iterations(16).Lease(5).Extra(
          "measure_warmup_iterations: 1\nmeasure_window: 5"));
  ASSERT_TRUE(controller.Start(job).ok());
  std::unique_ptr<AgentProcess> a = StartAgent("a", 2, dir, controller);
  std::unique_ptr<AgentProcess> b = StartAgent("b", 1, dir, controller);

  // Generation 1 measured 3 iterations after its warm-up: fitted on it.
  absl::StatusOr<v1::GetStatusResponse> st = WaitFor(
      controller,
      [](const v1::GetStatusResponse& s) {
        return s.generation() == 1 && s.corrections().generations() >= 1;
      },
      absl::Seconds(40), "generation 1 measured and fitted");
  ASSERT_TRUE(st.ok()) << st.status();
  {
    const v1::GenerationMeasurement& m = st->measurement();
    EXPECT_EQ(m.generation(), 1);
    EXPECT_EQ(m.cluster(), "a: 2 x A6000, b: 1 x A6000");
    EXPECT_EQ(m.first_iteration(), 0);
    EXPECT_EQ(m.warmup_iterations(), 1);
    EXPECT_GE(m.iterations_measured(), 3);
    EXPECT_GT(m.measured_iteration_s(), 0);
    // The raw prediction is the plan's own.
    EXPECT_DOUBLE_EQ(m.predicted_iteration_s(), st->plan().iteration_time_s());
    EXPECT_GT(m.predicted_iteration_s(), 0);
    // CPU ranks are far slower than the A6000 the model prices.
    EXPECT_GT(m.measured_iteration_s(), 10 * m.predicted_iteration_s());
    // Fitted on this generation alone, the compute scale explains it.
    EXPECT_NEAR(m.corrected_iteration_s(), m.measured_iteration_s(),
                0.1 * m.measured_iteration_s())
        << "compute_scale " << st->corrections().compute_scale().at("A6000")
        << " needed x" << m.measured_iteration_s() / m.corrected_iteration_s()
        << " more (FitCorrections bounds it); " << m.ShortDebugString();
    EXPECT_GT(m.measured_peak_gib(), 0);
    EXPECT_GT(m.predicted_peak_gib(), 0);
    // PP 2 on b and one GPU of a: each node's agent measured its peak.
    ASSERT_EQ(m.memory_size(), 2) << m.ShortDebugString();
    EXPECT_EQ(m.memory(0).node(), "a");
    EXPECT_EQ(m.memory(0).gpus(), 1);
    EXPECT_GT(m.memory(0).peak_rss_bytes(), 0);
    EXPECT_EQ(m.memory(1).node(), "b");
    EXPECT_EQ(m.memory(1).gpus(), 1);
    EXPECT_GT(m.memory(1).peak_rss_bytes(), 0);
    EXPECT_DOUBLE_EQ(m.memory(0).predicted_gib(),
                     st->plan().templates(0).stages(1).memory_gib());
    ASSERT_EQ(st->corrections().compute_scale().count("A6000"), 1u)
        << st->corrections().ShortDebugString();
    EXPECT_GT(st->corrections().compute_scale().at("A6000"), 10);
    EXPECT_THAT(st->corrections().summary(),
                ::testing::StartsWith("compute_scale A6000 "));
    EXPECT_THAT(st->corrections().note(),
                ::testing::HasSubstr("fitted on 1 generation (1)"));
  }
  const v1::GetStatusResponse fitted = *st;

  // A restart: the record and the corrections are read back from the state
  // database.
  controller.Kill();
  ASSERT_TRUE(controller.Start(job).ok());
  st = WaitFor(
      controller,
      [](const v1::GetStatusResponse& s) { return s.generation() == 1; },
      absl::Seconds(20), "the restarted controller");
  ASSERT_TRUE(st.ok()) << st.status();
  EXPECT_GE(st->measurement().iterations_measured(),
            fitted.measurement().iterations_measured());
  EXPECT_EQ(st->corrections().summary(), fitted.corrections().summary());
  EXPECT_GT(st->measurement().corrected_iteration_s(), 0);
  ASSERT_EQ(st->generations_size(), 1);

  // The join is decided on corrected throughputs, the raw ones beside them.
  std::unique_ptr<AgentProcess> c = StartAgent("c", 1, dir, controller);
  st = WaitFor(
      controller,
      [](const v1::GetStatusResponse& s) { return s.decisions_size() > 0; },
      absl::Seconds(30), "a decision on the join");
  ASSERT_TRUE(st.ok()) << st.status();
  const v1::Decision d = st->decisions(0);
  EXPECT_THAT(d.trigger(), ::testing::HasSubstr("join c"));
  EXPECT_THAT(d.corrections(), ::testing::StartsWith("compute_scale A6000 "));
  EXPECT_THAT(d.reason(), ::testing::HasSubstr("it/s corrected; raw "));
  EXPECT_GT(d.old_throughput_raw(), 10 * d.old_throughput()) << d.ShortDebugString();
  EXPECT_GT(d.new_throughput_raw(), 10 * d.new_throughput()) << d.ShortDebugString();
  // The current plan on the new cluster (c unused) is generation 1's plan:
  // its corrected throughput is 1 / generation 1's corrected time.
  EXPECT_NEAR(d.old_throughput(), 1 / st->measurement().corrected_iteration_s(),
              0.01 * d.old_throughput());
  if (d.verdict() == "switch") {
    // Generation 2 measured too: the fit is on both.
    st = WaitFor(
        controller,
        [](const v1::GetStatusResponse& s) {
          return s.generation() == 2 && s.corrections().generations() >= 2;
        },
        absl::Seconds(40), "generation 2 measured and fitted");
    ASSERT_TRUE(st.ok()) << st.status();
    const v1::GenerationMeasurement& m = st->measurement();
    EXPECT_EQ(m.generation(), 2);
    EXPECT_GT(m.first_iteration(), 0);
    EXPECT_GT(m.measured_iteration_s(), 0);
    // Generation 2's plan was searched on corrected costs (the query
    // carried the fitted compute scale): the planner's prediction is the
    // CPU-scale one, the raw prediction the controller priced itself.
    EXPECT_GT(st->plan().iteration_time_s(), 10 * m.predicted_iteration_s())
        << m.ShortDebugString();
    // Two plans the raw model prices alike (per-micro-batch latency
    // dominates on a GPU) that CPU ranks run at different speeds (4 ranks
    // share 2 cores in generation 2): one compute scale explains both only
    // as well as the note says; the corrected prediction is still far
    // closer to the measured time than the raw one.
    EXPECT_LT(std::abs(std::log(m.corrected_iteration_s() / m.measured_iteration_s())),
              std::abs(std::log(m.predicted_iteration_s() / m.measured_iteration_s())))
        << m.ShortDebugString() << " " << st->corrections().ShortDebugString();
    EXPECT_THAT(st->corrections().note(),
                ::testing::HasSubstr("fitted on 2 generations (1, 2)"));
    ASSERT_EQ(st->generations_size(), 2);
    EXPECT_EQ(st->generations(0).generation(), 2);
    EXPECT_EQ(st->generations(1).generation(), 1);
  }
  // `arachne status` shows measured, raw and corrected side by side.
  const std::string cli = absl::StrCat(
      ARACHNE_BINARY_DIR, "/planner_service/cli/arachne status --controller ",
      controller.address(), " 2>&1");
  std::string text;
  if (FILE* p = popen(cli.c_str(), "r")) {
    char buf[4096];
    size_t n;
    while ((n = fread(buf, 1, sizeof(buf), p)) > 0) text.append(buf, n);
    EXPECT_EQ(pclose(p), 0) << text;
  }
  EXPECT_THAT(text, ::testing::ContainsRegex(
                        "iteration: measured [0-9.]+ s \\(median of [0-9]+ "
                        "after 1 warm-up\\), predicted [0-9.e-]+ s raw / "
                        "[0-9.]+ s corrected \\(compute_scale A6000 "));
  EXPECT_THAT(text, ::testing::HasSubstr("memory per GPU: measured "));
  EXPECT_THAT(text, ::testing::HasSubstr("corrections: fitted on "));
  EXPECT_THAT(text, ::testing::HasSubstr(" corrected (raw "));
  LOG(INFO) << "arachne status:\n" << text;
  LOG(INFO) << "decision: " << d.ShortDebugString();
  LOG(INFO) << "measurement: " << st->measurement().ShortDebugString();
  LOG(INFO) << "corrections: " << st->corrections().ShortDebugString();
}

// A first fit far from the profiles replans (replan_correction_factor 2):
// CPU ranks run ~500x slower than the A6000 the first plan was priced at,
// so the plan was chosen on wrong prices. The controller asks for a replan
// on its own, names the moved scale in the trigger, and decides on the
// corrected prices; the replan's fit sets the prices its decision used, so
// the same fit does not ask again.
TEST(ControllerE2E, AFitFarFromTheProfilesReplansOnMeasuredPrices) {
  const std::string dir = TempDir("refit-replan");
  ControllerProcess controller(dir);
  ASSERT_TRUE(controller
                  .Start(testing::JobYaml(
                      testing::JobOptions()
                          .Iterations(14)
                          .Lease(5)
                          .ReplanCorrectionFactor(2)
                          .Extra("measure_warmup_iterations: 1\n"
                                 "measure_window: 5")))
                  .ok());
  std::unique_ptr<AgentProcess> a = StartAgent("a", 2, dir, controller);
  std::unique_ptr<AgentProcess> b = StartAgent("b", 1, dir, controller);
  absl::StatusOr<v1::GetStatusResponse> st = WaitFor(
      controller,
      [](const v1::GetStatusResponse& s) { return s.decisions_size() > 0; },
      absl::Seconds(45), "the replan the first fit asks for");
  ASSERT_TRUE(st.ok()) << st.status();
  ASSERT_EQ(st->decisions_size(), 1);
  const v1::Decision d = st->decisions(0);
  EXPECT_THAT(d.trigger(), ::testing::MatchesRegex(
                               "replan \\(corrections moved "
                               "compute_scale\\[A6000\\] 1 -> [0-9.e+]+\\)"))
      << d.ShortDebugString();
  // Priced on the measured speed: both plans' corrected throughputs far
  // below their raw ones.
  EXPECT_THAT(d.corrections(), ::testing::StartsWith("compute_scale A6000 "));
  EXPECT_GT(d.old_throughput_raw(), 10 * d.old_throughput()) << d.ShortDebugString();
  EXPECT_GT(d.new_throughput_raw(), 10 * d.new_throughput()) << d.ShortDebugString();
  EXPECT_EQ(st->corrections().generations(), 1);
  LOG(INFO) << "decision: " << d.ShortDebugString();
  // Trained to the end, and no second replan for the same fit.
  st = WaitFor(
      controller,
      [](const v1::GetStatusResponse& s) { return s.iteration() >= 14; },
      absl::Seconds(50), "the last iteration");
  ASSERT_TRUE(st.ok()) << st.status();
  int on_corrections = 0;
  for (const v1::Decision& x : st->decisions()) {
    on_corrections += absl::StrContains(x.trigger(), "corrections moved");
  }
  EXPECT_GE(on_corrections, 1);
  EXPECT_LE(on_corrections, st->corrections().generations());
}

// The same loop on the PyTorch engine (python/arachne_torch), for a dense
// and an MoE model: c joins and the controller switches live (each engine
// process moves its share of the schedule), then c drains and the state
// moves off it live again; every iteration's loss follows the unswitched run
// within 1e-4 and the final state the reference engine's within 1e-5.
class OnThePyTorchEngine : public ::testing::TestWithParam<std::string> {};

TEST_P(OnThePyTorchEngine, AJoinAndADrainSwitchLive) {
  constexpr int kTorchIterations = 20;
  const std::string model = GetParam();
  agent::JobSpec job = TinyJob32();
  job.model = *ResolveModel(model);
  const std::vector<std::string> torch = {
      "--engine-command",
      std::string(ARACHNE_BINARY_DIR) + "/python/arachne-torch-engine"};
  const std::string dir = TempDir("torch-" + model);
  ControllerProcess controller(dir);
  ASSERT_TRUE(controller
                  .Start(testing::JobYaml(testing::JobOptions()
                                              .Model(model)
                                              .Iterations(kTorchIterations)
                                              .Lease(5)))
                  .ok());
  std::unique_ptr<AgentProcess> a = StartAgent("a", 2, dir, controller, torch);
  std::unique_ptr<AgentProcess> b = StartAgent("b", 1, dir, controller, torch);
  std::unique_ptr<AgentProcess> c;  // the joiner; outlives the recorder
  LossRecorder recorder({a.get(), b.get()});
  // The join comes once generation 1's iteration times corrected the
  // predictions, so the decision weighs the CPU ranks' real costs (on raw
  // predictions the MoE job keeps its plan: tiny kernels favour fewer GPUs).
  absl::StatusOr<v1::GetStatusResponse> st = WaitFor(
      controller,
      [](const v1::GetStatusResponse& s) {
        return s.generation() == 1 && s.corrections().generations() >= 1;
      },
      absl::Seconds(50), "generation 1 measured");
  ASSERT_TRUE(st.ok()) << st.status();
  const Cluster ab = NamedCluster({{"a", 2}, {"b", 1}});
  absl::StatusOr<Plan> first = PlanOf(st->plan(), ab);
  ASSERT_TRUE(first.ok()) << first.status();

  c = StartAgent("c", 1, dir, controller, torch);
  recorder.Add(c.get());
  st = WaitFor(
      controller,
      [](const v1::GetStatusResponse& s) {
        return s.generation() == 2 && testing::Settled(s);
      },
      absl::Seconds(40), "the join's switch");
  ASSERT_TRUE(st.ok()) << st.status();
  // The new plan uses more GPUs (c, or a's second: the planner's choice),
  // which received their state live.
  EXPECT_EQ(st->last_switch().outcome(), "committed");
  EXPECT_GT(st->last_switch().bytes_moved(), 0);
  EXPECT_LT(st->last_switch().paused_at_iteration(), kTorchIterations);

  // Drain a node the plan uses (c when it does), so the plan must change.
  const std::set<std::string> used = PlanNodes(st->plan());
  const std::string drained =
      used.count("c") ? "c" : used.count("b") ? "b" : "a";
  std::vector<AgentProcess*> staying;
  for (AgentProcess* p : {a.get(), b.get(), c.get()}) {
    if (p->node() != drained) staying.push_back(p);
  }
  {
    grpc::ClientContext ctx;
    v1::DrainNodeRequest r;
    r.set_node(drained);
    r.set_deadline_s(30);
    v1::DrainNodeResponse out;
    grpc::Status s = controller.stub().DrainNode(&ctx, r, &out);
    ASSERT_TRUE(s.ok()) << s.error_message();
  }
  st = WaitFor(
      controller,
      [](const v1::GetStatusResponse& s) {
        return s.generation() == 3 && testing::Settled(s);
      },
      absl::Seconds(30), "the drain's switch");
  ASSERT_TRUE(st.ok()) << st.status();
  // Off the drained node. (Nothing may need to move: the GPUs that stay
  // can hold replicas of everything.)
  EXPECT_EQ(PlanNodes(st->plan()).count(drained), 0u)
      << drained << ": " << st->plan().ShortDebugString();
  EXPECT_EQ(st->last_switch().outcome(), "committed");
  EXPECT_LT(st->last_switch().paused_at_iteration(), kTorchIterations)
      << "the drain came after training ended: nothing was switched live";

  st = WaitFor(
      controller,
      [](const v1::GetStatusResponse& s) {
        return s.iteration() >= kTorchIterations;
      },
      absl::Seconds(60), "the last iteration");
  ASSERT_TRUE(st.ok()) << st.status();
  absl::SleepFor(absl::Milliseconds(50));  // the recorder's last poll
  auto reference = RunPlan(job, *first, ab, kTorchIterations);
  ASSERT_TRUE(reference.ok()) << reference.status();
  const std::map<int64_t, double> losses = recorder.losses();
  ASSERT_GE(losses.size(), size_t{kTorchIterations} - 2);
  for (const auto& [i, loss] : losses) {
    ASSERT_LE(i, kTorchIterations);
    EXPECT_NEAR(loss, reference->losses[i - 1], 1e-4 * std::abs(loss))
        << "iteration " << i;
  }
  absl::StatusOr<agent::FullState> end =
      testing::GatherState(staying, 3, dir + "/end", job);
  ASSERT_TRUE(end.ok()) << end.status();
  EXPECT_LE(agent::testing::MaxMasterDifference(job, *end, reference->state),
            1e-5);
}

INSTANTIATE_TEST_SUITE_P(Models, OnThePyTorchEngine,
                         ::testing::Values("tiny-gpt", "tiny-moe"),
                         [](const auto& info) {
                           return std::string(info.param == "tiny-gpt"
                                                  ? "Dense"
                                                  : "Moe");
                         });

}  // namespace
}  // namespace arachne::controller
