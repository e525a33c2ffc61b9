#include "migration/core/executor.h"

#include <algorithm>
#include <cstring>
#include <utility>

#include "absl/strings/str_cat.h"
#include "glog/logging.h"

namespace arachne::migration {

ShardSet::ShardSet(std::vector<Holding> holdings)
    : holdings_(std::move(holdings)) {
  std::sort(holdings_.begin(), holdings_.end(),
            [](const Holding& a, const Holding& b) { return a.tensor < b.tensor; });
  for (const Holding& h : holdings_) {
    owned_.emplace_back(h.range.size(), 0);
    data_.push_back(owned_.back().data());
  }
}

ShardSet ShardSet::View(std::vector<Holding> holdings,
                        std::vector<uint8_t*> data) {
  CHECK_EQ(holdings.size(), data.size());
  std::vector<int> order(holdings.size());
  for (size_t i = 0; i < order.size(); ++i) order[i] = static_cast<int>(i);
  std::sort(order.begin(), order.end(), [&](int a, int b) {
    return holdings[a].tensor < holdings[b].tensor;
  });
  ShardSet set;
  for (int i : order) {
    CHECK(data[i] != nullptr || holdings[i].range.empty())
        << "no buffer for tensor " << holdings[i].tensor;
    set.holdings_.push_back(holdings[i]);
    set.data_.push_back(data[i]);
  }
  return set;
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
               : data_[i] + (range.begin - holdings_[i].range.begin);
}

const uint8_t* ShardSet::Find(int tensor, const ByteRange& range) const {
  return const_cast<ShardSet*>(this)->Find(tensor, range);
}

int64_t ShardSet::bytes() const {
  int64_t n = 0;
  for (const Holding& h : holdings_) n += h.range.size();
  return n;
}

namespace {

const char* KindName(MemoryKind kind) {
  return kind == MemoryKind::kHost ? "host" : "device";
}

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

// Segments this large travel as their own message, without a copy; the
// smaller ones are packed.
constexpr size_t kDirectSegmentBytes = size_t{256} << 10;

// How one transfer goes on the wire: its large segments (indices into
// Transfer::segments) as messages of their own, its small ones in packs of
// at most `pack_bytes`, in segment order. Sub-round k carries pack k (and
// sub-round 0 the large segments and the checksums).
struct WirePlan {
  std::vector<int> direct;
  std::vector<std::vector<int>> pack;
  int packs() const { return std::max<int>(1, static_cast<int>(pack.size())); }
};

WirePlan PlanWire(const Transfer& t, size_t pack_bytes) {
  CHECK_GE(pack_bytes, kDirectSegmentBytes);
  WirePlan w;
  size_t in_pack = 0;
  for (int k = 0; k < static_cast<int>(t.segments.size()); ++k) {
    const size_t n = static_cast<size_t>(t.segments[k].range.size());
    if (n >= kDirectSegmentBytes) {
      w.direct.push_back(k);
      continue;
    }
    if (w.pack.empty() || in_pack + n > pack_bytes) {
      w.pack.emplace_back();
      in_pack = 0;
    }
    w.pack.back().push_back(k);
    in_pack += n;
  }
  return w;
}

}  // namespace

int64_t StagingBytesNeeded(const MigrationSchedule& schedule, int rank,
                           int64_t staging_bytes) {
  const size_t half = static_cast<size_t>(staging_bytes / 2);
  int64_t send = 0, recv = 0;
  for (int stage : {1, 2}) {
    for (const Round& round : schedule.stage(stage)) {
      for (const Transfer& t : round.transfers) {
        if (t.sender != rank && t.receiver != rank) continue;
        int64_t& most = t.sender == rank ? send : recv;
        const Transfer& tr = t;
        for (const std::vector<int>& pack : PlanWire(tr, half).pack) {
          int64_t n = 0;
          for (int k : pack) n += tr.segments[k].range.size();
          most = std::max(most, n);
        }
      }
    }
  }
  return send + recv;
}

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
  CHECK_GE(options.staging_bytes, ExecutorOptions::kMinStagingBytes);
  *report = ExecutionReport{};
  StateMemory& memory = options.memory ? *options.memory : HostMemory();
  if (memory.kind() != transport->memory()) {
    return absl::FailedPreconditionError(absl::StrCat(
        "rank ", me, ": the state is in ", KindName(memory.kind()),
        " memory but the '", transport->name(), "' transport takes ",
        KindName(transport->memory()), " memory"));
  }

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
    if (to == from) {
      report->bytes_shared += k.range.size();
    } else if (absl::Status c = memory.Copy(
                   to, from, static_cast<size_t>(k.range.size()));
               !c.ok()) {
      return absl::Status(
          c.code(), absl::StrCat("rank ", me, " copying the bytes it keeps of "
                                 "tensor '", state.tensor(k.tensor).name,
                                 "': ", c.message()));
    }
    report->bytes_kept += k.range.size();
  }

  Staging own_staging;
  Staging& staging = options.staging ? *options.staging : own_staging;
  const size_t half = static_cast<size_t>(options.staging_bytes / 2);
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
      if (out != nullptr) {
        for (const TransferSegment& seg : out->segments) {
          if (old_state.Find(seg.tensor, seg.range) == nullptr) {
            return fail(*out, absl::FailedPreconditionError(absl::StrCat(
                Describe(state, stage, ri, *out, &seg),
                ": the sender's old state does not hold these bytes")));
          }
        }
      }
      const WirePlan send_plan = out ? PlanWire(*out, half) : WirePlan{};
      const WirePlan recv_plan = in ? PlanWire(*in, half) : WirePlan{};
      // Sub-round 0 carries every large segment, straight from the old state
      // into the new (no copy), the per-segment checksums and the first
      // pack of small segments; each further pack has a sub-round of its
      // own, so the staging memory never exceeds one pack each way. Both
      // ends derive the same wire plan from the same transfer. The packing
      // copies were a third of a large migration's time when every segment
      // was packed (bench/results/reconfig.md).
      // The checksums travel in the state's memory (a device transport
      // takes device buffers only), computed and read on the host.
      std::vector<uint64_t> send_sums, recv_sums;
      if (out != nullptr) {
        for (const TransferSegment& seg : out->segments) {
          absl::StatusOr<uint64_t> sum =
              memory.Checksum(old_state.Find(seg.tensor, seg.range),
                              static_cast<size_t>(seg.range.size()));
          if (!sum.ok()) {
            return fail(*out, absl::Status(
                                  sum.status().code(),
                                  absl::StrCat(Describe(state, stage, ri, *out,
                                                        &seg),
                                               ": ", sum.status().message())));
          }
          send_sums.push_back(*sum);
        }
        const size_t n = 8 * send_sums.size();
        if (absl::Status r = staging.send_sums.Reserve(memory, n); !r.ok()) {
          return fail(*out, r);
        }
        if (absl::Status c = memory.FromHost(staging.send_sums.data(),
                                             send_sums.data(), n);
            !c.ok()) {
          return fail(*out, c);
        }
      }
      if (in != nullptr) {
        recv_sums.resize(in->segments.size());
        if (absl::Status r =
                staging.recv_sums.Reserve(memory, 8 * recv_sums.size());
            !r.ok()) {
          return fail(*in, r);
        }
      }
      const int subs = std::max(send_plan.packs(), recv_plan.packs());
      for (int sub = 0; sub < subs; ++sub) {
        std::vector<SendOp> sends;
        std::vector<RecvOp> recvs;
        if (out != nullptr && sub < send_plan.packs()) {
          if (sub == 0) {
            for (int k : send_plan.direct) {
              const TransferSegment& seg = out->segments[k];
              sends.push_back({out->receiver,
                               old_state.Find(seg.tensor, seg.range),
                               static_cast<size_t>(seg.range.size())});
            }
          }
          if (sub < static_cast<int>(send_plan.pack.size()) &&
              !send_plan.pack[sub].empty()) {
            size_t n = 0;
            for (int k : send_plan.pack[sub]) n += out->segments[k].range.size();
            if (absl::Status r = staging.send.Reserve(memory, n); !r.ok()) {
              return fail(*out, r);
            }
            uint8_t* at = staging.send.data();
            for (int k : send_plan.pack[sub]) {
              const TransferSegment& seg = out->segments[k];
              const size_t b = static_cast<size_t>(seg.range.size());
              if (absl::Status c =
                      memory.Copy(at, old_state.Find(seg.tensor, seg.range), b);
                  !c.ok()) {
                return fail(*out, c);
              }
              at += b;
            }
            sends.push_back({out->receiver, staging.send.data(), n});
          }
          if (sub == 0) {
            sends.push_back({out->receiver, staging.send_sums.data(),
                             8 * send_sums.size()});
          }
        }
        size_t packed_in = 0;
        if (in != nullptr && sub < recv_plan.packs()) {
          if (sub == 0) {
            for (int k : recv_plan.direct) {
              const TransferSegment& seg = in->segments[k];
              uint8_t* to = new_state->Find(seg.tensor, seg.range);
              CHECK(to != nullptr)
                  << "schedule sends bytes the rank does not need";
              recvs.push_back({in->sender, to,
                               static_cast<size_t>(seg.range.size())});
            }
          }
          if (sub < static_cast<int>(recv_plan.pack.size())) {
            for (int k : recv_plan.pack[sub]) {
              packed_in += in->segments[k].range.size();
            }
          }
          if (packed_in > 0) {
            if (absl::Status r = staging.recv.Reserve(memory, packed_in);
                !r.ok()) {
              return fail(*in, r);
            }
            recvs.push_back({in->sender, staging.recv.data(), packed_in});
          }
          if (sub == 0) {
            recvs.push_back({in->sender, staging.recv_sums.data(),
                             8 * recv_sums.size()});
          }
        }
        report->staging_peak = std::max<int64_t>(
            report->staging_peak, staging.send.size() + staging.recv.size());
        const uint64_t tag = (static_cast<uint64_t>(stage) << 36) |
                             (static_cast<uint64_t>(sub) << 20) |
                             static_cast<uint64_t>(ri);
        if (absl::Status s =
                transport->RunRound(tag, sends, recvs, options.round_timeout);
            !s.ok()) {
          const Transfer& t = in != nullptr ? *in : *out;
          return fail(t, absl::Status(
                             s.code(),
                             absl::StrCat(Describe(state, stage, ri, t, nullptr),
                                          ": ", s.message())));
        }
        if (packed_in == 0 && !(in != nullptr && sub == 0)) continue;
        if (sub == 0) {
          if (absl::Status c =
                  memory.ToHost(recv_sums.data(), staging.recv_sums.data(),
                                8 * recv_sums.size());
              !c.ok()) {
            return fail(*in, c);
          }
        }
        // Verify every segment where it landed: a large one already sits in
        // the new state (which the caller drops on any error), a packed one
        // in the staging buffer before it is copied into place.
        std::vector<std::pair<int, const uint8_t*>> check;
        if (sub == 0) {
          for (int k : recv_plan.direct) {
            const TransferSegment& seg = in->segments[k];
            check.push_back({k, new_state->Find(seg.tensor, seg.range)});
          }
        }
        const uint8_t* at = staging.recv.data();
        if (sub < static_cast<int>(recv_plan.pack.size())) {
          for (int k : recv_plan.pack[sub]) {
            check.push_back({k, at});
            at += in->segments[k].range.size();
          }
        }
        for (const auto& [k, got] : check) {
          const TransferSegment& seg = in->segments[k];
          const size_t n = static_cast<size_t>(seg.range.size());
          absl::StatusOr<uint64_t> sum = memory.Checksum(got, n);
          if (!sum.ok()) {
            return fail(*in, absl::Status(
                                 sum.status().code(),
                                 absl::StrCat(Describe(state, stage, ri, *in,
                                                       &seg),
                                              ": ", sum.status().message())));
          }
          if (*sum != recv_sums[k]) {
            return fail(*in, absl::DataLossError(absl::StrCat(
                Describe(state, stage, ri, *in, &seg),
                ": checksum of the received bytes differs from the "
                "sender's")));
          }
          uint8_t* to = new_state->Find(seg.tensor, seg.range);
          if (got != to) {
            if (absl::Status c = memory.Copy(to, got, n); !c.ok()) {
              return fail(*in, c);
            }
          }
        }
      }
      ++sr.rounds;
      if (out != nullptr) sr.bytes_sent += out->bytes;
      if (in != nullptr) sr.bytes_received += in->bytes;
    }
    sr.seconds = absl::ToDoubleSeconds(clock.Now() - start);
  }
  return absl::OkStatus();
}

}  // namespace arachne::migration
