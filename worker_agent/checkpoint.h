// Training state on disk, and whole-model state assembled from shards.
//
// A checkpoint is a directory with one file per GPU of the plan that wrote it
// (`shard-<node>-<index>.bin`), each holding that GPU's holdings in the
// canonical byte order of migration::PlanLayout, every piece named by its
// tensor and byte range and protected by a checksum. Any plan reads it back:
// a rank takes the bytes it needs from whichever pieces cover them, so a
// checkpoint written under TP 2 restores a TP 4 plan (the fallback when no
// live holder is left for some byte).
#ifndef ARACHNE_WORKER_AGENT_CHECKPOINT_H_
#define ARACHNE_WORKER_AGENT_CHECKPOINT_H_

#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "migration/core/executor.h"
#include "migration/core/state_layout.h"

namespace arachne::agent {

// Every tensor of a model whole, in canonical byte order (index: tensor id).
struct FullState {
  std::vector<std::vector<uint8_t>> tensors;
  friend bool operator==(const FullState&, const FullState&) = default;
};

// Assembles the whole state from the shards of every GPU of a plan.
// FailedPrecondition naming the tensor and the first byte no shard holds;
// DataLoss when two shards disagree on a byte they both hold (replicas that
// diverged).
absl::StatusOr<FullState> AssembleState(
    const migration::ModelState& state,
    const std::vector<const migration::ShardSet*>& shards);

// Copies the bytes `out` holds from `full`.
void FillFromState(const FullState& full, migration::ShardSet* out);

// A short description of the first difference between two states ("" when
// they are equal): the tensor name and byte offset.
std::string FirstDifference(const migration::ModelState& state,
                            const FullState& a, const FullState& b);

// Writes GPU `gpu`'s shards into `dir` (created if missing), atomically
// (temporary file, then rename).
absl::Status WriteCheckpointShard(const std::string& dir,
                                  const migration::ModelState& state,
                                  const migration::GpuId& gpu,
                                  const migration::ShardSet& shards);

// Reads every shard file of `dir`. NotFound when `dir` has none;
// DataLoss naming the file and tensor for a checksum mismatch or a truncated
// file; FailedPrecondition for a tensor this model does not have; then as
// AssembleState.
absl::StatusOr<FullState> ReadCheckpoint(const std::string& dir,
                                         const migration::ModelState& state);

}  // namespace arachne::agent

#endif  // ARACHNE_WORKER_AGENT_CHECKPOINT_H_
