// The downtime of one live switch with the real runtime (issue 14 §5):
// four NodeRuntime instances in this process ("agents" n0..n3, one virtual
// A6000 each, ranks as threads over c10d Gloo on 127.0.0.1), the job's
// TCPStore hosted here, and a small driver calling the runtime directly (no
// gRPC) in the order a controller does: Prepare on every node of the new
// cluster at once, Pause the old plan's nodes, Migrate 1, Migrate 2,
// Rebuild, Commit, Resume.
//
// Two joins, both from PP 2 on n0, n1 to a plan on n0..n3 (JoinShape below):
// add-replica (PP 2 x DP 2, most ranks receive a whole rank's state from
// another node, in both stages) and deepen (PP 4, all in stage 1, less
// memory, so it carries the 1 GB case). The model is LLaMA-shaped (SwiGLU,
// GQA, untied embeddings) and sized so one old rank's state (14 bytes per
// parameter plus the scalars, migration/core/state_layout.h) is ~32 MB ..
// ~1 GB; one iteration is trained before the switch so the moved state is
// real, and one after it to show training goes on.
//
// Downtime runs from Pause to Resume's return. The ranks sit at the boundary
// of iteration 1 when Pause arrives: the wait for an iteration in flight
// trains and is not downtime, so "pause" is the runtime's own cost.
// Process groups and the migration transport are built in Prepare, while
// the old plan could still train: Prepare and its groups are reported apart,
// off the critical path. "load" is Rebuild: the new engines load the
// migrated state.
//
// Baseline, same run, same bytes: c10d ProcessGroupGloo send/recv between
// two threads over a TCPStore on 127.0.0.1 (pieces of at most 256 MiB from
// one buffer). ratio = migration GB/s / baseline GB/s (target >= 0.8);
// non_xfer_s = downtime - (stage 1 + stage 2) (target < 1 s).
//
// Each join runs with three engines (engine:0 / :1 / :2): the ranks as
// threads of NodeRuntime in this process; as arachne-engine processes under
// an EngineSupervisor, so the process boundary's cost per phase is the
// difference (peak_GB then sums the engines' own peaks); and as arachne_torch
// (PyTorch) engine processes, which run their share of the same schedule
// in Python over torch.distributed's Gloo.
//
// Run:
//   build/bench/reconfig_bench --benchmark_counters_tabular=true
// Results and the paper's figures beside them: bench/results/reconfig.md.
// c10d's Gloo backend headers need it (Debian libtorch); Torch's own compile
// flags may define it already.
#ifndef USE_C10D_GLOO
#define USE_C10D_GLOO
#endif
#include <torch/csrc/distributed/c10d/PrefixStore.hpp>
#include <torch/csrc/distributed/c10d/ProcessGroupGloo.hpp>
#include <torch/csrc/distributed/c10d/TCPStore.hpp>
#include <torch/torch.h>

#include <algorithm>
#include <cmath>
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
#include "absl/time/clock.h"
#include "absl/time/time.h"
#include "benchmark/benchmark.h"
#include "glog/logging.h"
#include "migration/core/state_layout.h"
#include "planner_service/core/model/cluster.h"
#include "planner_service/core/model/plan.h"
#include "planner_service/io/gpu_catalog_io.h"
#include "worker_agent/engine/reference_engine.h"
#include "worker_agent/job_store.h"
#include "worker_agent/engine_supervisor.h"
#include "worker_agent/node_runtime.h"

namespace arachne::agent {
namespace {

// Generous: the 1 GB case moves ~3 GB through two cores.
constexpr absl::Duration kPhaseTimeout = absl::Seconds(300);

// A LLaMA-shaped model whose per-rank state under PP 2 is about `mb` MB
// (the two stages are the same size: half the blocks each, the embedding on
// the first, the untied head on the second).
ModelSpec ModelOfStateMb(int mb) {
  ModelSpec m;
  m.name = absl::StrCat("reconfig-bench-", mb, "mb");
  m.architecture = "LlamaForCausalLM";
  m.mlp = MlpKind::kSwiGlu;
  m.attention = AttentionKind::kGqa;
  m.tied_embeddings = false;
  m.head_dim = 64;
  struct Shape {
    int hidden, ffn, layers;
    int64_t vocab;
  };
  // (14 B/param) x params/2 ~ mb MB.
  const Shape s = mb <= 32     ? Shape{256, 1024, 4, 2048}
                  : mb <= 128  ? Shape{512, 2048, 4, 4096}
                  : mb <= 512  ? Shape{1024, 4096, 4, 6144}
                  : mb <= 1024 ? Shape{1024, 4096, 8, 8192}
                               : Shape{2048, 8192, 8, 16384};
  m.hidden = s.hidden;
  m.ffn = s.ffn;
  m.num_layers = s.layers;
  m.vocab = s.vocab;
  m.num_heads = s.hidden / m.head_dim;
  m.num_kv_heads = m.num_heads / 2;  // GQA, divides num_heads
  return m;
}

JobSpec JobOfStateMb(int mb) {
  JobSpec job;
  job.model = ModelOfStateMb(mb);
  // Tiny batches: the bench is about the state, not the compute.
  job.training.seq_len = 8;
  job.training.global_batch = 4;
  job.engine.data_seed = 7;
  job.engine.init_seed = 11;
  return job;
}

// nodes[i] holds one A6000.
Cluster OneGpuNodes(const GpuCatalog& catalog, int nodes) {
  std::vector<Node> ns;
  for (int i = 0; i < nodes; ++i) {
    ns.push_back(Node{.name = absl::StrCat("n", i),
                      .gpu_type = *catalog.IndexOf("A6000"),
                      .num_gpus = 1});
  }
  absl::StatusOr<Cluster> c = Cluster::Create(ns, catalog);
  CHECK(c.ok()) << c.status();
  return *std::move(c);
}

// One template, 4 micro-batches of 1 in all, the layers split evenly over
// the stages; stages[r][k] is the node (GPU 0 of it) of stage k of replica r.
Plan Pipeline(const GpuCatalog& catalog, int layers,
              const std::vector<std::vector<int>>& stages) {
  const int a6000 = *catalog.IndexOf("A6000");
  const int depth = static_cast<int>(stages[0].size());
  CHECK_EQ(layers % depth, 0);
  Template t;
  for (int k = 0; k < depth; ++k) {
    t.stages.push_back(Stage{.gpu_type = a6000, .tp = 1,
                             .layer_begin = k * layers / depth,
                             .layer_end = (k + 1) * layers / depth,
                             .tiling = {}});
  }
  t.replicas = static_cast<int>(stages.size());
  t.micro_batch_size = 1;
  t.total_micro_batches = 4;
  for (const std::vector<int>& replica : stages) {
    for (int node : replica) t.placement.push_back({node, {0}});
  }
  return Plan{{t}};
}

// Runs fn on every node at once (each phase is a collective across nodes)
// and returns the first error, prefixed by the node.
absl::Status OnNodes(const std::vector<NodeRanks*>& nodes,
                     const std::function<absl::Status(NodeRanks&)>& fn) {
  std::vector<absl::Status> st(nodes.size());
  std::vector<std::thread> threads;
  for (size_t i = 0; i < nodes.size(); ++i) {
    threads.emplace_back([&, i]() { st[i] = fn(*nodes[i]); });
  }
  for (std::thread& t : threads) t.join();
  for (size_t i = 0; i < nodes.size(); ++i) {
    if (!st[i].ok()) {
      return absl::Status(st[i].code(), absl::StrCat(nodes[i]->gpus().node,
                                                     ": ", st[i].message()));
    }
  }
  return absl::OkStatus();
}

// How the ranks run (the benchmark's "engine" argument).
constexpr int kThreads = 0;          // NodeRuntime threads in this process
constexpr int kEngineProcesses = 1;  // arachne-engine processes
constexpr int kTorchProcesses = 2;   // arachne_torch (PyTorch) processes

// The driver's wall clock per phase (max over nodes, since each phase call
// returns when every node's part is done) plus what the nodes report.
struct SwitchTiming {
  double prepare_s = 0, groups_s = 0;  // off the critical path
  double pause_s = 0, stage1_s = 0, stage2_s = 0, load_s = 0, commit_s = 0,
         resume_s = 0, downtime_s = 0;
  int64_t stage1_bytes = 0, stage2_bytes = 0;  // received, every node
  int64_t bytes_received = 0;  // both stages
  int64_t bytes_to_receive = 0;  // what Prepare announced
  // Engine processes only (each rank its own process): the largest ratio,
  // over the ranks of both plans, of a rank's peak resident set during the
  // switch (Prepare to Commit, RankStatus::switch_peak_rss_bytes) to its
  // state (the larger of its old and new); that rank's figures.
  double rank_peak_ratio = 0;
  int64_t rank_peak_bytes = 0, rank_state_bytes = 0;
  // The largest rise of a rank's resident set over its RSS at Prepare, less
  // its new state (what the switch added besides the state it must hold).
  int64_t rank_extra_bytes = 0;
};

// The controller's part of a job: nodes, store, generations.
class SwitchDriver {
 public:
  // `engine`: kThreads, ranks as threads of NodeRuntime in this process
  // (arachne-agent --in-process-ranks); else every rank an engine process
  // under an EngineSupervisor (what arachne-agent runs): arachne-engine or
  // arachne_torch.
  SwitchDriver(JobSpec job, GpuCatalog catalog, const Cluster& nodes,
               int engine)
      : job_(std::move(job)), catalog_(std::move(catalog)) {
    absl::StatusOr<std::unique_ptr<JobStoreServer>> server =
        JobStoreServer::Start("127.0.0.1", 0);
    CHECK(server.ok()) << server.status();
    server_ = *std::move(server);
    for (const Node& n : nodes.nodes()) {
      NodeGpus gpus;  // virtual GPUs on 127.0.0.1 (the defaults)
      gpus.node = n.name;
      gpus.gpu_type = n.gpu_type;
      gpus.count = n.num_gpus;
      if (engine != kThreads) {
        EngineSupervisorConfig config;
        config.command = {std::string(ARACHNE_BINARY_DIR) +
                          (engine == kTorchProcesses
                               ? "/python/arachne-torch-engine"
                               : "/worker_agent/arachne-engine")};
        config.start_timeout = absl::Seconds(120);
        absl::StatusOr<std::unique_ptr<EngineSupervisor>> s =
            EngineSupervisor::Start(gpus, catalog_, std::move(config));
        CHECK(s.ok()) << s.status();
        runtimes_[n.name] = *std::move(s);
      } else {
        runtimes_[n.name] = std::make_unique<NodeRuntime>(gpus, catalog_);
      }
    }
  }

  absl::Status Start(const Plan& plan, const Cluster& cluster) {
    PrepareArgs args = Args(1, plan, cluster);
    const std::vector<NodeRanks*> nodes = In(cluster);
    absl::Status s = OnNodes(nodes, [&](NodeRanks& n) {
      return n.Prepare(args).status();
    });
    if (s.ok()) {
      s = OnNodes(nodes, [&](NodeRanks& n) {
        return n.Rebuild(1, kPhaseTimeout);
      });
    }
    if (s.ok()) s = OnNodes(nodes, [](NodeRanks& n) { return n.Commit(1); });
    if (!s.ok()) return s;
    generation_ = 1;
    plan_ = plan;
    cluster_ = cluster;
    return absl::OkStatus();
  }

  // Trains the current plan until iteration `until` and waits for it (the
  // ranks then stop at that boundary). Returns the last iteration's seconds.
  absl::StatusOr<double> TrainUntil(int64_t until) {
    const std::vector<NodeRanks*> nodes = In(cluster_);
    if (absl::Status s = OnNodes(nodes, [&](NodeRanks& n) {
          return n.Resume(generation_, until);
        });
        !s.ok()) {
      return s;
    }
    const absl::Time deadline = absl::Now() + kPhaseTimeout;
    while (absl::Now() < deadline) {
      bool done = true;
      double seconds = 0;
      for (NodeRanks* n : nodes) {
        const NodeStatus st = n->Status();
        for (const RankStatus& r : st.ranks) {
          if (!r.error.empty()) return absl::UnavailableError(r.error);
          if (r.in_plan && r.iteration < until) done = false;
          if (r.in_plan) seconds = std::max(seconds, r.iteration_seconds);
        }
      }
      if (done) {
        if (std::isnan(last_loss()) || last_loss() == 0) {
          return absl::InternalError("no finite loss after training");
        }
        return seconds;
      }
      absl::SleepFor(absl::Milliseconds(2));
    }
    return absl::DeadlineExceededError(
        absl::StrCat("training did not reach iteration ", until));
  }

  double last_loss() const {
    double loss = 0;
    for (NodeRanks* n : In(cluster_)) {
      for (const RankStatus& r : n->Status().ranks) {
        if (r.in_plan && r.loss != 0) loss = r.loss;
      }
    }
    return loss;
  }

  // The whole switch to `plan` on `cluster`; Abort on every node of the new
  // cluster on failure (as the controller does). `resume_until` is the
  // iteration the new plan then trains to.
  absl::StatusOr<SwitchTiming> Switch(const Plan& plan, const Cluster& cluster,
                                      int64_t resume_until) {
    const int64_t next = generation_ + 1;
    PrepareArgs args = Args(next, plan, cluster);
    args.old_plan = plan_;
    args.old_cluster = cluster_;
    const std::vector<NodeRanks*> nodes = In(cluster);
    const std::vector<NodeRanks*> old_nodes = In(cluster_);
    auto abort = [&](absl::Status why) -> absl::Status {
      absl::Status s = OnNodes(nodes, [&](NodeRanks& n) {
        return n.Abort(next);
      });
      LOG_IF(ERROR, !s.ok()) << "abort failed: " << s;
      return why;
    };
    SwitchTiming t;
    auto timed = [](double* seconds, const std::function<absl::Status()>& fn) {
      const absl::Time start = absl::Now();
      absl::Status s = fn();
      *seconds = absl::ToDoubleSeconds(absl::Now() - start);
      return s;
    };
    // Each rank's state before the switch, by GPU.
    std::map<std::string, int64_t> old_state;
    for (NodeRanks* n : old_nodes) {
      for (const RankStatus& r : n->Status().ranks) {
        old_state[migration::GpuIdName(r.gpu)] = r.in_plan ? r.state_bytes : 0;
      }
    }
    std::vector<int64_t> to_receive(nodes.size());
    absl::Status s = timed(&t.prepare_s, [&]() {
      return OnNodes(nodes, [&](NodeRanks& n) -> absl::Status {
        absl::StatusOr<PrepareResult> r = n.Prepare(args);
        if (!r.ok()) return r.status();
        const size_t i = std::find(nodes.begin(), nodes.end(), &n) - nodes.begin();
        to_receive[i] = r->bytes_to_receive;
        return absl::OkStatus();
      });
    });
    if (!s.ok()) return abort(s);
    for (int64_t b : to_receive) t.bytes_to_receive += b;

    const absl::Time down = absl::Now();
    s = timed(&t.pause_s, [&]() {
      return OnNodes(old_nodes, [&](NodeRanks& n) {
        return n.Pause(next, 0, kPhaseTimeout).status();
      });
    });
    if (!s.ok()) return abort(s);
    s = timed(&t.stage1_s, [&]() {
      return OnNodes(nodes, [&](NodeRanks& n) {
        return n.Migrate(next, 1, kPhaseTimeout, absl::ZeroDuration());
      });
    });
    if (!s.ok()) return abort(s);
    s = timed(&t.stage2_s, [&]() {
      return OnNodes(nodes, [&](NodeRanks& n) {
        return n.Migrate(next, 2, kPhaseTimeout, absl::ZeroDuration());
      });
    });
    if (!s.ok()) return abort(s);
    s = timed(&t.load_s, [&]() {
      return OnNodes(nodes, [&](NodeRanks& n) {
        return n.Rebuild(next, kPhaseTimeout);
      });
    });
    if (!s.ok()) return abort(s);
    s = timed(&t.commit_s, [&]() {
      return OnNodes(nodes, [&](NodeRanks& n) { return n.Commit(next); });
    });
    // After every node rebuilt, a failed commit is a bug of the runtime.
    CHECK(s.ok()) << s;
    // The switch's memory, before the new plan trains (its gradients and
    // activations are training's, not the switch's).
    for (NodeRanks* n : nodes) {
      for (const RankStatus& r : n->Status().ranks) {
        if (r.engine_pid <= 0) continue;  // ranks share this process
        const std::string gpu = migration::GpuIdName(r.gpu);
        const int64_t new_state = r.in_plan ? r.state_bytes : 0;
        const int64_t state = std::max(old_state[gpu], new_state);
        if (state <= 0) continue;
        const double ratio = double(r.switch_peak_rss_bytes) / state;
        if (ratio > t.rank_peak_ratio) {
          t.rank_peak_ratio = ratio;
          t.rank_peak_bytes = r.switch_peak_rss_bytes;
          t.rank_state_bytes = state;
        }
        t.rank_extra_bytes = std::max(
            t.rank_extra_bytes,
            r.switch_peak_rss_bytes - r.switch_start_rss_bytes - new_state);
      }
    }
    generation_ = next;
    plan_ = plan;
    cluster_ = cluster;
    // Only the new plan's nodes resume (a drained node would have nothing).
    s = timed(&t.resume_s, [&]() {
      return OnNodes(In(cluster_), [&](NodeRanks& n) {
        return n.Resume(next, resume_until);
      });
    });
    if (!s.ok()) return s;
    t.downtime_s = absl::ToDoubleSeconds(absl::Now() - down);

    for (NodeRanks* n : nodes) {
      const NodeStatus st = n->Status();
      t.groups_s = std::max(t.groups_s, st.rebuild_groups.seconds);
      t.stage1_bytes += st.stage1.bytes_received;
      t.stage2_bytes += st.stage2.bytes_received;
    }
    t.bytes_received = t.stage1_bytes + t.stage2_bytes;
    return t;
  }

  // The process's peak RSS since ResetPeakRss (VmHWM of /proc/self/status);
  // all nodes share this process, so it is the switch's whole footprint.
  static int64_t PeakRssBytes() {
    std::ifstream f("/proc/self/status");
    std::string line;
    while (std::getline(f, line)) {
      if (line.rfind("VmHWM:", 0) == 0) {
        return std::stoll(line.substr(6)) * 1024;
      }
    }
    return 0;
  }
  static void ResetPeakRss() { std::ofstream("/proc/self/clear_refs") << "5"; }

  // With engine processes: the sum of their peaks (each reports its own);
  // with in-process ranks, this process's.
  int64_t PeakBytes() const {
    int64_t sum = 0;
    bool engines = false;
    for (const auto& [name, n] : runtimes_) {
      for (const RankStatus& r : n->Status().ranks) {
        if (r.engine_pid > 0) engines = true;
        sum += r.peak_rss_bytes;
      }
    }
    return engines ? sum : PeakRssBytes();
  }

 private:
  PrepareArgs Args(int64_t generation, const Plan& plan,
                   const Cluster& cluster) {
    PrepareArgs a;
    a.generation = generation;
    a.job = job_;
    a.cluster = cluster;
    a.plan = plan;
    a.store_address = server_->address();
    return a;
  }

  std::vector<NodeRanks*> In(const Cluster& c) const {
    std::vector<NodeRanks*> v;
    for (const Node& n : c.nodes()) v.push_back(runtimes_.at(n.name).get());
    return v;
  }

  JobSpec job_;
  GpuCatalog catalog_;
  std::unique_ptr<JobStoreServer> server_;  // outlives the runtimes
  std::map<std::string, std::unique_ptr<NodeRanks>> runtimes_;
  int64_t generation_ = 0;
  Plan plan_;
  Cluster cluster_;
};

// c10d ProcessGroupGloo send/recv of `bytes` from rank 0 to rank 1 (threads
// of this process) over a TCPStore on 127.0.0.1, in pieces of at most
// 256 MiB sent from one buffer; GB/s of the receiver, from the first recv
// posted to the last completed (after a barrier, so the mesh is connected).
double GlooSendRecvGbps(int64_t bytes) {
  constexpr int64_t kPiece = int64_t{256} << 20;
  const int64_t piece = std::min(bytes, kPiece);
  c10d::TCPStoreOptions so;
  so.port = 0;
  so.isServer = true;
  so.waitWorkers = false;
  so.multiTenant = true;
  auto server = c10::make_intrusive<c10d::TCPStore>("127.0.0.1", so);
  const uint16_t port = server->getPort();
  double seconds = 0;
  std::vector<std::thread> ranks;
  for (int rank = 0; rank < 2; ++rank) {
    ranks.emplace_back([&, rank]() {
      c10d::TCPStoreOptions co;
      co.port = port;
      co.isServer = false;
      co.waitWorkers = false;
      auto store = c10::make_intrusive<c10d::PrefixStore>(
          "baseline", c10::make_intrusive<c10d::TCPStore>("127.0.0.1", co));
      auto opts = c10d::ProcessGroupGloo::Options::create(
          std::chrono::milliseconds(300000));
      opts->devices.push_back(
          c10d::ProcessGroupGloo::createDeviceForHostname("127.0.0.1"));
      // One thread per group, as the reference engine's groups have.
      opts->threads = 1;
      auto pg = c10::make_intrusive<c10d::ProcessGroupGloo>(store, rank, 2,
                                                           opts);
      torch::Tensor buf = torch::ones({piece}, torch::kUInt8);
      pg->barrier()->wait();
      const absl::Time start = absl::Now();
      for (int64_t off = 0, tag = 0; off < bytes; off += piece, ++tag) {
        std::vector<at::Tensor> v = {
            buf.narrow(0, 0, std::min(piece, bytes - off))};
        if (rank == 0) {
          pg->send(v, 1, static_cast<int>(tag))->wait();
        } else {
          pg->recv(v, 0, static_cast<int>(tag))->wait();
        }
      }
      if (rank == 1) seconds = absl::ToDoubleSeconds(absl::Now() - start);
    });
  }
  for (std::thread& t : ranks) t.join();
  return bytes / seconds / 1e9;
}

// GB/s of fresh memory: allocating and zero-filling `bytes`, as
// ShardSet does for every buffer of a switch (first touch of new pages).
double FirstTouchGbps(int64_t bytes) {
  const absl::Time start = absl::Now();
  std::vector<uint8_t> v(static_cast<size_t>(bytes), 0);
  benchmark::DoNotOptimize(v.data());
  return bytes / absl::ToDoubleSeconds(absl::Now() - start) / 1e9;
}

// The two joins, both from PP 2 on n0, n1 to a plan on n0..n3.
enum class JoinShape {
  // PP 2 x DP 2, replicas crossed: replica 0 = n0, n2; replica 1 = n1, n3.
  // Three ranks receive a whole rank's state: n3 in stage 1, n1 and n2 in
  // stage 2. Old and new state of 2 + 4 ranks coexist: ~16x a rank's state
  // at peak, so up to 512 MB per rank here.
  kAddReplica,
  // PP 4: n0 keeps half its stage, n1 takes the other half of it, n2 and n3
  // split n1's stage; all in stage 1 (one replica). New ranks hold half an
  // old rank: ~9x a rank's state at peak, so the 1 GB case fits in ~10 GB.
  kDeepen,
};

// range(0): the target state per rank of the old plan, in MB.
// range(1): the engine (kThreads, kEngineProcesses, kTorchProcesses).
void RunJoin(benchmark::State& st, JoinShape shape) {
  const int mb = static_cast<int>(st.range(0));
  const int engine = static_cast<int>(st.range(1));
  absl::StatusOr<GpuCatalog> catalog = LoadGpuCatalog();
  CHECK(catalog.ok()) << catalog.status();
  const JobSpec job = JobOfStateMb(mb);
  const Cluster old_cluster = OneGpuNodes(*catalog, 2);
  const Cluster new_cluster = OneGpuNodes(*catalog, 4);
  const int layers = job.model.num_layers;
  const Plan old_plan = Pipeline(*catalog, layers, {{0, 1}});
  const Plan new_plan = shape == JoinShape::kAddReplica
                            ? Pipeline(*catalog, layers, {{0, 2}, {1, 3}})
                            : Pipeline(*catalog, layers, {{0, 1, 2, 3}});

  absl::StatusOr<migration::ModelState> state = ReferenceModelState(job);
  CHECK(state.ok()) << state.status();
  absl::StatusOr<migration::PlanLayout> layout =
      migration::PlanLayout::Create(*state, old_plan, old_cluster);
  CHECK(layout.ok()) << layout.status();
  int64_t rank_bytes = 0;
  for (int g = 0; g < layout->num_gpus(); ++g) {
    int64_t b = 0;
    for (const migration::Holding& h : layout->holdings(g)) b += h.range.size();
    rank_bytes = std::max(rank_bytes, b);
  }

  SwitchTiming t;
  double iter_s = 0, next_iter_s = 0, loss_before = 0, loss_after = 0;
  int64_t peak = 0;
  for (auto _ : st) {
    SwitchDriver::ResetPeakRss();
    SwitchDriver d(job, *catalog, new_cluster, engine);
    absl::Status s = d.Start(old_plan, old_cluster);
    CHECK(s.ok()) << s;
    absl::StatusOr<double> it = d.TrainUntil(1);
    CHECK(it.ok()) << it.status();
    iter_s = *it;
    loss_before = d.last_loss();
    absl::StatusOr<SwitchTiming> sw = d.Switch(new_plan, new_cluster, 2);
    CHECK(sw.ok()) << sw.status();
    t = *sw;
    // The first iteration of the new plan: the switch left it trainable.
    it = d.TrainUntil(2);
    CHECK(it.ok()) << it.status();
    next_iter_s = *it;
    loss_after = d.last_loss();
    peak = d.PeakBytes();
    st.SetIterationTime(t.downtime_s);
  }
  // After the runtimes are gone, so the baselines have the machine alone.
  const double gloo_gbps = GlooSendRecvGbps(t.bytes_received);
  const double touch_gbps = FirstTouchGbps(rank_bytes);
  const double transfer_s = t.stage1_s + t.stage2_s;
  const double mig_gbps = t.bytes_received / transfer_s / 1e9;
  CHECK_EQ(t.bytes_received, t.bytes_to_receive);

  st.counters["rank_MB"] = rank_bytes / 1e6;
  st.counters["moved_GB"] = t.bytes_received / 1e9;
  st.counters["prepare_s"] = t.prepare_s;
  st.counters["groups_s"] = t.groups_s;
  st.counters["pause_s"] = t.pause_s;
  st.counters["stage1_s"] = t.stage1_s;
  st.counters["stage2_s"] = t.stage2_s;
  st.counters["load_s"] = t.load_s;
  st.counters["commit_s"] = t.commit_s;
  st.counters["resume_s"] = t.resume_s;
  st.counters["downtime_s"] = t.downtime_s;
  st.counters["non_xfer_s"] = t.downtime_s - transfer_s;
  st.counters["mig_GBps"] = mig_gbps;
  st.counters["s1_GBps"] = t.stage1_s > 0 ? t.stage1_bytes / t.stage1_s / 1e9 : 0;
  st.counters["s2_GBps"] = t.stage2_s > 0 ? t.stage2_bytes / t.stage2_s / 1e9 : 0;
  st.counters["gloo_GBps"] = gloo_gbps;
  st.counters["ratio"] = mig_gbps / gloo_gbps;
  st.counters["touch_GBps"] = touch_gbps;
  st.counters["iter_s"] = iter_s;
  st.counters["next_iter_s"] = next_iter_s;
  st.counters["loss1"] = loss_before;
  st.counters["loss2"] = loss_after;
  st.counters["peak_GB"] = peak / 1e9;
  st.counters["rank_peak_ratio"] = t.rank_peak_ratio;
  st.counters["rank_peak_GB"] = t.rank_peak_bytes / 1e9;
  st.counters["rank_state_GB"] = t.rank_state_bytes / 1e9;
  st.counters["rank_extra_MB"] = t.rank_extra_bytes / 1e6;
}

void BM_JoinAddReplica(benchmark::State& st) {
  RunJoin(st, JoinShape::kAddReplica);
}
BENCHMARK(BM_JoinAddReplica)
    ->ArgNames({"state_MB", "engine"})
    ->ArgsProduct({{32, 128, 512}, {kThreads, kEngineProcesses, kTorchProcesses}})
    ->Iterations(1)
    ->UseManualTime()
    ->Unit(benchmark::kSecond);

void BM_JoinDeepen(benchmark::State& st) { RunJoin(st, JoinShape::kDeepen); }
BENCHMARK(BM_JoinDeepen)
    ->ArgNames({"state_MB", "engine"})
    ->ArgsProduct({{32, 128, 512, 1024}, {kThreads, kEngineProcesses, kTorchProcesses}})
    ->Iterations(1)
    ->UseManualTime()
    ->Unit(benchmark::kSecond);

// The bounded-memory cases (docs/migration.md, "Memory during a switch"):
// 1 GB and 4 GB of state per rank, arachne-engine processes only (each
// rank's peak is its own process's). add-replica at 4 GB holds ~20 GB of
// state at once on this 24 GiB machine; run it alone.
void BM_JoinAddReplicaLarge(benchmark::State& st) {
  RunJoin(st, JoinShape::kAddReplica);
}
BENCHMARK(BM_JoinAddReplicaLarge)
    ->ArgNames({"state_MB", "engine"})
    ->ArgsProduct({{1024, 4096}, {kEngineProcesses}})
    ->Iterations(1)
    ->UseManualTime()
    ->Unit(benchmark::kSecond);
void BM_JoinDeepenLarge(benchmark::State& st) {
  RunJoin(st, JoinShape::kDeepen);
}
BENCHMARK(BM_JoinDeepenLarge)
    ->ArgNames({"state_MB", "engine"})
    ->ArgsProduct({{4096}, {kEngineProcesses}})
    ->Iterations(1)
    ->UseManualTime()
    ->Unit(benchmark::kSecond);

}  // namespace
}  // namespace arachne::agent

BENCHMARK_MAIN();
