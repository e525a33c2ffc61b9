// The construction environment: state values on hand-checkable clusters,
// masks, equivalence with auto-fill, rewards, and a property test of random
// legal rollouts over generated compositions with the shipped profiles.
#include "planner_service/core/learned/construction_env.h"

#include <cmath>
#include <memory>
#include <random>
#include <string>
#include <vector>

#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "planner_service/core/planners/auto_fill.h"
#include "planner_service/core/planners/composition_generator.h"
#include "planner_service/core/cost/plan_validation.h"
#include "planner_service/io/gpu_catalog_io.h"
#include "planner_service/io/model_io.h"
#include "planner_service/io/planning_context.h"
#include "planner_service/io/scenario_io.h"
#include "test/core/toy_fixture.h"

namespace arachne {
namespace {

using ::arachne::testing::kFast;
using ::arachne::testing::kSlow;
using ::arachne::testing::MakeCluster;
using ::testing::ElementsAre;
using ::testing::HasSubstr;

namespace tf = env_type_feature;
namespace gf = env_global_feature;

constexpr int kFastSlot = 0;  // FAST has the higher peak TFLOPS
constexpr int kSlowSlot = 1;
constexpr int kTp1 = 0;  // TP head actions
constexpr int kTp2 = 1;

class ConstructionEnvTest : public ::testing::Test {
 protected:
  const CostModel& Build(const Cluster& cluster,
                         const ProfileStore* profiles = nullptr) {
    clusters_.push_back(std::make_unique<Cluster>(cluster));
    auto cm =
        CostModel::Create(catalog_, testing::ToyModel(), testing::ToyTraining(),
                          *clusters_.back(), profiles ? *profiles : profiles_);
    CHECK(cm.ok()) << cm.status();
    models_.push_back(std::make_unique<CostModel>(*std::move(cm)));
    return *models_.back();
  }
  ConstructionEnv Env(const CostModel& cm, ConstructionEnvConfig config = {}) {
    auto env = ConstructionEnv::Create(cm, config);
    CHECK(env.ok()) << env.status();
    return *std::move(env);
  }
  // Profiles whose dense layers on `type` hold 32x the activations: 3.2 GiB
  // per layer and micro-batch, so 4 layers never fit one 10 GiB GPU.
  ProfileStore Oversized(const std::string& type_id) {
    ProfileStore big;
    for (const ProfileEntry* e : profiles_.Entries()) {
      ProfileEntry copy = *e;
      if (copy.key.kind == LayerKind::kDense && copy.key.gpu == type_id)
        copy.activation_bytes *= 32;
      CHECK(big.Add(copy).ok());
    }
    return big;
  }
  std::vector<uint8_t> Mask(absl::Span<const uint8_t> m) {
    return std::vector<uint8_t>(m.begin(), m.end());
  }

  GpuCatalog catalog_ = testing::ToyCatalog();
  ProfileStore profiles_ = testing::ToyProfiles();
  std::vector<std::unique_ptr<Cluster>> clusters_;
  std::vector<std::unique_ptr<CostModel>> models_;
};

TEST_F(ConstructionEnvTest, StateLayoutIsFixed) {
  // 4 slots x 22 + 20 global + 16 depth counts + 13 composition summary +
  // 13 model summary; the per-model policies read the first 137.
  EXPECT_EQ(kEnvStateSize, 150);
  EXPECT_EQ(kEnvGlobalOffset, 88);
  EXPECT_EQ(kEnvDepthCountOffset, 108);
  EXPECT_EQ(kEnvSummaryOffset, 124);
  EXPECT_EQ(kEnvModelSummaryOffset, 137);
  EXPECT_EQ(kEnvUnconditionedStateSize, 137);
  const CostModel& cm = Build(MakeCluster(catalog_, {{kSlow, 4}, {kFast, 4}}));
  ConstructionEnv env = Env(cm);
  EXPECT_EQ(env.State().size(), kEnvStateSize);
  EXPECT_EQ(env.DepthCandidates().size(), kEnvDepthActions * kEnvDepthFeatures);
  EXPECT_EQ(env.DeviceCandidates().size(),
            kEnvDeviceSlots * kEnvDeviceFeatures);
  EXPECT_EQ(env.CompositionSummary().size(), kEnvSummarySize);
  // Slots by peak TFLOPS, whatever the node order.
  EXPECT_EQ(env.SlotType(kFastSlot), kFast);
  EXPECT_EQ(env.SlotType(kSlowSlot), kSlow);
  EXPECT_EQ(env.SlotType(2), -1);
  EXPECT_EQ(env.SlotOfType(kSlow), kSlowSlot);
}

TEST_F(ConstructionEnvTest, ModelSummaryOnAHandCheckedCluster) {
  namespace mf = env_model_feature;
  // FAST 4 + 2 GPUs, SLOW 4: 10 GPUs of 10 GiB, NIC 100 Gb/s.
  const CostModel& cm =
      Build(MakeCluster(catalog_, {{kFast, 4}, {kFast, 2}, {kSlow, 4}}));
  ConstructionEnv env = Env(cm);
  absl::Span<const float> m = env.ModelSummary();
  ASSERT_EQ(m.size(), kEnvModelSummarySize);
  const ModelSpec model = testing::ToyModel();
  EXPECT_FLOAT_EQ(m[mf::kLogLayers], 2.0f / 8);  // 4 layers
  EXPECT_FLOAT_EQ(m[mf::kLogHidden], 10.0f / 14);
  EXPECT_FLOAT_EQ(m[mf::kFfnRatio], 4.0f / 8);
  EXPECT_FLOAT_EQ(m[mf::kKvHeadShare], 1);
  EXPECT_FLOAT_EQ(m[mf::kMoe], 0);
  EXPECT_FLOAT_EQ(m[mf::kLogExperts], 0);
  const double params = static_cast<double>(model.TotalParams());
  const double edge =
      static_cast<double>(model.EmbeddingParams() + model.LmHeadParams());
  EXPECT_FLOAT_EQ(m[mf::kEmbeddingShare], edge / params);
  // 4 layers of 16e6 B + 100 MiB (TP 1; TP 2 halves both) over 0.95 x 10 GiB.
  const double gpus =
      4 * (16e6 + 100.0 * (1 << 20)) / (0.95 * 10 * double{1 << 30});
  EXPECT_FLOAT_EQ(m[mf::kModelGpus], std::log2(1 + gpus) / 10);
  EXPECT_FLOAT_EQ(m[mf::kMemoryPressure], gpus / 10);
  // The least GPU time of a layer is FAST at TP 1, 3 ms; 100 Gb/s is
  // 12.5e9 B/s; the global batch is 8 sequences of 1024 tokens.
  const double layer_params = (params - edge) / 4;
  const double allreduce_s = 2 * layer_params * 2 / 12.5e9;
  EXPECT_FLOAT_EQ(m[mf::kGradientCommRatio],
                  std::log2(1 + allreduce_s / (3e-3 * 8 / 10)) / 8);
  EXPECT_FLOAT_EQ(m[mf::kActivationCommRatio],
                  std::log2(1 + 1024.0 * 1024 * 2 / 12.5e9 / 3e-3) / 8);
  EXPECT_FLOAT_EQ(m[mf::kBatchPerGpu], std::log2(1 + 8.0 / 10) / 10);
  // The state's tail, constant over the episode.
  absl::Span<const float> s = env.State();
  for (int i = 0; i < kEnvModelSummarySize; ++i)
    EXPECT_EQ(s[kEnvModelSummaryOffset + i], m[i]);
  env.Step(1);
  s = env.State();
  for (int i = 0; i < kEnvModelSummaryOffset - kEnvSummaryOffset; ++i)
    EXPECT_EQ(s[kEnvSummaryOffset + i], env.CompositionSummary()[i]);
  for (int i = 0; i < kEnvModelSummarySize; ++i)
    EXPECT_EQ(s[kEnvModelSummaryOffset + i], m[i]);
}

TEST_F(ConstructionEnvTest, ModelSummaryTellsAMixtureOfExpertsApart) {
  namespace mf = env_model_feature;
  GpuCatalog catalog = testing::ToyCatalog();
  ProfileStore profiles = testing::ToyProfiles("toymoe");
  Cluster cluster = MakeCluster(catalog, {{kFast, 4}, {kSlow, 4}});
  auto cm = CostModel::Create(catalog, testing::ToyMoeModel(),
                              testing::ToyTraining(), cluster, profiles);
  ASSERT_TRUE(cm.ok()) << cm.status();
  auto env = ConstructionEnv::Create(*cm, {});
  ASSERT_TRUE(env.ok()) << env.status();
  absl::Span<const float> m = env->ModelSummary();
  EXPECT_FLOAT_EQ(m[mf::kMoe], 1);
  EXPECT_FLOAT_EQ(m[mf::kLogExperts], std::log2(9.0) / 9);  // 8 experts
  EXPECT_FLOAT_EQ(m[mf::kActiveExperts], 2.0f / 8);         // top-2
  EXPECT_GT(m[mf::kModelGpus], 0);
}

TEST_F(ConstructionEnvTest, StateValuesOnAHandCheckedCluster) {
  // FAST: a 4-GPU and a 2-GPU node; SLOW: one 4-GPU node. 10 GPUs.
  const CostModel& cm =
      Build(MakeCluster(catalog_, {{kFast, 4}, {kFast, 2}, {kSlow, 4}}));
  ConstructionEnv env = Env(cm);
  absl::Span<const float> s = env.State();
  const float* fast = &s[kFastSlot * kEnvTypeFeatures];
  const float* slow = &s[kSlowSlot * kEnvTypeFeatures];
  EXPECT_FLOAT_EQ(fast[tf::kPresent], 1);
  EXPECT_FLOAT_EQ(fast[tf::kShare], 0.6f);
  EXPECT_FLOAT_EQ(slow[tf::kShare], 0.4f);
  EXPECT_FLOAT_EQ(fast[tf::kPeakTflops], 1);
  EXPECT_FLOAT_EQ(slow[tf::kPeakTflops], 0.5f);
  EXPECT_FLOAT_EQ(slow[tf::kMemory], 1);
  // Block times at micro-batch 1 (compute + TP comm): FAST 3 ms at TP 1,
  // 1.5 + 0.5 = 2 ms at TP 2; SLOW 6 and 3 + 0.5 = 3.5 ms. The reference is
  // the least GPU time, FAST at TP 1 (3 ms).
  EXPECT_FLOAT_EQ(fast[tf::kRelativeSpeed + 0], 1);
  EXPECT_FLOAT_EQ(fast[tf::kRelativeSpeed + 1], 1.5f);
  EXPECT_FLOAT_EQ(fast[tf::kEffectiveSpeed + 1], 0.75f);
  EXPECT_FLOAT_EQ(slow[tf::kRelativeSpeed + 0], 0.5f);
  EXPECT_FLOAT_EQ(slow[tf::kRelativeSpeed + 1], 3.0f / 3.5f);
  EXPECT_FLOAT_EQ(slow[tf::kEffectiveSpeed + 1], 3.0f / 7.0f);
  // TP 4 and 8 have no profile: zero.
  EXPECT_FLOAT_EQ(fast[tf::kRelativeSpeed + 2], 0);
  EXPECT_FLOAT_EQ(fast[tf::kLayerMemory + 2], 0);
  // Layer memory: 1e6 / tp parameters x 16 B + 100 MiB / tp of activations
  // over 0.95 x 10 GiB.
  const double usable = 0.95 * 10 * (1 << 30);
  EXPECT_FLOAT_EQ(fast[tf::kLayerMemory + 0],
                  (16e6 + 100.0 * (1 << 20)) / usable);
  EXPECT_FLOAT_EQ(fast[tf::kLayerMemory + 1],
                  (8e6 + 50.0 * (1 << 20)) / usable);
  // Nothing used yet; FAST nodes in buckets 4 and 2.
  EXPECT_FLOAT_EQ(fast[tf::kRemainingGpus], 1);
  EXPECT_FLOAT_EQ(fast[tf::kRemainingNodes], 1);
  EXPECT_THAT(
      std::vector<float>(fast + tf::kNodesOfSize, fast + tf::kNodesOfSize + 4),
      ElementsAre(0, 0.5f, 0.5f, 0));
  const float* g = &s[kEnvGlobalOffset];
  EXPECT_FLOAT_EQ(g[gf::kLogScale], std::log2(10.0) / 12);
  EXPECT_FLOAT_EQ(g[gf::kHeadDepth], 1);
  EXPECT_FLOAT_EQ(g[gf::kStageCapacity], 1);  // 10 stages at TP 1
  // GPU count over depth: log2(1 + floor(10 / d)) / log2(11).
  EXPECT_FLOAT_EQ(s[kEnvDepthCountOffset + 0], 1);
  EXPECT_FLOAT_EQ(s[kEnvDepthCountOffset + 2],
                  std::log2(4.0) / std::log2(11.0));
  absl::Span<const float> summary = env.CompositionSummary();
  EXPECT_FLOAT_EQ(summary[env_summary_feature::kTypeShare + kFastSlot], 0.6f);
  EXPECT_FLOAT_EQ(summary[env_summary_feature::kTypeCount], 0.5f);
  EXPECT_FLOAT_EQ(summary[env_summary_feature::kShareSpread], 0.2f);
  // GPUs in 4-GPU nodes 8/10, in 2-GPU nodes 2/10; NIC 100 / 400.
  EXPECT_FLOAT_EQ(summary[env_summary_feature::kNodeSizeMix + 2], 0.8f);
  EXPECT_FLOAT_EQ(summary[env_summary_feature::kNodeSizeMix + 1], 0.2f);
  EXPECT_FLOAT_EQ(summary[env_summary_feature::kNicGbps], 0.25f);
  for (int i = 0; i < kEnvSummarySize; ++i)
    EXPECT_EQ(s[kEnvSummaryOffset + i], summary[i]);

  // One template: depth 1 on SLOW at TP 1 packs 4 replicas on the SLOW node.
  env.Step(1);
  env.Step(kSlowSlot);
  StepOutcome out = env.Step(kTp1);
  EXPECT_TRUE(out.template_completed);
  EXPECT_FALSE(out.done);
  ASSERT_EQ(env.plan().templates.size(), 1u);
  EXPECT_EQ(env.plan().templates[0].replicas, 4);
  s = env.State();
  fast = &s[kFastSlot * kEnvTypeFeatures];
  slow = &s[kSlowSlot * kEnvTypeFeatures];
  EXPECT_FLOAT_EQ(slow[tf::kRemainingGpus], 0);
  EXPECT_FLOAT_EQ(slow[tf::kRemainingNodes], 0);
  EXPECT_FLOAT_EQ(fast[tf::kRemainingGpus], 1);
  g = &s[kEnvGlobalOffset];
  EXPECT_FLOAT_EQ(g[gf::kRemainingGpus], 0.6f);
  EXPECT_FLOAT_EQ(g[gf::kTemplateProgress], 1.0f / 3);
  EXPECT_FLOAT_EQ(g[gf::kStageCapacity], 0.6f);
  EXPECT_FLOAT_EQ(g[gf::kThroughput],
                  static_cast<float>(env.normalized_throughput()));
  EXPECT_FLOAT_EQ(s[kEnvDepthCountOffset + 1],
                  std::log2(4.0) / std::log2(11.0));
  // Masks: STOP now legal, depths up to the model's 4 layers; SLOW has no
  // GPU left.
  EXPECT_THAT(Mask(env.LegalMask()),
              ElementsAre(1, 1, 1, 1, 1, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0));
  env.Step(2);
  EXPECT_EQ(env.head(), EnvHead::kDevice);
  EXPECT_THAT(Mask(env.DeviceMask()),
              ElementsAre(1, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0));
  s = env.State();
  EXPECT_FLOAT_EQ(s[kEnvGlobalOffset + gf::kHeadDevice], 1);
  EXPECT_FLOAT_EQ(s[kEnvGlobalOffset + gf::kDepth], 2.0f / 16);
  EXPECT_FLOAT_EQ(s[kEnvGlobalOffset + gf::kStagesLeft], 2.0f / 16);
  env.Step(kFastSlot);
  s = env.State();
  EXPECT_FLOAT_EQ(s[kEnvGlobalOffset + gf::kHeadTp], 1);
  EXPECT_FLOAT_EQ(s[kEnvGlobalOffset + gf::kPendingType + kFastSlot], 1);
  env.Step(kTp2);
  // The first stage's TP group went to the 2-GPU node (exact fit): FAST has
  // 4 of 6 GPUs free, in one node (bucket 4), and the state says so.
  s = env.State();
  fast = &s[kFastSlot * kEnvTypeFeatures];
  EXPECT_FLOAT_EQ(fast[tf::kRemainingGpus], 4.0f / 6);
  EXPECT_FLOAT_EQ(fast[tf::kRemainingNodes], 0.5f);
  EXPECT_THAT(
      std::vector<float>(fast + tf::kNodesOfSize, fast + tf::kNodesOfSize + 4),
      ElementsAre(0, 0, 0.5f, 0));
  EXPECT_FLOAT_EQ(s[kEnvGlobalOffset + gf::kPreviousType + kFastSlot], 1);
  EXPECT_FLOAT_EQ(s[kEnvGlobalOffset + gf::kPreviousTp], 1.0f / 3);
  EXPECT_FLOAT_EQ(s[kEnvGlobalOffset + gf::kStage], 1.0f / 16);
}

TEST_F(ConstructionEnvTest, DepthMaskFollowsTheFreeGpus) {
  // 3 GPUs: depths 1-3 legal, 4 (the model's layers) is not; STOP is masked
  // before the first template (an empty plan is no plan).
  const CostModel& cm = Build(MakeCluster(catalog_, {{kFast, 2}, {kSlow, 1}}));
  ConstructionEnv env = Env(cm);
  EXPECT_EQ(env.head(), EnvHead::kDepth);
  EXPECT_THAT(Mask(env.DepthMask()),
              ElementsAre(0, 1, 1, 1, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0));
  EXPECT_EQ(env.FeasibleDepthCount(), 3);
  EXPECT_EQ(env.FeasibleDepth(0), 1);
  EXPECT_EQ(env.FeasibleDepth(2), 3);
  // Forced depths are drawn among the legal ones, never STOP.
  std::seed_seq seq{5};
  std::mt19937_64 rng(seq);
  std::vector<int> seen(kEnvDepthActions, 0);
  for (int i = 0; i < 300; ++i) ++seen[env.UniformFeasibleDepth(rng)];
  EXPECT_EQ(seen[0], 0);
  EXPECT_GT(seen[1], 0);
  EXPECT_GT(seen[2], 0);
  EXPECT_GT(seen[3], 0);
  EXPECT_EQ(seen[1] + seen[2] + seen[3], 300);
  // Dmax in the config caps it too.
  ConstructionEnv shallow = Env(cm, {.max_depth = 2});
  EXPECT_EQ(shallow.FeasibleDepthCount(), 2);
  EXPECT_EQ(shallow.depth_limit(), 2);
  // The depth candidates carry the mask.
  absl::Span<const float> rows = env.DepthCandidates();
  EXPECT_FLOAT_EQ(rows[0 * kEnvDepthFeatures + env_depth_feature::kIsStop], 1);
  EXPECT_FLOAT_EQ(rows[3 * kEnvDepthFeatures + env_depth_feature::kLegal], 1);
  EXPECT_FLOAT_EQ(rows[4 * kEnvDepthFeatures + env_depth_feature::kLegal], 0);
  EXPECT_FLOAT_EQ(
      rows[2 * kEnvDepthFeatures + env_depth_feature::kLayersPerStage], 0.5f);
}

TEST_F(ConstructionEnvTest, TpMaskStopsAtTheLargestFreeNodeBlock) {
  // FAST in one 2-GPU node, SLOW in 1-GPU nodes: SLOW never gets TP 2 (no
  // node holds 2); after a FAST TP-1 stage, FAST has a 1-GPU block left.
  const CostModel& cm =
      Build(MakeCluster(catalog_, {{kFast, 2}, {kSlow, 1}, {kSlow, 1}}));
  ConstructionEnv env = Env(cm);
  env.Step(2);
  env.Step(kSlowSlot);
  EXPECT_THAT(Mask(env.TpMask()), ElementsAre(1, 0, 0, 0));
  env.Step(kTp1);
  env.Step(kFastSlot);
  EXPECT_THAT(Mask(env.TpMask()), ElementsAre(1, 1, 0, 0));
  env.Reset();
  env.Step(2);
  env.Step(kFastSlot);
  env.Step(kTp1);
  env.Step(kFastSlot);
  EXPECT_THAT(Mask(env.TpMask()), ElementsAre(1, 0, 0, 0));
}

TEST_F(ConstructionEnvTest, TpMaskLeavesRoomForTheStagesStillToChoose) {
  // Only FAST, one 2-GPU node: depth 2 needs both GPUs, so the first stage
  // cannot take TP 2.
  const CostModel& cm = Build(MakeCluster(catalog_, {{kFast, 2}}));
  ConstructionEnv env = Env(cm);
  env.Step(2);
  EXPECT_THAT(Mask(env.DeviceMask()),
              ElementsAre(1, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0));
  env.Step(kFastSlot);
  EXPECT_THAT(Mask(env.TpMask()), ElementsAre(1, 0, 0, 0));
}

TEST_F(ConstructionEnvTest, MasksFollowThePlacementAutoFillMakes) {
  // FAST nodes of 4 and 1 GPUs. Stage 1 at TP 2 goes to the 4-GPU node
  // (no exact fit); stage 2 at TP 1 stays on that node (the replica's
  // previous node has room), leaving 1 + 1 free GPUs on two nodes: a third
  // stage cannot take TP 2 although 2 GPUs are free.
  const CostModel& cm = Build(MakeCluster(catalog_, {{kFast, 4}, {kFast, 1}}));
  ConstructionEnv env = Env(cm);
  env.Step(3);
  env.Step(kFastSlot);
  env.Step(kTp2);
  env.Step(kFastSlot);
  env.Step(kTp1);
  env.Step(kFastSlot);
  EXPECT_THAT(Mask(env.TpMask()), ElementsAre(1, 0, 0, 0));
  // NodePool::PlaceReplica makes the same placement.
  NodePool pool(cm.cluster());
  std::vector<StagePlacement> placement;
  std::vector<Stage> stages(2);
  stages[0].gpu_type = kFast;
  stages[0].tp = 2;
  stages[1].gpu_type = kFast;
  stages[1].tp = 1;
  ASSERT_TRUE(pool.PlaceReplica(stages, &placement));
  EXPECT_EQ(placement[0].node, 0);
  EXPECT_EQ(placement[1].node, 0);
  EXPECT_EQ(pool.LargestFreeOfType(kFast), 1);
}

// The masks are exact: a structure is admitted by the depth, device and TP
// masks if and only if NodePool places a replica of it (what auto-fill needs
// first), over every structure of depth <= 4 on a cluster with uneven nodes.
TEST_F(ConstructionEnvTest, MasksAdmitExactlyThePlaceableStructures) {
  const CostModel& cm = Build(MakeCluster(
      catalog_, {{kFast, 4}, {kFast, 1}, {kSlow, 2}, {kSlow, 1}, {kSlow, 1}}));
  const ConstructionEnv fresh = Env(cm);
  const std::vector<StageChoice> choices = {
      {kFast, 1}, {kFast, 2}, {kSlow, 1}, {kSlow, 2}};
  int admitted = 0, rejected = 0;
  for (int depth = 1; depth <= 4; ++depth) {
    int total = 1;
    for (int i = 0; i < depth; ++i) total *= 4;
    for (int code = 0; code < total; ++code) {
      std::vector<Stage> stages(depth);
      int x = code;
      for (int i = 0; i < depth; ++i, x /= 4) {
        stages[i].gpu_type = choices[x % 4].gpu_type;
        stages[i].tp = choices[x % 4].tp;
      }
      NodePool pool(cm.cluster());
      std::vector<StagePlacement> placement;
      const bool placeable = pool.PlaceReplica(stages, &placement);
      ConstructionEnv env = fresh;
      bool legal = env.DepthMask()[depth] == 1;
      if (legal) env.Step(depth);
      for (int i = 0; i < depth && legal; ++i) {
        const int slot = env.SlotOfType(stages[i].gpu_type);
        legal = env.DeviceMask()[slot] == 1;
        if (!legal) break;
        env.Step(slot);
        const int k = Log2Exact(stages[i].tp);
        legal = env.TpMask()[k] == 1;
        if (legal) env.Step(k);
      }
      EXPECT_EQ(legal, placeable) << "depth " << depth << " code " << code;
      admitted += legal;
      rejected += !legal;
    }
  }
  EXPECT_GT(admitted, 0);
  EXPECT_GT(rejected, 0);
}

TEST_F(ConstructionEnvTest, EpisodeMatchesAutoFillDirectly) {
  const Cluster cluster =
      MakeCluster(catalog_, {{kFast, 4}, {kFast, 2}, {kSlow, 4}});
  const CostModel& cm = Build(cluster);
  ConstructionEnv env = Env(cm);
  // Template 1: [FAST/2, SLOW/1]; template 2: [SLOW/1].
  env.Step(2);
  env.Step(kFastSlot);
  env.Step(kTp2);
  env.Step(kSlowSlot);
  const StepOutcome first = env.Step(kTp1);
  EXPECT_THAT(env.structure(), ::testing::IsEmpty());
  const std::vector<StageChoice> s1 = {{kFast, 2}, {kSlow, 1}};
  const std::vector<StageChoice> s2 = {{kSlow, 1}};
  AutoFill fill(cm);
  auto a = fill.Extend(Plan{}, NodePool(cm.cluster()), s1);
  ASSERT_TRUE(a.ok()) << a.status();
  EXPECT_EQ(env.iteration_time_s(), a->iteration_time_s);
  EXPECT_EQ(first.reward,
            (1 / a->iteration_time_s) / env.reference_throughput());
  env.Step(1);
  env.Step(kSlowSlot);
  const StepOutcome second = env.Step(kTp1);
  auto b = fill.Extend(a->plan, a->pool, s2);
  ASSERT_TRUE(b.ok()) << b.status();
  EXPECT_EQ(env.iteration_time_s(), b->iteration_time_s);
  EXPECT_EQ(second.reward, (1 / b->iteration_time_s - 1 / a->iteration_time_s) /
                               env.reference_throughput());
  ASSERT_EQ(env.plan().templates.size(), 2u);
  for (int t = 0; t < 2; ++t) {
    const Template& x = env.plan().templates[t];
    const Template& y = b->plan.templates[t];
    EXPECT_EQ(x.replicas, y.replicas);
    EXPECT_EQ(x.micro_batch_size, y.micro_batch_size);
    EXPECT_EQ(x.total_micro_batches, y.total_micro_batches);
    ASSERT_EQ(x.depth(), y.depth());
    for (int st = 0; st < x.depth(); ++st) {
      EXPECT_EQ(x.stages[st].gpu_type, y.stages[st].gpu_type);
      EXPECT_EQ(x.stages[st].tp, y.stages[st].tp);
      EXPECT_EQ(x.stages[st].layer_begin, y.stages[st].layer_begin);
      EXPECT_EQ(x.stages[st].layer_end, y.stages[st].layer_end);
    }
    ASSERT_EQ(x.placement.size(), y.placement.size());
    for (size_t p = 0; p < x.placement.size(); ++p) {
      EXPECT_EQ(x.placement[p].node, y.placement[p].node);
      EXPECT_EQ(x.placement[p].gpus, y.placement[p].gpus);
    }
  }
  EXPECT_TRUE(ValidatePlan(env.plan(), cm).ok());
  EXPECT_DOUBLE_EQ(env.episode_return(), env.normalized_throughput());
  EXPECT_GT(env.evaluations(), 0);
  // The reference is a bound: 6 FAST at 3 ms and 4 SLOW at 6 ms of GPU time
  // per block and sequence, 4 blocks, batch 8.
  EXPECT_DOUBLE_EQ(env.reference_throughput(), (6 / 12e-3 + 4 / 24e-3) / 8);
  EXPECT_LE(env.normalized_throughput(), 1);
  // The second template took the last GPU.
  EXPECT_TRUE(second.done);
  EXPECT_EQ(env.episode_end(), EpisodeEnd::kNoStageLeft);
}

TEST_F(ConstructionEnvTest, InfeasibleFirstTemplateIsPenalisedAndEnds) {
  const ProfileStore big = Oversized("FAST");
  const CostModel& cm = Build(MakeCluster(catalog_, {{kFast, 1}}), &big);
  ConstructionEnv env = Env(cm, {.infeasible_penalty = 0.75});
  env.Step(1);
  env.Step(kFastSlot);
  const StepOutcome out = env.Step(kTp1);
  EXPECT_TRUE(out.done);
  EXPECT_TRUE(out.template_completed);
  EXPECT_EQ(out.reward, -0.75);
  EXPECT_EQ(env.episode_end(), EpisodeEnd::kInfeasibleFirstTemplate);
  EXPECT_TRUE(env.plan().templates.empty());
  EXPECT_EQ(env.throughput_iters_per_s(), 0);
  EXPECT_TRUE(env.LegalMask().empty());
  // Reset starts over.
  env.Reset();
  EXPECT_EQ(env.head(), EnvHead::kDepth);
  EXPECT_EQ(env.episode_return(), 0);
}

TEST_F(ConstructionEnvTest, InfeasibleLaterTemplateEndsWithoutPenalty) {
  const ProfileStore big = Oversized("SLOW");
  const CostModel& cm =
      Build(MakeCluster(catalog_, {{kFast, 1}, {kSlow, 1}}), &big);
  ConstructionEnv env = Env(cm);
  env.Step(1);
  env.Step(kFastSlot);
  const StepOutcome first = env.Step(kTp1);
  EXPECT_GT(first.reward, 0);
  const double kept = env.iteration_time_s();
  env.Step(1);
  env.Step(kSlowSlot);
  const StepOutcome second = env.Step(kTp1);
  EXPECT_TRUE(second.done);
  EXPECT_EQ(second.reward, 0);
  EXPECT_EQ(env.episode_end(), EpisodeEnd::kInfeasibleLaterTemplate);
  EXPECT_EQ(env.plan().templates.size(), 1u);
  EXPECT_EQ(env.iteration_time_s(), kept);
  EXPECT_TRUE(ValidatePlan(env.plan(), cm).ok());
}

TEST_F(ConstructionEnvTest, EndsWhenNoGpuIsLeftOrAtMaxTemplates) {
  const CostModel& cm = Build(MakeCluster(catalog_, {{kFast, 2}, {kSlow, 1}}));
  ConstructionEnv env = Env(cm);
  env.Step(1);
  env.Step(kSlowSlot);
  env.Step(kTp1);
  env.Step(1);
  env.Step(kFastSlot);
  const StepOutcome out = env.Step(kTp1);  // 2 replicas take both FAST GPUs
  EXPECT_TRUE(out.done);
  EXPECT_EQ(env.episode_end(), EpisodeEnd::kNoStageLeft);
  // STOP ends an episode and keeps the plan.
  ConstructionEnv stopped = Env(cm);
  stopped.Step(1);
  stopped.Step(kSlowSlot);
  stopped.Step(kTp1);
  const double kept = stopped.iteration_time_s();
  const StepOutcome stop = stopped.Step(0);
  EXPECT_TRUE(stop.done);
  EXPECT_FALSE(stop.template_completed);
  EXPECT_EQ(stop.reward, 0);
  EXPECT_EQ(stopped.episode_end(), EpisodeEnd::kStop);
  EXPECT_EQ(stopped.plan().templates.size(), 1u);
  EXPECT_EQ(stopped.iteration_time_s(), kept);
  ConstructionEnv one = Env(cm, {.max_templates = 1});
  one.Step(1);
  one.Step(kSlowSlot);
  EXPECT_TRUE(one.Step(kTp1).done);
  EXPECT_EQ(one.episode_end(), EpisodeEnd::kMaxTemplates);
}

TEST_F(ConstructionEnvTest, CreateRejectsBadConfigs) {
  const CostModel& cm = Build(MakeCluster(catalog_, {{kFast, 2}}));
  auto a = ConstructionEnv::Create(cm, {.max_depth = 17});
  EXPECT_EQ(a.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(a.status().message(),
              HasSubstr("max_depth must be in [1, 16], got 17"));
  auto b = ConstructionEnv::Create(cm, {.max_templates = 0});
  EXPECT_THAT(b.status().message(),
              HasSubstr("max_templates must be >= 1, got 0"));
  auto c = ConstructionEnv::Create(cm, {.infeasible_penalty = -1});
  EXPECT_THAT(c.status().message(),
              HasSubstr("infeasible_penalty must be >= 0, got -1"));
  // No profile for this model at all: no template can exist.
  ProfileStore none;
  const CostModel& bare = Build(MakeCluster(catalog_, {{kFast, 2}}), &none);
  auto d = ConstructionEnv::Create(bare);
  EXPECT_EQ(d.status().code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_THAT(d.status().message(), HasSubstr("no GPU type of the cluster"));
}

TEST_F(ConstructionEnvTest, UniformRolloutsAreDeterministicForASeed) {
  const CostModel& cm = Build(
      MakeCluster(catalog_, {{kFast, 4}, {kFast, 2}, {kSlow, 4}, {kSlow, 1}}));
  ConstructionEnv env = Env(cm);
  std::vector<double> first, second;
  for (std::vector<double>* out : {&first, &second}) {
    std::seed_seq seq{7};
    std::mt19937_64 rng(seq);
    for (int i = 0; i < 50; ++i) {
      env.Reset();
      out->push_back(env.RunUniformEpisode(rng));
      out->push_back(env.iteration_time_s());
    }
  }
  EXPECT_EQ(first, second);
}

// The fill cache answers exactly what auto-fill would: the same rewards and
// plans with and without it, over random episodes (small capacity, so it is
// also emptied and refilled on the way).
TEST_F(ConstructionEnvTest, FillCacheChangesNothingButTheWork) {
  const CostModel& cm = Build(
      MakeCluster(catalog_, {{kFast, 4}, {kFast, 2}, {kSlow, 4}, {kSlow, 1}}));
  // Depth <= 2: few enough structures that templates repeat.
  ConstructionEnv cached = Env(cm, {.max_depth = 2, .fill_cache_entries = 64});
  ConstructionEnv plain = Env(cm, {.max_depth = 2, .fill_cache_entries = 0});
  std::seed_seq seq_a{3}, seq_b{3};
  std::mt19937_64 rng_a(seq_a), rng_b(seq_b);
  for (int episode = 0; episode < 300; ++episode) {
    cached.Reset();
    plain.Reset();
    while (!plain.done()) {
      ASSERT_FALSE(cached.done());
      const StepOutcome a = cached.Step(cached.UniformLegalAction(rng_a));
      const StepOutcome b = plain.Step(plain.UniformLegalAction(rng_b));
      ASSERT_EQ(a.reward, b.reward);
      ASSERT_EQ(a.done, b.done);
    }
    ASSERT_TRUE(cached.done());
    ASSERT_EQ(cached.iteration_time_s(), plain.iteration_time_s());
    ASSERT_EQ(cached.plan().templates.size(), plain.plan().templates.size());
    for (size_t t = 0; t < plain.plan().templates.size(); ++t) {
      const Template& x = cached.plan().templates[t];
      const Template& y = plain.plan().templates[t];
      ASSERT_EQ(x.replicas, y.replicas);
      ASSERT_EQ(x.total_micro_batches, y.total_micro_batches);
      ASSERT_EQ(x.placement.size(), y.placement.size());
      for (size_t p = 0; p < x.placement.size(); ++p)
        ASSERT_EQ(x.placement[p].gpus, y.placement[p].gpus);
    }
  }
  EXPECT_EQ(cached.fills(), plain.fills());
  EXPECT_GT(cached.fill_cache_hits(), cached.fills() / 4);
  EXPECT_LT(cached.fill_cache_hits(), cached.fills());  // emptied on the way
  EXPECT_EQ(plain.fill_cache_hits(), 0);
  EXPECT_LT(cached.evaluations(), plain.evaluations());
  auto bad = ConstructionEnv::Create(cm, {.fill_cache_entries = -1});
  EXPECT_THAT(bad.status().message(),
              HasSubstr("fill_cache_entries must be >= 0, got -1"));
}

// Random legal rollouts on generated compositions with the shipped catalog,
// models and synthesized profiles: no crash, every acting head has a legal
// action, the state stays finite, and every episode ends with a plan that
// passes ValidatePlan or with an empty plan and the penalty.
TEST(ConstructionEnvProperty, RandomLegalRolloutsEndInValidPlans) {
  auto catalog = LoadGpuCatalog();
  ASSERT_TRUE(catalog.ok()) << catalog.status();
  auto models = LoadModelCatalog();
  ASSERT_TRUE(models.ok()) << models.status();
  std::vector<int> types;
  for (const char* id : {"A100-40GB", "A100-80GB", "H100-80GB", "A6000"}) {
    auto t = catalog->IndexOf(id);
    ASSERT_TRUE(t.ok()) << t.status();
    types.push_back(*t);
  }
  auto gen = CompositionGenerator::Create(*catalog, {.gpu_types = types}, {});
  ASSERT_TRUE(gen.ok()) << gen.status();
  auto clusters = gen->Generate(32, /*seed=*/3);
  ASSERT_TRUE(clusters.ok()) << clusters.status();
  int plans = 0, penalties = 0, later_infeasible = 0;
  // Dense and MoE models; Qwen3-32B with full recomputation and the
  // distributed optimizer (other memory formulas), GPT-Neo with a small
  // batch (batch splits that fail).
  struct Case {
    const char* model;
    TrainingConfig training;
  };
  const std::vector<Case> cases = {
      {"llama3-8b", {}},
      {"qwen3-32b", {}},
      {"qwen3-32b",
       {.recompute = Recompute::kFull, .distributed_optimizer = true}},
      {"mixtral-8x7b", {}},
      {"qwen3-30b-a3b", {}},
      {"gpt-neo-2.7b", {.global_batch = 128}},
      {"deepseek-v3", {.recompute = Recompute::kFull}},
  };
  for (const Case& k : cases) {
    const char* name = k.model;
    const ModelSpec* model = nullptr;
    for (const ModelSpec& m : *models)
      if (m.name == name) model = &m;
    ASSERT_NE(model, nullptr) << name;
    for (size_t c = 0; c < clusters->size(); ++c) {
      auto ctx = PlanningContext::Create(*catalog, *model, k.training,
                                         (*clusters)[c], "");
      ASSERT_TRUE(ctx.ok()) << ctx.status();
      const CostModel& cm = (*ctx)->cost_model();
      auto env = ConstructionEnv::Create(cm, {.infeasible_penalty = 0.5});
      ASSERT_TRUE(env.ok()) << env.status();
      std::seed_seq seq{static_cast<unsigned>(c), 11u};
      std::mt19937_64 rng(seq);
      for (int episode = 0; episode < 15; ++episode) {
        env->Reset();
        double total = 0;
        while (!env->done()) {
          absl::Span<const uint8_t> mask = env->LegalMask();
          int legal = 0;
          for (uint8_t m : mask) legal += m;
          ASSERT_GT(legal, 0) << name << " composition " << c;
          for (float x : env->State()) ASSERT_TRUE(std::isfinite(x));
          for (float x : env->DepthCandidates()) ASSERT_TRUE(std::isfinite(x));
          for (float x : env->DeviceCandidates()) ASSERT_TRUE(std::isfinite(x));
          total += env->Step(env->UniformLegalAction(rng)).reward;
        }
        EXPECT_DOUBLE_EQ(total, env->episode_return());
        if (env->plan().templates.empty()) {
          ASSERT_EQ(env->episode_end(), EpisodeEnd::kInfeasibleFirstTemplate);
          EXPECT_EQ(total, -0.5);
          ++penalties;
          continue;
        }
        ++plans;
        later_infeasible +=
            env->episode_end() == EpisodeEnd::kInfeasibleLaterTemplate;
        absl::Status valid = ValidatePlan(env->plan(), cm);
        ASSERT_TRUE(valid.ok())
            << name << " composition " << c << ": " << valid;
        EXPECT_NEAR(total, env->normalized_throughput(), 1e-9);
        // One block kind (no dense-first layers): the reference bounds it.
        if (model->moe.dense_first_layers == 0) {
          EXPECT_LE(env->normalized_throughput(), 1.0) << name << " " << c;
        }
      }
    }
  }
  // The sample covers both endings.
  EXPECT_GT(plans, 0);
  EXPECT_GT(penalties, 0);
  RecordProperty("plans", plans);
  RecordProperty("penalties", penalties);
  RecordProperty("later_infeasible", later_infeasible);
}

// Every composition of the evaluation suite (1-, 3- and 4-GPU nodes, up to
// four types, dense and MoE models) builds an environment and random
// rollouts on it end in valid plans: the suite the policy will be judged on
// fits the state and the masks.
TEST(ConstructionEnvProperty, EveryBenchCompositionRuns) {
  auto catalog = LoadGpuCatalog();
  ASSERT_TRUE(catalog.ok()) << catalog.status();
  auto suite = LoadScenarioSuite(
      std::string(ARACHNE_SOURCE_DIR) + "/bench/scenarios", {}, *catalog);
  ASSERT_TRUE(suite.ok()) << suite.status();
  int compositions = 0, plans = 0;
  for (const Scenario& scenario : *suite) {
    for (const Composition& composition : scenario.compositions) {
      auto ctx =
          PlanningContext::Create(*catalog, scenario.model_spec,
                                  scenario.training, composition.cluster, "");
      ASSERT_TRUE(ctx.ok()) << ctx.status();
      const CostModel& cm = (*ctx)->cost_model();
      auto env = ConstructionEnv::Create(cm);
      ASSERT_TRUE(env.ok())
          << scenario.name << " " << composition.label << ": " << env.status();
      ++compositions;
      std::seed_seq seq{compositions};
      std::mt19937_64 rng(seq);
      for (int episode = 0; episode < 5; ++episode) {
        env->Reset();
        env->RunUniformEpisode(rng);
        if (env->plan().templates.empty()) continue;
        ++plans;
        absl::Status valid = ValidatePlan(env->plan(), cm);
        ASSERT_TRUE(valid.ok())
            << scenario.name << " " << composition.label << ": " << valid;
      }
    }
  }
  EXPECT_GT(compositions, 40);
  EXPECT_GT(plans, 0);
}

}  // namespace
}  // namespace arachne
