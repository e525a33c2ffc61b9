// Auto-fill choices and the exact planner on hand-made inputs.
#include <cmath>
#include <random>

#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "planner_service/core/planners/auto_fill.h"
#include "planner_service/core/planners/exact_planner.h"
#include "planner_service/core/planners/layer_split.h"
#include "planner_service/core/cost/plan_validation.h"
#include "test/core/toy_fixture.h"

namespace arachne {
namespace {

using ::arachne::testing::kFast;
using ::arachne::testing::kSlow;
using ::arachne::testing::MakeCluster;
using ::testing::ElementsAre;
using ::testing::HasSubstr;

class PlannerTest : public ::testing::Test {
 protected:
  CostModel Build(const Cluster& cluster,
                  TrainingConfig training = testing::ToyTraining()) {
    auto cm = CostModel::Create(catalog_, testing::ToyModel(), training,
                                cluster, profiles_);
    CHECK(cm.ok());
    return *std::move(cm);
  }
  GpuCatalog catalog_ = testing::ToyCatalog();
  ProfileStore profiles_ = testing::ToyProfiles();
};

TEST_F(PlannerTest, AutoFillPacksAllReplicasThatFit) {
  // Two 4-GPU FAST nodes and one 2-GPU node: a TP-2 single-stage template
  // packs 2 + 2 + 1 = 5 replicas.
  Cluster cluster = MakeCluster(catalog_, {{kFast, 4}, {kFast, 4}, {kFast, 2}});
  CostModel cm = Build(cluster);
  AutoFill fill(cm);
  auto r = fill.Extend(Plan{}, NodePool(cluster), {{kFast, 2}});
  ASSERT_TRUE(r.ok()) << r.status();
  EXPECT_EQ(r->plan.templates[0].replicas, 5);
  EXPECT_EQ(r->pool.TotalFree(), 0);
  EXPECT_TRUE(ValidatePlan(r->plan, cm).ok());
}

TEST_F(PlannerTest, AutoFillPrefersExactFitNodes) {
  // One 1-GPU node and one 4-GPU node: a TP-1 stage goes to the 1-GPU node
  // first, leaving the 4-GPU node whole.
  Cluster cluster = MakeCluster(catalog_, {{kFast, 4}, {kFast, 1}});
  NodePool pool(cluster);
  std::vector<StagePlacement> placement;
  Stage st;
  st.gpu_type = kFast;
  st.tp = 1;
  ASSERT_TRUE(pool.PlaceReplica({st}, &placement));
  EXPECT_EQ(placement[0].node, 1);
  EXPECT_EQ(pool.LargestFreeOfType(kFast), 4);
}

TEST_F(PlannerTest, AutoFillSplitsLayersBySpeed) {
  // FAST does a layer in 3 ms, SLOW in 6: 4 layers split 3 + 1 balances
  // better (9 vs 6 ms) than 2 + 2 (6 vs 12 ms).
  Cluster cluster = MakeCluster(catalog_, {{kFast, 1}, {kSlow, 1}});
  CostModel cm = Build(cluster);
  AutoFill fill(cm);
  auto r = fill.Extend(Plan{}, NodePool(cluster), {{kFast, 1}, {kSlow, 1}});
  ASSERT_TRUE(r.ok()) << r.status();
  const Template& t = r->plan.templates[0];
  EXPECT_EQ(t.stages[0].num_layers(), 3);
  EXPECT_EQ(t.stages[1].num_layers(), 1);
  EXPECT_EQ(t.replicas, 1);
}

TEST_F(PlannerTest, AutoFillPicksTheFastestMicroBatch) {
  // Profiles scale linearly with the micro-batch, so the micro-batch only
  // changes the pipeline bubble: with 2 stages of 2 layers (6 ms per
  // sequence each), mbs 1 takes 7 * 6 + 12 = 54 ms and mbs 4 takes
  // 1 * 24 + 48 = 72 ms, so auto-fill keeps mbs 1.
  Cluster cluster = MakeCluster(catalog_, {{kFast, 2}});
  CostModel cm = Build(cluster);
  AutoFill fill(cm);
  int64_t evaluations = 0;
  auto r = fill.Extend(Plan{}, NodePool(cluster), {{kFast, 1}, {kFast, 1}},
                       &evaluations);
  ASSERT_TRUE(r.ok()) << r.status();
  EXPECT_EQ(r->plan.templates[0].micro_batch_size, 1);
  EXPECT_GT(evaluations, 0);
}

TEST_F(PlannerTest, AutoFillReportsWhyNothingFits) {
  // 3 GiB of activations per layer and micro-batch: no split of 4 layers
  // fits one 10 GiB GPU.
  ProfileStore big;
  for (const ProfileEntry* e : profiles_.Entries()) {
    ProfileEntry copy = *e;
    if (copy.key.kind == LayerKind::kDense) copy.activation_bytes *= 32;
    ASSERT_TRUE(big.Add(copy).ok());
  }
  Cluster cluster = MakeCluster(catalog_, {{kFast, 1}});
  auto cm = CostModel::Create(catalog_, testing::ToyModel(),
                              testing::ToyTraining(), cluster, big);
  ASSERT_TRUE(cm.ok());
  AutoFill fill(*cm);
  auto r = fill.Extend(Plan{}, NodePool(cluster), {{kFast, 1}});
  EXPECT_EQ(r.status().code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_THAT(r.status().message(),
              HasSubstr("[FAST/tp1] with 1 replicas: no layer split fits"));
  ExactPlanner planner;
  auto p = planner.Run(*cm, PlannerOptions{});
  EXPECT_EQ(p.status().code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_THAT(p.status().message(), HasSubstr("no plan fits toy"));
}

TEST_F(PlannerTest, ExactPlannerIsExhaustiveOnASmallCluster) {
  Cluster cluster = MakeCluster(catalog_, {{kFast, 2}, {kSlow, 2}});
  CostModel cm = Build(cluster);
  ExactPlanner planner;
  PlannerOptions options;
  options.budget = absl::Seconds(60);
  auto r = planner.Run(cm, options);
  ASSERT_TRUE(r.ok()) << r.status();
  EXPECT_TRUE(r->stats.exhaustive);
  EXPECT_GT(r->stats.evaluations, 100);
  EXPECT_TRUE(ValidatePlan(r->plan, cm).ok());
  // Brute force over the same single-template structures cannot beat it.
  AutoFill fill(cm);
  const std::vector<StageChoice> choices = ExactPlanner::StageOptions(cm);
  ASSERT_THAT(choices.size(), 4);
  for (const StageChoice& a : choices) {
    for (const StageChoice& b : choices) {
      auto x = fill.Extend(Plan{}, NodePool(cluster), {a, b});
      if (x.ok()) {
        EXPECT_GE(x->iteration_time_s, r->prediction.iteration_time_s - 1e-12);
      }
    }
  }
}

TEST_F(PlannerTest, ExactPlannerStopsAtTheEvaluationBudget) {
  Cluster cluster = MakeCluster(catalog_, {{kFast, 4}, {kFast, 4}, {kSlow, 4}});
  CostModel cm = Build(cluster);
  ExactPlanner planner;
  PlannerOptions options;
  options.max_evaluations = 50;
  auto r = planner.Run(cm, options);
  ASSERT_TRUE(r.ok()) << r.status();
  EXPECT_FALSE(r->stats.exhaustive);
  EXPECT_LE(r->stats.evaluations, 50 + 20);  // one fill may overshoot
  EXPECT_TRUE(ValidatePlan(r->plan, cm).ok());
}

// Property: on random small clusters every plan the exact planner returns
// validates, and its predicted time equals a fresh pricing.
TEST_F(PlannerTest, EveryReturnedPlanValidatesOnRandomClusters) {
  std::mt19937 rng(7);
  for (int trial = 0; trial < 25; ++trial) {
    std::vector<std::pair<int, int>> nodes;
    const int n = 1 + rng() % 4;
    for (int i = 0; i < n; ++i) {
      static constexpr int kSizes[] = {1, 2, 4};
      nodes.push_back({static_cast<int>(rng() % 2), kSizes[rng() % 3]});
    }
    Cluster cluster = MakeCluster(catalog_, nodes);
    TrainingConfig training = testing::ToyTraining();
    training.global_batch = 8 << (rng() % 3);
    CostModel cm = Build(cluster, training);
    ExactPlanner planner;
    PlannerOptions options;
    options.max_evaluations = 3000;
    auto r = planner.Run(cm, options);
    ASSERT_TRUE(r.ok()) << "trial " << trial << ": " << r.status();
    EXPECT_TRUE(ValidatePlan(r->plan, cm).ok()) << "trial " << trial;
    EXPECT_NEAR(cm.IterationTime(r->plan), r->prediction.iteration_time_s,
                1e-12);
    EXPECT_LE(r->plan.used_gpus(), cluster.total_gpus());
  }
}

TEST_F(PlannerTest, ValidationNamesTheBrokenRule) {
  Cluster cluster = MakeCluster(catalog_, {{kFast, 2}, {kSlow, 2}});
  CostModel cm = Build(cluster);
  Plan plan;
  Template t;
  t.stages = {testing::MakeStage(kFast, 1, 0, 2), testing::MakeStage(kSlow, 1, 3, 4)};
  t.total_micro_batches = 8;
  t.placement = {{0, {0}}, {1, {0}}};
  plan.templates = {t};
  absl::Status s = ValidatePlan(plan, cm);
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(s.message(), HasSubstr("templates[0].stages[1].layers: [3, 4) "
                                     "must start at layer 2"));

  plan.templates[0].stages[1].layer_begin = 2;
  plan.templates[0].placement[1] = {0, {0}};  // FAST node for a SLOW stage
  s = ValidatePlan(plan, cm);
  EXPECT_THAT(s.message(), HasSubstr("templates[0].placement[0].stages[1].node: \"n0\" "
                                     "has FAST GPUs but the stage needs SLOW"));

  plan.templates[0].placement[1] = {1, {0}};
  plan.templates[0].stages[0].tp = 2;
  s = ValidatePlan(plan, cm);
  EXPECT_THAT(s.message(), HasSubstr("templates[0].placement[0].stages[0].gpus: 1 GPUs "
                                     "for a TP group of 2"));

  plan.templates[0].stages[0].tp = 1;
  plan.templates[0].total_micro_batches = 7;
  s = ValidatePlan(plan, cm);
  EXPECT_THAT(s.message(), HasSubstr("hold 7 sequences but the global batch is 8"));

  plan.templates[0].total_micro_batches = 8;
  plan.templates.push_back(plan.templates[0]);
  plan.templates[0].total_micro_batches = 4;
  plan.templates[1].total_micro_batches = 4;
  s = ValidatePlan(plan, cm);
  // The path as plan files and docs/api.md write it.
  EXPECT_THAT(s.message(),
              HasSubstr("templates[1].placement[0].stages[0].gpus: GPU 0 of "
                        "node \"n0\" is used twice"));
}

}  // namespace
}  // namespace arachne

namespace arachne {
namespace {

TEST(LayerSplit, GreedySplitMinimisesTheSlowestStageWithinCaps) {
  // Stage 1 carries a fixed 3 time units: it gets one layer, stage 0 four.
  EXPECT_THAT(GreedySplit(5, {1, 1}, {0, 3}, {10, 10}),
              ::testing::ElementsAre(4, 1));
  // A cap of 3 on stage 0 pushes the rest to stage 1.
  EXPECT_THAT(GreedySplit(5, {1, 1}, {0, 3}, {3, 10}),
              ::testing::ElementsAre(3, 2));
  // Caps that cannot hold the model, or more stages than layers: no split.
  EXPECT_TRUE(GreedySplit(5, {1, 1}, {0, 0}, {2, 2}).empty());
  EXPECT_TRUE(GreedySplit(1, {1, 1}, {0, 0}, {2, 2}).empty());
  EXPECT_THAT(EvenSplit(7, 3), ::testing::ElementsAre(3, 2, 2));
}

}  // namespace
}  // namespace arachne
