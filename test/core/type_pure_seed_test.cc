// The learned planner's type-pure seed (LearnedPlannerConfig::
// type_pure_seed): after the greedy rollout, one plan of one template per
// GPU type, each the fastest of its type alone. On the paper's 512-GPU
// cluster Mixtral-8x7B's best plan is of that shape (bench/moe-scale), and
// the seed reaches it within a budget the search without it does not.
#include <memory>
#include <set>
#include <string>

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
  config.type_pure_seed = seed;
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

TEST(TypePureSeed, ReachesMixtralsTypePurePlanEarly) {
  auto ctx = ExampleContext("mixtral-8x7b", "paper-512.yaml");
  const CostModel& cm = ctx->cost_model();
  // When this was written: 0.198 it/s with the seed after 1,000
  // evaluations; without it 0.084 there and 0.176 after 16,000.
  const PlanResult early = SearchWith(cm, true, 1000);
  ASSERT_TRUE(ValidatePlan(early.plan, cm).ok());
  const std::vector<std::set<int>> types = TemplateTypes(early.plan);
  ASSERT_EQ(types.size(), 3u);
  std::set<int> all;
  for (const std::set<int>& t : types) {
    EXPECT_EQ(t.size(), 1u) << "a template of several GPU types";
    all.insert(t.begin(), t.end());
  }
  EXPECT_EQ(all.size(), 3u) << "one template per GPU type";
  int gpus = 0;
  for (const auto& t : early.plan.templates)
    gpus += t.gpus_per_replica() * t.replicas;
  EXPECT_EQ(gpus, 512);
  const double without_early =
      SearchWith(cm, false, 1000).prediction.throughput_iters_per_s;
  const double without_late =
      SearchWith(cm, false, 16000).prediction.throughput_iters_per_s;
  EXPECT_GT(early.prediction.throughput_iters_per_s, 1.5 * without_early);
  EXPECT_GT(early.prediction.throughput_iters_per_s, 1.05 * without_late);
}

}  // namespace
}  // namespace arachne
