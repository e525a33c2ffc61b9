// A larger budget never gives a worse plan (issue 35): the learned
// planner's search (here with a uniform policy, template-search) prices
// the same candidates in the same order whatever its budget, which only
// ends it. Time comes from a clock that advances 100 us per read, so where
// each run stops is deterministic.
#include <cctype>
#include <memory>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/time/time.h"
#include "glog/logging.h"
#include "gtest/gtest.h"
#include "planner_service/core/learned/learned_planner.h"
#include "planner_service/core/planners.h"
#include "planner_service/io/planning_context.h"
#include "test/core/planning_fixtures.h"

namespace arachne {
namespace {

using testing::ExampleContext;
using testing::TickingClock;

// Throughput of template-search's plan (seed 7) under `options`.
double TemplateSearchThroughput(const CostModel& cm, PlannerOptions options) {
  auto planner = MakePlanner(kTemplateSearchPlannerName);
  CHECK(planner.ok()) << planner.status();
  options.seed = 7;
  absl::StatusOr<PlanResult> r = (*planner)->Run(cm, options);
  CHECK(r.ok()) << r.status();
  return r->prediction.throughput_iters_per_s;
}

// Under a wall-clock budget of `ms` on a TickingClock.
double ThroughputWithin(const CostModel& cm, int ms) {
  TickingClock clock;
  PlannerOptions options;
  options.budget = absl::Milliseconds(ms);
  options.clock = &clock;
  return TemplateSearchThroughput(cm, options);
}

struct Scenario {
  const char* model;
  const char* cluster;
};

class BudgetMonotonicityTest : public ::testing::TestWithParam<Scenario> {
 protected:
  const CostModel& cm() const { return ctx_->cost_model(); }
  std::unique_ptr<PlanningContext> ctx_ =
      ExampleContext(GetParam().model, GetParam().cluster);
};

// Wall-clock budgets from 20 ms to the 0.9 s default. Before the search
// was made budget-independent, mixtral-8x7b on paper-512 fell from 0.175
// it/s at 20 ms to 0.127 at 50 ms, and llama3-8b on mix5-52 from 0.0527
// at 0.2 s to 0.0517 at 0.4 s.
TEST_P(BudgetMonotonicityTest, ALargerTimeBudgetIsNeverWorse) {
  std::vector<double> found;
  for (int ms : {20, 50, 100, 200, 400, 900}) {
    found.push_back(ThroughputWithin(cm(), ms));
    if (found.size() > 1) {
      EXPECT_GE(found.back(), found[found.size() - 2])
          << "budget " << ms << " ms";
    }
  }
}

// Evaluation budgets (no time limit), the same property.
TEST_P(BudgetMonotonicityTest, ALargerEvaluationBudgetIsNeverWorse) {
  double previous = 0;
  for (int64_t evaluations : {1000, 4000, 16000, 64000}) {
    PlannerOptions options;
    options.budget = absl::Seconds(600);
    options.max_evaluations = evaluations;
    const double found = TemplateSearchThroughput(cm(), options);
    EXPECT_GE(found, previous) << evaluations << " evaluations";
    previous = found;
  }
}

INSTANTIATE_TEST_SUITE_P(
    Clusters, BudgetMonotonicityTest,
    ::testing::Values(Scenario{"llama3-8b", "mix5-52.yaml"},
                      Scenario{"qwen3-32b", "mix5-52.yaml"},
                      Scenario{"mixtral-8x7b", "mix8-96.yaml"},
                      Scenario{"llama3-8b", "paper-512.yaml"},
                      Scenario{"mixtral-8x7b", "paper-512.yaml"}),
    [](const ::testing::TestParamInfo<Scenario>& info) {
      std::string name = absl::StrCat(info.param.model, "_", info.param.cluster);
      for (char& c : name)
        if (!isalnum(static_cast<unsigned char>(c))) c = '_';
      return name;
    });

// The budget buys something: on paper-512, mixtral-8x7b's plan at 0.9 s is
// faster than at 5 ms (0.2015 against 0.1747 it/s when this was written;
// the grown seed reaches 0.2015 by 20 ms, the seed before it 0.1982 there).
TEST(BudgetMonotonicity, TheBudgetIsUsed) {
  auto ctx = ExampleContext("mixtral-8x7b", "paper-512.yaml");
  EXPECT_GT(ThroughputWithin(ctx->cost_model(), 900),
            1.01 * ThroughputWithin(ctx->cost_model(), 5));
}

}  // namespace
}  // namespace arachne
