#include "migration/core/schedule.h"

#include <map>
#include <set>
#include <tuple>

#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "test/migration/migration_fixture.h"

namespace arachne::migration {
namespace {

using testing::MakeCluster;
using testing::MakePlan;
using testing::MakeStage;
using testing::MakeTemplate;
using testing::ToyCatalog;

// A model big enough that pieces matter: 8 layers, hidden 512.
ModelSpec MidModel() {
  ModelSpec m = testing::TinyModel();
  m.num_layers = 8;
  m.hidden = 512;
  m.num_heads = 8;
  m.num_kv_heads = 4;
  m.head_dim = 64;
  m.ffn = 2048;
  m.vocab = 4096;
  return m;
}

// `replicas` pipelines of 4 stages x TP 1, replica r on node r.
Plan PipelinesOnNodes(int replicas) {
  std::vector<StagePlacement> placement;
  for (int r = 0; r < replicas; ++r) {
    for (int s = 0; s < 4; ++s) placement.push_back({r, {s}});
  }
  return MakePlan({MakeTemplate({MakeStage(1, 0, 2), MakeStage(1, 2, 4),
                                 MakeStage(1, 4, 6), MakeStage(1, 6, 8)},
                                replicas, placement)});
}

struct Case {
  ModelState state;
  Cluster old_c, new_c;
  Plan p, q;
};

// Node n3 joins three 4-GPU nodes; the new plan adds a fourth pipeline and,
// in the old three, swaps the stages of GPUs 0 and 1 (a re-split).
Case JoinCase() {
  auto s = ModelState::Create(MidModel());
  CHECK(s.ok());
  Case c{*std::move(s),
         MakeCluster({{"n0", testing::kFast, 4},
                      {"n1", testing::kFast, 4},
                      {"n2", testing::kFast, 4}}),
         MakeCluster({{"n0", testing::kFast, 4},
                      {"n1", testing::kFast, 4},
                      {"n2", testing::kFast, 4},
                      {"n3", testing::kFast, 4}}),
         PipelinesOnNodes(3), PipelinesOnNodes(4)};
  for (int r = 0; r < 3; ++r) {
    std::swap(c.q.templates[0].placement[r * 4].gpus,
              c.q.templates[0].placement[r * 4 + 1].gpus);
  }
  return c;
}

MigrationSchedule Build(const Case& c, const ScheduleOptions& o = {}) {
  const MigrationWorld w(c.new_c, ToyCatalog());
  auto d = ComputeDiff(c.state, c.p, c.old_c, c.q, c.new_c, w);
  CHECK(d.ok()) << d.status();
  return BuildSchedule(*d, w, o);
}

TEST(ScheduleTest, NoRankHasTwoPeersInARoundAndEveryByteIsScheduledOnce) {
  const Case c = JoinCase();
  const MigrationWorld w(c.new_c, ToyCatalog());
  auto d = ComputeDiff(c.state, c.p, c.old_c, c.q, c.new_c, w);
  ASSERT_TRUE(d.ok()) << d.status();
  const MigrationSchedule s = BuildSchedule(*d, w);
  ASSERT_FALSE(s.stage1.empty());
  ASSERT_FALSE(s.stage2.empty());
  // (sender, receiver, tensor) -> scheduled ranges.
  std::map<std::tuple<int, int, int>, int64_t> scheduled;
  for (int stage : {1, 2}) {
    for (const Round& r : s.stage(stage)) {
      std::set<int> senders, receivers;
      // The round's time is its busiest resource: a GPU's transfer or a
      // NIC's bytes (shared by the round's transfers through it).
      std::map<int, double> nic_out, nic_in;
      double longest = 0;
      for (const Transfer& t : r.transfers) {
        EXPECT_TRUE(senders.insert(t.sender).second);
        EXPECT_TRUE(receivers.insert(t.receiver).second);
        const double alone = t.bytes / w.BytesPerSecond(t.sender, t.receiver);
        EXPECT_DOUBLE_EQ(t.estimated_s, alone);
        longest = std::max(longest, alone);
        if (!w.SameNode(t.sender, t.receiver)) {
          nic_out[w.node_of(t.sender)] += alone;
          nic_in[w.node_of(t.receiver)] += alone;
        }
        int64_t bytes = 0;
        for (const TransferSegment& seg : t.segments) {
          bytes += seg.range.size();
          scheduled[{t.sender, t.receiver, seg.tensor}] += seg.range.size();
        }
        EXPECT_EQ(bytes, t.bytes);
      }
      for (const auto& [node, s] : nic_out) longest = std::max(longest, s);
      for (const auto& [node, s] : nic_in) longest = std::max(longest, s);
      EXPECT_NEAR(r.estimated_s, longest, 1e-12);
    }
  }
  std::map<std::tuple<int, int, int>, int64_t> wanted;
  for (const MigrationTuple& t : d->tuples) {
    wanted[{t.sender, t.receiver, t.tensor}] += t.range.size();
  }
  EXPECT_EQ(scheduled, wanted);
  EXPECT_EQ(s.bytes, d->bytes_moved);
  EXPECT_DOUBLE_EQ(s.makespan_s, s.stage1_s + s.stage2_s);
}

TEST(ScheduleTest, IsDeterministic) {
  const Case c = JoinCase();
  const MigrationSchedule a = Build(c), b = Build(c);
  EXPECT_EQ(a.stage1, b.stage1);
  EXPECT_EQ(a.stage2, b.stage2);
  EXPECT_EQ(a.makespan_s, b.makespan_s);
}

TEST(ScheduleTest, MakespanIsWithinAQuarterOfTheLowerBound) {
  const MigrationSchedule s = Build(JoinCase(), {.min_piece_bytes = 64 << 10});
  EXPECT_GT(s.lower_bound_s, 0);
  EXPECT_GE(s.makespan_s, s.lower_bound_s * (1 - 1e-9));
  EXPECT_LE(s.ratio(), 1.25) << s.makespan_s << " vs " << s.lower_bound_s;
}

TEST(ScheduleTest, LowerBoundIsTheBusiestLink) {
  const Cluster c =
      MakeCluster({{"a", testing::kFast, 2}, {"b", testing::kFast, 1}});
  const MigrationWorld w(c, ToyCatalog());
  // a:0 -> b:0 over the 100 Gb/s NIC (12.5 GB/s), a:0 -> a:1 over the
  // FAST type's 100 GB/s link: a:0 sends 12.5e9 / 12.5e9 + 100e9 / 100e9.
  const std::vector<MigrationTuple> tuples = {
      {.sender = 0, .receiver = 2, .tensor = 0, .range = {0, 12'500'000'000}},
      {.sender = 0, .receiver = 1, .tensor = 0, .range = {0, 100'000'000'000}},
  };
  EXPECT_DOUBLE_EQ(LowerBoundSeconds(tuples, w), 2.0);
}

TEST(ScheduleTest, EmptyDiffHasNoRounds) {
  const Case c = JoinCase();
  const MigrationWorld w(c.old_c, ToyCatalog());
  auto d = ComputeDiff(c.state, c.p, c.old_c, c.p, c.old_c, w);
  ASSERT_TRUE(d.ok());
  const MigrationSchedule s = BuildSchedule(*d, w);
  EXPECT_TRUE(s.stage1.empty());
  EXPECT_TRUE(s.stage2.empty());
  EXPECT_EQ(s.makespan_s, 0);
  EXPECT_EQ(s.ratio(), 1.0);
}

}  // namespace
}  // namespace arachne::migration
