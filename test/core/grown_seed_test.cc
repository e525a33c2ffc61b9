// The learned planner's grown seed (LearnedPlannerConfig::grown_seed):
// after the greedy rollout, one plan grown a template at a time from each
// type's fastest type-pure templates and a template of one stage per type
// with free nodes left. On the paper's 512-GPU cluster Mixtral-8x7B's best
// plan is type-pure (bench/moe-scale); on eight GPU types the seed's mixed
// template keeps the search from a plan of the three fastest types alone.
// Both are reached within budgets the search without the seed does not.
#include <fstream>
#include <memory>
#include <set>
#include <string>

#include "absl/strings/str_cat.h"
#include "absl/time/time.h"
#include "glog/logging.h"
#include "gtest/gtest.h"
#include "planner_service/core/cost/plan_validation.h"
#include "planner_service/core/learned/learned_planner.h"
#include "planner_service/io/planning_context.h"
#include "test/core/planning_fixtures.h"

namespace arachne {
namespace {

using testing::ExampleContext;

PlanResult SearchWith(const CostModel& cm, bool seed, int64_t evaluations) {
  LearnedPlannerConfig config;
  config.grown_seed = seed;
  LearnedPlanner planner(config, UniformPolicyFactory(), "template-search");
  PlannerOptions options;
  options.budget = absl::Seconds(600);  // the evaluation count ends it
  options.max_evaluations = evaluations;
  options.seed = 7;
  absl::StatusOr<PlanResult> r = planner.Run(cm, options);
  CHECK(r.ok()) << r.status();
  return *r;
}

// The GPU types of each template's stages.
std::vector<std::set<int>> TemplateTypes(const Plan& plan) {
  std::vector<std::set<int>> types;
  for (const auto& t : plan.templates) {
    std::set<int> of_template;
    for (const auto& stage : t.stages) of_template.insert(stage.gpu_type);
    types.push_back(of_template);
  }
  return types;
}

int UnusedGpus(const Plan& plan, const CostModel& cm) {
  int used = 0;
  for (const auto& t : plan.templates)
    used += t.gpus_per_replica() * t.replicas;
  return cm.cluster().total_gpus() - used;
}

TEST(GrownSeed, ReachesMixtralsTypePurePlanEarly) {
  auto ctx = ExampleContext("mixtral-8x7b", "paper-512.yaml");
  const CostModel& cm = ctx->cost_model();
  // When this was written: 0.2015 it/s with the seed after 2,000
  // evaluations (the 0.9 s plan); without it
  // 0.107 there and 0.176 after 16,000.
  const PlanResult early = SearchWith(cm, true, 2000);
  ASSERT_TRUE(ValidatePlan(early.plan, cm).ok());
  const std::vector<std::set<int>> types = TemplateTypes(early.plan);
  ASSERT_EQ(types.size(), 3u);
  std::set<int> all;
  for (const std::set<int>& t : types) {
    EXPECT_EQ(t.size(), 1u) << "a template of several GPU types";
    all.insert(t.begin(), t.end());
  }
  EXPECT_EQ(all.size(), 3u) << "one template per GPU type";
  EXPECT_EQ(UnusedGpus(early.plan, cm), 0);
  const double without_early =
      SearchWith(cm, false, 2000).prediction.throughput_iters_per_s;
  const double without_late =
      SearchWith(cm, false, 16000).prediction.throughput_iters_per_s;
  EXPECT_GT(early.prediction.throughput_iters_per_s, 1.5 * without_early);
  EXPECT_GT(early.prediction.throughput_iters_per_s, 1.05 * without_late);
}

TEST(GrownSeed, UsesEveryGpuOfEightTypes) {
  // LLaMA-3-8B on 96 GPUs of eight types (8 to 16 each). The seed of one
  // type-pure template per type it replaced took the three fastest types
  // (H200, H100, A100-80GB: 32 GPUs) and, after 3,000 evaluations, the
  // search stood at 0.0585 it/s with 64 GPUs idle. The grown seed's
  // template of one stage per type with free nodes uses them: 0.0639 it/s
  // there when this was written, on all 96; without a seed, 0.0482.
  auto ctx = ExampleContext("llama3-8b", "mix8-96.yaml");
  const CostModel& cm = ctx->cost_model();
  ASSERT_EQ(cm.cluster().total_gpus(), 96);
  const PlanResult seeded = SearchWith(cm, true, 3000);
  ASSERT_TRUE(ValidatePlan(seeded.plan, cm).ok());
  EXPECT_EQ(UnusedGpus(seeded.plan, cm), 0);
  std::set<int> types;
  for (const std::set<int>& t : TemplateTypes(seeded.plan))
    types.insert(t.begin(), t.end());
  EXPECT_EQ(types.size(), 8u);
  const PlanResult without = SearchWith(cm, false, 3000);
  EXPECT_GT(seeded.prediction.throughput_iters_per_s,
            1.05 * without.prediction.throughput_iters_per_s);
}

TEST(GrownSeed, SeedsWithEveryTypesFastestSideBySideWhenThatIsFaster) {
  // DeepSeek-V3 on Figure 9(c)'s 256 A100-80GB + 256 H100: grown from the
  // fastest template alone the seed priced 120.2 s an iteration; the two
  // types' fastest templates alone, side by side, 102.8 s, the plan the
  // search then keeps (the 0.9 s plan in seeds 1-3 when this was written).
  const std::string cluster =
      absl::StrCat(::testing::TempDir(), "/a100-80gb-h100-512.yaml");
  std::ofstream(cluster)
      << "inter_node_gbps: 100\n"
         "node_groups:\n"
         "  - {gpu: A100-80GB, gpus_per_node: 4, count: 64}\n"
         "  - {gpu: H100-80GB, gpus_per_node: 4, count: 64}\n";
  PlanningRequest request;
  request.model = "deepseek-v3";
  request.cluster_file = cluster;
  absl::StatusOr<std::unique_ptr<PlanningContext>> ctx =
      PlanningContext::Create(request);
  ASSERT_TRUE(ctx.ok()) << ctx.status();
  const PlanResult seeded = SearchWith((*ctx)->cost_model(), true, 1000);
  ASSERT_TRUE(ValidatePlan(seeded.plan, (*ctx)->cost_model()).ok());
  // The cost model's predicted iteration, after a fixed number of
  // evaluations: deterministic, no clock involved.
  EXPECT_LT(seeded.prediction.iteration_time_s, 103.0);
  EXPECT_EQ(UnusedGpus(seeded.plan, (*ctx)->cost_model()), 0);
  const PlanResult without = SearchWith((*ctx)->cost_model(), false, 1000);
  EXPECT_GT(without.prediction.iteration_time_s, 105.0);
}

}  // namespace
}  // namespace arachne
