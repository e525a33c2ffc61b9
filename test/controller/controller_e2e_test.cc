// The controller end to end: real arachne-agent processes with virtual
// GPUs, a real arachne-controller process (embedded planner, SQLite store,
// the job's TCPStore) on 127.0.0.1, all driven through their gRPC services.
// Two agents register and training starts; a third registers (a join); the
// controller replans, decides and — by the rule of docs/controller.md —
// switches live or keeps the plan. Training must go on as if nothing had
// happened: the loss of every iteration equals that of a run without the
// switch (RunPlan, in process) within 1e-4.
//
// The agents have no Register loop of their own yet, so the test registers
// each agent with the controller and keeps its lease alive by Heartbeat, as
// the agent would.
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <atomic>
#include <filesystem>
#include <fstream>
#include <map>
#include <set>
#include <string>
#include <thread>
#include <vector>

#include "absl/synchronization/mutex.h"
#include "arachne/v1/controller.grpc.pb.h"
#include "gmock/gmock.h"
#include "google/protobuf/util/json_util.h"
#include "grpcpp/grpcpp.h"
#include "gtest/gtest.h"
#include "planner_service/io/plan_io.h"
#include "test/agent/agent_harness.h"

namespace arachne::controller {
namespace {

using agent::testing::AgentProcess;
using agent::testing::Catalog;
using agent::testing::NamedCluster;
using agent::testing::RunPlan;

std::string TempDir(const std::string& name) {
  std::string d = std::string(::testing::TempDir()) + "arachne-controller-" +
                  name + "-" + std::to_string(getpid());
  std::filesystem::remove_all(d);
  std::filesystem::create_directories(d);
  return d;
}

// tiny-gpt at seq_len 32, global batch 32: the smallest shape for which
// the cost model prefers the plan with the joining GPU (665.6 -> 669.4
// it/s on 2+1 -> 2+1+1 A6000s, docs/controller.md); at global batch 16
// every join makes the predicted plan slower, so a join never switches.
agent::JobSpec TinyJob32() {
  agent::JobSpec job = agent::testing::TinyJob();
  job.training.seq_len = 32;
  job.training.global_batch = 32;
  return job;
}

constexpr int kIterations = 8;

std::string JobYaml(double horizon_s) {
  return absl::StrCat(R"(model: {name: tiny-gpt}
training: {seq_len: 32, global_batch: 32}
engine: {learning_rate: 0.001, data_seed: 7, init_seed: 11}
iterations: )", kIterations, R"(
min_gpus: 3
join_window_s: 0.3
switch_horizon_s: )", horizon_s, R"(
switch_fixed_cost_s: 2
timeouts: {lease_s: 5, transfer_round_s: 10, phase_s: 20, switch_s: 50}
planner: {planner: exact, budget_s: 2}
)");
}

// One arachne-controller process.
class ControllerProcess {
 public:
  explicit ControllerProcess(std::string dir) : dir_(std::move(dir)) {}
  ~ControllerProcess() { Stop(); }

  absl::Status Start(const std::string& job_yaml) {
    const std::string job = dir_ + "/job.yaml";
    std::ofstream(job) << job_yaml;
    const std::string port_file = dir_ + "/controller.port";
    std::filesystem::remove(port_file);
    const std::string log = dir_ + "/controller.log";
    std::vector<std::string> argv = {
        std::string(ARACHNE_BINARY_DIR) + "/controller/arachne-controller",
        "--job", job, "--state-dir", dir_ + "/state", "--listen",
        "127.0.0.1:0", "--port-file", port_file};
    pid_ = fork();
    if (pid_ == 0) {
      FILE* f = freopen(log.c_str(), "w", stderr);
      (void)f;
      std::vector<char*> args;
      for (std::string& a : argv) args.push_back(a.data());
      args.push_back(nullptr);
      execv(args[0], args.data());
      _exit(127);
    }
    const absl::Time deadline = absl::Now() + absl::Seconds(30);
    while (absl::Now() < deadline) {
      std::ifstream f(port_file);
      int port = 0;
      if (f >> port && port > 0) {
        stub_ = v1::Controller::NewStub(grpc::CreateChannel(
            absl::StrCat("127.0.0.1:", port), grpc::InsecureChannelCredentials()));
        return absl::OkStatus();
      }
      int st = 0;
      if (waitpid(pid_, &st, WNOHANG) == pid_) {
        pid_ = -1;
        return absl::InternalError(absl::StrCat("controller exited; see ", log));
      }
      absl::SleepFor(absl::Milliseconds(20));
    }
    return absl::DeadlineExceededError("controller did not start");
  }
  void Stop() {
    if (pid_ > 0) {
      kill(pid_, SIGTERM);
      waitpid(pid_, nullptr, 0);
      pid_ = -1;
    }
  }
  v1::Controller::Stub& stub() { return *stub_; }

  absl::StatusOr<v1::GetStatusResponse> Status() {
    grpc::ClientContext ctx;
    ctx.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(10));
    v1::GetStatusResponse r;
    grpc::Status s = stub_->GetStatus(&ctx, v1::GetStatusRequest(), &r);
    if (!s.ok()) return absl::UnavailableError(s.error_message());
    return r;
  }

 private:
  std::string dir_;
  pid_t pid_ = -1;
  std::unique_ptr<v1::Controller::Stub> stub_;
};

// Registers an agent with the controller and renews its lease, as the
// agent itself would.
class Registration {
 public:
  Registration(ControllerProcess* controller, AgentProcess* agent, int gpus)
      : controller_(controller), agent_(agent) {
    v1::RegisterRequest r;
    r.set_node(agent->node());
    r.set_gpu_type("A6000");
    r.set_gpus(gpus);
    r.set_address(agent->client().address());
    grpc::ClientContext ctx;
    v1::RegisterResponse out;
    status_ = controller_->stub().Register(&ctx, r, &out);
    thread_ = std::thread([this]() {
      while (!stop_) {
        absl::SleepFor(absl::Milliseconds(500));
        v1::HeartbeatRequest h;
        h.set_node(agent_->node());
        grpc::ClientContext ctx;
        v1::HeartbeatResponse out;
        controller_->stub().Heartbeat(&ctx, h, &out);
      }
    });
  }
  ~Registration() {
    stop_ = true;
    thread_.join();
  }
  const grpc::Status& status() const { return status_; }

 private:
  ControllerProcess* controller_;
  AgentProcess* agent_;
  grpc::Status status_;
  std::atomic<bool> stop_{false};
  std::thread thread_;
};

// Polls the agents' Status for the loss of every iteration they report.
class LossRecorder {
 public:
  explicit LossRecorder(std::vector<AgentProcess*> agents)
      : agents_(std::move(agents)) {
    thread_ = std::thread([this]() {
      while (!stop_) {
        for (AgentProcess* a : agents_) {
          absl::StatusOr<agent::NodeStatus> st = a->client().Status(0);
          if (!st.ok()) continue;
          absl::MutexLock lock(&mu_);
          for (const agent::RankStatus& r : st->ranks) {
            if (r.in_plan && r.iteration > 0 && r.loss != 0) {
              losses_[r.iteration] = r.loss;
            }
          }
        }
        absl::SleepFor(absl::Milliseconds(5));
      }
    });
  }
  ~LossRecorder() {
    stop_ = true;
    thread_.join();
  }
  std::map<int64_t, double> losses() {
    absl::MutexLock lock(&mu_);
    return losses_;
  }

 private:
  std::vector<AgentProcess*> agents_;
  absl::Mutex mu_;
  std::map<int64_t, double> losses_;
  std::atomic<bool> stop_{false};
  std::thread thread_;
};

// Waits until `pred(status)` holds; the last status, or an error.
absl::StatusOr<v1::GetStatusResponse> WaitFor(
    ControllerProcess& c,
    const std::function<bool(const v1::GetStatusResponse&)>& pred,
    absl::Duration timeout, const std::string& what) {
  const absl::Time deadline = absl::Now() + timeout;
  v1::GetStatusResponse last;
  while (absl::Now() < deadline) {
    absl::StatusOr<v1::GetStatusResponse> s = c.Status();
    if (s.ok()) {
      last = *s;
      if (pred(*s)) return s;
    }
    absl::SleepFor(absl::Milliseconds(20));
  }
  return absl::DeadlineExceededError(absl::StrCat(
      "waiting for ", what, "; last status: ", last.ShortDebugString()));
}

std::set<std::string> PlanNodes(const v1::PlanDocument& plan) {
  std::set<std::string> out;
  for (const v1::Template& t : plan.templates()) {
    for (const v1::ReplicaPlacement& r : t.placement()) {
      for (const v1::StagePlacement& s : r.stages()) out.insert(s.node());
    }
  }
  return out;
}

absl::StatusOr<Plan> PlanOf(const v1::PlanDocument& doc, const Cluster& cluster) {
  std::string text;
  google::protobuf::util::JsonPrintOptions o;
  o.preserve_proto_field_names = true;
  (void)google::protobuf::util::MessageToJsonString(doc, &text, o);
  nlohmann::json j = nlohmann::json::parse(text);
  return PlanFromJson(nlohmann::json{{"templates", j["templates"]}}, cluster,
                      Catalog(), "plan");
}

struct JoinRun {
  v1::GetStatusResponse before, after;
  std::map<int64_t, double> losses;
  Plan first_plan;
  Cluster first_cluster;
};

// a (2 GPUs) and b (1) train; c (1) joins at iteration >= 2.
void RunJoin(const std::string& name, double horizon_s, JoinRun* run,
             bool expect_switch) {
  const std::string dir = TempDir(name);
  AgentProcess a("a", 2, dir), b("b", 1, dir), c("c", 1, dir);
  ASSERT_TRUE(a.Start().ok());
  ASSERT_TRUE(b.Start().ok());
  ASSERT_TRUE(c.Start().ok());
  ControllerProcess controller(dir);
  ASSERT_TRUE(controller.Start(JobYaml(horizon_s)).ok());
  LossRecorder recorder({&a, &b, &c});
  Registration ra(&controller, &a, 2), rb(&controller, &b, 1);
  ASSERT_TRUE(ra.status().ok()) << ra.status().error_message();
  ASSERT_TRUE(rb.status().ok()) << rb.status().error_message();

  absl::StatusOr<v1::GetStatusResponse> st = WaitFor(
      controller,
      [](const v1::GetStatusResponse& s) {
        return s.generation() == 1 && s.iteration() >= 2;
      },
      absl::Seconds(40), "generation 1 training");
  ASSERT_TRUE(st.ok()) << st.status();
  run->before = *st;
  EXPECT_EQ(PlanNodes(st->plan()), (std::set<std::string>{"a", "b"}));
  run->first_cluster = NamedCluster({{"a", 2}, {"b", 1}});
  absl::StatusOr<Plan> first = PlanOf(st->plan(), run->first_cluster);
  ASSERT_TRUE(first.ok()) << first.status();
  run->first_plan = *first;

  Registration rc(&controller, &c, 1);
  ASSERT_TRUE(rc.status().ok()) << rc.status().error_message();
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
  // Polled every 5 ms, iterations of ~1 s: every one is seen, or nearly.
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
  EXPECT_EQ(s.last_switch().outcome(), "committed");
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
  // Nothing switched: the losses are the unswitched run's, exactly.
  ExpectLossesMatchTheUnswitchedRun(run, 0);
}

}  // namespace
}  // namespace arachne::controller
