// The transport conformance suite on NCCL (label gpu), and the NCCL
// transport's own cases: staged host rounds, device memory in place, a
// silent peer at init, abort after a failed round. Skips where no GPU is
// present, or where the machine has fewer GPUs than a test has ranks. CUDA
// is only ever touched in forked children (never in the parent, which
// forks the ranks).
#include "test/migration/transport_conformance.h"

#ifdef ARACHNE_HAVE_NCCL
#include <cuda_runtime.h>

#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "migration/core/checksum.h"
#include "migration/nccl/cuda_state_memory.h"
#include "migration/nccl/nccl_transport.h"

namespace arachne::migration::testing {
namespace {

INSTANTIATE_TEST_SUITE_P(Nccl, TransportConformanceTest,
                         ::testing::Values(&MakeNcclTransportFactory),
                         FactoryName);

TEST(NcclFactoryTest, RejectsARankOutsideTheWorld) {
  FileRendezvousStore store(MakeTempDir());
  // Checked before any CUDA call, so safe in the parent process.
  auto t = MakeNcclTransportFactory()->Create({.rank = 3, .world_size = 2},
                                              &store);
  EXPECT_EQ(t.status(),
            absl::InvalidArgumentError("nccl: rank 3 of world size 2"));
}

TEST(NcclFactoryTest, RejectsAStagingSizeOutsideTheRange) {
  FileRendezvousStore store(MakeTempDir());
  // Also checked before any CUDA call.
  auto t = MakeNcclTransportFactory()->Create(
      {.rank = 0, .world_size = 2, .staging_bytes = 1000}, &store);
  EXPECT_EQ(t.status(),
            absl::InvalidArgumentError("nccl: TransportConfig::staging_bytes "
                                       "1000 is outside [4096, 68719476736]"));
  t = MakeNcclTransportFactory()->Create(
      {.rank = 0, .world_size = 16, .staging_bytes = 4096}, &store);
  EXPECT_EQ(t.status().code(), absl::StatusCode::kInvalidArgument);
}

// GPUs the factory sees, asked in a child (0 when none, or on a crash).
int GpusHere() {
  const auto st = RunForkedRanks(1, [](int) {
    auto f = MakeNcclTransportFactory();
    return absl::InternalError(absl::StrCat(f->IsViable() ? f->MaxLocalRanks() : 0));
  });
  int n = 0;
  if (st[0].code() != absl::StatusCode::kInternal ||
      !absl::SimpleAtoi(st[0].message(), &n)) {
    return 0;
  }
  return n;
}

class NcclTransportTest : public ::testing::Test {
 protected:
  void SetUp() override {
    gpus_ = GpusHere();
    if (gpus_ == 0) GTEST_SKIP() << "no GPU";
    store_dir_ = MakeTempDir();
  }
  int gpus_ = 0;
  std::string store_dir_;
};

// Sends `sizes` to itself (world of 1: NCCL pairs a rank's send to itself
// with its receive inside one group) in `rounds` rounds; checks every byte.
absl::Status SelfExchange(Transport& t, const std::vector<size_t>& sizes,
                          int rounds) {
  for (int round = 0; round < rounds; ++round) {
    std::vector<std::vector<uint8_t>> out, in;
    std::vector<SendOp> sends;
    std::vector<RecvOp> recvs;
    for (size_t op = 0; op < sizes.size(); ++op) {
      out.emplace_back(sizes[op]);
      in.emplace_back(sizes[op], 0);
      for (size_t i = 0; i < sizes[op]; ++i) {
        out[op][i] = PatternByte(0, 0, round, op, i);
      }
    }
    for (size_t op = 0; op < sizes.size(); ++op) {
      sends.push_back({0, out[op].data(), sizes[op]});
      recvs.push_back({0, in[op].data(), sizes[op]});
    }
    if (absl::Status s = t.RunRound(round, sends, recvs, absl::Seconds(20));
        !s.ok()) {
      return s;
    }
    for (size_t op = 0; op < sizes.size(); ++op) {
      if (in[op] != out[op]) {
        return absl::DataLossError(
            absl::StrCat("round ", round, " op ", op, " differs"));
      }
    }
  }
  return absl::OkStatus();
}

TEST_F(NcclTransportTest, SelfExchangeStagedThroughASmallBuffer) {
  // 4096 bytes of staging in a world of 1: 2048 bytes per stream and
  // sub-round, so the 70001-byte op alone takes 35 sub-rounds.
  const std::string dir = store_dir_;
  auto st = RunForkedRanks(1, [&](int) -> absl::Status {
    FileRendezvousStore store(dir);
    auto t = MakeNcclTransportFactory()->Create(
        {.rank = 0, .world_size = 1, .store_prefix = "s",
         .staging_bytes = 4096},
        &store);
    if (!t.ok()) return t.status();
    return SelfExchange(**t, {0, 1, 5000, 2048, 70001, 3}, 3);
  }, absl::Seconds(120));
  EXPECT_TRUE(st[0].ok()) << st[0];
}

TEST_F(NcclTransportTest, SelfExchangeOfDeviceMemoryInPlace) {
  const std::string dir = store_dir_;
  auto st = RunForkedRanks(1, [&](int) -> absl::Status {
    FileRendezvousStore store(dir);
    auto t = MakeNcclTransportFactory()->Create(
        {.rank = 0, .world_size = 1, .store_prefix = "d", .device = 0,
         .memory = MemoryKind::kDevice},
        &store);
    if (!t.ok()) return t.status();
    const size_t kBytes = (3 << 20) + 5;
    std::vector<uint8_t> out(kBytes), in(kBytes, 0);
    for (size_t i = 0; i < kBytes; ++i) out[i] = PatternByte(0, 0, 0, 0, i);
    void* d_out = nullptr;
    void* d_in = nullptr;
    if (cudaMalloc(&d_out, kBytes) != cudaSuccess ||
        cudaMalloc(&d_in, kBytes) != cudaSuccess ||
        cudaMemcpy(d_out, out.data(), kBytes, cudaMemcpyHostToDevice) !=
            cudaSuccess ||
        cudaMemset(d_in, 0, kBytes) != cudaSuccess) {
      return absl::InternalError("cuda setup failed");
    }
    const SendOp s{0, d_out, kBytes};
    const RecvOp r{0, d_in, kBytes};
    absl::Status status = (*t)->RunRound(1, {&s, 1}, {&r, 1}, absl::Seconds(20));
    if (status.ok() && cudaMemcpy(in.data(), d_in, kBytes,
                                  cudaMemcpyDeviceToHost) != cudaSuccess) {
      status = absl::InternalError("cudaMemcpy back failed");
    }
    cudaFree(d_out);
    cudaFree(d_in);
    if (!status.ok()) return status;
    return in == out ? absl::OkStatus() : absl::DataLossError("bytes differ");
  });
  EXPECT_TRUE(st[0].ok()) << st[0];
}

TEST_F(NcclTransportTest, SilentPeerMakesInitTimeOutInsteadOfHanging) {
  // World of 2 whose rank 1 never comes: rank 0 publishes the id, inits
  // non-blocking, and must give up (and abort) within connect_timeout.
  const std::string dir = store_dir_;
  auto st = RunForkedRanks(1, [&](int) -> absl::Status {
    FileRendezvousStore store(dir);
    const absl::Time start = absl::Now();
    auto t = MakeNcclTransportFactory()->Create(
        {.rank = 0, .world_size = 2, .store_prefix = "silent",
         .connect_timeout = absl::Seconds(3), .device = 0},
        &store);
    const absl::Duration took = absl::Now() - start;
    if (t.ok()) return absl::InternalError("init succeeded without rank 1");
    if (t.status().code() != absl::StatusCode::kDeadlineExceeded ||
        !absl::StrContains(t.status().message(),
                           "communicator init of rank 0 of world size 2 "
                           "(store prefix 'silent') did not finish within 3s")) {
      return absl::InternalError(absl::StrCat("got ", t.status().ToString()));
    }
    if (took > absl::Seconds(3 + 10)) {
      return absl::InternalError(absl::StrCat("took ", absl::FormatDuration(took)));
    }
    return absl::OkStatus();
  }, absl::Seconds(60));
  EXPECT_TRUE(st[0].ok()) << st[0];
}

TEST_F(NcclTransportTest, MissingRankZeroTimesOutAtTheStore) {
  const std::string dir = store_dir_;
  auto st = RunForkedRanks(1, [&](int) -> absl::Status {
    FileRendezvousStore store(dir);
    auto t = MakeNcclTransportFactory()->Create(
        {.rank = 1, .world_size = 2, .store_prefix = "norank0",
         .connect_timeout = absl::Seconds(1), .device = 0},
        &store);
    if (t.status().code() != absl::StatusCode::kDeadlineExceeded) {
      return absl::InternalError(absl::StrCat("got ", t.status().ToString()));
    }
    return absl::OkStatus();
  }, absl::Seconds(30));
  EXPECT_TRUE(st[0].ok()) << st[0];
}

TEST_F(NcclTransportTest, MismatchedStagingIsRefusedAtConnect) {
  // Rank 1 refuses before it touches NCCL (so both may share GPU 0); rank 0
  // then waits for it in vain and times out.
  const std::string dir = store_dir_;
  auto st = RunForkedRanks(2, [&](int rank) -> absl::Status {
    FileRendezvousStore store(dir);
    auto t = MakeNcclTransportFactory()->Create(
        {.rank = rank, .world_size = 2, .store_prefix = "mismatch",
         .connect_timeout = absl::Seconds(3), .device = 0,
         .staging_bytes = rank == 0 ? size_t{8192} : size_t{4096}},
        &store);
    const absl::StatusCode want = rank == 0
                                      ? absl::StatusCode::kDeadlineExceeded
                                      : absl::StatusCode::kFailedPrecondition;
    if (t.status().code() != want) {
      return absl::InternalError(absl::StrCat("got ", t.status().ToString()));
    }
    if (rank == 1 &&
        !absl::StrContains(t.status().message(),
                           "has settings 'staging=4096;memory=host' but rank "
                           "0 has 'staging=8192;memory=host'")) {
      return absl::InternalError(absl::StrCat("got ", t.status().ToString()));
    }
    return absl::OkStatus();
  }, absl::Seconds(60));
  for (const absl::Status& s : st) EXPECT_TRUE(s.ok()) << s;
}

TEST_F(NcclTransportTest, AFailedRoundAbortsAndLaterRoundsAreRefused) {
  // A receive from itself with no matching send never completes (or NCCL
  // refuses it): either way the round fails, the communicator is aborted
  // before RunRound returns, and the next round is refused naming it.
  const std::string dir = store_dir_;
  auto st = RunForkedRanks(1, [&](int) -> absl::Status {
    FileRendezvousStore store(dir);
    auto t = MakeNcclTransportFactory()->Create(
        {.rank = 0, .world_size = 1, .store_prefix = "abort"}, &store);
    if (!t.ok()) return t.status();
    std::vector<uint8_t> in(4096);
    const RecvOp r{0, in.data(), in.size()};
    const absl::Time start = absl::Now();
    const absl::Status first =
        (*t)->RunRound(5, {}, {&r, 1}, absl::Milliseconds(300));
    const absl::Duration took = absl::Now() - start;
    if (first.ok()) return absl::InternalError("unmatched receive completed");
    if (!absl::StartsWith(first.message(), "nccl: round 5: ")) {
      return absl::InternalError(absl::StrCat("first: ", first.ToString()));
    }
    if (first.code() == absl::StatusCode::kDeadlineExceeded &&
        took > absl::Seconds(11)) {
      return absl::InternalError(absl::StrCat("took ", absl::FormatDuration(took)));
    }
    const absl::Status second = SelfExchange(**t, {16}, 1);
    if (second.code() != absl::StatusCode::kFailedPrecondition ||
        !absl::StrContains(second.message(), "round 0 refused") ||
        !absl::StrContains(second.message(), first.message())) {
      return absl::InternalError(absl::StrCat("second: ", second.ToString()));
    }
    return absl::OkStatus();  // the destructor must not hang either
  }, absl::Seconds(60));
  EXPECT_TRUE(st[0].ok()) << st[0];
}

TEST_F(NcclTransportTest, TwoRanksStageUnevenRoundsThroughASmallBuffer) {
  if (gpus_ < 2) GTEST_SKIP() << "needs 2 GPUs";
  // 4096 bytes for a world of 2: 1024 per stream and sub-round. Rank 0
  // sends more than it receives, so the ranks' streams end in different
  // sub-rounds; each also sends to itself.
  const std::string dir = store_dir_;
  auto st = RunForkedRanks(2, [&](int rank) -> absl::Status {
    FileRendezvousStore store(dir);
    auto t = MakeNcclTransportFactory()->Create(
        {.rank = rank, .world_size = 2, .store_prefix = "two",
         .staging_bytes = 4096},
        &store);
    if (!t.ok()) return t.status();
    const int peer = 1 - rank;
    auto sizes_from = [](int from) {
      return from == 0 ? std::vector<size_t>{10000, 0, 1, 3000}
                       : std::vector<size_t>{700, 2049};
    };
    for (int round = 0; round < 2; ++round) {
      const std::vector<size_t> out_sizes = sizes_from(rank);
      const std::vector<size_t> in_sizes = sizes_from(peer);
      const std::vector<size_t> self = {513, 4096};
      std::vector<std::vector<uint8_t>> out, in, self_out, self_in;
      std::vector<SendOp> sends;
      std::vector<RecvOp> recvs;
      for (size_t op = 0; op < out_sizes.size(); ++op) {
        out.emplace_back(out_sizes[op]);
        for (size_t i = 0; i < out_sizes[op]; ++i) {
          out[op][i] = PatternByte(rank, peer, round, op, i);
        }
      }
      for (size_t op = 0; op < in_sizes.size(); ++op) {
        in.emplace_back(in_sizes[op], 0);
      }
      for (size_t op = 0; op < self.size(); ++op) {
        self_out.emplace_back(self[op]);
        self_in.emplace_back(self[op], 0);
        for (size_t i = 0; i < self[op]; ++i) {
          self_out[op][i] = PatternByte(rank, rank, round, op, i);
        }
      }
      // Interleaved: the peer's and this rank's own streams in one list.
      for (size_t op = 0; op < std::max(out.size(), self.size()); ++op) {
        if (op < out.size()) sends.push_back({peer, out[op].data(), out[op].size()});
        if (op < self.size()) {
          sends.push_back({rank, self_out[op].data(), self[op]});
          recvs.push_back({rank, self_in[op].data(), self[op]});
        }
      }
      for (size_t op = 0; op < in.size(); ++op) {
        recvs.push_back({peer, in[op].data(), in[op].size()});
      }
      if (absl::Status s = (*t)->RunRound(10 + round, sends, recvs,
                                          absl::Seconds(20));
          !s.ok()) {
        return s;
      }
      for (size_t op = 0; op < in.size(); ++op) {
        for (size_t i = 0; i < in[op].size(); ++i) {
          if (in[op][i] != PatternByte(peer, rank, round, op, i)) {
            return absl::DataLossError(absl::StrCat(
                "round ", round, " op ", op, " byte ", i, " differs"));
          }
        }
      }
      if (self_in != self_out) return absl::DataLossError("self bytes differ");
    }
    return absl::OkStatus();
  }, absl::Seconds(120));
  for (const absl::Status& s : st) EXPECT_TRUE(s.ok()) << s;
}

// A bad checksum chunk is refused before CUDA is asked anything.
TEST(CudaStateMemoryTest, AChunkOutsideTheRangeIsRefused) {
  for (size_t chunk : {size_t{1024}, (size_t{8} << 20) + 1, size_t{2} << 30}) {
    auto m = MakeCudaStateMemory(0, chunk);
    EXPECT_EQ(m.status().code(), absl::StatusCode::kInvalidArgument) << chunk;
    EXPECT_TRUE(absl::StrContains(m.status().message(),
                                  absl::StrCat("checksum_chunk_bytes ", chunk)))
        << m.status();
  }
}

// The device checksum (a copy back in 64 KiB chunks) is the host's value
// for the same bytes and sees a flipped byte; copies, staging buffers and
// host round trips land bit for bit.
TEST_F(NcclTransportTest, CudaStateMemoryChecksumIsTheHostChecksum) {
  auto st = RunForkedRanks(1, [&](int) -> absl::Status {
    auto m = MakeCudaStateMemory(0, size_t{64} << 10);
    if (!m.ok()) return m.status();
    StateMemory& mem = **m;
    const size_t kBytes = (size_t{1} << 20) + 7;
    std::vector<uint8_t> host(kBytes), back(kBytes, 0);
    for (size_t i = 0; i < kBytes; ++i) host[i] = PatternByte(1, 2, 3, 4, i);
    auto a = mem.Allocate(kBytes);
    auto b = mem.Allocate(kBytes);
    if (!a.ok()) return a.status();
    if (!b.ok()) return b.status();
    if (absl::Status s = mem.FromHost(a->get(), host.data(), kBytes); !s.ok()) {
      return s;
    }
    absl::StatusOr<uint64_t> sum = mem.Checksum(a->get(), kBytes);
    if (!sum.ok()) return sum.status();
    if (*sum != Checksum(host.data(), kBytes)) {
      return absl::DataLossError("device checksum differs from the host's");
    }
    if (absl::Status s = mem.Copy(b->get(), a->get(), kBytes); !s.ok()) return s;
    if (absl::Status s = mem.ToHost(back.data(), b->get(), kBytes); !s.ok()) {
      return s;
    }
    if (back != host) return absl::DataLossError("copy differs");
    const uint8_t flipped = host[kBytes / 2] ^ 1;
    if (absl::Status s =
            mem.FromHost(b->get() + kBytes / 2, &flipped, 1);
        !s.ok()) {
      return s;
    }
    absl::StatusOr<uint64_t> other = mem.Checksum(b->get(), kBytes);
    if (!other.ok()) return other.status();
    return *other != *sum ? absl::OkStatus()
                          : absl::DataLossError("a flipped byte went unseen");
  });
  EXPECT_TRUE(st[0].ok()) << st[0];
}

}  // namespace
}  // namespace arachne::migration::testing
#else
GTEST_ALLOW_UNINSTANTIATED_PARAMETERIZED_TEST(TransportConformanceTest);
TEST(NcclFactoryTest, NotBuilt) { GTEST_SKIP() << "built without NCCL"; }
#endif
