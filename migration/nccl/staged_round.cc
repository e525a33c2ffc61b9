#include "migration/nccl/staged_round.h"

#include <algorithm>
#include <utility>

#include "absl/strings/str_cat.h"

namespace arachne::migration::nccl {
namespace {

size_t AlignUp(size_t n) {
  return (n + kStagingAlignment - 1) / kStagingAlignment * kStagingAlignment;
}

// The ops of one direction grouped by peer, each in op order, and a cursor
// (next op, offset in it) per peer as the stream is cut.
struct Streams {
  std::vector<std::vector<int>> ops;  // by peer
  std::vector<size_t> length;         // by peer
  std::vector<size_t> next_op;        // index into ops[peer]
  std::vector<size_t> op_offset;      // offset inside that op
};

absl::StatusOr<Streams> GroupByPeer(absl::Span<const StagedOp> ops,
                                    int world_size, const char* direction) {
  Streams s;
  s.ops.resize(world_size);
  s.length.assign(world_size, 0);
  s.next_op.assign(world_size, 0);
  s.op_offset.assign(world_size, 0);
  for (size_t i = 0; i < ops.size(); ++i) {
    const int peer = ops[i].peer;
    if (peer < 0 || peer >= world_size) {
      return absl::InvalidArgumentError(
          absl::StrCat("staged round: ", direction, " op ", i, " names peer ",
                       peer, " outside the world of ", world_size));
    }
    if (ops[i].bytes == 0) continue;  // no bytes, nothing to post
    s.ops[peer].push_back(static_cast<int>(i));
    s.length[peer] += ops[i].bytes;
  }
  return s;
}

// Fragment [k*chunk, ...) of the stream to/from `peer`, at `staging_offset`;
// advances the stream's cursor.
StagedTransfer CutFragment(absl::Span<const StagedOp> ops, Streams& s,
                           int peer, size_t k, size_t chunk,
                           size_t staging_offset) {
  StagedTransfer t;
  t.peer = peer;
  t.stream_offset = k * chunk;
  t.bytes = std::min(chunk, s.length[peer] - t.stream_offset);
  t.staging_offset = staging_offset;
  size_t left = t.bytes;
  size_t at = staging_offset;
  while (left > 0) {
    const int op = s.ops[peer][s.next_op[peer]];
    const size_t in_op = ops[op].bytes - s.op_offset[peer];
    const size_t take = std::min(left, in_op);
    t.pieces.push_back({op, s.op_offset[peer], take, at});
    at += take;
    left -= take;
    if (take == in_op) {
      ++s.next_op[peer];
      s.op_offset[peer] = 0;
    } else {
      s.op_offset[peer] += take;
    }
  }
  return t;
}

}  // namespace

absl::Status ValidateStagingBytes(size_t staging_bytes, int world_size) {
  if (world_size < 1) {
    return absl::InvalidArgumentError(
        absl::StrCat("staging: world size ", world_size, " is not positive"));
  }
  if (staging_bytes < kMinStagingBytes || staging_bytes > kMaxStagingBytes) {
    return absl::InvalidArgumentError(absl::StrCat(
        "staging_bytes ", staging_bytes, " is outside [", kMinStagingBytes,
        ", ", kMaxStagingBytes, "]"));
  }
  const size_t per_stream = staging_bytes / (2 * static_cast<size_t>(world_size));
  if (per_stream < kStagingAlignment) {
    return absl::InvalidArgumentError(absl::StrCat(
        "staging_bytes ", staging_bytes, " leaves ", per_stream,
        " bytes per stream for world size ", world_size,
        " (2 streams per peer); it needs at least ", kStagingAlignment,
        ", i.e. staging_bytes >= ",
        2 * static_cast<size_t>(world_size) * kStagingAlignment));
  }
  return absl::OkStatus();
}

size_t StreamChunkBytes(size_t staging_bytes, int world_size) {
  if (!ValidateStagingBytes(staging_bytes, world_size).ok()) return 0;
  return staging_bytes / (2 * static_cast<size_t>(world_size)) /
         kStagingAlignment * kStagingAlignment;
}

absl::StatusOr<StagedRoundPlan> PlanStagedRound(
    absl::Span<const StagedOp> sends, absl::Span<const StagedOp> recvs,
    int world_size, size_t staging_bytes) {
  if (absl::Status s = ValidateStagingBytes(staging_bytes, world_size);
      !s.ok()) {
    return s;
  }
  absl::StatusOr<Streams> out = GroupByPeer(sends, world_size, "send");
  if (!out.ok()) return out.status();
  absl::StatusOr<Streams> in = GroupByPeer(recvs, world_size, "receive");
  if (!in.ok()) return in.status();

  StagedRoundPlan plan;
  plan.chunk = StreamChunkBytes(staging_bytes, world_size);
  size_t longest = 0;
  for (int p = 0; p < world_size; ++p) {
    longest = std::max({longest, out->length[p], in->length[p]});
  }
  const size_t rounds = (longest + plan.chunk - 1) / plan.chunk;
  plan.sub_rounds.resize(rounds);
  for (size_t k = 0; k < rounds; ++k) {
    SubRound& sr = plan.sub_rounds[k];
    size_t at = 0;
    for (int p = 0; p < world_size; ++p) {
      if (out->length[p] <= k * plan.chunk) continue;
      sr.sends.push_back(CutFragment(sends, *out, p, k, plan.chunk, at));
      at += AlignUp(sr.sends.back().bytes);
    }
    sr.send_region = at;
    for (int p = 0; p < world_size; ++p) {
      if (in->length[p] <= k * plan.chunk) continue;
      sr.recvs.push_back(CutFragment(recvs, *in, p, k, plan.chunk, at));
      at += AlignUp(sr.recvs.back().bytes);
    }
    sr.staging_used = at;
  }
  return plan;
}

}  // namespace arachne::migration::nccl
