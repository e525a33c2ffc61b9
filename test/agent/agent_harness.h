// Real `arachne-agent` processes on 127.0.0.1 with virtual GPUs, a real
// TCPStore (c10d) hosted here, and a driver that plays the controller
// through the agents' RPCs: what the end-to-end tests of the live switch
// start, kill and check.
#ifndef ARACHNE_TEST_AGENT_AGENT_HARNESS_H_
#define ARACHNE_TEST_AGENT_AGENT_HARNESS_H_

#include <signal.h>
#include <sys/types.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <functional>
#include <map>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/str_cat.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/clock.h"
#include "glog/logging.h"
#include "test/engine/engine_harness.h"
#include "test/port_file_process.h"
#include "worker_agent/agent_client.h"
#include "worker_agent/checkpoint.h"
#include "worker_agent/job_store.h"
#include "worker_agent/node_runtime.h"

namespace arachne::agent::testing {

inline std::string AgentBinary() {
  return std::string(ARACHNE_BINARY_DIR) + "/worker_agent/arachne-agent";
}

// One arachne-agent process.
class AgentProcess {
 public:
  AgentProcess(std::string node, int gpus, std::string dir,
               std::vector<std::string> extra_args = {},
               std::string gpu_type = "A6000")
      : node_(std::move(node)),
        gpus_(gpus),
        dir_(std::move(dir)),
        extra_args_(std::move(extra_args)),
        gpu_type_(std::move(gpu_type)) {}
  ~AgentProcess() { Kill(); }

  absl::Status Start() {
    Spawn();
    return AwaitStarted();
  }
  // Start in two halves: Spawn forks and execs the agent, AwaitStarted
  // waits for its port and connects. Spawning several agents before
  // awaiting any starts them side by side (their engines load at once).
  void Spawn() {
    std::vector<std::string> argv = {AgentBinary(),
                                     "--node", node_,
                                     "--gpu-type", gpu_type_,
                                     "--virtual-gpus", std::to_string(gpus_),
                                     "--listen", "127.0.0.1:0",
                                     "--port-file", PortFile()};
    // Checkpoints go under the test's directory (Gather, the controller's
    // fallback checkpoint) unless the test names its own root.
    if (std::find(extra_args_.begin(), extra_args_.end(),
                  "--checkpoint-root") == extra_args_.end()) {
      argv.insert(argv.end(), {"--checkpoint-root", dir_});
    }
    argv.insert(argv.end(), extra_args_.begin(), extra_args_.end());
    pid_ = arachne::testing::SpawnWithPortFile(std::move(argv), Log(),
                                               PortFile());
  }
  absl::Status AwaitStarted() {
    absl::StatusOr<arachne::testing::StartedProcess> p =
        arachne::testing::AwaitPortFile(pid_, Log(), PortFile(),
                                        absl::StrCat("agent ", node_));
    if (!p.ok()) {
      pid_ = -1;  // AwaitPortFile left no process
      return p.status();
    }
    address_ = absl::StrCat("127.0.0.1:", p->port);
    AgentClientConfig c;
    c.address = address_;
    auto client = AgentClient::Connect(c);
    if (!client.ok()) return client.status();
    client_ = *std::move(client);
    return absl::OkStatus();
  }
  // Commands from now on carry `id` (x-arachne-controller-id): what an
  // agent registered with that controller requires.
  absl::Status SetControllerId(const std::string& id) {
    AgentClientConfig c;
    c.address = address_;
    c.controller_id = id;
    auto client = AgentClient::Connect(c);
    if (!client.ok()) return client.status();
    client_ = *std::move(client);
    return absl::OkStatus();
  }
  pid_t pid() const { return pid_; }
  std::string PortFile() const { return dir_ + "/" + node_ + ".port"; }
  std::string Log() const { return dir_ + "/" + node_ + ".log"; }
  // SIGKILL: the ungraceful death of a node.
  void Kill() {
    if (pid_ > 0) {
      kill(pid_, SIGKILL);
      waitpid(pid_, nullptr, 0);
      pid_ = -1;
    }
  }
  bool alive() const { return pid_ > 0; }
  const std::string& node() const { return node_; }
  const std::string& address() const { return address_; }
  AgentClient& client() { return *client_; }

 private:
  std::string node_;
  int gpus_;
  std::string dir_;
  std::vector<std::string> extra_args_;
  std::string gpu_type_;
  pid_t pid_ = -1;
  std::string address_;
  std::unique_ptr<AgentClient> client_;
};

// Calls fn on every agent at once (the phases are collectives across
// agents) and returns the root cause of a failure: the first error that is
// not a peer's timeout or disconnection (those follow from it), else the
// first error.
inline absl::Status OnAll(const std::vector<AgentProcess*>& agents,
                          const std::function<absl::Status(AgentProcess&)>& fn) {
  std::vector<absl::Status> st(agents.size());
  std::vector<std::thread> threads;
  for (size_t i = 0; i < agents.size(); ++i) {
    threads.emplace_back([&, i]() { st[i] = fn(*agents[i]); });
  }
  for (std::thread& t : threads) t.join();
  int first = -1;
  for (size_t i = 0; i < agents.size(); ++i) {
    if (st[i].ok()) continue;
    const bool consequence = absl::IsDeadlineExceeded(st[i]) ||
                             absl::IsUnavailable(st[i]);
    if (first < 0 || (!consequence && (absl::IsDeadlineExceeded(st[first]) ||
                                       absl::IsUnavailable(st[first])))) {
      first = static_cast<int>(i);
    }
  }
  if (first < 0) return absl::OkStatus();
  return absl::Status(st[first].code(), absl::StrCat(agents[first]->node(), ": ",
                                                     st[first].message()));
}

// A cluster of `nodes` (name, GPU count), all of `gpu_type` (A6000 unless
// said) of `catalog` (the built-in one unless given).
inline Cluster NamedCluster(const std::vector<std::pair<std::string, int>>& nodes,
                            const GpuCatalog& catalog = Catalog(),
                            const std::string& gpu_type = "A6000") {
  std::vector<Node> ns;
  for (const auto& [name, n] : nodes) {
    ns.push_back(Node{.name = name, .gpu_type = *catalog.IndexOf(gpu_type),
                      .num_gpus = n});
  }
  return *Cluster::Create(ns, catalog);
}

// Where a switch stops: the step after which a fault is injected.
enum class SwitchStep { kNone, kBeforeStage1, kBeforeStage2, kBeforeRebuild };

// The controller's part, for tests.
class Driver {
 public:
  // `catalog`: the agents' (their --profiles-dir's), when not the built-in.
  Driver(JobSpec job, std::string dir, GpuCatalog catalog = Catalog())
      : job_(std::move(job)), dir_(std::move(dir)), catalog_(std::move(catalog)) {
    server_ = *JobStoreServer::Start("127.0.0.1", 0);
  }

  AgentProcess* Agent(const std::string& node, int gpus,
                      std::vector<std::string> extra_args = {},
                      const std::string& gpu_type = "A6000") {
    auto a = std::make_unique<AgentProcess>(node, gpus, dir_,
                                            std::move(extra_args), gpu_type);
    absl::Status s = a->Start();
    CHECK(s.ok()) << s;
    agents_[node] = std::move(a);
    return agents_[node].get();
  }
  AgentProcess* agent(const std::string& node) { return agents_.at(node).get(); }
  // The last switch's migration estimate: the largest any agent's Prepare
  // answered (PrepareResponse.estimated_seconds).
  double last_estimate_s() const { return last_estimate_s_; }

  std::vector<AgentProcess*> In(const Cluster& c) {
    std::vector<AgentProcess*> v;
    for (const Node& n : c.nodes()) {
      auto it = agents_.find(n.name);
      if (it != agents_.end() && it->second->alive()) v.push_back(it->second.get());
    }
    return v;
  }

  // Generation 1 of `plan`: the initial weights, or the state of
  // `checkpoint_dir` when given.
  absl::Status Start(const Plan& plan, const Cluster& cluster,
                     const std::string& checkpoint_dir = "") {
    generation_ = 1;
    PrepareArgs args = Args(plan, cluster);
    args.checkpoint_dir = checkpoint_dir;
    const std::vector<AgentProcess*> agents = In(cluster);
    absl::Status s = OnAll(agents, [&](AgentProcess& a) {
      return a.client().Prepare(args, catalog_).status();
    });
    if (s.ok()) s = OnAll(agents, [&](AgentProcess& a) { return a.client().Rebuild(1, absl::Seconds(30)); });
    if (s.ok()) s = OnAll(agents, [&](AgentProcess& a) { return a.client().Commit(1); });
    if (!s.ok()) return s;
    plan_ = plan;
    cluster_ = cluster;
    return absl::OkStatus();
  }

  // Resumes training on every agent of the current plan without waiting
  // (until 0: until paused).
  absl::Status Resume(int64_t until = 0) {
    return OnAll(In(cluster_), [&](AgentProcess& a) {
      return a.client().Resume(generation_, until);
    });
  }

  // Trains until iteration `until` and waits for it.
  absl::Status TrainUntil(int64_t until) {
    const std::vector<AgentProcess*> agents = In(cluster_);
    if (absl::Status s = OnAll(agents, [&](AgentProcess& a) {
          return a.client().Resume(generation_, until);
        });
        !s.ok()) {
      return s;
    }
    const absl::Time deadline = absl::Now() + absl::Seconds(60);
    while (absl::Now() < deadline) {
      bool done = true;
      for (AgentProcess* a : agents) {
        absl::StatusOr<NodeStatus> st = a->client().Status(generation_);
        if (!st.ok()) return st.status();
        for (const RankStatus& r : st->ranks) {
          if (!r.error.empty()) return absl::UnavailableError(r.error);
          if (r.in_plan && r.iteration < until) done = false;
          if (r.in_plan && r.loss != 0) losses_[r.iteration] = r.loss;
        }
      }
      if (done) return absl::OkStatus();
      absl::SleepFor(absl::Milliseconds(20));
    }
    return absl::DeadlineExceededError("training did not reach the iteration");
  }

  // The whole state of the current generation, through a checkpoint.
  absl::StatusOr<FullState> Gather(const std::string& name) {
    const std::string dir = dir_ + "/" + name;
    std::filesystem::remove_all(dir);
    if (absl::Status s = OnAll(In(cluster_), [&](AgentProcess& a) {
          return a.client().SaveCheckpoint(generation_, dir);
        });
        !s.ok()) {
      return s;
    }
    return ReadCheckpoint(dir, *ReferenceModelState(job_));
  }

  // Pauses, migrates, rebuilds and commits (Abort on any failure, as the
  // controller does). `fault` runs after `step` (e.g. kills an agent).
  absl::Status Switch(const Plan& plan, const Cluster& cluster,
                      SwitchStep step = SwitchStep::kNone,
                      const std::function<void()>& fault = nullptr,
                      const std::string& checkpoint_dir = "",
                      const std::vector<migration::GpuId>& lost = {}) {
    // An aborted generation is never reused (agents refuse it).
    const int64_t next = std::max(generation_, last_attempted_) + 1;
    last_attempted_ = next;
    PrepareArgs args = Args(plan, cluster);
    args.generation = next;
    args.old_plan = plan_;
    args.old_cluster = cluster_;
    args.checkpoint_dir = checkpoint_dir;
    args.lost = lost;
    // The new cluster's agents are the migration ranks; a drained node
    // stays in it until the switch commits.
    std::vector<AgentProcess*> agents = In(cluster);
    auto abort = [&](absl::Status why) {
      std::vector<AgentProcess*> alive;
      for (AgentProcess* a : agents) {
        if (a->alive()) alive.push_back(a);
      }
      absl::Status s = OnAll(alive, [&](AgentProcess& a) { return a.client().Abort(next); });
      CHECK(s.ok()) << s;
      last_abort_ = why;
      return why;
    };
    last_estimate_s_ = 0;
    absl::Mutex estimate_mu;
    absl::Status s = OnAll(agents, [&](AgentProcess& a) {
      auto prepared = a.client().Prepare(args, catalog_);
      if (!prepared.ok()) return prepared.status();
      absl::MutexLock l(&estimate_mu);
      last_estimate_s_ =
          std::max(last_estimate_s_, prepared->estimated_seconds);
      return absl::OkStatus();
    });
    if (!s.ok()) return abort(s);
    s = OnAll(In(cluster_), [&](AgentProcess& a) {
      return a.client().Pause(next, 0, absl::Seconds(30)).status();
    });
    if (!s.ok()) return abort(s);
    auto phase = [&](SwitchStep at, const std::function<absl::Status(AgentProcess&)>& fn) {
      if (step == at && fault) fault();
      std::vector<AgentProcess*> alive;
      for (AgentProcess* a : agents) alive.push_back(a);
      return OnAll(alive, [&](AgentProcess& a) {
        if (!a.alive()) return absl::UnavailableError("agent is dead");
        return fn(a);
      });
    };
    s = phase(SwitchStep::kBeforeStage1, [&](AgentProcess& a) { return a.client().Migrate(next, 1, absl::Seconds(5)); });
    if (!s.ok()) return abort(s);
    s = phase(SwitchStep::kBeforeStage2, [&](AgentProcess& a) { return a.client().Migrate(next, 2, absl::Seconds(5)); });
    if (!s.ok()) return abort(s);
    s = phase(SwitchStep::kBeforeRebuild, [&](AgentProcess& a) { return a.client().Rebuild(next, absl::Seconds(15)); });
    if (!s.ok()) return abort(s);
    s = OnAll(agents, [&](AgentProcess& a) { return a.client().Commit(next); });
    CHECK(s.ok()) << s;  // after every agent rebuilt, commit cannot fail here
    generation_ = next;
    plan_ = plan;
    cluster_ = cluster;
    return absl::OkStatus();
  }

  int64_t generation() const { return generation_; }
  const std::map<int64_t, double>& losses() const { return losses_; }
  const JobSpec& job() const { return job_; }

 private:
  PrepareArgs Args(const Plan& plan, const Cluster& cluster) {
    PrepareArgs a;
    a.generation = 1;
    a.job = job_;
    a.cluster = cluster;
    a.plan = plan;
    a.store_address = server_->address();
    return a;
  }

  JobSpec job_;
  std::string dir_;
  GpuCatalog catalog_;
  std::unique_ptr<JobStoreServer> server_;
  std::map<std::string, std::unique_ptr<AgentProcess>> agents_;
  int64_t generation_ = 0;
  int64_t last_attempted_ = 0;
  Plan plan_;
  Cluster cluster_;
  std::map<int64_t, double> losses_;
  absl::Status last_abort_;
  double last_estimate_s_ = 0;
};

// Places the stages of a template over (node, gpu) slots in order.
inline Template Place(const std::vector<StageShape>& stages, int replicas,
                      int mbs, int micro,
                      const std::vector<std::pair<int, int>>& slots) {
  int unused = 0;
  Template t = MakeTemplate(stages, replicas, mbs, micro, 0, &unused);
  size_t k = 0;
  for (StagePlacement& p : t.placement) {
    const int node = slots[k].first;
    p.node = node;
    for (int& g : p.gpus) {
      CHECK_EQ(slots[k].first, node) << "a TP group stays on one node";
      g = slots[k++].second;
    }
  }
  return t;
}

// The largest difference of any fp32 master weight between two states of
// `job`.
inline double MaxMasterDifference(const JobSpec& job, const FullState& a,
                                  const FullState& b) {
  auto state = ReferenceModelState(job);
  CHECK(state.ok()) << state.status();
  double worst = 0;
  for (int id = 0; id < state->num_tensors(); ++id) {
    if (state->tensor(id).kind != migration::StateKind::kMasterWeight) continue;
    for (size_t o = 0; o + 4 <= a.tensors[id].size(); o += 4) {
      float u, v;
      std::memcpy(&u, a.tensors[id].data() + o, 4);
      std::memcpy(&v, b.tensors[id].data() + o, 4);
      worst = std::max(worst, double(std::abs(u - v)));
    }
  }
  return worst;
}

}  // namespace arachne::agent::testing

#endif  // ARACHNE_TEST_AGENT_AGENT_HARNESS_H_
