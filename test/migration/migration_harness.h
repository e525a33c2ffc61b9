// Runs a whole migration on Gloo with the ranks as forked processes, the way
// the worker agents will: every rank recomputes the diff and the schedule
// from the same inputs, fills its old shards with reference content, runs
// the executor and checks its new shards against the reference, bit for bit.
#ifndef ARACHNE_TEST_MIGRATION_MIGRATION_HARNESS_H_
#define ARACHNE_TEST_MIGRATION_MIGRATION_HARNESS_H_

#include <algorithm>
#include <cstdint>
#include <cstring>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "migration/core/diff.h"
#include "migration/core/executor.h"
#include "migration/core/schedule.h"
#include "migration/core/state_layout.h"
#include "migration/core/rendezvous_store.h"
#include "migration/core/transport.h"
#include "planner_service/core/model/cluster.h"
#include "planner_service/core/model/gpu_catalog.h"
#include "planner_service/core/model/plan.h"
#include "test/migration/forked_ranks.h"
#include "test/migration/guarded_memory.h"

namespace arachne::migration::testing {

// Deterministic content of a tensor: byte `offset` depends only on
// (tensor, offset), so any GPU can compute what any range must hold.
inline uint8_t ReferenceByte(int tensor, int64_t offset) {
  uint64_t z = (static_cast<uint64_t>(tensor) << 40) ^
               static_cast<uint64_t>(offset / 8) ^ 0x9e3779b97f4a7c15ull;
  z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
  z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
  z ^= z >> 31;
  return static_cast<uint8_t>(z >> (8 * (offset % 8)));
}

inline void FillReference(ShardSet& set) {
  for (const Holding& h : set.holdings()) {
    uint8_t* p = set.Find(h.tensor, h.range);
    for (int64_t o = h.range.begin; o < h.range.end; ++o) {
      p[o - h.range.begin] = ReferenceByte(h.tensor, o);
    }
  }
}

// OK when every byte of `set` equals the reference; else DataLoss naming
// the first wrong byte.
inline absl::Status CheckReference(const ModelState& state,
                                   const ShardSet& set) {
  for (const Holding& h : set.holdings()) {
    const uint8_t* p = set.Find(h.tensor, h.range);
    for (int64_t o = h.range.begin; o < h.range.end; ++o) {
      if (p[o - h.range.begin] != ReferenceByte(h.tensor, o)) {
        return absl::DataLossError(absl::StrCat(
            "tensor '", state.tensor(h.tensor).name, "' byte ", o,
            " differs from the reference"));
      }
    }
  }
  return absl::OkStatus();
}

struct MigrationCase {
  ModelSpec model;
  GpuCatalog catalog;
  Cluster old_cluster;
  Plan old_plan;
  Cluster new_cluster;
  Plan new_plan;
  DiffOptions diff_options;
  ScheduleOptions schedule_options;
};

// What one rank holds under `plan` on `cluster` (empty if unused).
inline std::vector<Holding> HoldingsOf(const PlanLayout& layout,
                                       const GpuId& gpu) {
  for (int g = 0; g < layout.num_gpus(); ++g) {
    if (layout.gpus()[g] == gpu) return layout.holdings(g);
  }
  return {};
}

// Wraps a transport; `tamper` may change a received buffer after a round.
class TamperingTransport : public Transport {
 public:
  TamperingTransport(std::unique_ptr<Transport> inner,
                     std::function<void(const RecvOp&)> tamper)
      : inner_(std::move(inner)), tamper_(std::move(tamper)) {}
  std::string name() const override { return inner_->name(); }
  int rank() const override { return inner_->rank(); }
  int world_size() const override { return inner_->world_size(); }
  MemoryKind memory() const override { return inner_->memory(); }
  absl::Status RunRound(uint64_t tag, absl::Span<const SendOp> sends,
                        absl::Span<const RecvOp> recvs,
                        absl::Duration timeout) override {
    absl::Status s = inner_->RunRound(tag, sends, recvs, timeout);
    for (const RecvOp& r : recvs) tamper_(r);
    return s;
  }

 private:
  std::unique_ptr<Transport> inner_;
  std::function<void(const RecvOp&)> tamper_;
};

// Per-rank hooks: wrap the transport, or check the outcome instead of
// expecting success.
struct RankHooks {
  std::function<std::unique_ptr<Transport>(int, std::unique_ptr<Transport>)>
      wrap;
  std::function<absl::Status(int rank, absl::Status run,
                             const ExecutionReport&, const ShardSet& old_state,
                             const ShardSet& new_state)>
      check;
  absl::Duration round_timeout = absl::Seconds(20);
  int64_t staging_bytes = ExecutorOptions::kDefaultStagingBytes;
  // The new state shares the old state's buffer for every holding both have
  // whole (as an engine shares the tensors it keeps), instead of owning one.
  bool share_kept = false;
  // Ranks that connect but take no part (to provoke timeouts).
  std::vector<int> idle_ranks;
  // Both states in a GuardedMemory (device memory stood in for on a CPU)
  // and the transport wrapped to take it; `check_memory` then sees what the
  // executor did there.
  bool guarded_memory = false;
  // false leaves the host transport unwrapped (a state and a transport in
  // different memories).
  bool wrap_guarded = true;
  std::function<absl::Status(int rank, const GuardedMemory&,
                             const ExecutionReport&)>
      check_memory;
};

// Runs `c` on `factory` over forked ranks; the Status of every rank.
inline std::vector<absl::Status> RunMigration(
    const MigrationCase& c, TransportFactory* factory,
    const RankHooks& hooks = {}) {
  const MigrationWorld world(c.new_cluster, c.catalog);
  const std::string dir = MakeTempDir();
  return RunForkedRanks(world.size(), [&](int rank) -> absl::Status {
    auto state = ModelState::Create(c.model);
    if (!state.ok()) return state.status();
    auto diff = ComputeDiff(*state, c.old_plan, c.old_cluster, c.new_plan,
                            c.new_cluster, world, c.diff_options);
    if (!diff.ok()) return diff.status();
    const MigrationSchedule schedule =
        BuildSchedule(*diff, world, c.schedule_options);
    auto old_layout = PlanLayout::Create(*state, c.old_plan, c.old_cluster);
    if (!old_layout.ok()) return old_layout.status();
    bool lost = false;
    for (const GpuId& g : c.diff_options.lost) lost |= g == world.gpu(rank);
    ShardSet old_state(lost ? std::vector<Holding>{}
                            : HoldingsOf(*old_layout, world.gpu(rank)));
    FillReference(old_state);
    ShardSet fresh, new_state;
    if (hooks.share_kept) {
      std::vector<Holding> rest;
      for (const Holding& h : diff->required[rank]) {
        if (old_state.Find(h.tensor, h.range) == nullptr) rest.push_back(h);
      }
      fresh = ShardSet(rest);
      std::vector<uint8_t*> data;
      for (const Holding& h : diff->required[rank]) {
        uint8_t* mine = old_state.Find(h.tensor, h.range);
        data.push_back(mine ? mine : fresh.Find(h.tensor, h.range));
      }
      new_state = ShardSet::View(diff->required[rank], std::move(data));
    } else {
      new_state = ShardSet(diff->required[rank]);
    }
    FileRendezvousStore store(dir);
    auto transport = factory->Create(
        {.rank = rank, .world_size = world.size(), .store_prefix = "m"},
        &store);
    if (!transport.ok()) return transport.status();
    std::unique_ptr<Transport> t = *std::move(transport);
    if (hooks.wrap) t = hooks.wrap(rank, std::move(t));
    for (int idle : hooks.idle_ranks) {
      if (idle != rank) continue;
      // Stay connected until every working rank is done, so they fail by
      // timeout, not by a closed connection.
      for (int r = 0; r < world.size(); ++r) {
        if (std::find(hooks.idle_ranks.begin(), hooks.idle_ranks.end(), r) !=
            hooks.idle_ranks.end()) {
          continue;
        }
        if (absl::Status s =
                store.Get(absl::StrCat("m/finished/", r), absl::Seconds(20))
                    .status();
            !s.ok()) {
          return s;
        }
      }
      return absl::OkStatus();
    }
    ExecutionReport report;
    ExecutorOptions options{.round_timeout = hooks.round_timeout,
                            .staging_bytes = hooks.staging_bytes};
    ShardSet* old_p = &old_state;
    ShardSet* new_p = &new_state;
    std::unique_ptr<GuardedMemory> guarded;
    ShardSet guarded_old, guarded_new;
    if (hooks.guarded_memory) {
      guarded = std::make_unique<GuardedMemory>(
          2 * static_cast<size_t>(old_state.bytes() + new_state.bytes()) +
          static_cast<size_t>(hooks.staging_bytes) + (size_t{1} << 20));
      guarded_old = guarded->State(old_state.holdings());
      guarded_new = guarded->State(new_state.holdings());
      guarded->Open();
      for (const Holding& h : old_state.holdings()) {
        std::memcpy(guarded_old.Find(h.tensor, h.range),
                    old_state.Find(h.tensor, h.range),
                    static_cast<size_t>(h.range.size()));
      }
      guarded->Close();
      if (hooks.wrap_guarded) {
        t = std::make_unique<GuardedTransport>(std::move(t), guarded.get());
      }
      options.memory = guarded.get();
      old_p = &guarded_old;
      new_p = &guarded_new;
    }
    const absl::Status run = ExecuteMigration(*state, *diff, schedule, *old_p,
                                              t.get(), new_p, &report, options);
    if (guarded) guarded->Open();  // the checks below read the states
    if (!hooks.idle_ranks.empty()) {
      (void)store.Set(absl::StrCat("m/finished/", rank), "1");
    }
    if (hooks.check_memory && run.ok()) {
      if (absl::Status s = hooks.check_memory(rank, *guarded, report); !s.ok()) {
        return s;
      }
    }
    if (hooks.check) {
      return hooks.check(rank, run, report, *old_p, *new_p);
    }
    if (!run.ok()) return run;
    if (report.stage1.bytes_received + report.stage2.bytes_received +
            report.bytes_kept !=
        new_p->bytes()) {
      return absl::InternalError("received + kept != required bytes");
    }
    return CheckReference(*state, *new_p);
  });
}

}  // namespace arachne::migration::testing

#endif  // ARACHNE_TEST_MIGRATION_MIGRATION_HARNESS_H_
