// Clusters with more GPU types than the state's 4 type slots (issue 35):
// the construction environment groups their types into the type slots by
// the documented rule and loses none (every type is a device slot a stage
// can take), template-search plans 5- and 8-type clusters, the default
// planner is the learned one only where its policy was trained on as many
// types (template-search otherwise), and a cluster with more types than the device slots falls back
// to a baseline search, saying so in one line.
#include <memory>
#include <numeric>
#include <set>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "glog/logging.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "planner_service/core/learned/construction_env.h"
#include "planner_service/core/learned/learned_planner.h"
#include "planner_service/core/cost/plan_validation.h"
#include "planner_service/core/planners.h"
#include "planner_service/io/cluster_io.h"
#include "planner_service/io/gpu_catalog_io.h"
#include "planner_service/io/model_io.h"
#include "planner_service/io/planning_context.h"
#include "test/core/planning_fixtures.h"

namespace arachne {
namespace {

namespace tf = env_type_feature;
namespace sf = env_summary_feature;

using testing::ExampleContext;

PlannerOptions Options() {
  PlannerOptions o;
  // Deterministic: an evaluation count, not a wall-clock budget.
  o.budget = absl::Seconds(600);
  o.max_evaluations = 3000;
  o.seed = 7;
  return o;
}

// Types of the plan's stages.
std::set<int> StageTypes(const Plan& plan) {
  std::set<int> types;
  for (const Template& t : plan.templates)
    for (const Stage& s : t.stages) types.insert(s.gpu_type);
  return types;
}

TEST(ManyGpuTypesTest, FiveTypesAreGroupedTwoOneOneOne) {
  auto ctx = ExampleContext("llama3-8b", "mix5-52.yaml");
  ASSERT_EQ(ctx->cluster().types_present().size(), 5u);
  absl::StatusOr<ConstructionEnv> env = ConstructionEnv::Create(
      ctx->cost_model());
  ASSERT_TRUE(env.ok()) << env.status();
  std::vector<int> groups;
  for (int s = 0; s < 5; ++s) groups.push_back(env->StateSlotOf(s));
  EXPECT_THAT(groups, ::testing::ElementsAre(0, 0, 1, 2, 3));
  EXPECT_EQ(env->SlotType(5), -1);
  EXPECT_EQ(env->StateSlotOf(5), -1);
  // By peak bf16 TFLOPS: H100 (989), L40S (362), A100-80GB (312, 80 GiB),
  // A100-40GB (312, 40 GiB), A6000 (155); the first two share type slot 0.
  const GpuCatalog& catalog = ctx->catalog();
  std::vector<std::string> order;
  for (int s = 0; s < 5; ++s) order.push_back(catalog.type(env->SlotType(s)).id);
  EXPECT_THAT(order, ::testing::ElementsAre("H100-80GB", "L40S", "A100-80GB",
                                            "A100-40GB", "A6000"));

  absl::Span<const float> state = env->State();
  // Shares: 24 of 52 GPUs in type slot 0 (16 H100 + 8 L40S), then 8
  // A100-80GB, 12 A100-40GB, 8 A6000; every type slot present.
  EXPECT_FLOAT_EQ(state[0 * kEnvTypeFeatures + tf::kShare], 24.0f / 52);
  EXPECT_FLOAT_EQ(state[0 * kEnvTypeFeatures + tf::kPresent], 1.0f);
  EXPECT_FLOAT_EQ(state[0 * kEnvTypeFeatures + tf::kRemainingGpus], 1.0f);
  float share_sum = 0;
  for (int g = 0; g < kEnvTypeSlots; ++g) {
    EXPECT_FLOAT_EQ(state[g * kEnvTypeFeatures + tf::kPresent], 1.0f) << g;
    share_sum += state[g * kEnvTypeFeatures + tf::kShare];
  }
  EXPECT_NEAR(share_sum, 1.0f, 1e-6);
  // Memory of type slot 0, weighted by GPUs: (16 x 80 + 8 x 48) / 24 GiB
  // over the largest type present (80 GiB).
  EXPECT_FLOAT_EQ(state[0 * kEnvTypeFeatures + tf::kMemory],
                  (16 * 80.0f + 8 * 48.0f) / 24 / 80);
  // Type slot 1 is A100-80GB on its own, 2 A100-40GB: 80 / 80, 40 / 80.
  EXPECT_FLOAT_EQ(state[1 * kEnvTypeFeatures + tf::kMemory], 1.0f);
  EXPECT_FLOAT_EQ(state[2 * kEnvTypeFeatures + tf::kMemory], 0.5f);
  EXPECT_FLOAT_EQ(state[1 * kEnvTypeFeatures + tf::kShare], 8.0f / 52);
  // The composition summary sees 4 type slots, not 5 / 4.
  absl::Span<const float> summary = env->CompositionSummary();
  EXPECT_FLOAT_EQ(summary[sf::kTypeCount], 1.0f);
  EXPECT_FLOAT_EQ(summary[sf::kTypeShare + 0], 24.0f / 52);
}

TEST(ManyGpuTypesTest, EightTypesGroupInPairsAndEveryTypeTakesAStage) {
  auto ctx = ExampleContext("llama3-8b", "mix8-96.yaml");
  ASSERT_EQ(ctx->cluster().types_present().size(), 8u);
  absl::StatusOr<ConstructionEnv> made =
      ConstructionEnv::Create(ctx->cost_model());
  ASSERT_TRUE(made.ok()) << made.status();
  ConstructionEnv& env = *made;
  std::vector<int> groups;
  for (int s = 0; s < 8; ++s) groups.push_back(env.StateSlotOf(s));
  EXPECT_THAT(groups, ::testing::ElementsAre(0, 0, 1, 1, 2, 2, 3, 3));

  // Depth 1, then each type in turn: its device slot is legal, and the
  // stage the TP step places is on that type (no type is lost to its
  // group). The types whose GPUs hold llama3-8b in one stage plan.
  constexpr int kPlannedAlone = 8;
  int planned = 0;
  for (int s = 0; s < 8; ++s) {
    env.Reset();
    ASSERT_EQ(env.head(), EnvHead::kDepth);
    env.Step(1);
    ASSERT_EQ(env.head(), EnvHead::kDevice);
    ASSERT_EQ(env.DeviceMask()[s], 1) << "device slot " << s;
    // The device row is the type's own: GPUs of the type free / its GPUs.
    EXPECT_FLOAT_EQ(
        env.DeviceCandidates()[s * kEnvDeviceFeatures +
                               env_device_feature::kRemainingGpus],
        1.0f);
    env.Step(s);
    ASSERT_EQ(env.head(), EnvHead::kTp);
    // Pending one-hot at the type's group.
    absl::Span<const float> state = env.State();
    for (int g = 0; g < kEnvTypeSlots; ++g) {
      EXPECT_FLOAT_EQ(
          state[kEnvGlobalOffset + env_global_feature::kPendingType + g],
          g == s / 2 ? 1.0f : 0.0f);
    }
    // The largest TP the type allows, so the one stage holds the model.
    int k = kEnvTpSlots - 1;
    while (env.TpMask()[k] == 0) --k;
    env.Step(k);
    if (!env.plan().templates.empty()) {
      ++planned;
      EXPECT_EQ(StageTypes(env.plan()), std::set<int>{env.SlotType(s)})
          << ctx->catalog().type(env.SlotType(s)).id;
    }
  }
  EXPECT_EQ(planned, kPlannedAlone);
}

TEST(ManyGpuTypesTest, AtMostFourTypesKeepOneTypePerTypeSlot) {
  auto ctx = ExampleContext("llama3-8b", "a100-h100-64.yaml");
  absl::StatusOr<ConstructionEnv> env =
      ConstructionEnv::Create(ctx->cost_model());
  ASSERT_TRUE(env.ok()) << env.status();
  EXPECT_EQ(env->StateSlotOf(0), 0);
  EXPECT_EQ(env->StateSlotOf(1), 1);
  EXPECT_EQ(env->StateSlotOf(2), -1);
  absl::Span<const float> state = env->State();
  EXPECT_FLOAT_EQ(state[0 * kEnvTypeFeatures + tf::kShare], 0.5f);
  EXPECT_FLOAT_EQ(state[2 * kEnvTypeFeatures + tf::kPresent], 0.0f);
  EXPECT_FLOAT_EQ(env->CompositionSummary()[sf::kTypeCount], 0.5f);
}

class ManyGpuTypesPlanTest
    : public ::testing::TestWithParam<const char*> {};

TEST_P(ManyGpuTypesPlanTest, TemplateSearchPlansIt) {
  auto ctx = ExampleContext("llama3-8b", GetParam());
  auto planner = MakePlanner(kTemplateSearchPlannerName);
  ASSERT_TRUE(planner.ok());
  absl::StatusOr<PlanResult> r =
      (*planner)->Run(ctx->cost_model(), Options());
  ASSERT_TRUE(r.ok()) << r.status();
  EXPECT_EQ(r->planner, kTemplateSearchPlannerName);
  EXPECT_TRUE(ValidatePlan(r->plan, ctx->cost_model()).ok());
  EXPECT_GT(r->prediction.throughput_iters_per_s, 0);
  // A heterogeneous plan: stages on more than one type.
  EXPECT_GE(StageTypes(r->plan).size(), 2u);
}

// A trained policy's stand-in: uniform choices, trained (it says) on
// compositions of at most `max_types` GPU types.
class PolicyTrainedOnTypes : public UniformPolicyModel {
 public:
  explicit PolicyTrainedOnTypes(int max_types) : max_types_(max_types) {}
  int MostGpuTypesTrainedOn() const override { return max_types_; }

 private:
  int max_types_;
};

class RegisteredPolicyTrainedOn {
 public:
  explicit RegisteredPolicyTrainedOn(int max_types) {
    RegisterLearnedPolicyFactory(
        [max_types](const CostModel&)
            -> absl::StatusOr<std::unique_ptr<PolicyModel>> {
          return std::unique_ptr<PolicyModel>(
              std::make_unique<PolicyTrainedOnTypes>(max_types));
        });
  }
  ~RegisteredPolicyTrainedOn() { RegisterLearnedPolicyFactory(nullptr); }
};

TEST_P(ManyGpuTypesPlanTest,
       APolicyTrainedOnFewerTypesFallsBackToTemplateSearchNotAnError) {
  // The checkpoints that predate training.max_gpu_types: at most 4.
  RegisteredPolicyTrainedOn policy(4);
  auto ctx = ExampleContext("llama3-8b", GetParam());
  DefaultPlannerChoice choice = ChooseDefaultPlanner(ctx->cost_model());
  EXPECT_EQ(choice.name, kTemplateSearchPlannerName);
  EXPECT_EQ(choice.fallback_reason,
            absl::StrCat("the cluster has ",
                         ctx->cluster().types_present().size(),
                         " GPU types; the learned policy for model "
                         "\"llama3-8b\" was trained on at most 4"));
  absl::StatusOr<PlanResult> r =
      choice.planner->Run(ctx->cost_model(), Options());
  ASSERT_TRUE(r.ok()) << r.status();
  EXPECT_TRUE(ValidatePlan(r->plan, ctx->cost_model()).ok());
}

TEST_P(ManyGpuTypesPlanTest, APolicyTrainedOnAsManyTypesIsTheDefault) {
  auto ctx = ExampleContext("llama3-8b", GetParam());
  const int types = ctx->cluster().types_present().size();
  {
    RegisteredPolicyTrainedOn policy(types);
    DefaultPlannerChoice choice = ChooseDefaultPlanner(ctx->cost_model());
    EXPECT_EQ(choice.name, "learned");
    EXPECT_EQ(choice.fallback_reason, "");
    absl::StatusOr<PlanResult> r =
        choice.planner->Run(ctx->cost_model(), Options());
    ASSERT_TRUE(r.ok()) << r.status();
    EXPECT_EQ(r->planner, "learned");
    EXPECT_TRUE(ValidatePlan(r->plan, ctx->cost_model()).ok());
  }
  {
    // One type short is one too few.
    RegisteredPolicyTrainedOn policy(types - 1);
    EXPECT_EQ(ChooseDefaultPlanner(ctx->cost_model()).name,
              kTemplateSearchPlannerName);
  }
}

INSTANTIATE_TEST_SUITE_P(FiveAndEight, ManyGpuTypesPlanTest,
                         ::testing::Values("mix5-52.yaml", "mix8-96.yaml"));

TEST(ManyGpuTypesTest, MoreTypesThanDeviceSlotsFallBackToABaselineSearch) {
  absl::StatusOr<GpuCatalog> catalog = LoadGpuCatalog();
  ASSERT_TRUE(catalog.ok()) << catalog.status();
  ASSERT_GT(catalog->size(), kEnvDeviceSlots);
  // One 4-GPU node of each of the first 17 catalog types.
  std::string yaml = "inter_node_gbps: 100\nnodes:\n";
  for (int t = 0; t <= kEnvDeviceSlots; ++t) {
    absl::StrAppend(&yaml, "  - {name: n", t, ", gpu: ", catalog->type(t).id,
                    ", gpus: 4}\n");
  }
  absl::StatusOr<Cluster> cluster = ParseCluster(yaml, "17 types", *catalog);
  ASSERT_TRUE(cluster.ok()) << cluster.status();
  absl::StatusOr<ModelSpec> model = ResolveModel("llama3-8b", "");
  ASSERT_TRUE(model.ok()) << model.status();
  auto ctx = PlanningContext::Create(*catalog, *model, TrainingConfig{},
                                     *cluster, "");
  ASSERT_TRUE(ctx.ok()) << ctx.status();
  const CostModel& cm = (*ctx)->cost_model();
  EXPECT_EQ(ConstructionEnv::Create(cm).status().message(),
            "construction env: cluster has 17 GPU types; the device head has "
            "slots for at most 16");
  DefaultPlannerChoice choice = ChooseDefaultPlanner(cm);
  EXPECT_EQ(choice.name, "sailor");
  EXPECT_EQ(DefaultPlannerLine(choice.name, choice.fallback_reason),
            "planner: sailor (the cluster has 17 GPU types; the learned "
            "planner and template-search take at most 16)");
  PlannerOptions o = Options();
  o.max_evaluations = 0;
  o.budget = absl::Seconds(5);
  absl::StatusOr<PlanResult> r = choice.planner->Run(cm, o);
  ASSERT_TRUE(r.ok()) << r.status();
  EXPECT_TRUE(ValidatePlan(r->plan, cm).ok());
}

}  // namespace
}  // namespace arachne
