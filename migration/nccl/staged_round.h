// How the NCCL transport moves a round of host buffers through a bounded
// staging buffer (TransportConfig::staging_bytes): the round is cut into
// sub-rounds, each one NCCL group. CUDA-free, so the cut is tested on CPU
// (test/migration/nccl_staging_test.cc).
//
// THE CUT. A directed stream is the concatenation, in op order, of a rank's
// sends to one peer (or of its receives from one peer). By the Transport
// contract both ends of a pair list the same op sizes in the same order, so
// the sender's stream to B and B's stream from the sender have the same
// bytes. Every stream is cut at the fixed offsets k*c (k = 0, 1, ...), and
// sub-round k carries bytes [k*c, min((k+1)*c, length)) of every stream
// longer than k*c, as ONE ncclSend / ncclRecv of that fragment. The per-
// stream chunk
//   c = floor(staging_bytes / (2 * world_size) / 256) * 256
// depends only on staging_bytes and world_size, which are equal on every
// rank (the transport checks staging_bytes at connect), so both ends of a
// pair cut their stream into the same fragments in the same sub-rounds
// whatever else either rank does: NCCL matches the k-th send A->B with the
// k-th receive at B, and sub-round k of every rank holds exactly the
// fragments k of its streams, so each group's ops are all matched by the
// peers' groups with the same index (induction on k: no deadlock). A rank
// whose streams are shorter runs fewer sub-rounds; that is fine, as no
// peer waits for it in the later ones. Zero-byte ops carry no bytes and
// post nothing on either end.
//
// THE BOUND. A rank has at most world_size send streams and world_size
// receive streams (one per peer, itself included), each contributes at most
// one fragment of at most c bytes per sub-round, placed at a 256-byte
// aligned offset (c is a multiple of 256), so a sub-round stages at most
// 2 * world_size * c <= staging_bytes bytes. Sends come first in the
// staging buffer ([0, send_region)), receives after ([send_region,
// staging_used)), so one host-to-device and one device-to-host copy move
// each sub-round.
#ifndef ARACHNE_MIGRATION_NCCL_STAGED_ROUND_H_
#define ARACHNE_MIGRATION_NCCL_STAGED_ROUND_H_

#include <cstddef>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/types/span.h"

namespace arachne::migration::nccl {

// Offsets in the staging buffer are multiples of this.
inline constexpr size_t kStagingAlignment = 256;
// The range TransportConfig::staging_bytes must be in.
inline constexpr size_t kMinStagingBytes = size_t{4} << 10;   // 4 KiB
inline constexpr size_t kMaxStagingBytes = size_t{64} << 30;  // 64 GiB

// InvalidArgument, naming the value and the bound it breaks, when
// staging_bytes is outside [kMinStagingBytes, kMaxStagingBytes] or gives a
// per-stream chunk below kStagingAlignment for this world size (that is,
// staging_bytes < 2 * world_size * 256); also for world_size < 1.
absl::Status ValidateStagingBytes(size_t staging_bytes, int world_size);

// The per-stream chunk c above (0 when ValidateStagingBytes fails).
size_t StreamChunkBytes(size_t staging_bytes, int world_size);

// One op of a round as the planner sees it: the peer and the size.
struct StagedOp {
  int peer = 0;
  size_t bytes = 0;
};

// Bytes [op_offset, op_offset + bytes) of op `op` (an index into the sends
// or the receives) live at [staging_offset, staging_offset + bytes) of the
// staging buffer.
struct StagedPiece {
  int op = 0;
  size_t op_offset = 0;
  size_t bytes = 0;
  size_t staging_offset = 0;
};

// One fragment of one stream: a single ncclSend/ncclRecv of `bytes` from/to
// [staging_offset, staging_offset + bytes), which is bytes
// [stream_offset, stream_offset + bytes) of the stream to/from `peer`; the
// pieces say which ops those bytes belong to (contiguous, in op order).
struct StagedTransfer {
  int peer = 0;
  size_t stream_offset = 0;
  size_t bytes = 0;
  size_t staging_offset = 0;
  std::vector<StagedPiece> pieces;
};

// One NCCL group. Sends, by ascending peer, lie in [0, send_region);
// receives, by ascending peer, in [send_region, staging_used).
struct SubRound {
  std::vector<StagedTransfer> sends;
  std::vector<StagedTransfer> recvs;
  size_t send_region = 0;
  size_t staging_used = 0;
};

struct StagedRoundPlan {
  size_t chunk = 0;  // c
  std::vector<SubRound> sub_rounds;
};

// The sub-rounds of one rank's round. InvalidArgument for an invalid
// staging size (ValidateStagingBytes) or a peer outside [0, world_size).
// No sub-rounds when the round carries no bytes.
absl::StatusOr<StagedRoundPlan> PlanStagedRound(
    absl::Span<const StagedOp> sends, absl::Span<const StagedOp> recvs,
    int world_size, size_t staging_bytes);

}  // namespace arachne::migration::nccl

#endif  // ARACHNE_MIGRATION_NCCL_STAGED_ROUND_H_
