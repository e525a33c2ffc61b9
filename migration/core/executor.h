// Runs one rank's part of a migration schedule over a Transport.
//
// Before the first round the rank copies the bytes it keeps from its old
// state into its new state. Then, stage by stage and round by round (every
// rank walks the same schedule), it sends the transfers whose sender it is
// and receives those whose receiver it is. A transfer's segments of 256 KiB
// and more travel as their own messages, from the old state straight into
// the new (no copy); the smaller ones packed into one message; then one
// message of per-segment checksums, computed by the sender over its own
// bytes. The receiver verifies every segment where it landed (DataLoss on a
// mismatch). Receives only ever write the new state, so when a round fails
// the old state is untouched and the caller can abort back to the old plan
// (dropping the new state, which may hold bytes that failed their check).
#ifndef ARACHNE_MIGRATION_CORE_EXECUTOR_H_
#define ARACHNE_MIGRATION_CORE_EXECUTOR_H_

#include <cstddef>
#include <cstdint>
#include <optional>
#include <vector>

#include "absl/status/status.h"
#include "absl/time/time.h"
#include "migration/core/diff.h"
#include "migration/core/schedule.h"
#include "migration/core/state_layout.h"
#include "migration/core/transport.h"
#include "planner_service/core/planners/planner.h"

namespace arachne::migration {

// 64-bit checksum of a byte range (not cryptographic: it catches corruption
// and misrouted bytes).
uint64_t Checksum(const void* data, size_t bytes);

// The shards one GPU holds, in host memory: one buffer per holding.
class ShardSet {
 public:
  // Zero-filled buffers for `holdings` (at most one per tensor).
  explicit ShardSet(std::vector<Holding> holdings);
  ShardSet() = default;

  const std::vector<Holding>& holdings() const { return holdings_; }
  // Bytes [range.begin, range.end) of `tensor` (canonical offsets) or
  // nullptr when this set does not hold all of them.
  uint8_t* Find(int tensor, const ByteRange& range);
  const uint8_t* Find(int tensor, const ByteRange& range) const;
  int64_t bytes() const;

 private:
  int IndexOf(int tensor, const ByteRange& range) const;
  std::vector<Holding> holdings_;  // sorted by tensor
  std::vector<std::vector<uint8_t>> data_;
};

struct StageReport {
  int rounds = 0;  // rounds this rank took part in
  int64_t bytes_sent = 0;
  int64_t bytes_received = 0;
  double seconds = 0;
  // Received bytes per second of the stage, in GB/s (1e9).
  double received_gbytes_per_s() const {
    return seconds > 0 ? bytes_received / seconds / 1e9 : 0;
  }
};

// Which transfer failed and where.
struct FailedTransfer {
  int stage = 0;
  int round = 0;
  Transfer transfer;
};

struct ExecutionReport {
  StageReport stage1;
  StageReport stage2;
  int64_t bytes_kept = 0;
  std::optional<FailedTransfer> failed;
};

struct ExecutorOptions {
  absl::Duration round_timeout = absl::Seconds(30);
  // 0 runs everything; 1 copies the kept bytes and runs stage 1; 2 runs
  // stage 2 only (so a caller can confirm each stage before the next, as
  // the live switch does). The report covers what ran.
  int only_stage = 0;
  const Clock* clock = nullptr;  // nullptr: real time
};

// Runs rank `transport->rank()`'s part of `schedule` (built from `diff`).
// `old_state` is what this rank held under the old plan (empty for a GPU
// that joins); `new_state` must hold exactly diff.required[rank]. Errors
// name the stage, round, peer, tensor and byte range: the transport's error
// for a failed or timed-out round, DataLoss when a received segment's
// checksum differs from the sender's, FailedPrecondition when this rank's
// old state lacks bytes the schedule says it sends. On error
// `report->failed` names the transfer and `old_state` is unchanged.
absl::Status ExecuteMigration(const ModelState& state, const StateDiff& diff,
                              const MigrationSchedule& schedule,
                              const ShardSet& old_state, Transport* transport,
                              ShardSet* new_state, ExecutionReport* report,
                              const ExecutorOptions& options = {});

}  // namespace arachne::migration

#endif  // ARACHNE_MIGRATION_CORE_EXECUTOR_H_
