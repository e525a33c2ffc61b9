// The executor on Gloo over loopback, ranks as forked processes: a join
// arrives bit for bit; a corrupted or missing transfer fails naming it and
// leaves the old state as it was.
#include "migration/core/executor.h"

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

TEST(ExecutorTest, CorruptedBytesFailNamingTheTransferAndKeepTheOldState) {
  auto gloo = MakeGlooTransportFactory();
  testing::RankHooks hooks;
  hooks.wrap = [](int rank, std::unique_ptr<Transport> t)
      -> std::unique_ptr<Transport> {
    if (rank != 3) return t;
    return std::make_unique<testing::TamperingTransport>(
        std::move(t), [](const RecvOp& r) {
          static_cast<uint8_t*>(r.data)[0] ^= 0x5a;
        });
  };
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
