// The CUDA-free half of the NCCL transport (runs on every machine): the cut
// of a host round into staged sub-rounds (migration/nccl/staged_round.h) and
// the poll-until-done-or-abort loop (migration/nccl/deadline_poll.h).
#include <algorithm>
#include <cstdint>
#include <functional>
#include <map>
#include <random>
#include <string>
#include <tuple>
#include <vector>

#include "absl/strings/str_cat.h"
#include "gtest/gtest.h"
#include "migration/nccl/deadline_poll.h"
#include "migration/nccl/staged_round.h"

namespace arachne::migration::nccl {
namespace {

// ---------------------------------------------------------------- the cut

TEST(StagingBytesTest, ChunkIsStagingOverTwiceTheWorldAligned) {
  EXPECT_EQ(StreamChunkBytes(size_t{64} << 20, 4), size_t{8} << 20);
  EXPECT_EQ(StreamChunkBytes(10000, 2), 2304u);  // 2500 rounded down to 256
  EXPECT_EQ(StreamChunkBytes(4096, 8), 256u);
  EXPECT_EQ(StreamChunkBytes(4096, 9), 0u);  // invalid
}

TEST(StagingBytesTest, RefusesSizesOutsideTheRangeWithThePreciseBound) {
  EXPECT_EQ(ValidateStagingBytes(4095, 1),
            absl::InvalidArgumentError(
                "staging_bytes 4095 is outside [4096, 68719476736]"));
  EXPECT_EQ(ValidateStagingBytes((size_t{64} << 30) + 1, 1),
            absl::InvalidArgumentError(
                "staging_bytes 68719476737 is outside [4096, 68719476736]"));
  EXPECT_EQ(ValidateStagingBytes(4096, 9),
            absl::InvalidArgumentError(
                "staging_bytes 4096 leaves 227 bytes per stream for world "
                "size 9 (2 streams per peer); it needs at least 256, i.e. "
                "staging_bytes >= 4608"));
  EXPECT_EQ(ValidateStagingBytes(4096, 0),
            absl::InvalidArgumentError("staging: world size 0 is not positive"));
  EXPECT_TRUE(ValidateStagingBytes(4096, 8).ok());
  EXPECT_TRUE(ValidateStagingBytes(size_t{64} << 20, 1000).ok());
}

TEST(PlanStagedRoundTest, RefusesAnInvalidChunkAndAPeerOutsideTheWorld) {
  const StagedOp op{1, 10};
  EXPECT_EQ(PlanStagedRound({&op, 1}, {}, 2, 100).status().code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(PlanStagedRound({&op, 1}, {}, 9, 4096).status().code(),
            absl::StatusCode::kInvalidArgument);
  const StagedOp bad{2, 10};
  EXPECT_EQ(PlanStagedRound({}, {&bad, 1}, 2, 4096).status(),
            absl::InvalidArgumentError(
                "staged round: receive op 0 names peer 2 outside the world "
                "of 2"));
  const StagedOp negative{-1, 0};
  EXPECT_EQ(PlanStagedRound({&negative, 1}, {}, 2, 4096).status(),
            absl::InvalidArgumentError(
                "staged round: send op 0 names peer -1 outside the world of "
                "2"));
}

TEST(PlanStagedRoundTest, ARoundWithoutBytesHasNoSubRounds) {
  const std::vector<StagedOp> zero = {{0, 0}, {1, 0}};
  auto plan = PlanStagedRound(zero, zero, 2, 4096);
  ASSERT_TRUE(plan.ok()) << plan.status();
  EXPECT_TRUE(plan->sub_rounds.empty());
  plan = PlanStagedRound({}, {}, 2, 4096);
  ASSERT_TRUE(plan.ok()) << plan.status();
  EXPECT_TRUE(plan->sub_rounds.empty());
}

TEST(PlanStagedRoundTest, CutsEachStreamAtMultiplesOfTheChunk) {
  // World 2, 4096 bytes: c = 1024. To peer 1: ops of 1500, 0, 700 (one
  // stream of 2200: fragments 1024, 1024, 152); from peer 0: one op of 10.
  const std::vector<StagedOp> sends = {{1, 1500}, {1, 0}, {1, 700}};
  const std::vector<StagedOp> recvs = {{0, 10}};
  auto plan = PlanStagedRound(sends, recvs, 2, 4096);
  ASSERT_TRUE(plan.ok()) << plan.status();
  EXPECT_EQ(plan->chunk, 1024u);
  ASSERT_EQ(plan->sub_rounds.size(), 3u);
  const SubRound& s0 = plan->sub_rounds[0];
  ASSERT_EQ(s0.sends.size(), 1u);
  EXPECT_EQ(s0.sends[0].bytes, 1024u);
  EXPECT_EQ(s0.send_region, 1024u);
  ASSERT_EQ(s0.recvs.size(), 1u);
  EXPECT_EQ(s0.recvs[0].staging_offset, 1024u);
  EXPECT_EQ(s0.recvs[0].bytes, 10u);
  EXPECT_EQ(s0.staging_used, 1024u + 256u);
  const SubRound& s1 = plan->sub_rounds[1];
  ASSERT_EQ(s1.sends.size(), 1u);
  EXPECT_TRUE(s1.recvs.empty());
  // Bytes 1024..2047 of the stream: the last 476 of op 0, the first 548 of
  // op 2 (op 1 has none).
  ASSERT_EQ(s1.sends[0].pieces.size(), 2u);
  EXPECT_EQ(s1.sends[0].pieces[0].op, 0);
  EXPECT_EQ(s1.sends[0].pieces[0].op_offset, 1024u);
  EXPECT_EQ(s1.sends[0].pieces[0].bytes, 476u);
  EXPECT_EQ(s1.sends[0].pieces[1].op, 2);
  EXPECT_EQ(s1.sends[0].pieces[1].op_offset, 0u);
  EXPECT_EQ(s1.sends[0].pieces[1].bytes, 548u);
  EXPECT_EQ(s1.sends[0].pieces[1].staging_offset, 476u);
  EXPECT_EQ(plan->sub_rounds[2].sends[0].bytes, 152u);
}

TEST(PlanStagedRoundTest, AFullSubRoundUsesExactlyTheStagingBuffer) {
  // Every peer, both ways, longer than the chunk: 2 * W fragments of c.
  const int kWorld = 3;
  const size_t kStaging = 6 * 1024;
  std::vector<StagedOp> ops;
  for (int p = 0; p < kWorld; ++p) ops.push_back({p, 5000});
  auto plan = PlanStagedRound(ops, ops, kWorld, kStaging);
  ASSERT_TRUE(plan.ok()) << plan.status();
  EXPECT_EQ(plan->chunk, 1024u);
  ASSERT_EQ(plan->sub_rounds.size(), 5u);
  EXPECT_EQ(plan->sub_rounds[0].staging_used, kStaging);
  EXPECT_EQ(plan->sub_rounds[0].sends.size(), 3u);
  EXPECT_EQ(plan->sub_rounds[0].recvs.size(), 3u);
}

// Checks one rank's plan on its own: every byte of every op staged exactly
// once, in stream order; transfers inside their region, not overlapping,
// aligned, within staging_bytes.
void CheckPlanCoversEveryByteOnce(const std::vector<StagedOp>& sends,
                                  const std::vector<StagedOp>& recvs,
                                  const StagedRoundPlan& plan,
                                  size_t staging_bytes,
                                  const std::string& where) {
  SCOPED_TRACE(where);
  for (int dir = 0; dir < 2; ++dir) {
    const std::vector<StagedOp>& ops = dir == 0 ? sends : recvs;
    std::vector<size_t> covered(ops.size(), 0);  // next byte expected
    std::map<int, size_t> stream_at;             // by peer
    for (size_t k = 0; k < plan.sub_rounds.size(); ++k) {
      const SubRound& sr = plan.sub_rounds[k];
      EXPECT_LE(sr.staging_used, staging_bytes) << "sub-round " << k;
      EXPECT_LE(sr.send_region, sr.staging_used);
      const auto& transfers = dir == 0 ? sr.sends : sr.recvs;
      size_t last_end = dir == 0 ? 0 : sr.send_region;
      int last_peer = -1;
      for (const StagedTransfer& t : transfers) {
        EXPECT_GT(t.peer, last_peer) << "peers ascend, one fragment each";
        last_peer = t.peer;
        EXPECT_GT(t.bytes, 0u);
        EXPECT_LE(t.bytes, plan.chunk);
        EXPECT_EQ(t.staging_offset % kStagingAlignment, 0u);
        EXPECT_GE(t.staging_offset, last_end);
        last_end = t.staging_offset + t.bytes;
        EXPECT_LE(last_end, dir == 0 ? sr.send_region : sr.staging_used);
        EXPECT_EQ(t.stream_offset, stream_at[t.peer]);
        EXPECT_EQ(t.stream_offset, k * plan.chunk)
            << "fragment k of a stream is in sub-round k";
        stream_at[t.peer] += t.bytes;
        size_t at = t.staging_offset;
        size_t sum = 0;
        for (const StagedPiece& p : t.pieces) {
          ASSERT_GE(p.op, 0);
          ASSERT_LT(static_cast<size_t>(p.op), ops.size());
          EXPECT_EQ(ops[p.op].peer, t.peer);
          EXPECT_GT(p.bytes, 0u);
          EXPECT_EQ(p.staging_offset, at);
          EXPECT_EQ(p.op_offset, covered[p.op]) << "op " << p.op;
          covered[p.op] += p.bytes;
          at += p.bytes;
          sum += p.bytes;
        }
        EXPECT_EQ(sum, t.bytes);
      }
    }
    for (size_t i = 0; i < ops.size(); ++i) {
      EXPECT_EQ(covered[i], ops[i].bytes) << (dir == 0 ? "send" : "recv")
                                          << " op " << i;
    }
  }
}

// A random round over `world` ranks: for each ordered pair a list of op
// sizes (some zero, some larger than the chunk); each rank lists its sends
// and its receives in its own random interleaving of the peers (keeping
// each pair's order, as the Transport contract requires).
struct RandomRound {
  std::vector<std::vector<StagedOp>> sends, recvs;  // by rank
};

RandomRound MakeRandomRound(int world, size_t chunk, std::mt19937& rng) {
  std::vector<std::vector<std::vector<size_t>>> sizes(
      world, std::vector<std::vector<size_t>>(world));
  for (int a = 0; a < world; ++a) {
    for (int b = 0; b < world; ++b) {
      if (rng() % 3 == 0) continue;  // no ops between a and b
      const int n = 1 + rng() % 4;
      for (int i = 0; i < n; ++i) {
        switch (rng() % 5) {
          case 0: sizes[a][b].push_back(0); break;
          case 1: sizes[a][b].push_back(1 + rng() % 16); break;
          case 2: sizes[a][b].push_back(chunk); break;
          case 3: sizes[a][b].push_back(chunk + 1 + rng() % (3 * chunk)); break;
          default: sizes[a][b].push_back(rng() % (2 * chunk)); break;
        }
      }
    }
  }
  // Interleaves the per-peer lists of one rank in a random order.
  auto interleave = [&](const std::vector<std::vector<size_t>>& by_peer) {
    std::vector<int> order;
    for (int p = 0; p < world; ++p) {
      order.insert(order.end(), by_peer[p].size(), p);
    }
    std::shuffle(order.begin(), order.end(), rng);
    std::vector<size_t> next(world, 0);
    std::vector<StagedOp> ops;
    for (int p : order) ops.push_back({p, by_peer[p][next[p]++]});
    return ops;
  };
  RandomRound r;
  for (int a = 0; a < world; ++a) {
    r.sends.push_back(interleave(sizes[a]));
    std::vector<std::vector<size_t>> from(world);
    for (int b = 0; b < world; ++b) from[b] = sizes[b][a];
    r.recvs.push_back(interleave(from));
  }
  return r;
}

uint8_t Byte(int from, int to, size_t op, size_t i) {
  return static_cast<uint8_t>(from * 37 + to * 11 + op * 5 + i * 13 + (i >> 9));
}

TEST(PlanStagedRoundTest, RandomRoundsMatchPairBySubRoundAndMoveEveryByte) {
  std::mt19937 rng(20240611);
  for (int trial = 0; trial < 60; ++trial) {
    const int world = 4 + trial % 3;  // 4..6 ranks
    const size_t staging =
        std::vector<size_t>{8192, 12345, 65536}[trial % 3];
    const size_t chunk = StreamChunkBytes(staging, world);
    ASSERT_GT(chunk, 0u);
    const RandomRound round = MakeRandomRound(world, chunk, rng);
    std::vector<StagedRoundPlan> plans;
    for (int r = 0; r < world; ++r) {
      auto plan = PlanStagedRound(round.sends[r], round.recvs[r], world, staging);
      ASSERT_TRUE(plan.ok()) << plan.status();
      CheckPlanCoversEveryByteOnce(round.sends[r], round.recvs[r], *plan,
                                   staging,
                                   absl::StrCat("trial ", trial, " rank ", r));
      plans.push_back(*std::move(plan));
    }
    // The deadlock rule: what a sends to b, fragment by fragment (sub-round,
    // stream offset, bytes), is what b receives from a, in the same
    // sub-rounds and order.
    for (int a = 0; a < world; ++a) {
      for (int b = 0; b < world; ++b) {
        std::vector<std::tuple<size_t, size_t, size_t>> sent, received;
        for (size_t k = 0; k < plans[a].sub_rounds.size(); ++k) {
          for (const StagedTransfer& t : plans[a].sub_rounds[k].sends) {
            if (t.peer == b) sent.emplace_back(k, t.stream_offset, t.bytes);
          }
        }
        for (size_t k = 0; k < plans[b].sub_rounds.size(); ++k) {
          for (const StagedTransfer& t : plans[b].sub_rounds[k].recvs) {
            if (t.peer == a) received.emplace_back(k, t.stream_offset, t.bytes);
          }
        }
        EXPECT_EQ(sent, received) << "trial " << trial << ": " << a << "->" << b;
      }
    }
    // Run the plans as NCCL would: per sub-round, each rank packs its sends
    // into its staging buffer, each receive fragment takes the matching
    // send fragment's bytes, receivers unpack. Every received op must then
    // hold exactly what its sender's op held.
    std::vector<std::vector<std::vector<uint8_t>>> out(world), in(world);
    for (int r = 0; r < world; ++r) {
      std::vector<size_t> nth(world, 0);
      for (const StagedOp& op : round.sends[r]) {
        std::vector<uint8_t> data(op.bytes);
        for (size_t i = 0; i < op.bytes; ++i) data[i] = Byte(r, op.peer, nth[op.peer], i);
        ++nth[op.peer];
        out[r].push_back(std::move(data));
      }
      for (const StagedOp& op : round.recvs[r]) in[r].emplace_back(op.bytes, 0xEE);
    }
    size_t rounds = 0;
    for (const auto& p : plans) rounds = std::max(rounds, p.sub_rounds.size());
    for (size_t k = 0; k < rounds; ++k) {
      std::vector<std::vector<uint8_t>> staging_of(world,
                                                   std::vector<uint8_t>(staging));
      for (int r = 0; r < world; ++r) {
        if (k >= plans[r].sub_rounds.size()) continue;
        for (const StagedTransfer& t : plans[r].sub_rounds[k].sends) {
          for (const StagedPiece& p : t.pieces) {
            std::copy_n(out[r][p.op].begin() + p.op_offset, p.bytes,
                        staging_of[r].begin() + p.staging_offset);
          }
        }
      }
      for (int b = 0; b < world; ++b) {
        if (k >= plans[b].sub_rounds.size()) continue;
        for (const StagedTransfer& t : plans[b].sub_rounds[k].recvs) {
          const int a = t.peer;
          ASSERT_LT(k, plans[a].sub_rounds.size());
          const auto& sends = plans[a].sub_rounds[k].sends;
          auto it = std::find_if(sends.begin(), sends.end(),
                                 [&](const StagedTransfer& s) { return s.peer == b; });
          ASSERT_NE(it, sends.end()) << "unmatched receive: deadlock";
          ASSERT_EQ(it->bytes, t.bytes);
          std::copy_n(staging_of[a].begin() + it->staging_offset, t.bytes,
                      staging_of[b].begin() + t.staging_offset);
        }
        for (const StagedTransfer& t : plans[b].sub_rounds[k].recvs) {
          for (const StagedPiece& p : t.pieces) {
            std::copy_n(staging_of[b].begin() + p.staging_offset, p.bytes,
                        in[b][p.op].begin() + p.op_offset);
          }
        }
      }
    }
    for (int b = 0; b < world; ++b) {
      std::vector<size_t> nth(world, 0);
      for (size_t i = 0; i < round.recvs[b].size(); ++i) {
        const StagedOp& op = round.recvs[b][i];
        const size_t n = nth[op.peer]++;
        for (size_t j = 0; j < op.bytes; ++j) {
          if (in[b][i][j] != Byte(op.peer, b, n, j)) {
            ADD_FAILURE() << "trial " << trial << ": rank " << b << " op " << i
                          << " byte " << j << " differs";
            break;
          }
        }
      }
    }
  }
}

// ---------------------------------------------------------- the poll loop

// Moves only when slept on; records every sleep.
class FakePollClock final : public PollClock {
 public:
  absl::Time Now() const override { return now_; }
  void Sleep(absl::Duration d) override {
    sleeps.push_back(d);
    now_ += d;
  }
  std::vector<absl::Duration> sleeps;

 private:
  absl::Time now_ = absl::FromUnixSeconds(1'700'000'000);
};

class DeadlinePollTest : public ::testing::Test {
 protected:
  PollSpec Spec(absl::Duration budget, absl::Duration interval) {
    return {.what = "nccl: round 7: sub-round 1 of 2 (to 1: 64 bytes)",
            .deadline = clock_.Now() + budget,
            .budget = budget,
            .interval = interval};
  }
  absl::Status Abort() {
    events_.push_back("abort");
    ++aborts_;
    return abort_result_;
  }
  // Polls, recording each call.
  absl::Status Run(const PollSpec& spec,
                   const std::function<absl::StatusOr<bool>(int)>& answer) {
    int n = 0;
    absl::Status s = PollUntilDone(
        spec,
        [&]() -> absl::StatusOr<bool> {
          events_.push_back("poll");
          return answer(n++);
        },
        [&] { return Abort(); }, clock_);
    events_.push_back("returned");
    polls_ = n;
    return s;
  }

  FakePollClock clock_;
  std::vector<std::string> events_;
  int aborts_ = 0;
  int polls_ = 0;
  absl::Status abort_result_;
};

TEST_F(DeadlinePollTest, SuccessNeverAborts) {
  const absl::Status s = Run(Spec(absl::Seconds(1), absl::Milliseconds(100)),
                             [](int n) { return n == 3; });
  EXPECT_TRUE(s.ok()) << s;
  EXPECT_EQ(aborts_, 0);
  EXPECT_EQ(polls_, 4);
  EXPECT_EQ(clock_.sleeps.size(), 3u);
}

TEST_F(DeadlinePollTest, PollsOnceEvenPastTheDeadline) {
  const absl::Status s = Run(Spec(absl::ZeroDuration(), absl::Milliseconds(1)),
                             [](int) { return true; });
  EXPECT_TRUE(s.ok()) << s;
  EXPECT_EQ(aborts_, 0);
  EXPECT_EQ(polls_, 1);
}

TEST_F(DeadlinePollTest, TimeoutAbortsOnceBeforeReturning) {
  const PollSpec spec = Spec(absl::Seconds(1), absl::Milliseconds(300));
  const absl::Status s = Run(spec, [](int) { return false; });
  EXPECT_EQ(s, absl::DeadlineExceededError(
                   "nccl: round 7: sub-round 1 of 2 (to 1: 64 bytes) did not "
                   "finish within 1s; aborted"));
  EXPECT_EQ(aborts_, 1);
  // Polled at 0, 300, 600, 900 and 1000 ms: sleeps never pass the deadline.
  EXPECT_EQ(clock_.sleeps,
            (std::vector<absl::Duration>{
                absl::Milliseconds(300), absl::Milliseconds(300),
                absl::Milliseconds(300), absl::Milliseconds(100)}));
  EXPECT_EQ(clock_.Now(), spec.deadline);
  EXPECT_EQ(events_, (std::vector<std::string>{"poll", "poll", "poll", "poll",
                                               "poll", "abort", "returned"}));
}

TEST_F(DeadlinePollTest, ErrorAbortsOnceThenReturnsThatError) {
  const absl::Status s =
      Run(Spec(absl::Seconds(1), absl::Milliseconds(100)),
          [](int n) -> absl::StatusOr<bool> {
            if (n == 2) return absl::UnavailableError("peer 3 went away");
            return false;
          });
  EXPECT_EQ(s, absl::UnavailableError(
                   "nccl: round 7: sub-round 1 of 2 (to 1: 64 bytes): peer 3 "
                   "went away; aborted"));
  EXPECT_EQ(aborts_, 1);
  EXPECT_EQ(events_, (std::vector<std::string>{"poll", "poll", "poll", "abort",
                                               "returned"}));
}

TEST_F(DeadlinePollTest, AFailedAbortIsNamedAndKeepsTheCode) {
  abort_result_ = absl::InternalError("ncclCommAbort failed");
  const absl::Status s = Run(Spec(absl::Milliseconds(10), absl::Milliseconds(5)),
                             [](int) { return false; });
  EXPECT_EQ(s.code(), absl::StatusCode::kDeadlineExceeded);
  EXPECT_EQ(s.message(),
            "nccl: round 7: sub-round 1 of 2 (to 1: 64 bytes) did not finish "
            "within 10ms; aborted; abort failed: ncclCommAbort failed");
  EXPECT_EQ(aborts_, 1);
}

}  // namespace
}  // namespace arachne::migration::nccl
