// Cost model on hand-computed cases (see toy_fixture.h for the inputs).
#include "planner_service/core/cost/cost_model.h"

#include <cmath>
#include <random>
#include <set>
#include <utility>
#include <vector>

#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "planner_service/core/planners/layer_split.h"
#include "planner_service/core/model/node_pool.h"
#include "planner_service/core/cost/plan_validation.h"
#include "test/core/toy_fixture.h"

namespace arachne {
namespace {

using ::arachne::testing::kFast;
using ::arachne::testing::kSlow;
using ::arachne::testing::MakeCluster;
using ::arachne::testing::MakeStage;
using ::testing::HasSubstr;

// Between `least` and least + spread - 1 nodes of the toy catalog's two
// types, of 1, 2 or 4 GPUs each.
std::vector<std::pair<int, int>> RandomNodes(std::mt19937& rng, int least,
                                             int spread) {
  std::vector<std::pair<int, int>> nodes;
  for (int i = 0, n = least + static_cast<int>(rng() % spread); i < n; ++i) {
    static constexpr int kSizes[] = {1, 2, 4};
    nodes.push_back({static_cast<int>(rng() % 2), kSizes[rng() % 3]});
  }
  return nodes;
}

class CostModelTest : public ::testing::Test {
 protected:
  CostModel Build(const Cluster& cluster, TrainingConfig training =
                                              testing::ToyTraining(),
                  ModelSpec model = testing::ToyModel()) {
    auto cm = CostModel::Create(catalog_, model, training, cluster, profiles_);
    CHECK(cm.status().ok());
    return *std::move(cm);
  }
  GpuCatalog catalog_ = testing::ToyCatalog();
  ProfileStore profiles_ = testing::ToyProfiles();
};

constexpr double kMs = 1e-3;
// 100 Gb/s NIC at the default 97.6% efficiency, GB/s.
constexpr double kNic = 12.5 * 0.976;

TEST_F(CostModelTest, OneStage) {
  Cluster cluster = MakeCluster(catalog_, {{kFast, 1}});
  CostModel cm = Build(cluster);
  Plan plan;
  Template t;
  t.stages = {MakeStage(kFast, 1, 0, 4)};
  t.replicas = 1;
  t.micro_batch_size = 1;
  t.placement = {{0, {0}}};
  plan.templates = {t};
  ASSERT_EQ(cm.BalanceMicroBatches(plan), Infeasibility::kOk);
  EXPECT_EQ(plan.templates[0].total_micro_batches, 8);
  // 8 micro-batches x 4 layers x 3 ms; one replica: no gradient sync; Adam
  // touches 4e6 params x 30 B at 1000 GB/s.
  const double expected = 8 * 12 * kMs + 4e6 * 30 / 1000e9;
  EXPECT_NEAR(cm.IterationTime(plan), expected, 1e-12);
  auto p = cm.Predict(plan);
  ASSERT_TRUE(p.ok()) << p.status();
  EXPECT_NEAR(p->iteration_time_s, expected, 1e-12);
  EXPECT_NEAR(p->tokens_per_s, 8 * 1024 / expected, 1e-6);
  EXPECT_NEAR(p->breakdown.compute_s, 96 * kMs, 1e-12);
  EXPECT_NEAR(p->breakdown.bubble_s, 0, 1e-12);
  EXPECT_NEAR(p->breakdown.dp_sync_s, 0, 1e-12);
  EXPECT_TRUE(ValidatePlan(plan, cm).ok());
}

TEST_F(CostModelTest, NodeTopologyPricesTpCollectivesAtTheSlowestGroup) {
  // One TP 2 stage of 4 layers on a 4-GPU FAST node (catalog 100 GB/s):
  // 8 micro-batches x 4 layers x 0.5 ms of TP collectives through a switch.
  Plan plan = testing::OneReplicaPlan({MakeStage(kFast, 2, 0, 4)},
                                      {{0, {0, 1}}});
  auto tp_comm_on = [&](const Cluster& cluster) {
    absl::StatusOr<Prediction> p = Build(cluster).Predict(plan);
    CHECK(p.ok()) << p.status();
    return p->breakdown.tp_comm_s;
  };
  const Cluster switched = MakeCluster(catalog_, {{kFast, 4}});
  EXPECT_NEAR(tp_comm_on(switched), 8 * 4 * 0.5 * kMs, 1e-12);

  // Pairs (0,1) on 1 link and (2,3) on 2, 25 GB/s each: the slowest pair
  // moves at 25 GB/s, a quarter of the switch, so 4x the time.
  std::vector<Node> nodes = switched.nodes();
  nodes[0].topology.gpu_links = {
      {0, 1, 0, 1}, {1, 0, 1, 0}, {0, 1, 0, 2}, {1, 0, 2, 0}};
  nodes[0].topology.nvlink_gbps = 25;
  absl::StatusOr<Cluster> meshed = Cluster::Create(nodes, catalog_);
  ASSERT_TRUE(meshed.ok()) << meshed.status();
  EXPECT_NEAR(tp_comm_on(*meshed), 4 * 8 * 4 * 0.5 * kMs, 1e-12);

  // A second, switched node of the same type does not hide the slow one.
  nodes.push_back(switched.node(0));
  nodes.back().name = "n1";
  absl::StatusOr<Cluster> mixed = Cluster::Create(nodes, catalog_);
  ASSERT_TRUE(mixed.ok()) << mixed.status();
  EXPECT_NEAR(tp_comm_on(*mixed), 4 * 8 * 4 * 0.5 * kMs, 1e-12);

  // Links faster than the catalog's speed the collectives up: 3 links a
  // GPU at 50 GB/s = 150 GB/s against 100.
  nodes.pop_back();
  nodes[0].topology.gpu_links = {
      {0, 3, 1, 1}, {3, 0, 1, 1}, {1, 1, 0, 3}, {1, 1, 3, 0}};
  nodes[0].topology.nvlink_gbps = 50;
  absl::StatusOr<Cluster> fast_pairs = Cluster::Create(nodes, catalog_);
  ASSERT_TRUE(fast_pairs.ok()) << fast_pairs.status();
  EXPECT_NEAR(tp_comm_on(*fast_pairs), 100.0 / 150 * 8 * 4 * 0.5 * kMs,
              1e-12);

  // Cluster::Create checks a programmatic topology as a file's.
  nodes[0].topology.gpu_links[0][1] = 2;
  EXPECT_EQ(Cluster::Create(nodes, catalog_).status().message(),
            "nodes[0].topology.gpu_links[0][1]: links are symmetric, but GPU "
            "0 -> 1 has 2 and 1 -> 0 has 3 (node \"n0\")");
}

TEST_F(CostModelTest, TwoStagesUnequalSpeedAndBubble) {
  Cluster cluster = MakeCluster(catalog_, {{kFast, 1}, {kSlow, 1}});
  CostModel cm = Build(cluster);
  const Plan plan = testing::OneReplicaPlan(
      {MakeStage(kFast, 1, 0, 2), MakeStage(kSlow, 1, 2, 4)},
      {{0, {0}}, {1, {0}}});
  // Stage 0: 2 x 3 ms + activations out and gradients back over the NIC
  // (2 MiB each way); stage 1: 2 x 6 ms.
  const double p2p = 2 * (2.0 * 1024 * 1024 / (kNic * 1e9) + 20e-6);
  const double t0 = 6 * kMs + p2p, t1 = 12 * kMs;
  EXPECT_NEAR(cm.StageTime(plan, 0, 0), t0, 1e-12);
  EXPECT_NEAR(cm.StageTime(plan, 0, 1), t1, 1e-12);
  const double pipeline = 7 * t1 + (t0 + t1);
  const double optimizer = 2e6 * 30 / 500e9;  // the slow GPU's HBM
  auto p = cm.Predict(plan);
  ASSERT_TRUE(p.ok()) << p.status();
  EXPECT_NEAR(p->iteration_time_s, pipeline + optimizer, 1e-12);
  // The slow stage runs 8 times; the fast stage's time is the bubble.
  EXPECT_NEAR(p->breakdown.compute_s, 8 * t1, 1e-12);
  EXPECT_NEAR(p->breakdown.bubble_s, t0, 1e-12);
  EXPECT_NEAR(p->breakdown.optimizer_s, optimizer, 1e-15);
}

TEST_F(CostModelTest, DataParallelSyncAcrossMixedReplicas) {
  Cluster cluster = MakeCluster(catalog_, {{kFast, 1}, {kSlow, 1}});
  CostModel cm = Build(cluster);
  Plan plan;
  Template a, b;
  a.stages = {MakeStage(kFast, 1, 0, 4)};
  a.placement = {{0, {0}}};
  b.stages = {MakeStage(kSlow, 1, 0, 4)};
  b.placement = {{1, {0}}};
  plan.templates = {a, b};
  ASSERT_EQ(cm.BalanceMicroBatches(plan), Infeasibility::kOk);
  // FAST takes 12 ms per micro-batch, SLOW 24: 6 + 2 and 5 + 3 both finish
  // by 72 ms, the best possible (7 + 1 takes 84 ms).
  const int fast = plan.templates[0].total_micro_batches;
  const int slow = plan.templates[1].total_micro_batches;
  EXPECT_EQ(fast + slow, 8);
  EXPECT_TRUE((fast == 6 && slow == 2) || (fast == 5 && slow == 3))
      << fast << " + " << slow;
  // Ring all-reduce of 4e6 bf16 gradients over 2 replicas on the NIC.
  const double sync = 8.4e-6 + 2 * 9.6e-6 + 8e6 / (kNic * 1e9);
  const double optimizer = 4e6 * 30 / 500e9;
  auto p = cm.Predict(plan);
  ASSERT_TRUE(p.ok()) << p.status();
  EXPECT_NEAR(p->breakdown.dp_sync_s, sync, 1e-12);
  EXPECT_NEAR(p->iteration_time_s, 72 * kMs + sync + optimizer, 1e-12);
  EXPECT_TRUE(ValidatePlan(plan, cm).ok());
}

// A data-parallel ring crosses each node's NIC once, whatever number of its
// members sit there: two replicas per node share one ring's crossing, two
// replicas of TP 2 (two rings, one per TP rank) split the NIC between them.
TEST_F(CostModelTest, GradientRingGetsTheNicShareOfItsMembersOnTheNode) {
  Cluster cluster = MakeCluster(catalog_, {{kFast, 2}, {kFast, 2}});
  CostModel cm = Build(cluster);
  auto dp_sync = [&](int tp, int replicas, std::vector<StagePlacement> where) {
    Plan plan;
    Template t;
    t.stages = {MakeStage(kFast, tp, 0, 4)};
    t.replicas = replicas;
    t.micro_batch_size = 1;
    t.placement = std::move(where);
    plan.templates = {t};
    CHECK(cm.BalanceMicroBatches(plan) == Infeasibility::kOk);
    auto p = cm.Predict(plan);
    CHECK(p.ok()) << p.status();
    return p->breakdown.dp_sync_s;
  };
  // Four TP-1 replicas, two per node: one ring, 2 members per node, so the
  // NIC's two per-GPU shares (kNic / 2 each) are one crossing's kNic.
  const double four = 8.4e-6 + 2 * 3 * 9.6e-6 + 2 * 0.75 * 8e6 / (kNic * 1e9);
  EXPECT_NEAR(dp_sync(1, 4, {{0, {0}}, {0, {1}}, {1, {0}}, {1, {1}}}), four,
              1e-12);
  // Two TP-2 replicas, one per node: two rings (one per TP rank) of one
  // member per node, each on half the NIC, carrying half the gradients.
  const double two = 8.4e-6 + 2 * 9.6e-6 + 4e6 / (kNic / 2 * 1e9);
  EXPECT_NEAR(dp_sync(2, 2, {{0, {0, 1}}, {1, {0, 1}}}), two, 1e-12);
}

TEST_F(CostModelTest, MoeStageAllToAllInsideNode) {
  profiles_ = testing::ToyProfiles("toymoe");
  Cluster cluster = MakeCluster(catalog_, {{kFast, 2}});
  CostModel cm = Build(cluster, testing::ToyTraining(), testing::ToyMoeModel());
  Plan plan;
  Template t;
  t.stages = {MakeStage(kFast, 1, 0, 4)};
  t.stages[0].tiling = ExpertTiling{2, 1, 1};
  t.replicas = 2;
  t.micro_batch_size = 1;
  t.total_micro_batches = 8;
  t.placement = {{0, {0}}, {0, {1}}};
  plan.templates = {t};
  // Per MoE layer: attention 3 ms + experts 3 ms x etp/tp = 3 ms, and the
  // all-to-all: 4 x top-2 x 1024 x 2 B x 1024 tokens x (2-1)/2 over NVLink
  // (100 GB/s) + 4 steps of 3.4 us.
  const double a2a = 4.0 * 2 * 1024 * 2 * 1024 * 0.5 / 100e9 + 4 * 3.4e-6;
  EXPECT_NEAR(cm.StageTime(plan, 0, 0), 4 * (6 * kMs + a2a), 1e-12);
  auto p = cm.Predict(plan);
  ASSERT_TRUE(p.ok()) << p.status();
  // 4 replicas-per-stage micro-batches: 8 / 2 = 4 on each replica.
  EXPECT_NEAR(p->breakdown.all_to_all_s, 4 * 4 * a2a, 1e-12);
  // Experts split over EP 2: 4 layers x 8e6 / 2 expert params per GPU, plus
  // 4e6 attention params: 16 B each; 4 micro-batches of 2 x 100 MiB per
  // layer in flight at most min(1 - 0, 4) = 1.
  const StageMemory m = p->stage_memory[0][0];
  EXPECT_NEAR(m.weights_gib, (4e6 + 16e6) * 16 / (1 << 30), 1e-9);
  EXPECT_NEAR(m.activations_gib, 1 * 4 * 200.0 / 1024, 1e-9);
  EXPECT_TRUE(ValidatePlan(plan, cm).ok());
}

TEST_F(CostModelTest, MemoryAccountingFollowsTheFormulas) {
  Cluster cluster = MakeCluster(catalog_, {{kFast, 4}});
  TrainingConfig training = testing::ToyTraining();
  training.distributed_optimizer = true;
  CostModel cm = Build(cluster, training);
  Plan plan;
  Template t;
  t.stages = {MakeStage(kFast, 1, 0, 3), MakeStage(kFast, 1, 3, 4)};
  t.replicas = 2;
  t.micro_batch_size = 2;
  t.total_micro_batches = 4;
  t.placement = {{0, {0}}, {0, {1}}, {0, {2}}, {0, {3}}};
  plan.templates = {t};
  // Stage 0 of 2 holds min(2 - 0, 2) = 2 micro-batches of 3 layers x 200
  // MiB; state: 3e6 params x (2 + 2 + 12 / 2 replicas) B.
  StageMemory m0 = cm.StageMemoryOf(plan, 0, 0);
  EXPECT_NEAR(m0.weights_gib, 3e6 * 10 / (1 << 30), 1e-12);
  EXPECT_NEAR(m0.activations_gib, 2 * 3 * 200.0 / 1024, 1e-12);
  EXPECT_NEAR(m0.reserve_gib, 1.5, 1e-12);
  // Stage 1 holds one micro-batch.
  StageMemory m1 = cm.StageMemoryOf(plan, 0, 1);
  EXPECT_NEAR(m1.activations_gib, 1 * 1 * 200.0 / 1024, 1e-12);

  // Full recomputation keeps only each layer's 2-byte input (2 x 1024 x 1024
  // x mbs 2 = 4 MiB) plus one layer's activations while it is recomputed
  // (the entry's 200 MiB at mbs 2).
  training.recompute = Recompute::kFull;
  training.distributed_optimizer = false;
  CostModel full = Build(cluster, training);
  StageMemory f0 = full.StageMemoryOf(plan, 0, 0);
  const double working = 200.0 * (1 << 20);
  EXPECT_NEAR(f0.activations_gib,
              (2 * 3 * 4.0 * (1 << 20) + working) / (1 << 30), 1e-12);
  EXPECT_NEAR(f0.weights_gib, 3e6 * 16 / (1 << 30), 1e-12);
  // ...and runs the forward twice: 3 layers x (2 + 4 + 2) ms at mbs 2.
  EXPECT_NEAR(full.StageTime(plan, 0, 0) - 2 * (4.0 * 1024 * 1024 / 100e9 + 20e-6),
              3 * 8 * kMs, 1e-12);
}

TEST_F(CostModelTest, FullRecomputeKeepsTheWholeInputWithoutSequenceParallel) {
  // One stage of 4 layers at TP 2, micro-batch 2, full recomputation. The
  // block input is 2 B x 2 x 1024 x 1024 = 4 MiB; with sequence parallelism
  // each TP rank keeps its 2 MiB shard, without it all 4 MiB. While a block
  // is recomputed its activations without recomputation are live: the
  // entry's 100 MiB x 2 / 2 either way.
  Cluster cluster = MakeCluster(catalog_, {{kFast, 2}});
  Plan plan;
  Template t;
  t.stages = {MakeStage(kFast, 2, 0, 4)};
  t.replicas = 1;
  t.micro_batch_size = 2;
  t.total_micro_batches = 4;
  t.placement = {{0, {0, 1}}};
  plan.templates = {t};
  TrainingConfig training = testing::ToyTraining();
  training.recompute = Recompute::kFull;
  const double mib = 1 << 20, working = 100 * mib;
  CostModel sp = Build(cluster, training);
  EXPECT_NEAR(sp.StageMemoryOf(plan, 0, 0).activations_gib,
              (4 * 2 * mib + working) / (1 << 30), 1e-12);
  training.framework.sequence_parallel = false;
  CostModel no_sp = Build(cluster, training);
  EXPECT_NEAR(no_sp.StageMemoryOf(plan, 0, 0).activations_gib,
              (4 * 4 * mib + working) / (1 << 30), 1e-12);
}

TEST_F(CostModelTest, OutOfMemoryIsReportedWithTheStage) {
  Cluster cluster = MakeCluster(catalog_, {{kFast, 1}});
  TrainingConfig training = testing::ToyTraining();
  training.global_batch = 64;
  CostModel cm = Build(cluster, training);
  Plan plan;
  Template t;
  t.stages = {MakeStage(kFast, 1, 0, 4)};
  t.micro_batch_size = 4;  // 4 layers x 400 MiB fits; now grow the layers
  t.total_micro_batches = 16;
  t.placement = {{0, {0}}};
  plan.templates = {t};
  EXPECT_TRUE(cm.Predict(plan).ok());
  // A 1-GPU stage of 10 GiB x 0.95 holds 4 x 400 MiB + 1.5 GiB easily; a
  // profile with 3 GiB activations per layer does not.
  ProfileStore big = testing::ToyProfiles();
  ProfileStore replaced;
  for (const ProfileEntry* e : big.Entries()) {
    ProfileEntry copy = *e;
    if (copy.key.kind == LayerKind::kDense) copy.activation_bytes *= 8;
    ASSERT_TRUE(replaced.Add(copy).ok());
  }
  auto cm2 = CostModel::Create(catalog_, testing::ToyModel(), training, cluster,
                               replaced);
  ASSERT_TRUE(cm2.ok());
  auto p = cm2->Predict(plan);
  EXPECT_EQ(p.status().code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_THAT(p.status().message(),
              HasSubstr("templates[0].stages[0] (FAST, tp=1, layers 0-4)"));
  EXPECT_THAT(p.status().message(), HasSubstr("9.5 GiB are usable"));
}

TEST_F(CostModelTest, BatchThatDoesNotSplitIsRejected) {
  Cluster cluster = MakeCluster(catalog_, {{kFast, 1}});
  TrainingConfig training = testing::ToyTraining();
  training.global_batch = 6;
  CostModel cm = Build(cluster, training);
  Plan plan;
  Template t;
  t.stages = {MakeStage(kFast, 1, 0, 4)};
  t.micro_batch_size = 4;
  t.placement = {{0, {0}}};
  plan.templates = {t};
  EXPECT_EQ(cm.BalanceMicroBatches(plan), Infeasibility::kBadBatch);
}

TEST_F(CostModelTest, MissingProfileIsOutsideTheSearchSpace) {
  Cluster cluster = MakeCluster(catalog_, {{kFast, 4}});
  CostModel cm = Build(cluster);
  EXPECT_TRUE(cm.Supports(kFast, 2, 4));
  EXPECT_FALSE(cm.Supports(kFast, 4, 1));  // no TP-4 entries
  EXPECT_FALSE(cm.Supports(kFast, 1, 8));  // no micro-batch 8 entries
  EXPECT_FALSE(cm.Supports(kFast, 3, 1));  // not a power of two
}

}  // namespace
}  // namespace arachne

namespace arachne {
namespace {

// Property: BalanceAndPrice is BalanceMicroBatches then IterationTime, bit
// for bit, with the same reason when infeasible and the same micro-batch
// counts, over random plans of one to three templates on random clusters
// (OOM, missing profiles and batches that do not split among them); with a
// PricingScratch reused across candidates too.
TEST_F(CostModelTest, BalanceAndPriceIsBalanceThenIterationTime) {
  // Activations 4x the toy's in half the trials, so some plans run out of
  // memory.
  ProfileStore heavy;
  for (const ProfileEntry* e : profiles_.Entries()) {
    ProfileEntry copy = *e;
    if (copy.key.kind == LayerKind::kDense) copy.activation_bytes *= 4;
    ASSERT_TRUE(heavy.Add(copy).ok());
  }
  std::mt19937 rng(11);
  int priced = 0, infeasible = 0, multi = 0;
  std::set<Infeasibility> reasons;
  for (int trial = 0; trial < 1000; ++trial) {
    const Cluster cluster = MakeCluster(catalog_, RandomNodes(rng, 2, 7));
    TrainingConfig training = testing::ToyTraining();
    training.global_batch = 4 << (rng() % 4);
    training.distributed_optimizer = rng() % 2;
    auto created = CostModel::Create(catalog_, testing::ToyModel(), training,
                                     cluster, rng() % 2 ? heavy : profiles_);
    ASSERT_TRUE(created.ok()) << created.status();
    const CostModel& cm = *created;
    NodePool pool(cluster);
    Plan plan;
    for (int k = 0, templates = 1 + rng() % 3; k < templates; ++k) {
      Template t;
      t.stages.resize(1 + rng() % 3);
      for (Stage& st : t.stages) {
        st.gpu_type = static_cast<int>(rng() % 2);
        st.tp = 1 << (rng() % 3);
      }
      t.micro_batch_size = 1 << (rng() % 4);
      t.replicas = 0;
      for (int r = 0, cap = 1 + rng() % 2; r < cap; ++r)
        if (pool.PlaceReplica(t.stages, &t.placement)) ++t.replicas;
      if (t.replicas == 0) break;
      ApplySplit(t, EvenSplit(4, t.depth()));
      plan.templates.push_back(std::move(t));
    }
    if (plan.templates.empty()) continue;
    Plan a = plan, b = plan;
    Infeasibility why_a = cm.BalanceMicroBatches(a);
    double time_a = kInfeasible;
    if (why_a == Infeasibility::kOk) time_a = cm.IterationTime(a, &why_a);
    Infeasibility why_b = Infeasibility::kOk;
    const double time_b = cm.BalanceAndPrice(b, &why_b);
    EXPECT_EQ(time_a, time_b) << "trial " << trial;
    EXPECT_EQ(why_a, why_b) << "trial " << trial;
    for (size_t j = 0; j < a.templates.size(); ++j) {
      EXPECT_EQ(a.templates[j].total_micro_batches,
                b.templates[j].total_micro_batches)
          << "trial " << trial << " template " << j;
    }
    // A scratch kept across candidates that differ in the last template's
    // micro-batch size and split (auto-fill's) changes nothing either.
    CostModel::PricingScratch scratch;
    for (int mbs : {1, 2, 4, 8}) {
      for (int split = 0; split < 2; ++split) {
        Plan c = plan;
        Template& last = c.templates.back();
        last.micro_batch_size = mbs;
        if (split == 1) {
          std::vector<int> uneven(last.depth(), 1);
          uneven.back() = 4 - (last.depth() - 1);
          ApplySplit(last, uneven);
        }
        Plan d = c;
        Infeasibility why_c = Infeasibility::kOk, why_d = Infeasibility::kOk;
        EXPECT_EQ(cm.BalanceAndPrice(c, &why_c),
                  cm.BalanceAndPrice(d, &why_d, &scratch))
            << "trial " << trial << " mbs " << mbs << " split " << split;
        EXPECT_EQ(why_c, why_d) << "trial " << trial << " mbs " << mbs;
      }
    }
    std::isfinite(time_b) ? ++priced : ++infeasible;
    reasons.insert(why_b);
    multi += plan.templates.size() > 1;
  }
  // Both outcomes and multi-template plans are covered.
  EXPECT_GT(priced, 150);
  EXPECT_GT(infeasible, 150);
  EXPECT_GT(multi, 150);
  EXPECT_THAT(reasons, ::testing::IsSupersetOf(
                           {Infeasibility::kOk, Infeasibility::kMissingProfile,
                            Infeasibility::kOutOfMemory,
                            Infeasibility::kBadBatch}));
}

// A PricingScratch keeps each template's stage times, gradient sync,
// optimizer step and memory between the candidates it prices: over random
// sequences of the moves a fill makes (any template's micro-batch size,
// layer split or expert tiling, and back to an earlier candidate, so kept
// templates are met again), pricing with it is pricing afresh, bit for bit,
// with the same reason when infeasible and the same micro-batch counts; so
// are its balance and stage times, and a stage's tilings priced together
// (PriceStageTilings) are each priced alone. A move that changes one
// stage's tiling has only that stage priced again. Dense and MoE, every
// framework preset (FSDP gathers read the plan's replicas), some plans out
// of memory, one template or several.
TEST_F(CostModelTest, PricingScratchMatchesFreshPricingOverMoveSequences) {
  // Activations 1 to 12 times the toy's, so that some templates fit in
  // memory with few micro-batches in flight and not with more.
  auto with_activations = [](const ProfileStore& base, int factor) {
    ProfileStore heavy;
    for (const ProfileEntry* e : base.Entries()) {
      ProfileEntry copy = *e;
      copy.activation_bytes *= factor;
      CHECK(heavy.Add(copy).ok());
    }
    return heavy;
  };
  std::vector<ProfileStore> dense, moe;
  for (int factor = 1; factor <= 12; ++factor) {
    dense.push_back(with_activations(profiles_, factor));
    moe.push_back(with_activations(testing::ToyProfiles("toymoe"), factor));
  }
  std::mt19937 rng(35);
  int priced = 0, steps = 0, multi = 0, single = 0, tilings_priced = 0;
  std::set<Infeasibility> reasons;
  for (int trial = 0; trial < 1000; ++trial) {
    const Cluster cluster = MakeCluster(catalog_, RandomNodes(rng, 6, 10));
    TrainingConfig training = testing::ToyTraining();
    training.global_batch = 4 << (rng() % 4);
    training.distributed_optimizer = rng() % 2;
    training.framework = FrameworkPresetConfig(
        kAllFrameworkPresets[rng() % std::size(kAllFrameworkPresets)]);
    const bool is_moe = rng() % 2;
    const ProfileStore& profiles = (is_moe ? moe : dense)[rng() % 12];
    auto created = CostModel::Create(
        catalog_, is_moe ? testing::ToyMoeModel() : testing::ToyModel(),
        training, cluster, profiles);
    ASSERT_TRUE(created.ok()) << created.status();
    const CostModel& cm = *created;
    NodePool pool(cluster);
    Plan plan;
    for (int k = 0, templates = 2 + rng() % 3; k < templates; ++k) {
      Template t;
      t.stages.resize(1 + rng() % 4);
      for (Stage& st : t.stages) {
        st.gpu_type = static_cast<int>(rng() % 2);
        st.tp = rng() % 16 == 0 ? 4 : 1 << (rng() % 2);  // 4: no profile
      }
      t.micro_batch_size = 1 << (rng() % 4);
      t.replicas = 0;
      for (int r = 0, cap = 1 + rng() % 3; r < cap; ++r)
        if (pool.PlaceReplica(t.stages, &t.placement)) ++t.replicas;
      if (t.replicas == 0) break;
      ApplySplit(t, EvenSplit(4, t.depth()));
      for (Stage& st : t.stages) st.tiling = {1, 1, st.tp * t.replicas};
      plan.templates.push_back(std::move(t));
    }
    if (plan.templates.empty()) continue;
    multi += plan.templates.size() > 1;
    single += plan.templates.size() == 1;
    // One scratch for the whole sequence: placements, GPU types and TP
    // stay (PricingScratch's contract).
    CostModel::PricingScratch scratch;
    std::vector<Plan> seen = {plan};
    for (int step = 0; step < 40; ++step) {
      Template& t = plan.templates[rng() % plan.templates.size()];
      switch (rng() % 4) {
        case 0:
          t.micro_batch_size = 1 << (rng() % 4);
          break;
        case 1: {  // a random split of the 4 layers, >= 1 per stage
          std::vector<int> split(t.depth(), 1);
          for (int extra = 4 - t.depth(); extra > 0; --extra)
            ++split[rng() % split.size()];
          ApplySplit(t, split);
          break;
        }
        case 2: {  // a random tiling ep x etp x edp of one stage's GPUs
          Stage& st = t.stages[rng() % t.stages.size()];
          const int w = st.tp * t.replicas;
          std::vector<ExpertTiling> tilings;
          for (int etp = 1; etp <= w; etp *= 2) {
            if (w % etp != 0) continue;
            for (int ep = 1; ep <= w / etp; ++ep)
              if ((w / etp) % ep == 0)
                tilings.push_back({ep, etp, w / (etp * ep)});
          }
          st.tiling = tilings[rng() % tilings.size()];
          break;
        }
        default:
          plan = seen[rng() % seen.size()];
          break;
      }
      seen.push_back(plan);
      Plan fresh = plan;
      Infeasibility why_fresh = Infeasibility::kOk, why_kept = Infeasibility::kOk;
      const double time_fresh = cm.BalanceAndPrice(fresh, &why_fresh);
      const double time_kept = cm.BalanceAndPrice(plan, &why_kept, &scratch);
      ASSERT_EQ(time_fresh, time_kept) << "trial " << trial << " step " << step;
      ASSERT_EQ(why_fresh, why_kept) << "trial " << trial << " step " << step;
      for (size_t j = 0; j < plan.templates.size(); ++j) {
        ASSERT_EQ(fresh.templates[j].total_micro_batches,
                  plan.templates[j].total_micro_batches)
            << "trial " << trial << " step " << step << " template " << j;
      }
      std::isfinite(time_kept) ? ++priced : 0;
      reasons.insert(why_kept);
      ++steps;
      // Every tiling of one stage priced together, as one at a time.
      {
        const int j = static_cast<int>(rng() % plan.templates.size());
        Template& t = plan.templates[j];
        const int s = static_cast<int>(rng() % t.stages.size());
        const int w = t.stages[s].tp * t.replicas;
        std::vector<ExpertTiling> tilings;
        for (int etp = 1; etp <= w; etp *= 2) {
          if (w % etp != 0) continue;
          for (int ep = 1; ep <= w / etp; ++ep)
            if ((w / etp) % ep == 0) tilings.push_back({ep, etp, w / (etp * ep)});
        }
        const ExpertTiling before = t.stages[s].tiling;
        // A limit some tilings exceed: those are not timed.
        const double limit = cm.StageMemoryOf(plan, j, s).total_gib();
        std::vector<double> memory(tilings.size()), time(tilings.size());
        cm.PriceStageTilings(plan, j, s, tilings, limit,
                             rng() % 2 ? &scratch : nullptr,
                             absl::MakeSpan(memory), absl::MakeSpan(time));
        ASSERT_EQ(t.stages[s].tiling, before);
        for (size_t i = 0; i < tilings.size(); ++i) {
          Plan one = plan;
          one.templates[j].stages[s].tiling = tilings[i];
          ASSERT_EQ(memory[i], cm.StageMemoryOf(one, j, s).total_gib());
          ASSERT_EQ(time[i], memory[i] > limit ? kInfeasible
                                               : cm.StageTime(one, j, s));
          ++tilings_priced;
        }
      }
      // Balance and stage times with the scratch, as without.
      Plan a = plan, b = plan;
      ASSERT_EQ(cm.BalanceMicroBatches(a), cm.BalanceMicroBatches(b, &scratch));
      for (size_t j = 0; j < a.templates.size(); ++j) {
        ASSERT_EQ(a.templates[j].total_micro_batches,
                  b.templates[j].total_micro_batches);
        for (int s = 0; s < a.templates[j].depth(); ++s) {
          ASSERT_EQ(cm.StageTime(a, static_cast<int>(j), s),
                    cm.StageTime(a, static_cast<int>(j), s, scratch))
              << "trial " << trial << " step " << step;
        }
      }
    }
  }
  EXPECT_GT(multi, 600);
  EXPECT_GT(single, 50);
  EXPECT_GT(tilings_priced, 100000);
  EXPECT_GT(priced, 6000) << "of " << steps;
  EXPECT_THAT(reasons, ::testing::IsSupersetOf(
                           {Infeasibility::kOk, Infeasibility::kMissingProfile,
                            Infeasibility::kOutOfMemory,
                            Infeasibility::kBadBatch}));
}

}  // namespace
}  // namespace arachne
