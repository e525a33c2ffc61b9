// The two-stage migration schedule (paper §5.6).
//
// Stage 1 runs the tuples whose sender and receiver lie in one pipeline
// replica of the new plan (all pipelines at once); stage 2 runs the rest.
// Each stage is a sequence of rounds. In a round every rank sends to at most
// one peer and receives from at most one, so both ends of a transfer know its
// peer and size in advance (what NCCL point-to-point needs) and nothing can
// deadlock. A transfer carries the bytes of several tuples between one pair;
// pair streams are cut into pieces of about one quantum of link time
// (stage lower bound / target_rounds), so rounds stay short and even.
//
// Cost model: alone, a transfer takes bytes / BytesPerSecond(sender,
// receiver). The inter-node transfers of a round that pass one NIC share its
// bandwidth. A round takes the longest of: each GPU's transfer on its
// intra-node link, each NIC's bytes (either direction) over its bandwidth;
// plus a fixed latency. A stage is the sum of its rounds. The lower bound is
// the busiest resource over both stages: a GPU's sends or receives (one at a
// time) or a node's NIC in either direction.
//
// Deterministic: the same diff, world and options give the same schedule on
// every rank (no randomness, no hash-order iteration, ties broken by rank).
#ifndef ARACHNE_MIGRATION_CORE_SCHEDULE_H_
#define ARACHNE_MIGRATION_CORE_SCHEDULE_H_

#include <cstdint>
#include <vector>

#include "migration/core/diff.h"
#include "migration/core/state_layout.h"

namespace arachne::migration {

// Part of one tuple carried by a transfer.
struct TransferSegment {
  int tensor = 0;
  ByteRange range;
  friend bool operator==(const TransferSegment&, const TransferSegment&) =
      default;
};

// One message from `sender` to `receiver` in a round: its segments, in
// order, packed back to back.
struct Transfer {
  int sender = 0;
  int receiver = 0;
  std::vector<TransferSegment> segments;
  int64_t bytes = 0;
  double estimated_s = 0;  // bytes over the pair's link, alone on it
  friend bool operator==(const Transfer&, const Transfer&) = default;
};

struct Round {
  std::vector<Transfer> transfers;  // sorted by sender
  double estimated_s = 0;  // its busiest resource (see the file comment)
  friend bool operator==(const Round&, const Round&) = default;
};

struct ScheduleOptions {
  // A round holds about one quantum = (stage lower bound / target_rounds)
  // seconds of link time per resource; more rounds balance better but pay
  // more per-round latency.
  int target_rounds = 64;
  // Pieces are a fraction of a quantum, so a round can pack several (of
  // one pair, or through one NIC) and fill its busiest links.
  int pieces_per_quantum = 4;
  // No piece is cut smaller than this (unless its tuple is smaller).
  int64_t min_piece_bytes = int64_t{1} << 20;
  // Fixed cost of a round (launch, synchronisation), seconds.
  double round_latency_s = 0;
};

struct MigrationSchedule {
  std::vector<Round> stage1;
  std::vector<Round> stage2;
  double stage1_s = 0;
  double stage2_s = 0;
  double makespan_s = 0;     // stage1_s + stage2_s
  double lower_bound_s = 0;  // over both stages; see the file comment
  double stage1_bound_s = 0;  // the same over each stage's tuples alone
  double stage2_bound_s = 0;
  int64_t bytes = 0;
  double ratio() const {
    return lower_bound_s > 0 ? makespan_s / lower_bound_s : 1.0;
  }
  const std::vector<Round>& stage(int s) const {
    return s == 1 ? stage1 : stage2;
  }
};

// Busiest resource time of `tuples` (see the file comment), seconds.
double LowerBoundSeconds(const std::vector<MigrationTuple>& tuples,
                         const MigrationWorld& world);

// The schedule of `diff`'s tuples. CHECKs that every tuple names ranks of
// `world`.
MigrationSchedule BuildSchedule(const StateDiff& diff,
                                const MigrationWorld& world,
                                const ScheduleOptions& options = {});

}  // namespace arachne::migration

#endif  // ARACHNE_MIGRATION_CORE_SCHEDULE_H_
