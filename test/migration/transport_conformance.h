// The conformance suite every Transport passes. A test file instantiates it
// with the factories it has:
//   INSTANTIATE_TEST_SUITE_P(Gloo, TransportConformanceTest,
//                            ::testing::Values(&MakeGlooTransportFactory),
//                            FactoryName);
// Ranks are forked processes meeting through a FileRendezvousStore; buffers
// are host memory (a kDevice transport needs its own suite). The suite skips
// when the factory is not viable here or the machine has fewer slots than
// ranks.
#ifndef ARACHNE_TEST_MIGRATION_TRANSPORT_CONFORMANCE_H_
#define ARACHNE_TEST_MIGRATION_TRANSPORT_CONFORMANCE_H_

#include <algorithm>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "gtest/gtest.h"
#include "migration/core/rendezvous_store.h"
#include "migration/core/transport.h"
#include "test/migration/forked_ranks.h"

namespace arachne::migration::testing {

using FactoryMaker = std::unique_ptr<TransportFactory> (*)();

// Test names say the backend ("Gloo/...ExchangesBytes.../gloo").
inline std::string FactoryName(
    const ::testing::TestParamInfo<FactoryMaker>& info) {
  return info.param()->name();
}

// Byte `i` of the message from `from` to `to` in round `round`, op `op`.
inline uint8_t PatternByte(int from, int to, int round, int op, size_t i) {
  return static_cast<uint8_t>((from * 131 + to * 31 + round * 7 + op * 3 + i * 13 +
                               (i >> 8)) & 0xff);
}

class TransportConformanceTest : public ::testing::TestWithParam<FactoryMaker> {
 protected:
  void SetUp() override {
    // Asked in a child so that a CUDA backend never initialises the driver
    // in the parent before it forks the ranks.
    const auto viable = RunForkedRanks(1, [](int) {
      auto f = GetParam()();
      return f->IsViable() ? absl::InternalError(absl::StrCat(
                                 std::min(f->MaxLocalRanks(), 1 << 20)))
                           : absl::UnavailableError("not viable");
    });
    if (viable[0].code() != absl::StatusCode::kInternal) {
      GTEST_SKIP() << "transport not viable here";
    }
    max_ranks_ = std::stoi(std::string(viable[0].message()));
    store_dir_ = MakeTempDir();
  }

  // Runs body(rank, transport) on `n` connected ranks; the caller skips
  // first when Skip(n).
  bool Skip(int n) const { return n > max_ranks_; }
  std::vector<absl::Status> RunConnected(
      int n,
      const std::function<absl::Status(int, Transport&, RendezvousStore&)>&
          body) {
    const std::string dir = store_dir_;
    return RunForkedRanks(n, [&, dir](int rank) -> absl::Status {
      FileRendezvousStore store(dir);
      auto t = GetParam()()->Create(
          {.rank = rank, .world_size = n, .store_prefix = "t"}, &store);
      if (!t.ok()) return t.status();
      return body(rank, **t, store);
    });
  }

  std::string store_dir_;
  int max_ranks_ = 0;
};

TEST_P(TransportConformanceTest, ExchangesBytesBothWaysInOneRound) {
  const size_t kBytes = (1 << 20) + 7;
  if (Skip(2)) GTEST_SKIP() << "needs 2 ranks on this machine";
  auto st = RunConnected(2, [&](int rank, Transport& t, RendezvousStore&) {
    if (t.rank() != rank || t.world_size() != 2) {
      return absl::InternalError("wrong rank or world size");
    }
    const int peer = 1 - rank;
    std::vector<uint8_t> out(kBytes), in(kBytes, 0);
    for (size_t i = 0; i < kBytes; ++i) out[i] = PatternByte(rank, peer, 0, 0, i);
    const SendOp s{peer, out.data(), kBytes};
    const RecvOp r{peer, in.data(), kBytes};
    if (auto status = t.RunRound(1, {&s, 1}, {&r, 1}, absl::Seconds(10));
        !status.ok()) {
      return status;
    }
    for (size_t i = 0; i < kBytes; ++i) {
      if (in[i] != PatternByte(peer, rank, 0, 0, i)) {
        return absl::DataLossError(absl::StrCat("byte ", i, " differs"));
      }
    }
    return absl::OkStatus();
  });
  for (const absl::Status& s : st) EXPECT_TRUE(s.ok()) << s;
}

TEST_P(TransportConformanceTest, RingRoundsWithSeveralOpsPerPeerKeepOrder) {
  const int kRanks = 4;
  const std::vector<size_t> kSizes = {1, 100003, 4096};
  if (Skip(kRanks)) GTEST_SKIP() << "needs 4 ranks on this machine";
  auto st = RunConnected(kRanks, [&](int rank, Transport& t,
                                     RendezvousStore&) -> absl::Status {
    for (int round = 0; round < 3; ++round) {
      const int to = (rank + round + 1) % kRanks;
      const int from = (rank - round - 1 + 2 * kRanks) % kRanks;
      std::vector<std::vector<uint8_t>> out, in;
      std::vector<SendOp> sends;
      std::vector<RecvOp> recvs;
      for (size_t op = 0; op < kSizes.size(); ++op) {
        out.emplace_back(kSizes[op]);
        in.emplace_back(kSizes[op], 0);
        for (size_t i = 0; i < kSizes[op]; ++i) {
          out[op][i] = PatternByte(rank, to, round, op, i);
        }
      }
      for (size_t op = 0; op < kSizes.size(); ++op) {
        sends.push_back({to, out[op].data(), kSizes[op]});
        recvs.push_back({from, in[op].data(), kSizes[op]});
      }
      if (auto s = t.RunRound(100 + round, sends, recvs, absl::Seconds(10));
          !s.ok()) {
        return s;
      }
      for (size_t op = 0; op < kSizes.size(); ++op) {
        for (size_t i = 0; i < kSizes[op]; ++i) {
          if (in[op][i] != PatternByte(from, rank, round, op, i)) {
            return absl::DataLossError(absl::StrCat(
                "round ", round, " op ", op, " byte ", i, " differs"));
          }
        }
      }
    }
    return absl::OkStatus();
  });
  for (const absl::Status& s : st) EXPECT_TRUE(s.ok()) << s;
}

TEST_P(TransportConformanceTest, RejectsAPeerOutsideTheWorld) {
  if (Skip(2)) GTEST_SKIP() << "needs 2 ranks on this machine";
  auto st = RunConnected(2, [&](int rank, Transport& t, RendezvousStore&) {
    if (rank == 1) return absl::OkStatus();
    uint8_t b = 0;
    const SendOp s{7, &b, 1};
    absl::Status r = t.RunRound(1, {&s, 1}, {}, absl::Seconds(1));
    return r.code() == absl::StatusCode::kInvalidArgument
               ? absl::OkStatus()
               : absl::InternalError(absl::StrCat("got ", r.ToString()));
  });
  for (const absl::Status& s : st) EXPECT_TRUE(s.ok()) << s;
}

TEST_P(TransportConformanceTest, RoundTimesOutWhenThePeerNeverSends) {
  if (Skip(2)) GTEST_SKIP() << "needs 2 ranks on this machine";
  auto st = RunConnected(2, [&](int rank, Transport& t,
                                RendezvousStore& store) -> absl::Status {
    if (rank == 1) {
      // Stay connected, sending nothing, until rank 0 has timed out.
      return store.Get("t/rank0_done", absl::Seconds(20)).status();
    }
    uint8_t b = 0;
    const RecvOp r{1, &b, 1};
    const absl::Time start = absl::Now();
    absl::Status s = t.RunRound(1, {}, {&r, 1}, absl::Milliseconds(300));
    const absl::Duration took = absl::Now() - start;
    (void)store.Set("t/rank0_done", "1");
    if (s.code() != absl::StatusCode::kDeadlineExceeded) {
      return absl::InternalError(absl::StrCat("got ", s.ToString()));
    }
    if (took > absl::Seconds(5)) return absl::InternalError("timeout ignored");
    return absl::OkStatus();
  });
  for (const absl::Status& s : st) EXPECT_TRUE(s.ok()) << s;
}

}  // namespace arachne::migration::testing

#endif  // ARACHNE_TEST_MIGRATION_TRANSPORT_CONFORMANCE_H_
