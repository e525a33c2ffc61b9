#include "migration/core/diff.h"

#include <set>

#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "test/migration/migration_fixture.h"

namespace arachne::migration {
namespace {

using testing::MakeCluster;
using testing::MakePlan;
using testing::MakeStage;
using testing::MakeTemplate;
using testing::TinyModel;
using testing::TinyMoeModel;
using testing::ToyCatalog;

constexpr int64_t kTinyBytes = 180800 * 14;

// Every rank ends with exactly its required bytes: kept + received.
void ExpectCoversRequired(const StateDiff& d) {
  for (size_t r = 0; r < d.required.size(); ++r) {
    int64_t need = 0, have = 0;
    for (const Holding& h : d.required[r]) need += h.range.size();
    for (const Holding& h : d.kept[r]) have += h.range.size();
    for (const MigrationTuple& t : d.tuples) {
      if (t.receiver == static_cast<int>(r)) have += t.range.size();
    }
    EXPECT_EQ(have, need) << "rank " << r;
  }
}

class DiffTest : public ::testing::Test {
 protected:
  void SetUp() override {
    auto s = ModelState::Create(TinyModel());
    ASSERT_TRUE(s.ok());
    state_ = *std::move(s);
  }
  ModelState state_;
  GpuCatalog catalog_ = ToyCatalog();
};

TEST_F(DiffTest, SamePlanMovesNothing) {
  const Cluster c = MakeCluster({{"a", testing::kFast, 2}});
  const Plan p = MakePlan({MakeTemplate(
      {MakeStage(1, 0, 2), MakeStage(1, 2, 4)}, 1, {{0, {0}}, {0, {1}}})});
  const MigrationWorld w(c, catalog_);
  auto d = ComputeDiff(state_, p, c, p, c, w);
  ASSERT_TRUE(d.ok()) << d.status();
  EXPECT_TRUE(d->tuples.empty());
  EXPECT_EQ(d->bytes_moved, 0);
  EXPECT_EQ(d->bytes_kept, kTinyBytes);
  EXPECT_EQ(d->naive_bytes, kTinyBytes);
}

TEST_F(DiffTest, JoinSendsWholeReplicasOverTheNetworkBalanced) {
  const Cluster old_c = MakeCluster({{"a", testing::kFast, 2}});
  const Cluster new_c =
      MakeCluster({{"a", testing::kFast, 2}, {"b", testing::kFast, 2}});
  const Plan p = MakePlan(
      {MakeTemplate({MakeStage(1, 0, 4)}, 2, {{0, {0}}, {0, {1}}})});
  const Plan q = MakePlan({MakeTemplate(
      {MakeStage(1, 0, 4)}, 4, {{0, {0}}, {0, {1}}, {1, {0}}, {1, {1}}})});
  const MigrationWorld w(new_c, catalog_);
  ASSERT_EQ(w.size(), 4);
  EXPECT_EQ(w.RankOf({"b", 1}), 3);
  auto d = ComputeDiff(state_, p, old_c, q, new_c, w);
  ASSERT_TRUE(d.ok()) << d.status();
  EXPECT_EQ(d->bytes_kept, 2 * kTinyBytes);
  EXPECT_EQ(d->bytes_moved, 2 * kTinyBytes);
  EXPECT_EQ(d->naive_bytes, 4 * kTinyBytes);
  int64_t sent[2] = {0, 0};
  for (const MigrationTuple& t : d->tuples) {
    EXPECT_EQ(t.stage, 2);  // different replicas
    ASSERT_LT(t.sender, 2);
    EXPECT_GE(t.receiver, 2);
    sent[t.sender] += t.range.size();
  }
  // Both holders send, within one tensor's bytes of each other.
  EXPECT_NEAR(static_cast<double>(sent[0]), static_cast<double>(sent[1]),
              16384.0 * 2 * 4);
  ExpectCoversRequired(*d);
}

TEST_F(DiffTest, PrefersAHolderOnTheReceiversNode) {
  const Cluster c =
      MakeCluster({{"a", testing::kFast, 2}, {"b", testing::kFast, 2}});
  // Old: replicas on a:0 and b:0. New: a third replica on b:1.
  const Plan p = MakePlan(
      {MakeTemplate({MakeStage(1, 0, 4)}, 2, {{0, {0}}, {1, {0}}})});
  const Plan q = MakePlan({MakeTemplate({MakeStage(1, 0, 4)}, 3,
                                        {{0, {0}}, {1, {0}}, {1, {1}}})});
  const MigrationWorld w(c, catalog_);
  auto d = ComputeDiff(state_, p, c, q, c, w);
  ASSERT_TRUE(d.ok()) << d.status();
  ASSERT_FALSE(d->tuples.empty());
  for (const MigrationTuple& t : d->tuples) {
    EXPECT_EQ(t.sender, w.RankOf({"b", 0}));
    EXPECT_EQ(t.receiver, w.RankOf({"b", 1}));
  }
}

TEST_F(DiffTest, LeaveKeepsWhatStaysAndFailsNamingTheLostRange) {
  const Cluster old_c =
      MakeCluster({{"a", testing::kFast, 2}, {"b", testing::kFast, 2}});
  const Cluster new_c = MakeCluster({{"a", testing::kFast, 2}});
  const MigrationWorld w(new_c, catalog_);
  const Plan p = MakePlan(
      {MakeTemplate({MakeStage(1, 0, 4)}, 2, {{0, {0}}, {1, {0}}})});
  const Plan q =
      MakePlan({MakeTemplate({MakeStage(1, 0, 4)}, 1, {{0, {1}}})});
  auto d = ComputeDiff(state_, p, old_c, q, new_c, w);
  ASSERT_TRUE(d.ok()) << d.status();
  EXPECT_EQ(d->bytes_moved, kTinyBytes);
  for (const MigrationTuple& t : d->tuples) {
    EXPECT_EQ(t.sender, 0);  // a:0, the only holder left
    EXPECT_EQ(t.receiver, 1);
  }
  // Only b held the second half of the pipeline.
  const Plan p2 = MakePlan({MakeTemplate(
      {MakeStage(1, 0, 2), MakeStage(1, 2, 4)}, 1, {{0, {0}}, {1, {0}}})});
  auto lost = ComputeDiff(state_, p2, old_c, q, new_c, w);
  EXPECT_EQ(lost.status(),
            absl::FailedPreconditionError(
                "no GPU still holds bytes [0, 128) of tensor "
                "'layers.2.input_norm.weight:weight' that the new plan needs "
                "on GPU a:1; restore this state from a checkpoint"));
}

TEST_F(DiffTest, LostGpuReceivesEverything) {
  const Cluster c = MakeCluster({{"a", testing::kFast, 2}});
  const MigrationWorld w(c, catalog_);
  const Plan p = MakePlan(
      {MakeTemplate({MakeStage(1, 0, 4)}, 2, {{0, {0}}, {0, {1}}})});
  auto d = ComputeDiff(state_, p, c, p, c, w, {.lost = {{"a", 1}}});
  ASSERT_TRUE(d.ok()) << d.status();
  EXPECT_EQ(d->bytes_kept, kTinyBytes);
  EXPECT_EQ(d->bytes_moved, kTinyBytes);
}

TEST_F(DiffTest, TpChangeKeepsTheOwnShardAndMovesTheOther) {
  const Cluster c = MakeCluster({{"a", testing::kFast, 2}});
  const MigrationWorld w(c, catalog_);
  const Plan p =
      MakePlan({MakeTemplate({MakeStage(1, 0, 4)}, 1, {{0, {0}}})});
  const Plan q =
      MakePlan({MakeTemplate({MakeStage(2, 0, 4)}, 1, {{0, {0, 1}}})});
  auto d = ComputeDiff(state_, p, c, q, c, w);
  ASSERT_TRUE(d.ok()) << d.status();
  // Each TP-2 shard: half of every split tensor plus the replicated norms,
  // 90,688 parameters.
  EXPECT_EQ(d->bytes_kept, 90688 * 14);
  EXPECT_EQ(d->bytes_moved, 90688 * 14);
  for (const MigrationTuple& t : d->tuples) {
    EXPECT_EQ(t.stage, 1);  // one pipeline
    EXPECT_EQ(t.sender, 0);
    EXPECT_EQ(t.receiver, 1);
  }
  ExpectCoversRequired(*d);
}

TEST_F(DiffTest, DepthChangeMovesTheSecondHalf) {
  const Cluster c = MakeCluster({{"a", testing::kFast, 2}});
  const MigrationWorld w(c, catalog_);
  const Plan p =
      MakePlan({MakeTemplate({MakeStage(1, 0, 4)}, 1, {{0, {0}}})});
  const Plan q = MakePlan({MakeTemplate(
      {MakeStage(1, 0, 2), MakeStage(1, 2, 4)}, 1, {{0, {0}}, {0, {1}}})});
  auto d = ComputeDiff(state_, p, c, q, c, w);
  ASSERT_TRUE(d.ok()) << d.status();
  // Layers 2-3 (73,984) and the head (16,448) move to a:1.
  EXPECT_EQ(d->bytes_moved, 90432 * 14);
  EXPECT_EQ(d->bytes_kept, kTinyBytes - 90432 * 14);
  std::set<int> layers;
  for (const MigrationTuple& t : d->tuples) {
    layers.insert(state_.tensor(t.tensor).layer);
  }
  EXPECT_EQ(layers, (std::set<int>{2, 3, kHeadLayer}));
}

TEST_F(DiffTest, MoeGathersExpertsFromTheirEpRank) {
  auto s = ModelState::Create(TinyMoeModel());
  ASSERT_TRUE(s.ok());
  const Cluster c = MakeCluster({{"a", testing::kFast, 2}});
  const MigrationWorld w(c, catalog_);
  const Plan p = MakePlan({MakeTemplate(
      {MakeStage(1, 0, 4, {.ep = 2, .etp = 1, .edp = 1})}, 2,
      {{0, {0}}, {0, {1}}})});
  const Plan q =
      MakePlan({MakeTemplate({MakeStage(1, 0, 4)}, 1, {{0, {0}}})});
  auto d = ComputeDiff(*s, p, c, q, c, w);
  ASSERT_TRUE(d.ok()) << d.status();
  std::set<int> experts;
  for (const MigrationTuple& t : d->tuples) {
    EXPECT_EQ(t.sender, 1);
    experts.insert(s->tensor(t.tensor).expert);
  }
  EXPECT_EQ(experts, (std::set<int>{2, 3}));
  // Experts 2-3 of 4 layers: 2 x 3 x 64 x 32 parameters each, 14 bytes.
  EXPECT_EQ(d->bytes_moved, 4 * 2 * 3 * 64 * 32 * 14);
}

TEST_F(DiffTest, SplitsALargeRangeAcrossHolders) {
  const Cluster c = MakeCluster({{"a", testing::kFast, 4}});
  const MigrationWorld w(c, catalog_);
  const Plan p = MakePlan({MakeTemplate({MakeStage(1, 0, 4)}, 3,
                                        {{0, {0}}, {0, {1}}, {0, {2}}})});
  const Plan q = MakePlan({MakeTemplate(
      {MakeStage(1, 0, 4)}, 4, {{0, {0}}, {0, {1}}, {0, {2}}, {0, {3}}})});
  DiffOptions split;
  split.min_split_bytes = 4096;
  auto d = ComputeDiff(state_, p, c, q, c, w, split);
  ASSERT_TRUE(d.ok()) << d.status();
  int64_t sent[3] = {0, 0, 0};
  std::set<int> senders_of_embedding;
  for (const MigrationTuple& t : d->tuples) {
    sent[t.sender] += t.range.size();
    if (state_.tensor(t.tensor).name == "embedding.weight:master") {
      senders_of_embedding.insert(t.sender);
    }
  }
  EXPECT_EQ(senders_of_embedding.size(), 3u);
  for (int i = 0; i < 3; ++i) {
    EXPECT_NEAR(static_cast<double>(sent[i]), kTinyBytes / 3.0,
                kTinyBytes * 0.01);
  }
  ExpectCoversRequired(*d);
}

TEST_F(DiffTest, RejectsANodeWhoseTypeChanged) {
  const Cluster old_c = MakeCluster({{"a", testing::kFast, 1}});
  const Cluster new_c = MakeCluster({{"a", testing::kSlow, 1}});
  const MigrationWorld w(new_c, catalog_);
  const Plan p =
      MakePlan({MakeTemplate({MakeStage(1, 0, 4)}, 1, {{0, {0}}})});
  EXPECT_EQ(ComputeDiff(state_, p, old_c, p, new_c, w).status(),
            absl::InvalidArgumentError(
                "node a has GPU type 0 in the old cluster and 1 in the new "
                "one; a changed node needs a new name"));
}

}  // namespace
}  // namespace arachne::migration
