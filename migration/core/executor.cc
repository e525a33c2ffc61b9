#include "migration/core/executor.h"

#include <algorithm>
#include <cstring>
#include <utility>

#include "absl/strings/str_cat.h"
#include "glog/logging.h"

namespace arachne::migration {

uint64_t Checksum(const void* data, size_t bytes) {
  // FNV-1a over 8-byte words in four independent lanes (32 bytes a step),
  // folded together, then a final avalanche: sensitive to every byte and
  // its position. One lane was a serial multiply chain at ~4 GB/s, which
  // both ends of every transfer paid (bench/results/reconfig.md); four
  // lanes keep the multiplier busy.
  constexpr uint64_t kPrime = 0x100000001b3ull;
  const auto* p = static_cast<const uint8_t*>(data);
  uint64_t lane[4];
  for (int l = 0; l < 4; ++l) {
    lane[l] = (0xcbf29ce484222325ull ^ bytes) + 0x9e3779b97f4a7c15ull * l;
  }
  size_t i = 0;
  for (; i + 32 <= bytes; i += 32) {
    for (int l = 0; l < 4; ++l) {
      uint64_t w;
      std::memcpy(&w, p + i + 8 * l, 8);
      lane[l] = (lane[l] ^ w) * kPrime;
      lane[l] ^= lane[l] >> 29;
    }
  }
  uint64_t h = lane[0];
  for (int l = 1; l < 4; ++l) {
    h = (h ^ lane[l]) * kPrime;
    h ^= h >> 29;
  }
  for (; i + 8 <= bytes; i += 8) {
    uint64_t w;
    std::memcpy(&w, p + i, 8);
    h = (h ^ w) * kPrime;
    h ^= h >> 29;
  }
  for (; i < bytes; ++i) h = (h ^ p[i]) * kPrime;
  h ^= h >> 33;
  h *= 0xff51afd7ed558ccdull;
  h ^= h >> 33;
  return h;
}

ShardSet::ShardSet(std::vector<Holding> holdings)
    : holdings_(std::move(holdings)) {
  std::sort(holdings_.begin(), holdings_.end(),
            [](const Holding& a, const Holding& b) { return a.tensor < b.tensor; });
  for (const Holding& h : holdings_) data_.emplace_back(h.range.size(), 0);
}

int ShardSet::IndexOf(int tensor, const ByteRange& range) const {
  auto it = std::lower_bound(
      holdings_.begin(), holdings_.end(), tensor,
      [](const Holding& h, int t) { return h.tensor < t; });
  if (it == holdings_.end() || it->tensor != tensor) return -1;
  if (range.begin < it->range.begin || range.end > it->range.end) return -1;
  return static_cast<int>(it - holdings_.begin());
}

uint8_t* ShardSet::Find(int tensor, const ByteRange& range) {
  const int i = IndexOf(tensor, range);
  return i < 0 ? nullptr
               : data_[i].data() + (range.begin - holdings_[i].range.begin);
}

const uint8_t* ShardSet::Find(int tensor, const ByteRange& range) const {
  return const_cast<ShardSet*>(this)->Find(tensor, range);
}

int64_t ShardSet::bytes() const {
  int64_t n = 0;
  for (const auto& d : data_) n += static_cast<int64_t>(d.size());
  return n;
}

namespace {

std::string Describe(const ModelState& state, int stage, int round,
                     const Transfer& t, const TransferSegment* seg) {
  std::string s = absl::StrCat("stage ", stage, " round ", round, ": rank ",
                               t.sender, " -> rank ", t.receiver);
  if (seg != nullptr) {
    absl::StrAppend(&s, ", tensor '", state.tensor(seg->tensor).name,
                    "' bytes [", seg->range.begin, ", ", seg->range.end, ")");
  }
  return s;
}

// Wire form of a transfer: segments back to back, then a checksum each.
// Segments this large travel as their own message, without a copy.
constexpr size_t kDirectSegmentBytes = size_t{256} << 10;

}  // namespace

absl::Status ExecuteMigration(const ModelState& state, const StateDiff& diff,
                              const MigrationSchedule& schedule,
                              const ShardSet& old_state, Transport* transport,
                              ShardSet* new_state, ExecutionReport* report,
                              const ExecutorOptions& options) {
  const Clock& clock = options.clock ? *options.clock : DefaultClock();
  const int me = transport->rank();
  CHECK_GE(me, 0);
  CHECK_LT(me, static_cast<int>(diff.required.size()));
  CHECK(new_state->holdings() == diff.required[me])
      << "new_state must be built from diff.required[rank]";
  CHECK(options.only_stage >= 0 && options.only_stage <= 2)
      << options.only_stage;
  *report = ExecutionReport{};

  for (const Holding& k : options.only_stage == 2
                              ? std::vector<Holding>{}
                              : diff.kept[me]) {
    const uint8_t* from = old_state.Find(k.tensor, k.range);
    if (from == nullptr) {
      return absl::FailedPreconditionError(absl::StrCat(
          "rank ", me, " should keep bytes [", k.range.begin, ", ",
          k.range.end, ") of tensor '", state.tensor(k.tensor).name,
          "' but its old state does not hold them"));
    }
    uint8_t* to = new_state->Find(k.tensor, k.range);
    CHECK(to != nullptr);
    std::memcpy(to, from, static_cast<size_t>(k.range.size()));
    report->bytes_kept += k.range.size();
  }

  std::vector<uint8_t> send_buf, recv_buf;
  for (int stage : {1, 2}) {
    if (options.only_stage != 0 && stage != options.only_stage) continue;
    StageReport& sr = stage == 1 ? report->stage1 : report->stage2;
    const absl::Time start = clock.Now();
    const std::vector<Round>& rounds = schedule.stage(stage);
    for (int ri = 0; ri < static_cast<int>(rounds.size()); ++ri) {
      const Transfer* out = nullptr;
      const Transfer* in = nullptr;
      for (const Transfer& t : rounds[ri].transfers) {
        if (t.sender == me) out = &t;
        if (t.receiver == me) in = &t;
      }
      if (out == nullptr && in == nullptr) continue;
      auto fail = [&](const Transfer& t, absl::Status s) {
        report->failed = FailedTransfer{stage, ri, t};
        return s;
      };
      // On the wire, per transfer: every segment of at least
      // kDirectSegmentBytes as its own op, straight from the old state and
      // into the new (no copy); the smaller ones packed into one op; then
      // one op of per-segment checksums. Both ends derive the same ops from
      // the same transfer. The packing copies were a third of a large
      // migration's time (bench/results/reconfig.md).
      std::vector<SendOp> sends;
      std::vector<RecvOp> recvs;
      std::vector<uint64_t> send_sums, recv_sums;
      if (out != nullptr) {
        send_buf.clear();
        std::vector<SendOp> direct;
        for (const TransferSegment& seg : out->segments) {
          const uint8_t* from = old_state.Find(seg.tensor, seg.range);
          if (from == nullptr) {
            return fail(*out, absl::FailedPreconditionError(absl::StrCat(
                Describe(state, stage, ri, *out, &seg),
                ": the sender's old state does not hold these bytes")));
          }
          const size_t n = static_cast<size_t>(seg.range.size());
          send_sums.push_back(Checksum(from, n));
          if (n >= kDirectSegmentBytes) {
            direct.push_back({out->receiver, from, n});
          } else {
            send_buf.insert(send_buf.end(), from, from + n);
          }
        }
        sends = std::move(direct);
        if (!send_buf.empty()) {
          sends.push_back({out->receiver, send_buf.data(), send_buf.size()});
        }
        sends.push_back({out->receiver, send_sums.data(), 8 * send_sums.size()});
      }
      if (in != nullptr) {
        size_t packed = 0;
        for (const TransferSegment& seg : in->segments) {
          const size_t n = static_cast<size_t>(seg.range.size());
          uint8_t* to = new_state->Find(seg.tensor, seg.range);
          CHECK(to != nullptr) << "schedule sends bytes the rank does not need";
          if (n >= kDirectSegmentBytes) {
            recvs.push_back({in->sender, to, n});
          } else {
            packed += n;
          }
        }
        recv_buf.resize(packed);
        if (packed > 0) recvs.push_back({in->sender, recv_buf.data(), packed});
        recv_sums.resize(in->segments.size());
        recvs.push_back({in->sender, recv_sums.data(), 8 * recv_sums.size()});
      }
      const uint64_t tag = (static_cast<uint64_t>(stage) << 32) | ri;
      if (absl::Status s =
              transport->RunRound(tag, sends, recvs, options.round_timeout);
          !s.ok()) {
        const Transfer& t = in != nullptr ? *in : *out;
        return fail(t, absl::Status(
                           s.code(),
                           absl::StrCat(Describe(state, stage, ri, t, nullptr),
                                        ": ", s.message())));
      }
      ++sr.rounds;
      if (out != nullptr) sr.bytes_sent += out->bytes;
      if (in != nullptr) {
        // Verify every segment where it landed; a direct segment already
        // sits in the new state, which the caller drops on any error.
        size_t off = 0;
        for (size_t k = 0; k < in->segments.size(); ++k) {
          const TransferSegment& seg = in->segments[k];
          const size_t n = static_cast<size_t>(seg.range.size());
          uint8_t* to = new_state->Find(seg.tensor, seg.range);
          const uint8_t* got = to;
          if (n < kDirectSegmentBytes) {
            got = recv_buf.data() + off;
            off += n;
          }
          if (Checksum(got, n) != recv_sums[k]) {
            return fail(*in, absl::DataLossError(absl::StrCat(
                Describe(state, stage, ri, *in, &seg),
                ": checksum of the received bytes differs from the "
                "sender's")));
          }
          if (got != to) std::memcpy(to, got, n);
        }
        sr.bytes_received += in->bytes;
      }
    }
    sr.seconds = absl::ToDoubleSeconds(clock.Now() - start);
  }
  return absl::OkStatus();
}

}  // namespace arachne::migration
