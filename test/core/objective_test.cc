// The planner objective: throughput versus dollars per token, on a cluster
// where the fast GPU type costs 8x the slow one for 2x its speed.
#include <memory>
#include <string>
#include <vector>

#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "planner_service/core/planners/auto_fill.h"
#include "planner_service/core/planners/exact_planner.h"
#include "planner_service/core/cost/plan_validation.h"
#include "planner_service/core/planners.h"
#include "planner_service/core/planners/random_planner.h"
#include "planner_service/core/planners/search_tracker.h"
#include "test/core/toy_fixture.h"

namespace arachne {
namespace {

using ::arachne::testing::kFast;
using ::arachne::testing::kSlow;
using ::arachne::testing::MakeCluster;
using ::testing::HasSubstr;

// The toy catalog (FAST does a layer twice as fast as SLOW) with FAST at
// $8/h and SLOW at `slow_usd`/h: per token SLOW is 4x cheaper at $1/h.
GpuCatalog PricedCatalog(double slow_usd = 1) {
  std::vector<GpuType> types = testing::ToyCatalog().types();
  types[kFast].usd_per_hour = 8;
  types[kSlow].usd_per_hour = slow_usd;
  auto c = GpuCatalog::Create(types);
  CHECK(c.ok()) << c.status();
  return *std::move(c);
}

double UsdPerTokenOf(const Prediction& p) {
  return UsdPerToken(p.usd_per_hour, p.tokens_per_s);
}

// The search planners that need no checkpoint (the learned planner also goes
// through SearchTracker but needs a policy for the model).
const std::vector<std::string>& SearchPlanners() {
  static const auto* names = new std::vector<std::string>{
      "exact", "amp", "espresso", "hexiscale", "metis", "sailor", "random"};
  return *names;
}

int GpusOfType(const Plan& plan, int type) {
  int n = 0;
  for (const Template& t : plan.templates)
    for (const Stage& st : t.stages)
      if (st.gpu_type == type) n += st.tp * t.replicas;
  return n;
}

class ObjectiveTest : public ::testing::Test {
 protected:
  // One 4-GPU FAST node and one 4-GPU SLOW node.
  CostModel Build(const GpuCatalog& catalog) {
    cluster_ = std::make_unique<Cluster>(
        MakeCluster(catalog, {{kFast, 4}, {kSlow, 4}}));
    auto cm = CostModel::Create(catalog, testing::ToyModel(),
                                testing::ToyTraining(), *cluster_, profiles_);
    CHECK(cm.ok()) << cm.status();
    return *std::move(cm);
  }
  static PlannerOptions Options(PlannerObjective objective) {
    PlannerOptions o;
    o.objective = objective;
    return o;
  }
  ProfileStore profiles_ = testing::ToyProfiles();
  std::unique_ptr<Cluster> cluster_;
};

TEST(ObjectiveNameTest, NamesRoundTripAndUnknownNamesAreRejected) {
  EXPECT_EQ(PlannerObjectiveName(PlannerObjective::kThroughput), "throughput");
  EXPECT_EQ(PlannerObjectiveName(PlannerObjective::kUsdPerToken),
            "usd_per_token");
  auto t = ParsePlannerObjective("throughput");
  ASSERT_TRUE(t.ok()) << t.status();
  EXPECT_EQ(*t, PlannerObjective::kThroughput);
  auto u = ParsePlannerObjective("usd_per_token");
  ASSERT_TRUE(u.ok()) << u.status();
  EXPECT_EQ(*u, PlannerObjective::kUsdPerToken);
  // Names are exact: the gRPC enum's spelling is not a CLI name.
  for (const char* bad : {"USD_PER_TOKEN", "cheapest", ""}) {
    auto r = ParsePlannerObjective(bad);
    EXPECT_EQ(r.status().code(), absl::StatusCode::kInvalidArgument) << bad;
    EXPECT_THAT(r.status().message(),
                HasSubstr(absl::StrCat("unknown value \"", bad,
                                       "\"; expected throughput or "
                                       "usd_per_token")));
  }
}

TEST_F(ObjectiveTest, UsdPerTokenPlanIsCheaperThroughputPlanIsFaster) {
  const GpuCatalog catalog = PricedCatalog();
  const CostModel cm = Build(catalog);
  ExactPlanner exact;
  auto fast = exact.Run(cm, Options(PlannerObjective::kThroughput));
  auto cheap = exact.Run(cm, Options(PlannerObjective::kUsdPerToken));
  ASSERT_TRUE(fast.ok()) << fast.status();
  ASSERT_TRUE(cheap.ok()) << cheap.status();
  EXPECT_TRUE(fast->stats.exhaustive);
  EXPECT_TRUE(cheap->stats.exhaustive);
  const Prediction& f = fast->prediction;
  const Prediction& c = cheap->prediction;
  // Throughput: the four FAST GPUs ($32/h) at 24.27 ms per iteration.
  EXPECT_EQ(GpusOfType(fast->plan, kFast), 4);
  EXPECT_EQ(GpusOfType(fast->plan, kSlow), 0);
  EXPECT_DOUBLE_EQ(f.usd_per_hour, 32);
  EXPECT_NEAR(f.iteration_time_s, 0.024269, 1e-6);
  // $/token: one SLOW GPU ($1/h) and nothing else billed. On paper: 8
  // sequences x 4 layers x (2 + 4) ms = 192 ms, plus the Adam step of 4e6
  // parameters x 30 B at 500 GB/s = 0.24 ms; 8 x 1024 tokens per iteration.
  ASSERT_EQ(cheap->plan.templates.size(), 1u);
  EXPECT_EQ(cheap->plan.templates[0].replicas, 1);
  EXPECT_EQ(cheap->plan.used_gpus(), 1);
  EXPECT_EQ(GpusOfType(cheap->plan, kSlow), 1);
  EXPECT_DOUBLE_EQ(c.usd_per_hour, 1);
  EXPECT_NEAR(c.iteration_time_s, 0.19224, 1e-9);
  EXPECT_NEAR(UsdPerTokenOf(c), 0.19224 / 3600 / 8192, 1e-15);
  EXPECT_LT(UsdPerTokenOf(c), UsdPerTokenOf(f) / 4);
  EXPECT_GT(f.tokens_per_s, 7 * c.tokens_per_s);
  EXPECT_TRUE(ValidatePlan(cheap->plan, cm).ok());
  // The progress curve is in the objective: $/token falls at every point and
  // its last point is the returned plan. Packing all four SLOW replicas was
  // found first; the one-replica plan only by trying fewer replicas.
  const std::vector<ProgressPoint>& curve = cheap->stats.progress;
  ASSERT_GE(curve.size(), 2u);
  for (size_t i = 1; i < curve.size(); ++i)
    EXPECT_LT(curve[i].usd_per_token, curve[i - 1].usd_per_token) << i;
  EXPECT_DOUBLE_EQ(curve.back().usd_per_token, UsdPerTokenOf(c));
  EXPECT_DOUBLE_EQ(curve.back().throughput_iters_per_s,
                   c.throughput_iters_per_s);
  // Under throughput the curve's throughput rises and $/token is reported.
  EXPECT_DOUBLE_EQ(fast->stats.progress.back().usd_per_token,
                   UsdPerTokenOf(f));
}

TEST_F(ObjectiveTest, ExactIsNoWorseThanRandomUnderUsdPerToken) {
  const GpuCatalog catalog = PricedCatalog();
  const CostModel cm = Build(catalog);
  ExactPlanner exact;
  auto e = exact.Run(cm, Options(PlannerObjective::kUsdPerToken));
  ASSERT_TRUE(e.ok()) << e.status();
  EXPECT_TRUE(e->stats.exhaustive);
  EXPECT_NEAR(UsdPerTokenOf(e->prediction), 0.19224 / 3600 / 8192, 1e-15);
  RandomPlanner random;
  for (int64_t evaluations : {10, 100, 3000}) {
    for (uint64_t seed : {1, 2, 3}) {
      PlannerOptions o = Options(PlannerObjective::kUsdPerToken);
      o.max_evaluations = evaluations;
      o.seed = seed;
      auto r = random.Run(cm, o);
      ASSERT_TRUE(r.ok()) << r.status();
      EXPECT_LE(UsdPerTokenOf(e->prediction), UsdPerTokenOf(r->prediction))
          << evaluations << " evaluations, seed " << seed;
      // Random draws replica caps from the same list as exact, so with
      // enough draws it reaches the one-SLOW-GPU optimum too.
      if (evaluations == 3000) {
        EXPECT_NEAR(UsdPerTokenOf(r->prediction), 0.19224 / 3600 / 8192,
                    1e-15)
            << seed;
        EXPECT_EQ(r->plan.used_gpus(), 1) << seed;
      }
    }
  }
}

TEST_F(ObjectiveTest, EveryPlannerRanksByTheObjective) {
  // Each planner's usd_per_token plan costs no more per token than its
  // throughput plan (their candidate sets are the same or larger under
  // usd_per_token, and Espresso's pruning bound is on $/token there).
  const GpuCatalog catalog = PricedCatalog();
  const CostModel cm = Build(catalog);
  for (const std::string& name : SearchPlanners()) {
    auto planner = MakePlanner(name);
    ASSERT_TRUE(planner.ok()) << planner.status();
    PlannerOptions fast_options = Options(PlannerObjective::kThroughput);
    PlannerOptions cheap_options = Options(PlannerObjective::kUsdPerToken);
    fast_options.max_evaluations = cheap_options.max_evaluations = 3000;
    auto fast = (*planner)->Run(cm, fast_options);
    auto cheap = (*planner)->Run(cm, cheap_options);
    ASSERT_TRUE(fast.ok()) << name << ": " << fast.status();
    ASSERT_TRUE(cheap.ok()) << name << ": " << cheap.status();
    EXPECT_LE(UsdPerTokenOf(cheap->prediction),
              UsdPerTokenOf(fast->prediction))
        << name;
    EXPECT_GE(fast->prediction.throughput_iters_per_s,
              cheap->prediction.throughput_iters_per_s)
        << name;
    EXPECT_DOUBLE_EQ(cheap->stats.progress.back().usd_per_token,
                     UsdPerTokenOf(cheap->prediction))
        << name;
  }
}

TEST_F(ObjectiveTest, UnpricedGpuTypeIsAnErrorUnderUsdPerTokenOnly) {
  const GpuCatalog catalog = PricedCatalog(/*slow_usd=*/0);
  const CostModel cm = Build(catalog);
  const absl::Status check =
      CheckObjective(cm, PlannerObjective::kUsdPerToken);
  EXPECT_EQ(check.code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_THAT(check.message(),
              HasSubstr("objective usd_per_token: GPU type SLOW of the "
                        "cluster has no price"));
  EXPECT_TRUE(CheckObjective(cm, PlannerObjective::kThroughput).ok());
  for (const std::string& name : SearchPlanners()) {
    auto planner = MakePlanner(name);
    ASSERT_TRUE(planner.ok()) << planner.status();
    PlannerOptions o = Options(PlannerObjective::kUsdPerToken);
    o.max_evaluations = 100;
    auto r = (*planner)->Run(cm, o);
    EXPECT_EQ(r.status().code(), absl::StatusCode::kFailedPrecondition)
        << name;
    EXPECT_THAT(r.status().message(),
                HasSubstr(absl::StrCat(name, ": objective usd_per_token: GPU "
                                       "type SLOW")));
  }
  // Throughput does not need prices: the same cluster plans as before.
  ExactPlanner exact;
  auto fast = exact.Run(cm, Options(PlannerObjective::kThroughput));
  ASSERT_TRUE(fast.ok()) << fast.status();
  EXPECT_DOUBLE_EQ(fast->prediction.usd_per_hour, 32);
}

TEST_F(ObjectiveTest, TiesInDollarsPerTokenGoToTheFasterPlan) {
  const GpuCatalog catalog = PricedCatalog();
  const CostModel cm = Build(catalog);
  SearchTracker tracker(cm, Options(PlannerObjective::kUsdPerToken));
  // One SLOW GPU at 0.5 s and two at 0.25 s cost the same per token.
  Plan one;
  Template t;
  t.stages.push_back(testing::MakeStage(kSlow, 1, 0, 4));
  t.replicas = 1;
  one.templates.push_back(t);
  Plan two = one;
  two.templates[0].replicas = 2;
  EXPECT_TRUE(tracker.Offer(one, 0.5));
  EXPECT_DOUBLE_EQ(tracker.best_score(), 1.0 * 0.5 / 3600 / 8192);
  EXPECT_TRUE(tracker.Offer(two, 0.25));
  EXPECT_DOUBLE_EQ(tracker.best_time(), 0.25);
  EXPECT_FALSE(tracker.Offer(one, 0.5));
  // A faster plan that costs more per token loses.
  EXPECT_FALSE(tracker.Offer(two, 0.3));
  Plan four = one;
  four.templates[0].replicas = 4;
  EXPECT_FALSE(tracker.Offer(four, 0.2));
  EXPECT_EQ(tracker.improvements(), 2);
  EXPECT_EQ(tracker.best().templates[0].replicas, 2);
}

TEST_F(ObjectiveTest, AutoFillCapsReplicas) {
  const GpuCatalog catalog = PricedCatalog();
  const CostModel cm = Build(catalog);
  AutoFill fill(cm);
  const NodePool pool(*cluster_);
  auto all = fill.Extend(Plan{}, pool, {{kSlow, 1}});
  ASSERT_TRUE(all.ok()) << all.status();
  EXPECT_EQ(all->plan.templates[0].replicas, 4);
  auto two = fill.Extend(Plan{}, pool, {{kSlow, 1}}, nullptr, 2);
  ASSERT_TRUE(two.ok()) << two.status();
  EXPECT_EQ(two->plan.templates[0].replicas, 2);
  EXPECT_EQ(two->pool.FreeOfType(kSlow), 2);
  EXPECT_TRUE(ValidatePlan(two->plan, cm).ok());
  // A cap above what fits places what fits.
  auto many = fill.Extend(Plan{}, pool, {{kSlow, 1}}, nullptr, 64);
  ASSERT_TRUE(many.ok()) << many.status();
  EXPECT_EQ(many->plan.templates[0].replicas, 4);
  // The caps the exact and random planners try under usd_per_token: no cap,
  // then the powers of two below the packable count.
  EXPECT_EQ(AutoFill::PackableReplicas(pool, {{kSlow, 1}}), 4);
  EXPECT_EQ(AutoFill::ReplicaCaps(pool, {{kSlow, 1}}),
            (std::vector<int>{0, 2, 1}));
  EXPECT_EQ(AutoFill::ReplicaCaps(pool, {{kSlow, 2}}),
            (std::vector<int>{0, 1}));
  EXPECT_EQ(AutoFill::ReplicaCaps(pool, {{kSlow, 2}, {kSlow, 2}}),
            (std::vector<int>{0}));
  auto bad = fill.Extend(Plan{}, pool, {{kSlow, 1}}, nullptr, -1);
  EXPECT_EQ(bad.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(bad.status().message(),
              HasSubstr("max_replicas must be >= 0 (0: no cap), got -1"));
}

}  // namespace
}  // namespace arachne
