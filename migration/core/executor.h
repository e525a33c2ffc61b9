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
#include "migration/core/checksum.h"
#include "migration/core/diff.h"
#include "migration/core/schedule.h"
#include "migration/core/state_layout.h"
#include "migration/core/state_memory.h"
#include "migration/core/transport.h"
#include "planner_service/core/planners/planner.h"

namespace arachne::migration {

// The shards one GPU holds: one buffer per holding, either owned by the set
// (zero-filled host memory) or a view of someone else's (an engine's own
// tensors, in canonical byte order, in host or device memory), so a
// migration reads the old engine's state and writes the new engine's where
// they live, with no copy of either.
class ShardSet {
 public:
  // Owned zero-filled buffers for `holdings` (at most one per tensor).
  explicit ShardSet(std::vector<Holding> holdings);
  // A view: data[i] holds holdings[i]'s bytes and must outlive the set.
  static ShardSet View(std::vector<Holding> holdings,
                       std::vector<uint8_t*> data);
  ShardSet() = default;
  // Moves keep the buffers where they are (a view stays a view); no copies,
  // so a view is never mistaken for the bytes it shows.
  ShardSet(ShardSet&&) = default;
  ShardSet& operator=(ShardSet&&) = default;
  ShardSet(const ShardSet&) = delete;
  ShardSet& operator=(const ShardSet&) = delete;

  const std::vector<Holding>& holdings() const { return holdings_; }
  // Bytes [range.begin, range.end) of `tensor` (canonical offsets) or
  // nullptr when this set does not hold all of them.
  uint8_t* Find(int tensor, const ByteRange& range);
  const uint8_t* Find(int tensor, const ByteRange& range) const;
  int64_t bytes() const;

 private:
  int IndexOf(int tensor, const ByteRange& range) const;
  std::vector<Holding> holdings_;  // sorted by tensor
  std::vector<uint8_t*> data_;     // per holding
  std::vector<std::vector<uint8_t>> owned_;  // empty for a view
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
  // Of bytes_kept, those the new state shares with the old (the same
  // buffer: an engine that kept a whole tensor), so nothing was copied.
  int64_t bytes_shared = 0;
  // The most staging memory the transfers used at once (packed small
  // segments, both directions), bytes: at most ExecutorOptions::staging_bytes.
  int64_t staging_peak = 0;
  std::optional<FailedTransfer> failed;
};

// Staging memory an ExecuteMigration caller keeps between switches, in the
// state's memory: the packs of small segments each way and the checksum
// messages.
struct Staging {
  StagingBuffer send, recv, send_sums, recv_sums;
};

struct ExecutorOptions {
  absl::Duration round_timeout = absl::Seconds(30);
  // 0 runs everything; 1 copies the kept bytes and runs stage 1; 2 runs
  // stage 2 only (so a caller can confirm each stage before the next, as
  // the live switch does). The report covers what ran.
  int only_stage = 0;
  const Clock* clock = nullptr;  // nullptr: real time
  // The most host memory a rank's packed small segments may take at once,
  // half for sending and half for receiving; a transfer whose small
  // segments need more is sent in several sub-rounds. Large segments go
  // straight from the old state into the new and need none.
  int64_t staging_bytes = kDefaultStagingBytes;
  static constexpr int64_t kDefaultStagingBytes = int64_t{256} << 20;
  static constexpr int64_t kMinStagingBytes = int64_t{1} << 20;
  // Where the staging memory lives: kept by the caller across switches, so
  // it is allocated once, not per transfer; nullptr uses buffers of this
  // call's own.
  Staging* staging = nullptr;
  // The memory both states live in; nullptr: HostMemory(). It must be the
  // memory the transport takes (Transport::memory()).
  StateMemory* memory = nullptr;
};


// The staging memory ExecuteMigration allocates for rank `rank`'s part of
// `schedule` with `staging_bytes` (ExecutorOptions), bytes: the largest pack
// it sends plus the largest it receives. At most staging_bytes.
int64_t StagingBytesNeeded(const MigrationSchedule& schedule, int rank,
                           int64_t staging_bytes);

// Runs rank `transport->rank()`'s part of `schedule` (built from `diff`).
// `old_state` is what this rank held under the old plan (empty for a GPU
// that joins); `new_state` must hold exactly diff.required[rank]. Kept bytes
// are copied from the old state into the new one, except where both are the
// same buffer (a view of a tensor the new engine shares with the old). Errors
// name the stage, round, peer, tensor and byte range: the transport's error
// for a failed or timed-out round, DataLoss when a received segment's
// checksum differs from the sender's, FailedPrecondition when this rank's
// old state lacks bytes the schedule says it sends or the state's memory is
// not the transport's, the memory's error when a copy or checksum there
// fails. On error
// `report->failed` names the transfer and `old_state` is unchanged.
absl::Status ExecuteMigration(const ModelState& state, const StateDiff& diff,
                              const MigrationSchedule& schedule,
                              const ShardSet& old_state, Transport* transport,
                              ShardSet* new_state, ExecutionReport* report,
                              const ExecutorOptions& options = {});

}  // namespace arachne::migration

#endif  // ARACHNE_MIGRATION_CORE_EXECUTOR_H_
