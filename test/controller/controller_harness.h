// What the controller's end-to-end tests start, kill and check: a real
// arachne-controller process on a fixed loopback port (so that it can be
// killed and restarted on the same --state-dir and the agents, given that
// address with --controller, find it again), real arachne-agent processes
// that register themselves, and the status, event and state readers the
// tests assert on.
#ifndef ARACHNE_TEST_CONTROLLER_CONTROLLER_HARNESS_H_
#define ARACHNE_TEST_CONTROLLER_CONTROLLER_HARNESS_H_

#include <netinet/in.h>
#include <signal.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include <atomic>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <functional>
#include <map>
#include <memory>
#include <set>
#include <string>
#include <thread>
#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/synchronization/mutex.h"
#include "arachne/v1/controller.grpc.pb.h"
#include "google/protobuf/util/json_util.h"
#include "grpcpp/grpcpp.h"
#include "gtest/gtest.h"
#include "planner_service/io/plan_io.h"
#include "test/agent/agent_harness.h"

namespace arachne::controller::testing {

using agent::testing::AgentProcess;
using agent::testing::Catalog;

inline std::string TempDir(const std::string& name) {
  std::string d = std::string(::testing::TempDir()) + "arachne-controller-" +
                  name + "-" + std::to_string(getpid());
  std::filesystem::remove_all(d);
  std::filesystem::create_directories(d);
  return d;
}

// A loopback port nobody listens on now (bound, read back, closed).
inline int FreePort() {
  int fd = socket(AF_INET, SOCK_STREAM, 0);
  sockaddr_in a{};
  a.sin_family = AF_INET;
  a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  a.sin_port = 0;
  CHECK_EQ(bind(fd, reinterpret_cast<sockaddr*>(&a), sizeof(a)), 0);
  socklen_t len = sizeof(a);
  CHECK_EQ(getsockname(fd, reinterpret_cast<sockaddr*>(&a), &len), 0);
  close(fd);
  return ntohs(a.sin_port);
}

// tiny-gpt at seq_len 32, global batch 32 (docs/controller.md): on A6000s
// a (2) + b (1) train PP 2 on b, a; with c (1) the planner prefers 2
// replicas x 2 stages (b, a / c, a) and switches for a long horizon.
inline agent::JobSpec TinyJob32() {
  agent::JobSpec job = agent::testing::TinyJob();
  job.training.seq_len = 32;
  job.training.global_batch = 32;
  return job;
}

struct JobOptions {
  int iterations = 8;
  int min_gpus = 3;
  double join_window_s = 0.3;
  double horizon_s = 3600;
  double lease_s = 2;
  std::string model = "tiny-gpt";  // a catalog model
  std::string extra;  // more job-file lines
  double replan_correction_factor = 0;  // see JobYaml
  // timeouts.phase_s and switch_s (lease_s < transfer_round_s 8 < phase_s
  // < switch_s).
  double phase_s = 15;
  double switch_s = 50;

  JobOptions& Iterations(int v) {
    iterations = v;
    return *this;
  }
  JobOptions& MinGpus(int v) {
    min_gpus = v;
    return *this;
  }
  JobOptions& JoinWindow(double v) {
    join_window_s = v;
    return *this;
  }
  JobOptions& Horizon(double v) {
    horizon_s = v;
    return *this;
  }
  JobOptions& Lease(double v) {
    lease_s = v;
    return *this;
  }
  JobOptions& Model(std::string v) {
    model = std::move(v);
    return *this;
  }
  JobOptions& Extra(std::string v) {
    extra = std::move(v);
    return *this;
  }
  JobOptions& PhaseTimeouts(double phase, double whole_switch) {
    phase_s = phase;
    switch_s = whole_switch;
    return *this;
  }
  JobOptions& ReplanCorrectionFactor(double v) {
    replan_correction_factor = v;
    return *this;
  }
};

// switch_min_gain 0: these jobs test the switch machinery on the paper's
// keep-or-switch rule; the least gain has its own tests (decision test,
// live_join_bench). replan_correction_factor 0 unless asked: their CPU
// ranks' first fit (~2000x the profiles) would otherwise replan, which
// the tests of that replan ask for.
inline std::string JobYaml(const JobOptions& o) {
  return absl::StrCat(
      "model: {name: ", o.model, R"(}
training: {seq_len: 32, global_batch: 32}
engine: {learning_rate: 0.001, data_seed: 7, init_seed: 11}
iterations: )",
      o.iterations, "\nmin_gpus: ", o.min_gpus,
      "\njoin_window_s: ", o.join_window_s, "\nswitch_horizon_s: ", o.horizon_s,
      R"(
switch_fixed_cost_s: 2
switch_min_gain: 0
replan_correction_factor: )",
      o.replan_correction_factor, R"(
timeouts: {lease_s: )",
      o.lease_s, ", transfer_round_s: 8, phase_s: ", o.phase_s,
      ", switch_s: ", o.switch_s, R"(}
)",
      // The exact planner unless `extra` names its own planner settings.
      absl::StrContains(o.extra, "planner:")
          ? ""
          : "planner: {planner: exact, budget_s: 2}\n",
      o.extra, "\n");
}

// One arachne-controller process on 127.0.0.1:<port>, the port fixed for
// the object's life so a restart is found at the same address.
class ControllerProcess {
 public:
  explicit ControllerProcess(std::string dir)
      : dir_(std::move(dir)), port_(FreePort()) {}
  ~ControllerProcess() { Stop(); }

  std::string address() const { return absl::StrCat("127.0.0.1:", port_); }
  std::string state_dir() const { return dir_ + "/state"; }

  absl::Status Start(const std::string& job_yaml,
                     const std::vector<std::string>& extra_args = {}) {
    const std::string job = dir_ + "/job.yaml";
    std::ofstream(job) << job_yaml;
    const std::string port_file = dir_ + "/controller.port";
    const std::string log =
        absl::StrCat(dir_, "/controller-", starts_++, ".log");
    std::vector<std::string> argv = {
        std::string(ARACHNE_BINARY_DIR) + "/controller/arachne-controller",
        "--job",
        job,
        "--state-dir",
        state_dir(),
        "--listen",
        address(),
        "--port-file",
        port_file};
    argv.insert(argv.end(), extra_args.begin(), extra_args.end());
    absl::StatusOr<arachne::testing::StartedProcess> p =
        arachne::testing::StartWithPortFile(std::move(argv), log, port_file,
                                            "controller");
    if (!p.ok()) return p.status();
    pid_ = p->pid;
    stub_ = v1::Controller::NewStub(
        grpc::CreateChannel(address(), grpc::InsecureChannelCredentials()));
    return absl::OkStatus();
  }
  // SIGKILL: the controller dies with whatever it was doing.
  void Kill() {
    if (pid_ > 0) {
      kill(pid_, SIGKILL);
      waitpid(pid_, nullptr, 0);
      pid_ = -1;
    }
  }
  void Stop() {
    if (pid_ > 0) {
      kill(pid_, SIGTERM);
      waitpid(pid_, nullptr, 0);
      pid_ = -1;
    }
  }
  v1::Controller::Stub& stub() { return *stub_; }
  pid_t pid() const { return pid_; }  // -1 when not running

  absl::StatusOr<v1::GetStatusResponse> Status() const {
    grpc::ClientContext ctx;
    ctx.set_deadline(std::chrono::system_clock::now() +
                     std::chrono::seconds(10));
    v1::GetStatusResponse r;
    grpc::Status s = stub_->GetStatus(&ctx, v1::GetStatusRequest(), &r);
    if (!s.ok()) return absl::UnavailableError(s.error_message());
    return r;
  }

  // Every event the controller still keeps after sequence `after`.
  std::vector<v1::Event> Events(int64_t after = 0) {
    grpc::ClientContext ctx;
    ctx.set_deadline(std::chrono::system_clock::now() +
                     std::chrono::milliseconds(1500));
    v1::WatchEventsRequest r;
    r.set_after(after);
    auto reader = stub_->WatchEvents(&ctx, r);
    std::vector<v1::Event> out;
    v1::Event e;
    while (reader->Read(&e)) out.push_back(e);
    reader->Finish();
    return out;
  }

 private:
  std::string dir_;
  int port_;
  int starts_ = 0;
  pid_t pid_ = -1;
  std::unique_ptr<v1::Controller::Stub> stub_;
};

// Agents that register themselves with `controller`, started side by side:
// every process is spawned before any is awaited, so their engines load at
// once and their joins arrive close together. nodes[i] has gpus[i] GPUs.
// `agent_args` go to every agent (e.g. the engine command).
inline std::vector<std::unique_ptr<AgentProcess>> StartAgents(
    const std::vector<std::string>& nodes, const std::vector<int>& gpus,
    const std::string& dir, const ControllerProcess& c,
    const std::vector<std::string>& agent_args = {}) {
  CHECK_EQ(nodes.size(), gpus.size());
  std::vector<std::unique_ptr<AgentProcess>> agents;
  for (size_t i = 0; i < nodes.size(); ++i) {
    std::vector<std::string> args{"--controller", c.address()};
    args.insert(args.end(), agent_args.begin(), agent_args.end());
    agents.push_back(
        std::make_unique<AgentProcess>(nodes[i], gpus[i], dir, args));
    agents.back()->Spawn();
  }
  // The test acts for the controller (SaveCheckpoint to gather the state),
  // so its client carries the controller's identity.
  absl::StatusOr<v1::GetStatusResponse> st = c.Status();
  CHECK(st.ok()) << st.status();
  for (std::unique_ptr<AgentProcess>& a : agents) {
    absl::Status s = a->AwaitStarted();
    CHECK(s.ok()) << s;
    s = a->SetControllerId(st->controller_id());
    CHECK(s.ok()) << s;
  }
  return agents;
}

// One agent that registers itself with `controller`.
inline std::unique_ptr<AgentProcess> StartAgent(
    const std::string& node, int gpus, const std::string& dir,
    const ControllerProcess& c,
    const std::vector<std::string>& agent_args = {}) {
  return std::move(StartAgents({node}, {gpus}, dir, c, agent_args)[0]);
}

// Polls the agents' Status for the loss of every iteration they report.
class LossRecorder {
 public:
  explicit LossRecorder(std::vector<AgentProcess*> agents)
      : agents_(std::move(agents)) {
    thread_ = std::thread([this]() {
      while (!stop_) {
        std::vector<AgentProcess*> agents;
        {
          absl::MutexLock lock(&mu_);
          agents = agents_;
        }
        for (AgentProcess* a : agents) {
          if (!a->alive()) continue;
          absl::StatusOr<agent::NodeStatus> st = a->client().Status(0);
          if (!st.ok()) continue;
          absl::MutexLock lock(&mu_);
          for (const agent::RankStatus& r : st->ranks) {
            if (r.in_plan && r.iteration > 0 && r.loss != 0) {
              losses_[r.iteration] = r.loss;
            }
          }
        }
        // Iterations take ~1 s here; polling faster only takes CPU from
        // the ranks.
        absl::SleepFor(absl::Milliseconds(20));
      }
    });
  }
  ~LossRecorder() {
    stop_ = true;
    thread_.join();
  }
  void Add(AgentProcess* a) {
    absl::MutexLock lock(&mu_);
    agents_.push_back(a);
  }
  std::map<int64_t, double> losses() {
    absl::MutexLock lock(&mu_);
    return losses_;
  }

 private:
  absl::Mutex mu_;
  std::vector<AgentProcess*> agents_;
  std::map<int64_t, double> losses_;
  std::atomic<bool> stop_{false};
  std::thread thread_;
};

// A wait's bound is on progress, not a measurement: each `timeout` below
// is the time the step takes on a busy machine, allowed kLoadAllowance
// times over. Under `ctest -j4` beside a build on 2 cores a tiny-gpt
// iteration took 11 s instead of about 1 s; a wait that holds returns as
// soon as its condition does, so only a failing test waits the longer.
inline constexpr int kLoadAllowance = 3;

// Waits until `pred(status)` holds (up to kLoadAllowance x `timeout`); the
// last status, or an error.
inline absl::StatusOr<v1::GetStatusResponse> WaitFor(
    ControllerProcess& c,
    const std::function<bool(const v1::GetStatusResponse&)>& pred,
    absl::Duration timeout, const std::string& what) {
  const absl::Time deadline = absl::Now() + kLoadAllowance * timeout;
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

inline bool Settled(const v1::GetStatusResponse& s) {
  return s.phase() == "running" || s.phase() == "finished";
}

// The highest iteration any rank of `a` reports, -1 when it cannot tell.
inline int64_t AgentIteration(AgentProcess& a) {
  absl::StatusOr<agent::NodeStatus> st = a.client().Status(0);
  if (!st.ok()) return -1;
  int64_t it = 0;
  for (const agent::RankStatus& r : st->ranks) {
    if (r.in_plan) it = std::max(it, r.iteration);
  }
  return it;
}

inline std::set<std::string> PlanNodes(const v1::PlanDocument& plan) {
  std::set<std::string> out;
  for (const v1::Template& t : plan.templates()) {
    for (const v1::ReplicaPlacement& r : t.placement()) {
      for (const v1::StagePlacement& s : r.stages()) out.insert(s.node());
    }
  }
  return out;
}

inline std::set<std::string> MemberNodes(const v1::GetStatusResponse& s) {
  std::set<std::string> out;
  for (const v1::Member& m : s.members()) out.insert(m.node());
  return out;
}

inline absl::StatusOr<Plan> PlanOf(const v1::PlanDocument& doc,
                                   const Cluster& cluster) {
  std::string text;
  google::protobuf::util::JsonPrintOptions o;
  o.preserve_proto_field_names = true;
  (void)google::protobuf::util::MessageToJsonString(doc, &text, o);
  nlohmann::json j = nlohmann::json::parse(text);
  return PlanFromJson(nlohmann::json{{"templates", j["templates"]}}, cluster,
                      Catalog(), "plan");
}

// The whole state of `generation`, saved by `agents` into `dir` and read
// back (training must be paused or stopped).
inline absl::StatusOr<agent::FullState> GatherState(
    const std::vector<AgentProcess*>& agents, int64_t generation,
    const std::string& dir, const agent::JobSpec& job = TinyJob32()) {
  std::filesystem::remove_all(dir);
  if (absl::Status s = agent::testing::OnAll(agents,
                                             [&](AgentProcess& a) {
                                               return a.client().SaveCheckpoint(
                                                   generation, dir);
                                             });
      !s.ok()) {
    return s;
  }
  return agent::ReadCheckpoint(dir, *agent::ReferenceModelState(job));
}

// The largest difference of any fp32 master weight (TinyJob32's state).
inline double MaxMasterDifference(const agent::FullState& a,
                                  const agent::FullState& b) {
  return agent::testing::MaxMasterDifference(TinyJob32(), a, b);
}

}  // namespace arachne::controller::testing

#endif  // ARACHNE_TEST_CONTROLLER_CONTROLLER_HARNESS_H_
