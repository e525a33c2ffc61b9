// The executor on Gloo over loopback, ranks as forked processes: a join
// arrives bit for bit; a corrupted or missing transfer fails naming it and
// leaves the old state as it was.
#include "migration/core/executor.h"

#include <fstream>
#include <string>

#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "test/migration/migration_fixture.h"
#include "test/migration/migration_harness.h"

#ifdef ARACHNE_HAVE_GLOO
#include "migration/gloo/gloo_transport.h"
#endif

namespace arachne::migration {
namespace {

using ::testing::HasSubstr;
using testing::MakeCluster;
using testing::MakePlan;
using testing::MakeStage;
using testing::MakeTemplate;

TEST(ChecksumTest, SeesEveryByteAndItsPosition) {
  std::vector<uint8_t> a(1001, 7), b = a;
  EXPECT_EQ(Checksum(a.data(), a.size()), Checksum(b.data(), b.size()));
  b[1000] ^= 1;
  EXPECT_NE(Checksum(a.data(), a.size()), Checksum(b.data(), b.size()));
  b = a;
  b[3] = 8;
  b[11] = 8;
  std::vector<uint8_t> c = a;
  c[11] = 8;
  c[3] = 8;
  EXPECT_EQ(Checksum(b.data(), b.size()), Checksum(c.data(), c.size()));
  c[3] = 7;
  c[4] = 8;
  EXPECT_NE(Checksum(b.data(), b.size()), Checksum(c.data(), c.size()));
  EXPECT_NE(Checksum(a.data(), 10), Checksum(a.data(), 11));
}

// The checksum of a byte range is what the committed executor computed
// before it could stream (checkpoint files carry these values), whole or fed
// in pieces of any multiple of 32 bytes.
TEST(ChecksumTest, StreamedInPiecesGivesTheOneShotValue) {
  const std::vector<std::pair<size_t, uint64_t>> golden = {
      {0, 0x4ded76a663920233ull},    {1, 0x2e86f44d82f365ffull},
      {31, 0x52a6e5dfdc49bc05ull},   {32, 0x681f51db3ef08fadull},
      {33, 0xc3588ed8c9e8a36bull},   {100, 0xc9bcd6b405c3ee7full},
      {1000, 0x26fa0cf10ae4da40ull}, {4103, 0xddb78acb788ada11ull},
  };
  for (const auto& [n, want] : golden) {
    SCOPED_TRACE(n);
    std::vector<uint8_t> v(n);
    for (size_t i = 0; i < n; ++i) v[i] = static_cast<uint8_t>(i * 37 + 11);
    EXPECT_EQ(Checksum(v.data(), n), want);
    for (size_t piece : {size_t{32}, size_t{64}, size_t{96}, size_t{4096}}) {
      ChecksumStream s(n);
      size_t at = 0;
      while (at < n) {
        const size_t k = std::min(piece, n - at);
        s.Update(v.data() + at, k);
        at += k;
      }
      EXPECT_EQ(s.Finish(), want) << "pieces of " << piece;
    }
  }
}

TEST(ShardSetTest, FindsWholeRangesOnly) {
  ShardSet s({{3, {100, 200}}, {1, {0, 10}}});
  EXPECT_EQ(s.bytes(), 110);
  ASSERT_NE(s.Find(3, {150, 200}), nullptr);
  EXPECT_EQ(s.Find(3, {150, 200}) - s.Find(3, {100, 200}), 50);
  EXPECT_EQ(s.Find(3, {50, 150}), nullptr);
  EXPECT_EQ(s.Find(2, {0, 1}), nullptr);
}

#ifdef ARACHNE_HAVE_GLOO

// Node b (2 GPUs) joins node a; the new plan is two 2-stage pipelines, one
// per node, so a:1's second stage also moves within a (stage 1).
testing::MigrationCase JoinCase() {
  testing::MigrationCase c{
      .model = testing::TinyModel(),
      .catalog = testing::ToyCatalog(),
      .old_cluster = MakeCluster({{"a", testing::kFast, 2}}),
      .old_plan = MakePlan({MakeTemplate({MakeStage(1, 0, 4)}, 1, {{0, {0}}})}),
      .new_cluster =
          MakeCluster({{"a", testing::kFast, 2}, {"b", testing::kFast, 2}}),
      .new_plan = MakePlan({MakeTemplate(
          {MakeStage(1, 0, 2), MakeStage(1, 2, 4)}, 2,
          {{0, {0}}, {0, {1}}, {1, {0}}, {1, {1}}})}),
      .diff_options = {},
      .schedule_options = {},
  };
  c.schedule_options.min_piece_bytes = 64 << 10;
  return c;
}

TEST(ExecutorTest, JoinArrivesBitForBit) {
  auto gloo = MakeGlooTransportFactory();
  for (const absl::Status& s : testing::RunMigration(JoinCase(), gloo.get())) {
    EXPECT_TRUE(s.ok()) << s;
  }
}

TEST(ExecutorTest, ReportsBytesPerStage) {
  auto gloo = MakeGlooTransportFactory();
  testing::RankHooks hooks;
  hooks.check = [](int rank, absl::Status run, const ExecutionReport& r,
                   const ShardSet&, const ShardSet& new_state) {
    if (!run.ok()) return run;
    // a:1 (rank 1) gets layers 2-3 and the head from a:0 inside its
    // pipeline: 90,432 parameters x 14 bytes, all in stage 1.
    if (rank == 1 && (r.stage1.bytes_received != 90432 * 14 ||
                      r.stage2.bytes_received != 0)) {
      return absl::InternalError(absl::StrCat(
          "rank 1 received ", r.stage1.bytes_received, " + ",
          r.stage2.bytes_received));
    }
    if (rank == 0 && r.bytes_kept != new_state.bytes()) {
      return absl::InternalError("rank 0 should keep all it needs");
    }
    return absl::OkStatus();
  };
  for (const absl::Status& s :
       testing::RunMigration(JoinCase(), gloo.get(), hooks)) {
    EXPECT_TRUE(s.ok()) << s;
  }
}

// TinyModel's tensors are all small (< 256 KiB), so every segment is packed.
// With the default staging a transfer's small segments travel in one pack
// (more than 1 MiB on some rank); with 1 MiB of staging they travel in
// sub-rounds of packs of at most 512 KiB each way, and arrive the same.
TEST(ExecutorTest, SmallSegmentsTravelInPacksWithinTheStagingBytes) {
  auto gloo = MakeGlooTransportFactory();
  testing::MigrationCase c = JoinCase();
  c.schedule_options.min_piece_bytes = 16 << 20;  // one transfer per pair
  for (int64_t staging : {ExecutorOptions::kDefaultStagingBytes,
                          ExecutorOptions::kMinStagingBytes}) {
    SCOPED_TRACE(staging);
    testing::RankHooks hooks;
    hooks.staging_bytes = staging;
    const std::string dir = testing::MakeTempDir();
    hooks.check = [&](int rank, absl::Status run, const ExecutionReport& r,
                      const ShardSet&, const ShardSet& new_state) {
      if (!run.ok()) return run;
      if (r.staging_peak > staging) {
        return absl::InternalError(absl::StrCat(
            "rank ", rank, " staged ", r.staging_peak, " bytes at once"));
      }
      std::ofstream(absl::StrCat(dir, "/peak-", rank)) << r.staging_peak;
      auto state = ModelState::Create(testing::TinyModel());
      return testing::CheckReference(*state, new_state);
    };
    for (const absl::Status& s :
         testing::RunMigration(c, gloo.get(), hooks)) {
      EXPECT_TRUE(s.ok()) << s;
    }
    int64_t most = 0;
    for (int rank = 0; rank < 4; ++rank) {
      int64_t peak = 0;
      std::ifstream(absl::StrCat(dir, "/peak-", rank)) >> peak;
      most = std::max(most, peak);
    }
    if (staging == ExecutorOptions::kDefaultStagingBytes) {
      EXPECT_GT(most, ExecutorOptions::kMinStagingBytes);
    } else {
      EXPECT_GT(most, 0);
      EXPECT_LE(most, ExecutorOptions::kMinStagingBytes);
    }
  }
}

// Where the new state's buffer is the old state's (an engine sharing a
// tensor it keeps whole), the kept bytes are not copied: a:0 keeps layers
// 0-1 whole, shares all of them and receives nothing.
TEST(ExecutorTest, KeptBytesInASharedBufferAreNotCopied) {
  auto gloo = MakeGlooTransportFactory();
  testing::RankHooks hooks;
  hooks.share_kept = true;
  hooks.check = [](int rank, absl::Status run, const ExecutionReport& r,
                   const ShardSet&, const ShardSet& new_state) {
    if (!run.ok()) return run;
    if (rank == 0 && (r.bytes_kept != new_state.bytes() ||
                      r.bytes_shared != r.bytes_kept)) {
      return absl::InternalError(absl::StrCat(
          "rank 0 kept ", r.bytes_kept, " shared ", r.bytes_shared, " of ",
          new_state.bytes()));
    }
    if (rank != 0 && r.bytes_shared != 0) {
      return absl::InternalError(absl::StrCat("rank ", rank, " shared ",
                                              r.bytes_shared));
    }
    auto state = ModelState::Create(testing::TinyModel());
    return testing::CheckReference(*state, new_state);
  };
  for (const absl::Status& s :
       testing::RunMigration(JoinCase(), gloo.get(), hooks)) {
    EXPECT_TRUE(s.ok()) << s;
  }
}

// b:1 (rank 3) sees the first byte of every buffer it receives flipped.
std::unique_ptr<Transport> CorruptWhatRank3Receives(
    int rank, std::unique_ptr<Transport> t) {
  if (rank != 3) return t;
  return std::make_unique<testing::TamperingTransport>(
      std::move(t),
      [](const RecvOp& r) { static_cast<uint8_t*>(r.data)[0] ^= 0x5a; });
}

// The executor reaches the states only through their StateMemory, as it
// can only reach a GPU's memory through CUDA: in a GuardedMemory (PROT_NONE
// outside its operations and the transport's rounds) a join arrives bit
// for bit, every sent and received byte was checksummed there, and the
// staging buffers were allocated once each, not per transfer, with small
// packs (1 MiB of staging: several sub-rounds) or one.
TEST(ExecutorTest, DeviceMemoryIsReachedOnlyThroughItsStateMemory) {
  auto gloo = MakeGlooTransportFactory();
  testing::MigrationCase c = JoinCase();
  c.schedule_options.min_piece_bytes = 16 << 20;  // one transfer per pair
  for (int64_t staging : {ExecutorOptions::kDefaultStagingBytes,
                          ExecutorOptions::kMinStagingBytes}) {
    SCOPED_TRACE(staging);
    testing::RankHooks hooks;
    hooks.guarded_memory = true;
    hooks.staging_bytes = staging;
    hooks.check_memory = [](int rank, const testing::GuardedMemory& m,
                            const ExecutionReport& r) {
      const int64_t sent = r.stage1.bytes_sent + r.stage2.bytes_sent;
      const int64_t received =
          r.stage1.bytes_received + r.stage2.bytes_received;
      if (m.checksummed_bytes != sent + received) {
        return absl::InternalError(absl::StrCat(
            "rank ", rank, " checksummed ", m.checksummed_bytes,
            " bytes in its memory; sent ", sent, " received ", received));
      }
      // send, recv, and the two checksum buffers, each at most once.
      if (m.allocations > 4) {
        return absl::InternalError(absl::StrCat(
            "rank ", rank, " allocated ", m.allocations, " staging buffers"));
      }
      if (m.copied_bytes < r.bytes_kept - r.bytes_shared) {
        return absl::InternalError(absl::StrCat(
            "rank ", rank, " copied ", m.copied_bytes, " bytes, kept ",
            r.bytes_kept));
      }
      return absl::OkStatus();
    };
    for (const absl::Status& s : testing::RunMigration(c, gloo.get(), hooks)) {
      EXPECT_TRUE(s.ok()) << s;
    }
  }
}

// A state in device memory cannot go over a host transport.
TEST(ExecutorTest, StateAndTransportInDifferentMemoriesAreRefused) {
  auto gloo = MakeGlooTransportFactory();
  testing::RankHooks hooks;
  hooks.guarded_memory = true;
  hooks.wrap_guarded = false;
  hooks.check = [](int rank, absl::Status run, const ExecutionReport&,
                   const ShardSet&, const ShardSet&) {
    if (run.code() == absl::StatusCode::kFailedPrecondition &&
        run.message() ==
            absl::StrCat("rank ", rank,
                         ": the state is in device memory but the 'gloo' "
                         "transport takes host memory")) {
      return absl::OkStatus();
    }
    return absl::InternalError(absl::StrCat("got ", run.ToString()));
  };
  for (const absl::Status& s :
       testing::RunMigration(JoinCase(), gloo.get(), hooks)) {
    EXPECT_TRUE(s.ok()) << s;
  }
}

// A corrupted segment in device memory is still DataLoss: the receiver's
// checksum runs where the bytes landed.
TEST(ExecutorTest, CorruptedBytesInDeviceMemoryAreDataLoss) {
  auto gloo = MakeGlooTransportFactory();
  testing::RankHooks hooks;
  hooks.guarded_memory = true;
  hooks.wrap = CorruptWhatRank3Receives;
  hooks.check = [](int rank, absl::Status run, const ExecutionReport& r,
                   const ShardSet&, const ShardSet&) {
    if (rank != 3) return absl::OkStatus();
    if (run.code() != absl::StatusCode::kDataLoss ||
        run.message().find("checksum") == absl::string_view::npos) {
      return absl::InternalError(absl::StrCat("got ", run.ToString()));
    }
    return r.failed.has_value() ? absl::OkStatus()
                                : absl::InternalError("no failed transfer");
  };
  const auto st = testing::RunMigration(JoinCase(), gloo.get(), hooks);
  EXPECT_TRUE(st[3].ok()) << st[3];
}

TEST(ExecutorTest, CorruptedBytesFailNamingTheTransferAndKeepTheOldState) {
  auto gloo = MakeGlooTransportFactory();
  testing::RankHooks hooks;
  hooks.wrap = CorruptWhatRank3Receives;
  hooks.check = [](int rank, absl::Status run, const ExecutionReport& r,
                   const ShardSet& old_state, const ShardSet&) {
    if (rank != 3) return absl::OkStatus();  // peers may finish or not
    if (run.code() != absl::StatusCode::kDataLoss ||
        run.message().find("checksum") == absl::string_view::npos ||
        run.message().find("tensor 'layers.") == absl::string_view::npos) {
      return absl::InternalError(absl::StrCat("got ", run.ToString()));
    }
    if (!r.failed.has_value() || r.failed->transfer.receiver != 3) {
      return absl::InternalError("no failed transfer reported");
    }
    return old_state.bytes() == 0 ? absl::OkStatus()
                                  : absl::InternalError("b:1 held nothing");
  };
  const auto st = testing::RunMigration(JoinCase(), gloo.get(), hooks);
  EXPECT_TRUE(st[3].ok()) << st[3];
}

TEST(ExecutorTest, SilentPeerTimesOutAndTheOldStateIsUntouched) {
  auto gloo = MakeGlooTransportFactory();
  testing::RankHooks hooks;
  hooks.idle_ranks = {0};  // a:0, the only holder, never sends
  hooks.round_timeout = absl::Milliseconds(300);
  hooks.check = [](int rank, absl::Status run, const ExecutionReport& r,
                   const ShardSet& old_state, const ShardSet&) {
    if (run.code() != absl::StatusCode::kDeadlineExceeded) {
      return absl::InternalError(absl::StrCat("got ", run.ToString()));
    }
    if (run.message().find("rank 0 -> rank " + std::to_string(rank)) ==
        absl::string_view::npos) {
      return absl::InternalError(absl::StrCat("message: ", run.message()));
    }
    if (!r.failed.has_value() || r.failed->transfer.sender != 0) {
      return absl::InternalError("no failed transfer reported");
    }
    return old_state.bytes() == 0
               ? absl::OkStatus()
               : absl::InternalError("joining GPUs held nothing before");
  };
  const auto st = testing::RunMigration(JoinCase(), gloo.get(), hooks);
  for (int r : {1, 2, 3}) EXPECT_TRUE(st[r].ok()) << "rank " << r << ": " << st[r];
}

#endif  // ARACHNE_HAVE_GLOO

}  // namespace
}  // namespace arachne::migration
