#include "worker_agent/node_runtime.h"

#include <algorithm>
#include <functional>
#include <limits>
#include <memory>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/clock.h"
#include "glog/logging.h"
#include "migration/core/diff.h"
#include "migration/core/executor.h"
#include "migration/core/schedule.h"
#include "migration/core/transport.h"
#include "migration/transports.h"
#include "worker_agent/checkpoint.h"
#include "worker_agent/engine/reference_engine.h"
#include "worker_agent/job_store.h"
#include "worker_agent/process_memory.h"

namespace arachne::agent {

namespace {

constexpr int64_t kForever = std::numeric_limits<int64_t>::max();

// The failpoint "corrupt-migration-stage-N": a transport that flips the
// first byte of the first buffer received in a round, once.
class CorruptingTransport : public migration::Transport {
 public:
  explicit CorruptingTransport(migration::Transport* inner) : inner_(inner) {}
  std::string name() const override { return inner_->name(); }
  int rank() const override { return inner_->rank(); }
  int world_size() const override { return inner_->world_size(); }
  migration::MemoryKind memory() const override { return inner_->memory(); }
  absl::Status RunRound(uint64_t tag, absl::Span<const migration::SendOp> sends,
                        absl::Span<const migration::RecvOp> recvs,
                        absl::Duration timeout) override {
    absl::Status s = inner_->RunRound(tag, sends, recvs, timeout);
    if (s.ok() && !done_ && !recvs.empty() && recvs[0].bytes > 0) {
      static_cast<uint8_t*>(recvs[0].data)[0] ^= 0xff;
      done_ = true;
      LOG(WARNING) << "failpoint: corrupted a received migration buffer";
    }
    return s;
  }

 private:
  migration::Transport* inner_;
  bool done_ = false;
};

// Runs fn(i) for i in [0, n) on n threads and returns the first error.
absl::Status ForEachParallel(int n, const std::function<absl::Status(int)>& fn) {
  std::vector<absl::Status> status(n);
  std::vector<std::thread> threads;
  for (int i = 0; i < n; ++i) {
    threads.emplace_back([&, i]() { status[i] = fn(i); });
  }
  for (std::thread& t : threads) t.join();
  for (const absl::Status& s : status) {
    if (!s.ok()) return s;
  }
  return absl::OkStatus();
}

}  // namespace

// One generation: a plan and the engines of this node's ranks in it.
struct GenerationState {
  int64_t id = 0;
  JobSpec job;
  Cluster cluster;
  Plan plan;
  std::unique_ptr<migration::ModelState> state;
  std::unique_ptr<migration::PlanLayout> layout;
  std::string store_address;
  std::vector<int> plan_rank;  // per local GPU: index into layout, or -1
  std::vector<std::unique_ptr<Engine>> engines;  // per local GPU (or null)
};

// A local rank training under the current generation on its own thread.
struct RankLoop {
  std::thread thread;
  bool running = false;  // the thread is inside its loop
  int64_t iteration = 0;
  double loss = 0;
  double seconds = 0;
  int64_t tokens = 0;
  std::string error;
};

struct NodeRuntime::Impl {
  explicit Impl(const NodeGpus& g, GpuCatalog c)
      : gpus(g), catalog(std::move(c)), staging(g.count), loops(g.count) {}

  const NodeGpus gpus;
  const GpuCatalog catalog;

  // One RPC that changes state at a time; Status reads under `mu` only.
  absl::Mutex op_mu;
  // A committed switch's old generation, torn down off the switch's
  // critical path (its process groups take ~0.1-0.2 s to destroy); joined
  // by the next Prepare and on destruction. Under op_mu.
  std::thread reaper;
  mutable absl::Mutex mu;

  std::unique_ptr<GenerationState> current ABSL_GUARDED_BY(mu);
  std::unique_ptr<GenerationState> next ABSL_GUARDED_BY(mu);
  Phase phase ABSL_GUARDED_BY(mu) = Phase::kIdle;
  int64_t last_aborted = 0;
  PrepareResult prepared_result;
  bool restore_from_checkpoint = false;
  std::string checkpoint_dir;

  // The switch to `next` (absent for generation 1 and checkpoint restores).
  std::unique_ptr<migration::MigrationWorld> world;
  migration::StateDiff diff;
  migration::MigrationSchedule schedule;
  std::vector<int> world_rank;  // per local GPU, -1 if not in the new cluster
  std::vector<std::unique_ptr<migration::Transport>> transports;
  // Per local GPU: the migration's staging memory, allocated by the first
  // switch that needs it and kept for the next (not per transfer).
  std::vector<migration::Staging> staging;

  // Training of the current generation.
  std::vector<RankLoop> loops ABSL_GUARDED_BY(mu);
  int64_t run_until ABSL_GUARDED_BY(mu) = 0;
  int64_t pause_at ABSL_GUARDED_BY(mu) = 0;  // 0: no pause asked
  bool pause_requested ABSL_GUARDED_BY(mu) = false;

  // This process's resident set when the last Prepare began (0: none yet).
  int64_t switch_start_rss = 0;

  PhaseTiming t_pause, t_stage1, t_stage2, t_groups, t_engines, t_resume;

  absl::Status CheckNode(const Cluster& cluster, absl::string_view field) const;
  absl::Status ExpectPrepared(int64_t generation) const
      ABSL_SHARED_LOCKS_REQUIRED(mu);
  void StartLoops() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu);
  void JoinLoops() ABSL_LOCKS_EXCLUDED(mu);
  void Loop(int local);
  bool AnyRunning() const ABSL_SHARED_LOCKS_REQUIRED(mu) {
    for (const RankLoop& l : loops) {
      if (l.running) return true;
    }
    return false;
  }
  bool AnyFailed() const ABSL_SHARED_LOCKS_REQUIRED(mu) {
    for (const RankLoop& l : loops) {
      if (!l.error.empty()) return true;
    }
    return false;
  }
  // The current generation's engine on local GPU i, or null.
  Engine* CurrentEngine(int i) const {
    return current && current->engines[i] ? current->engines[i].get()
                                          : nullptr;
  }
  // The engine whose tensors GPU i's new engine shares (EngineArgs::
  // share_with): its current one when the switch migrates and the GPU is
  // not lost (nothing to share with for a checkpoint restore).
  Engine* ShareSource(const PrepareArgs& args, bool migrate, int i) const {
    const bool lost = std::find(args.lost.begin(), args.lost.end(),
                                migration::GpuId{gpus.node, i}) !=
                      args.lost.end();
    return migrate && !lost ? CurrentEngine(i) : nullptr;
  }
  void DropNext() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu);
  // ResourceExhausted naming the GPU, the bytes the switch to `gen` needs
  // on it and the bytes free there, when they do not fit (docs/migration.md,
  // "Admission by memory").
  absl::Status AdmitByMemory(const GenerationState& gen,
                             const PrepareArgs& args, bool migrate) const;
};

absl::Status NodeRuntime::Impl::AdmitByMemory(const GenerationState& gen,
                                              const PrepareArgs& args,
                                              bool migrate) const {
  const GpuType& type = catalog.type(gpus.gpu_type);
  // A virtual GPU has its type's memory; what it holds is the state of its
  // engine (a GPU's memory holds tensors, not the process's code).
  const int64_t capacity =
      static_cast<int64_t>(type.memory_gib * double{1 << 30});
  int64_t node_need = 0;
  for (int i = 0; i < gpus.count; ++i) {
    if (!gpus.Owns(i) || gen.plan_rank[i] < 0) continue;
    const Engine* old = CurrentEngine(i);
    const bool shares = ShareSource(args, migrate, i) != nullptr;
    int64_t state = 0, shared = 0;
    for (const migration::Holding& h : gen.layout->holdings(gen.plan_rank[i])) {
      state += h.range.size();
      // The reference engine shares a tensor it keeps whole (EngineArgs::
      // share_with); its scalars are copied.
      if (shares &&
          gen.state->tensor(h.tensor).kind != migration::StateKind::kScalars &&
          std::find(old->holdings().begin(), old->holdings().end(), h) !=
              old->holdings().end()) {
        shared += h.range.size();
      }
    }
    const int64_t staging =
        migrate && world_rank[i] >= 0
            ? migration::StagingBytesNeeded(schedule, world_rank[i],
                                            gpus.staging_bytes)
            : 0;
    const int64_t need = state - shared + staging;
    const int64_t held = old != nullptr ? old->StateBytes() : 0;
    const int64_t free = capacity - held;
    if (need > free) {
      return absl::ResourceExhaustedError(absl::StrFormat(
          "node %s GPU %d: the switch to generation %d needs %d bytes "
          "(%.1f MiB: its new state of %d bytes, %d of them shared with the "
          "state it holds, plus %d of staging) and its GPU has %d free "
          "(%.1f MiB: %s's %.4g GiB less the %d bytes of state it holds)",
          gpus.node, i, gen.id, need, need / 1048576.0, state, shared,
          staging, free, free / 1048576.0, type.id, type.memory_gib, held));
    }
    node_need += need;
  }
  // Virtual GPUs live in the machine's memory: together they must fit what
  // it has available.
  const int64_t available = AvailableBytes();
  if (gpus.virtual_gpus && available > 0 && node_need > available) {
    return absl::ResourceExhaustedError(absl::StrFormat(
        "node %s: the switch to generation %d needs %d bytes (%.1f MiB) on "
        "this node's virtual GPUs together and the machine has %d available "
        "(%.1f MiB, MemAvailable)",
        gpus.node, gen.id, node_need, node_need / 1048576.0, available,
        available / 1048576.0));
  }
  return absl::OkStatus();
}

absl::Status NodeRuntime::Impl::CheckNode(const Cluster& cluster,
                                          absl::string_view field) const {
  for (int i = 0; i < cluster.num_nodes(); ++i) {
    const Node& n = cluster.node(i);
    if (n.name != gpus.node) continue;
    if (n.gpu_type != gpus.gpu_type || n.num_gpus != gpus.count) {
      return absl::InvalidArgumentError(absl::StrCat(
          field, ".nodes[", i, "] (", n.name, "): ", n.num_gpus, " GPUs of type ",
          catalog.type(n.gpu_type).id, ", but this agent has ", gpus.count,
          " of type ", catalog.type(gpus.gpu_type).id));
    }
    return absl::OkStatus();
  }
  return absl::InvalidArgumentError(absl::StrCat(
      field, ": has no node named \"", gpus.node, "\" (this agent's node)"));
}

absl::Status NodeRuntime::Impl::ExpectPrepared(int64_t generation) const {
  if (next == nullptr || next->id != generation) {
    return absl::FailedPreconditionError(absl::StrCat(
        "generation ", generation, " is not prepared on node ", gpus.node,
        " (current ", current ? current->id : 0, ", prepared ",
        next ? next->id : 0, ")"));
  }
  return absl::OkStatus();
}

void NodeRuntime::Impl::DropNext() {
  next.reset();
  world.reset();
  diff = {};
  schedule = {};
  transports.clear();
  world_rank.clear();
  restore_from_checkpoint = false;
}

void NodeRuntime::Impl::Loop(int local) {
  for (;;) {
    Engine* engine;
    IterationControl control;
    {
      absl::MutexLock l(&mu);
      RankLoop& me = loops[local];
      const int64_t it = current->engines[local]->iteration();
      const bool asked = pause_requested && it + 1 >= pause_at;
      if (it >= run_until || !me.error.empty()) {
        me.running = false;
        return;
      }
      control.stop_requested = asked;
      engine = current->engines[local].get();
    }
    absl::StatusOr<IterationResult> r = engine->RunIteration(control);
    absl::MutexLock l(&mu);
    RankLoop& me = loops[local];
    if (!r.ok()) {
      me.error = std::string(r.status().message());
      me.running = false;
      phase = Phase::kFailed;
      LOG(ERROR) << "node " << gpus.node << " GPU " << local << ": "
                 << r.status();
      return;
    }
    me.iteration = r->iteration;
    me.loss = r->loss;
    me.seconds = r->seconds;
    me.tokens = r->tokens;
    if (r->stop_agreed) {
      // Every rank of the plan stops here; later iterations wait for Resume.
      run_until = std::min(run_until, r->iteration);
      pause_requested = false;
    }
  }
}

void NodeRuntime::Impl::StartLoops() {
  for (int i = 0; i < gpus.count; ++i) {
    RankLoop& l = loops[i];
    if (current->engines[i] == nullptr || l.running || !l.error.empty()) {
      continue;
    }
    if (l.thread.joinable()) l.thread.join();  // finished earlier
    l.running = true;
    l.thread = std::thread([this, i]() { Loop(i); });
  }
}

void NodeRuntime::Impl::JoinLoops() {
  std::vector<std::thread> threads;
  {
    absl::MutexLock l(&mu);
    for (RankLoop& loop : loops) {
      if (loop.thread.joinable()) threads.push_back(std::move(loop.thread));
    }
  }
  for (std::thread& t : threads) t.join();
}

NodeRuntime::NodeRuntime(NodeGpus gpus, GpuCatalog catalog)
    : gpus_(std::move(gpus)), impl_(std::make_unique<Impl>(gpus_, std::move(catalog))) {
  CHECK_GT(gpus_.count, 0);
}

NodeRuntime::~NodeRuntime() {
  {
    absl::MutexLock l(&impl_->mu);
    impl_->run_until = 0;  // loops stop at their next boundary
  }
  impl_->JoinLoops();
  absl::MutexLock op(&impl_->op_mu);
  if (impl_->reaper.joinable()) impl_->reaper.join();
}

absl::StatusOr<PrepareResult> NodeRuntime::Prepare(const PrepareArgs& args) {
  absl::MutexLock op(&impl_->op_mu);
  Impl& m = *impl_;
  if (m.reaper.joinable()) m.reaper.join();
  {
    absl::MutexLock l(&m.mu);
    if (m.next != nullptr) {
      if (m.next->id == args.generation) return m.prepared_result;  // retry
      return absl::FailedPreconditionError(absl::StrCat(
          "generation ", m.next->id, " is being prepared on node ", gpus_.node,
          "; abort it before preparing generation ", args.generation));
    }
    const int64_t cur = m.current ? m.current->id : 0;
    if (args.generation <= cur || args.generation <= m.last_aborted) {
      return absl::FailedPreconditionError(absl::StrCat(
          "generation ", args.generation, " is not newer than node ",
          gpus_.node, "'s current generation ", cur, " (last aborted ",
          m.last_aborted, ")"));
    }
    // A failed generation (a peer died mid-iteration) can still be
    // replaced: an engine changes its state only in the optimizer step,
    // after its iteration's last collective, so a rank that failed holds the
    // state of its last completed iteration.
    //
    // The switch's memory window starts here (RankStatus::switch_*): the
    // peak from now on is the switch's, not that of training before it.
    ResetWindowPeak();
    m.switch_start_rss = ResidentBytes();
  }
  if (args.old_plan.has_value() != args.old_cluster.has_value()) {
    return absl::InvalidArgumentError(
        "old_plan and old_cluster: give both or neither");
  }
  if (!args.old_plan.has_value() && args.generation != 1 &&
      args.checkpoint_dir.empty()) {
    return absl::InvalidArgumentError(absl::StrCat(
        "old_plan: generation ", args.generation,
        " needs the plan it replaces (or a checkpoint_dir to restore from)"));
  }
  if (absl::Status s = m.CheckNode(args.cluster, "cluster"); !s.ok()) return s;
  // A node the old cluster does not name joins this switch afresh: a
  // generation it still holds is one the job left behind when it released
  // the node (drained, or its lease ran out), and none of its state is
  // read by this switch. It goes, so that the node prepares as a joiner
  // (its ranks, if any still run, stop at their next boundary or fail on
  // their peers within the collective timeout).
  if (args.old_cluster.has_value() &&
      !m.CheckNode(*args.old_cluster, "old_cluster").ok()) {
    int64_t stale = 0;
    {
      absl::MutexLock l(&m.mu);
      if (m.current != nullptr) {
        stale = m.current->id;
        m.run_until = 0;
      }
    }
    if (stale != 0) {
      m.JoinLoops();
      absl::MutexLock l(&m.mu);
      m.current.reset();
      m.phase = Phase::kIdle;
      LOG(INFO) << "node " << gpus_.node << ": dropped generation " << stale
                << ", which the job left behind (generation "
                << args.generation << " replaces a cluster without this node)";
    }
  }
  std::string host;
  int port = 0;
  if (absl::Status s = ParseStoreAddress(args.store_address, "store_address",
                                         &host, &port);
      !s.ok()) {
    return s;
  }
  if (absl::Status s = CheckReferencePlan(args.job, args.plan); !s.ok()) {
    return s;
  }
  auto gen = std::make_unique<GenerationState>();
  gen->id = args.generation;
  gen->job = args.job;
  gen->cluster = args.cluster;
  gen->plan = args.plan;
  gen->store_address = args.store_address;
  absl::StatusOr<migration::ModelState> state = ReferenceModelState(args.job);
  if (!state.ok()) return state.status();
  gen->state = std::make_unique<migration::ModelState>(*std::move(state));
  absl::StatusOr<migration::PlanLayout> layout =
      migration::PlanLayout::Create(*gen->state, args.plan, args.cluster);
  if (!layout.ok()) {
    return absl::InvalidArgumentError(
        absl::StrCat("plan: ", layout.status().message()));
  }
  gen->layout = std::make_unique<migration::PlanLayout>(*std::move(layout));
  gen->plan_rank.assign(gpus_.count, -1);
  for (int g = 0; g < gen->layout->num_gpus(); ++g) {
    const migration::GpuId& id = gen->layout->gpus()[g];
    if (id.node == gpus_.node && gpus_.Owns(id.index)) {
      gen->plan_rank[id.index] = g;
    }
  }
  gen->engines.resize(gpus_.count);

  PrepareResult result;
  const bool migrate = args.old_plan.has_value() && args.checkpoint_dir.empty();
  if (migrate) {
    // A joining node is absent from the old cluster; one that is there must
    // agree with this agent.
    const auto& old_nodes = args.old_cluster->nodes();
    if (std::any_of(old_nodes.begin(), old_nodes.end(),
                    [&](const Node& n) { return n.name == gpus_.node; })) {
      if (absl::Status s = m.CheckNode(*args.old_cluster, "old_cluster");
          !s.ok()) {
        return s;
      }
    }
    absl::StatusOr<migration::PlanLayout> old_layout =
        migration::PlanLayout::Create(*gen->state, *args.old_plan,
                                      *args.old_cluster);
    if (!old_layout.ok()) {
      return absl::InvalidArgumentError(
          absl::StrCat("old_plan: ", old_layout.status().message()));
    }
    m.world = std::make_unique<migration::MigrationWorld>(args.cluster,
                                                          m.catalog);
    migration::DiffOptions opts;
    opts.lost = args.lost;
    absl::StatusOr<migration::StateDiff> diff = migration::ComputeDiff(
        *gen->state, *args.old_plan, *args.old_cluster, args.plan,
        args.cluster, *m.world, opts);
    if (!diff.ok()) {
      m.world.reset();
      return diff.status();  // FailedPrecondition: a byte without a holder
    }
    m.diff = *std::move(diff);
    m.schedule = migration::BuildSchedule(m.diff, *m.world);
    result.estimated_seconds = m.schedule.makespan_s;
    m.world_rank.assign(gpus_.count, -1);
    for (int i = 0; i < gpus_.count; ++i) {
      if (!gpus_.Owns(i)) continue;
      m.world_rank[i] = m.world->RankOf({gpus_.node, i});
      const int w = m.world_rank[i];
      if (w < 0) continue;
      for (const migration::MigrationTuple& t : m.diff.tuples) {
        if (t.receiver == w) result.bytes_to_receive += t.range.size();
        if (t.sender == w) result.bytes_to_send += t.range.size();
      }
      for (const migration::Holding& h : m.diff.kept[w]) {
        result.bytes_kept += h.range.size();
      }
    }
  }

  // Admission by memory, before anything is allocated or paused: a switch
  // that would not fit on a GPU is refused here, and the current
  // generation trains on (the controller aborts the switch).
  if (absl::Status s = m.AdmitByMemory(*gen, args, migrate); !s.ok()) {
    m.world.reset();
    m.diff = {};
    m.schedule = {};
    return s;
  }

  // Off the critical path, while the current generation trains: the new
  // plan's engines (process groups under "arachne/g<n>", buffers) and the
  // migration transport of the new cluster's ranks.
  const absl::Time t0 = absl::Now();
  const bool initialize = args.generation == 1 && args.checkpoint_dir.empty();
  std::vector<EngineBuildTiming> timing(gpus_.count);
  std::vector<std::unique_ptr<migration::Transport>> transports(gpus_.count);
  absl::Status built = ForEachParallel(gpus_.count, [&](int i) -> absl::Status {
    if (migrate && m.world_rank[i] >= 0) {
      absl::StatusOr<std::unique_ptr<migration::TransportFactory>> factory =
          migration::MakeTransportFactory("gloo");
      if (!factory.ok()) return factory.status();
      absl::StatusOr<std::unique_ptr<migration::RendezvousStore>> store =
          ConnectJobStore(args.store_address,
                          GenerationPrefix(args.generation) + "/migration",
                          absl::Seconds(60));
      if (!store.ok()) return store.status();
      migration::TransportConfig config;
      config.rank = m.world_rank[i];
      config.world_size = m.world->size();
      config.store_prefix = "transport";
      config.hostname = gpus_.host;
      config.connect_timeout = absl::Seconds(60);
      // The store must outlive the transport's rendezvous only.
      absl::StatusOr<std::unique_ptr<migration::Transport>> t =
          (*factory)->Create(config, store->get());
      if (!t.ok()) return t.status();
      transports[i] = *std::move(t);
    }
    if (gen->plan_rank[i] < 0) return absl::OkStatus();
    EngineArgs ea;
    ea.job = args.job;
    ea.plan = args.plan;
    ea.state = gen->state.get();
    ea.layout = gen->layout.get();
    ea.plan_rank = gen->plan_rank[i];
    ea.generation = args.generation;
    ea.store_address = args.store_address;
    ea.initialize = initialize;
    // A migration writes the new engine's own tensors (allocated and first
    // touched now, while the old plan trains: faulting in fresh pages ran at
    // 1-2 GB/s and was most of a migration's time when it happened during
    // the pause, bench/results/reconfig.md), and what this GPU keeps whole
    // is shared with its old engine, not copied.
    ea.share_with = m.ShareSource(args, migrate, i);
    ea.listen_host = gpus_.host;
    ea.timeout = gpus_.collective_timeout;
    ea.virtual_gpu_speed = gpus_.virtual_gpu_speed;
    absl::StatusOr<std::unique_ptr<Engine>> e =
        CreateReferenceEngine(ea, &timing[i]);
    if (!e.ok()) return e.status();
    gen->engines[i] = *std::move(e);
    return absl::OkStatus();
  });
  if (!built.ok()) {
    m.world.reset();
    m.diff = {};
    m.schedule = {};
    return built;
  }
  m.t_groups = {};
  for (const EngineBuildTiming& t : timing) {
    m.t_groups.seconds = std::max(m.t_groups.seconds, t.groups_seconds);
  }
  LOG(INFO) << "node " << gpus_.node << ": prepared generation "
            << args.generation << " in "
            << absl::ToDoubleSeconds(absl::Now() - t0) << " s";

  absl::MutexLock l(&m.mu);
  m.transports = std::move(transports);
  m.restore_from_checkpoint = !args.checkpoint_dir.empty();
  m.checkpoint_dir = args.checkpoint_dir;
  m.next = std::move(gen);
  m.prepared_result = result;
  // The phase timings Status reports are this switch's from now on: a node
  // that takes no part in a phase (a joiner is not paused) reports 0 for
  // it, not a figure left from an earlier switch.
  m.t_pause = m.t_stage1 = m.t_stage2 = m.t_engines = m.t_resume = {};
  if (m.current == nullptr) m.phase = Phase::kPrepared;
  if (m.phase == Phase::kStopped || m.phase == Phase::kFailed) {
    m.phase = Phase::kPaused;  // nothing of the current generation runs
  }
  if (m.phase == Phase::kRunning) m.phase = Phase::kPrepared;
  return result;
}

absl::StatusOr<int64_t> NodeRuntime::Pause(int64_t generation,
                                           int64_t at_iteration,
                                           absl::Duration timeout) {
  absl::MutexLock op(&impl_->op_mu);
  Impl& m = *impl_;
  if (at_iteration < 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("at_iteration: must be >= 0, got ", at_iteration));
  }
  const absl::Time start = absl::Now();
  {
    absl::MutexLock l(&m.mu);
    if (absl::Status s = m.ExpectPrepared(generation); !s.ok()) return s;
    if (m.current == nullptr) {
      return absl::FailedPreconditionError(absl::StrCat(
          "generation ", generation, " is the job's first: nothing to pause"));
    }
    if (m.phase != Phase::kPrepared && m.phase != Phase::kPaused &&
        m.phase != Phase::kStopped) {
      if (m.phase == Phase::kFailed) {
        return absl::FailedPreconditionError(absl::StrCat(
            "node ", gpus_.node, ": a rank of generation ", m.current->id,
            " failed"));
      }
      int64_t it = 0;
      for (const RankLoop& r : m.loops) it = std::max(it, r.iteration);
      return it;  // already paused (a retry) or further along
    }
    m.pause_at = at_iteration;
    m.pause_requested = m.AnyRunning();
    auto stopped = [&m]() ABSL_SHARED_LOCKS_REQUIRED(m.mu) {
      return !m.AnyRunning();
    };
    if (!m.mu.AwaitWithTimeout(absl::Condition(&stopped), timeout)) {
      return absl::DeadlineExceededError(absl::StrCat(
          "node ", gpus_.node, ": the ranks of generation ", m.current->id,
          " did not stop within ", absl::FormatDuration(timeout)));
    }
    m.pause_requested = false;
    for (const RankLoop& r : m.loops) {
      if (!r.error.empty()) {
        // Its state is that of its last completed iteration (Prepare); the
        // iteration check below makes sure every local rank agrees.
        LOG(WARNING) << "node " << gpus_.node << ": pausing generation "
                     << m.current->id << " with a failed rank: " << r.error;
      }
    }
    m.phase = Phase::kPaused;
  }
  m.JoinLoops();
  absl::MutexLock l(&m.mu);
  int64_t it = -1;
  for (int i = 0; i < gpus_.count; ++i) {
    if (m.current->engines[i] == nullptr) continue;
    const int64_t e = m.current->engines[i]->iteration();
    if (it >= 0 && e != it) {
      return absl::FailedPreconditionError(absl::StrCat(
          "node ", gpus_.node, ": ranks stopped at iterations ", it, " and ",
          e, "; their states do not belong to one iteration"));
    }
    it = e;
  }
  m.t_pause = {absl::ToDoubleSeconds(absl::Now() - start), 0, 0};
  return std::max<int64_t>(it, 0);
}

absl::Status NodeRuntime::Migrate(int64_t generation, int stage,
                                  absl::Duration timeout,
                                  absl::Duration round_timeout) {
  absl::MutexLock op(&impl_->op_mu);
  Impl& m = *impl_;
  if (stage != 1 && stage != 2) {
    return absl::InvalidArgumentError(
        absl::StrCat("stage: must be 1 or 2, got ", stage));
  }
  {
    absl::MutexLock l(&m.mu);
    if (absl::Status s = m.ExpectPrepared(generation); !s.ok()) return s;
    const Phase done = stage == 1 ? Phase::kMigrated1 : Phase::kMigrated2;
    if (m.phase == done || (stage == 1 && m.phase == Phase::kMigrated2) ||
        m.phase == Phase::kRebuilt) {
      return absl::OkStatus();  // a retry
    }
    // A joining node has no current generation to pause.
    const Phase before = stage == 2          ? Phase::kMigrated1
                         : m.current == nullptr ? Phase::kPrepared
                                                : Phase::kPaused;
    if (m.phase != before) {
      return absl::FailedPreconditionError(absl::StrCat(
          "node ", gpus_.node, ": migration stage ", stage, " of generation ",
          generation, " needs phase ", PhaseName(before), ", the node is ",
          PhaseName(m.phase)));
    }
    if (m.world == nullptr) {  // a restore from a checkpoint: nothing moves
      m.phase = done;
      return absl::OkStatus();
    }
  }
  const absl::Time start = absl::Now();
  std::vector<migration::ExecutionReport> reports(gpus_.count);
  absl::Status s = ForEachParallel(gpus_.count, [&](int i) -> absl::Status {
    if (m.world_rank[i] < 0) return absl::OkStatus();
    // Straight from the paused old engine's tensors (intact until Commit:
    // nothing writes them) into the new engine's: no copy of either state.
    Engine* old = m.CurrentEngine(i);
    Engine* young = m.next->engines[i].get();
    const migration::ShardSet old_view =
        old != nullptr ? old->StateView() : migration::ShardSet();
    migration::ShardSet new_view =
        young != nullptr ? young->StateView() : migration::ShardSet();
    migration::ExecutorOptions opts;
    opts.staging_bytes = gpus_.staging_bytes;
    opts.staging = &m.staging[i];
    opts.round_timeout =
        round_timeout > absl::ZeroDuration() ? round_timeout : timeout;
    opts.only_stage = stage;
    migration::Transport* transport = m.transports[i].get();
    std::unique_ptr<CorruptingTransport> corrupt;
    if (gpus_.failpoint == absl::StrCat("corrupt-migration-stage-", stage)) {
      corrupt = std::make_unique<CorruptingTransport>(transport);
      transport = corrupt.get();
    }
    return migration::ExecuteMigration(*m.next->state, m.diff, m.schedule,
                                       old_view, transport, &new_view,
                                       &reports[i], opts);
  });
  PhaseTiming t{absl::ToDoubleSeconds(absl::Now() - start), 0, 0};
  for (const migration::ExecutionReport& r : reports) {
    const migration::StageReport& sr = stage == 1 ? r.stage1 : r.stage2;
    t.bytes_sent += sr.bytes_sent;
    t.bytes_received += sr.bytes_received;
  }
  absl::MutexLock l(&m.mu);
  (stage == 1 ? m.t_stage1 : m.t_stage2) = t;
  if (!s.ok()) {
    LOG(WARNING) << "node " << gpus_.node << ": migration stage " << stage
                 << " of generation " << generation << " failed: " << s;
    return s;
  }
  m.phase = stage == 1 ? Phase::kMigrated1 : Phase::kMigrated2;
  return absl::OkStatus();
}

absl::Status NodeRuntime::Rebuild(int64_t generation, absl::Duration timeout) {
  absl::MutexLock op(&impl_->op_mu);
  Impl& m = *impl_;
  {
    absl::MutexLock l(&m.mu);
    if (absl::Status s = m.ExpectPrepared(generation); !s.ok()) return s;
    if (m.phase == Phase::kRebuilt) return absl::OkStatus();
    // After migrating (or the no-op migration of a checkpoint restore); a
    // job's first generation has nothing to migrate.
    const Phase before = m.world == nullptr && m.phase == Phase::kPrepared
                             ? Phase::kPrepared
                             : Phase::kMigrated2;
    if (m.phase != before) {
      return absl::FailedPreconditionError(absl::StrCat(
          "node ", gpus_.node, ": rebuilding generation ", generation,
          " needs phase ", PhaseName(before), ", the node is ",
          PhaseName(m.phase)));
    }
  }
  const absl::Time start = absl::Now();
  GenerationState& gen = *m.next;
  absl::StatusOr<FullState> restored;
  if (!m.checkpoint_dir.empty()) {
    restored = ReadCheckpoint(m.checkpoint_dir, *gen.state);
    if (!restored.ok()) return restored.status();
  }
  absl::Status s = ForEachParallel(gpus_.count, [&](int i) -> absl::Status {
    if (gen.engines[i] == nullptr) return absl::OkStatus();
    if (restored.ok()) {
      migration::ShardSet in(gen.engines[i]->holdings());
      FillFromState(*restored, &in);
      return gen.engines[i]->LoadState(in);
    }
    if (m.world == nullptr) return absl::OkStatus();  // initial weights
    return gen.engines[i]->StateWritten();  // migrated in place
  });
  if (!s.ok()) return s;
  absl::MutexLock l(&m.mu);
  m.t_engines = {absl::ToDoubleSeconds(absl::Now() - start), 0, 0};
  m.phase = Phase::kRebuilt;
  return absl::OkStatus();
}

absl::Status NodeRuntime::Commit(int64_t generation) {
  absl::MutexLock op(&impl_->op_mu);
  Impl& m = *impl_;
  std::unique_ptr<GenerationState> old;
  std::vector<std::unique_ptr<migration::Transport>> transports;
  {
    absl::MutexLock l(&m.mu);
    if (m.current && m.current->id == generation && m.next == nullptr) {
      return absl::OkStatus();  // a retry
    }
    if (absl::Status s = m.ExpectPrepared(generation); !s.ok()) return s;
    if (m.phase != Phase::kRebuilt) {
      return absl::FailedPreconditionError(absl::StrCat(
          "node ", gpus_.node, ": generation ", generation,
          " is not rebuilt (phase ", PhaseName(m.phase), ")"));
    }
    old = std::move(m.current);
    m.current = std::move(m.next);
    // The switch's transports go with the old generation.
    transports = std::move(m.transports);
    m.DropNext();
    // Every rank of a plan saw the same global loss; a node that joins has
    // none until its first iteration (0).
    double loss = 0;
    for (const RankLoop& r : m.loops) {
      if (r.loss != 0) loss = r.loss;
    }
    for (int i = 0; i < gpus_.count; ++i) {
      RankLoop& r = m.loops[i];
      const Engine* e = m.current->engines[i].get();
      r.iteration = e ? e->iteration() : 0;
      r.loss = e ? loss : 0;
      r.error.clear();
    }
    m.run_until = 0;
    m.phase = Phase::kStopped;
  }
  // The old generation's engines and process groups go, beside Resume: the
  // new generation's buffers were allocated in Prepare, so nothing waits
  // for this memory.
  if (m.reaper.joinable()) m.reaper.join();
  m.reaper = std::thread(
      [old = std::move(old), t = std::move(transports)]() mutable {
        t.clear();
        old.reset();
      });
  return absl::OkStatus();
}

absl::Status NodeRuntime::Resume(int64_t generation, int64_t run_until) {
  absl::MutexLock op(&impl_->op_mu);
  Impl& m = *impl_;
  if (run_until < 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("run_until: must be >= 0, got ", run_until));
  }
  const absl::Time start = absl::Now();
  m.JoinLoops();  // threads of loops that stopped
  absl::MutexLock l(&m.mu);
  if (m.current == nullptr || m.current->id != generation) {
    return absl::FailedPreconditionError(absl::StrCat(
        "generation ", generation, " is not current on node ", gpus_.node,
        " (current ", m.current ? m.current->id : 0, ")"));
  }
  if (m.phase == Phase::kFailed || m.AnyFailed()) {
    return absl::FailedPreconditionError(absl::StrCat(
        "node ", gpus_.node, ": a rank of generation ", generation,
        " failed; it cannot resume (switch to a new plan instead)"));
  }
  if (m.next != nullptr && m.phase != Phase::kPrepared) {
    return absl::FailedPreconditionError(absl::StrCat(
        "node ", gpus_.node, ": generation ", m.next->id,
        " is mid-switch (phase ", PhaseName(m.phase),
        "); commit or abort it first"));
  }
  m.run_until = run_until == 0 ? kForever : run_until;
  m.pause_requested = false;
  m.StartLoops();
  if (m.next == nullptr) m.phase = Phase::kRunning;
  m.t_resume = {absl::ToDoubleSeconds(absl::Now() - start), 0, 0};
  return absl::OkStatus();
}

absl::Status NodeRuntime::Abort(int64_t generation) {
  absl::MutexLock op(&impl_->op_mu);
  Impl& m = *impl_;
  std::unique_ptr<GenerationState> dropped;
  std::vector<std::unique_ptr<migration::Transport>> transports;
  {
    absl::MutexLock l(&m.mu);
    if (m.next == nullptr && generation == m.last_aborted) {
      return absl::OkStatus();  // a retry
    }
    if (absl::Status s = m.ExpectPrepared(generation); !s.ok()) return s;
    dropped = std::move(m.next);
    transports = std::move(m.transports);
    m.DropNext();
    m.last_aborted = generation;
    if (m.current == nullptr) {
      m.phase = Phase::kIdle;
    } else if (m.AnyFailed()) {
      m.phase = Phase::kFailed;
    } else {
      m.phase = m.AnyRunning() ? Phase::kRunning : Phase::kStopped;
    }
  }
  // Outside the lock: tearing down groups whose peers died can take a while.
  transports.clear();
  dropped.reset();
  LOG(INFO) << "node " << gpus_.node << ": aborted generation " << generation;
  return absl::OkStatus();
}

absl::Status NodeRuntime::SaveCheckpoint(int64_t generation,
                                         const std::string& dir) {
  absl::MutexLock op(&impl_->op_mu);
  Impl& m = *impl_;
  if (dir.empty()) return absl::InvalidArgumentError("dir: must not be empty");
  absl::MutexLock l(&m.mu);
  if (m.current == nullptr || m.current->id != generation) {
    return absl::FailedPreconditionError(absl::StrCat(
        "generation ", generation, " is not current on node ", gpus_.node));
  }
  if (m.AnyRunning()) {
    return absl::FailedPreconditionError(absl::StrCat(
        "node ", gpus_.node, ": generation ", generation,
        " is training; pause it (or let it reach run_until) first"));
  }
  for (int i = 0; i < gpus_.count; ++i) {
    Engine* e = m.current->engines[i].get();
    if (e == nullptr) continue;
    migration::ShardSet shards(e->holdings());
    if (absl::Status s = e->SaveState(&shards); !s.ok()) return s;
    if (absl::Status s = WriteCheckpointShard(dir, *m.current->state,
                                              {gpus_.node, i}, shards);
        !s.ok()) {
      return s;
    }
  }
  return absl::OkStatus();
}

absl::StatusOr<StateDescription> NodeRuntime::DescribeState(
    const JobSpec& job) const {
  absl::StatusOr<migration::ModelState> state = ReferenceModelState(job);
  if (!state.ok()) return state.status();
  return StateDescription{.engine = std::string(kReferenceEngineName),
                          .state = *std::move(state)};
}

NodeStatus NodeRuntime::Status() const {
  const Impl& m = *impl_;
  absl::MutexLock l(&m.mu);
  NodeStatus st;
  st.current_generation = m.current ? m.current->id : 0;
  st.prepared_generation = m.next ? m.next->id : 0;
  st.phase = m.phase;
  const int64_t rss = PeakResidentBytes();
  const int64_t window_peak = WindowPeakResidentBytes();
  for (int i = 0; i < gpus_.count; ++i) {
    if (!gpus_.Owns(i)) continue;
    const RankLoop& r = m.loops[i];
    RankStatus rs;
    rs.gpu = {gpus_.node, i};
    const Engine* e = m.current ? m.current->engines[i].get() : nullptr;
    rs.in_plan = e != nullptr;
    rs.iteration = r.iteration;
    rs.loss = r.loss;
    rs.iteration_seconds = r.seconds;
    rs.tokens_per_second = r.seconds > 0 ? r.tokens / r.seconds : 0;
    rs.state_bytes = e ? e->StateBytes() : 0;
    rs.peak_rss_bytes = rss;
    if (m.switch_start_rss > 0) {
      rs.switch_start_rss_bytes = m.switch_start_rss;
      rs.switch_peak_rss_bytes = window_peak;
    }
    rs.error = r.error;
    if (rs.in_plan) {
      st.iteration = std::max(st.iteration, r.iteration);
      st.loss = r.loss;
    }
    st.ranks.push_back(rs);
  }
  st.pause = m.t_pause;
  st.stage1 = m.t_stage1;
  st.stage2 = m.t_stage2;
  st.rebuild_groups = m.t_groups;
  st.rebuild_engines = m.t_engines;
  st.resume = m.t_resume;
  return st;
}

}  // namespace arachne::agent
