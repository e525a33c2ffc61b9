// A search that a limit stops before it finds any plan says so, with its own
// code (ResourceExhausted for the evaluation limit, DeadlineExceeded for the
// budget), instead of "no plan fits"; a model that fits nowhere stays
// FailedPrecondition whatever stopped the search.
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "planner_service/core/planners/exact_planner.h"
#include "planner_service/core/planners.h"
#include "planner_service/core/planners/search_tracker.h"
#include "test/core/toy_fixture.h"

namespace arachne {
namespace {

using ::arachne::testing::kFast;
using ::arachne::testing::MakeCluster;
using ::testing::HasSubstr;

class SearchStopTest : public ::testing::Test {
 protected:
  CostModel Build(const Cluster& cluster) {
    auto cm = CostModel::Create(catalog_, testing::ToyModel(),
                                testing::ToyTraining(), cluster, profiles_);
    CHECK(cm.ok());
    return *std::move(cm);
  }
  GpuCatalog catalog_ = testing::ToyCatalog();
  ProfileStore profiles_ = testing::ToyProfiles();
  // The cost model refers to it: it must outlive the test's model.
  Cluster cluster_ = MakeCluster(catalog_, {{kFast, 4}});
};

TEST_F(SearchStopTest, EvaluationLimitBeforeAnyPlanIsResourceExhausted) {
  CostModel cm = Build(cluster_);
  PlannerOptions options;
  options.max_evaluations = 2;
  SearchTracker tracker(cm, options);
  // Two candidates priced elsewhere (as auto-fill does), neither kept.
  *tracker.evaluation_counter() += 2;
  ASSERT_TRUE(tracker.OutOfBudget());
  absl::StatusOr<PlanResult> r = tracker.Finish("exact", false);
  EXPECT_EQ(r.status().code(), absl::StatusCode::kResourceExhausted);
  EXPECT_THAT(r.status().message(),
              HasSubstr("exact: the search was stopped before any plan was "
                        "found, by the evaluation limit (max_evaluations 2, "
                        "reached after 2 plan evaluations)"));
  EXPECT_THAT(r.status().message(), ::testing::Not(HasSubstr("no plan fits")));
}

TEST_F(SearchStopTest, BudgetBeforeAnyPlanIsDeadlineExceeded) {
  CostModel cm = Build(cluster_);
  PlannerOptions options;
  options.budget = absl::ZeroDuration();
  ExactPlanner planner;
  absl::StatusOr<PlanResult> r = planner.Run(cm, options);
  EXPECT_EQ(r.status().code(), absl::StatusCode::kDeadlineExceeded);
  EXPECT_THAT(r.status().message(),
              HasSubstr("exact: the search was stopped before any plan was "
                        "found, by its time budget (0, after 0 plan "
                        "evaluations)"));
}

TEST_F(SearchStopTest, SearchToTheEndWithoutAPlanIsStillFailedPrecondition) {
  CostModel cm = Build(cluster_);
  PlannerOptions options;
  SearchTracker tracker(cm, options);
  ASSERT_FALSE(tracker.OutOfBudget());
  absl::StatusOr<PlanResult> r = tracker.Finish("exact", true);
  EXPECT_EQ(r.status().code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_THAT(r.status().message(), HasSubstr("exact: no plan fits toy"));
}

}  // namespace
}  // namespace arachne
