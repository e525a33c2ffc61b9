// The controller's online fit (controller/online_corrections.h) on hand-made
// generation records of tiny-gpt: what is fitted on, what a refusal says,
// the corrected prediction against the measured time, and the stored form
// of the corrections.
#include "controller/online_corrections.h"

#include "glog/logging.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "planner_service/io/cluster_io.h"
#include "planner_service/io/plan_io.h"
#include "planner_service/io/planning_context.h"
#include "test/engine/engine_harness.h"

namespace arachne::controller {
namespace {

using ::testing::ElementsAre;
using ::testing::HasSubstr;
using ::testing::StartsWith;

struct Job {
  GpuCatalog catalog = agent::testing::Catalog();
  ModelSpec model = *ResolveModel("tiny-gpt");
  TrainingConfig training;
  Cluster cluster;
  Plan plan;
  double raw_iteration_s = 0;
  std::string plan_json;

  // PP 2 on the two A6000s of node a, 2 micro-batches of 16.
  Job() {
    training.seq_len = 32;
    training.global_batch = 32;
    cluster = *ParseCluster(R"({"nodes":[{"name":"a","gpu":"A6000","gpus":2}]})",
                            "test", catalog);
    int next = 0;
    plan.templates.push_back(agent::testing::MakeTemplate(
        {{1, 0, 2}, {1, 2, 4}}, 1, 16, 2, 0, &next,
        *catalog.IndexOf("A6000")));
    auto ctx = PlanningContext::Create(catalog, model, training, cluster, "");
    CHECK(ctx.ok()) << ctx.status();
    (*ctx)->cost_model().BalanceMicroBatches(plan);
    absl::StatusOr<Prediction> p = (*ctx)->cost_model().Predict(plan);
    CHECK(p.ok()) << p.status();
    raw_iteration_s = p->iteration_time_s;
    plan_json = PlanToJson(plan, *p, cluster, catalog, model, training).dump();
  }

  GenerationRecord Record(int64_t generation, int measured, double seconds) const {
    GenerationRecord r;
    r.generation = generation;
    r.cluster_json = ClusterToJson(cluster, catalog).dump();
    r.plan_json = plan_json;
    r.predicted_iteration_s = raw_iteration_s;
    r.warmup = 1;
    r.window = 5;
    r.iterations_measured = measured;
    r.measured_iteration_s = seconds;
    return r;
  }
};

// A GPU type that never ran takes the geometric mean of the measured
// types' scales; a measured one keeps its own.
TEST(ImputeUnmeasuredTypes, TheFleetsCorrectionForATypeThatNeverRan) {
  RunCorrections c;
  c.compute_scale = {{"A100-40GB", 2.0}, {"H100-80GB", 8.0}};
  c.tp_comm_scale = {{"H100-80GB", 3.0}};
  EXPECT_THAT(ImputeUnmeasuredTypes({"A6000", "H100-80GB"}, &c),
              ::testing::ElementsAre("A6000"));
  EXPECT_DOUBLE_EQ(c.compute_scale.at("A6000"), 4.0);  // sqrt(2 * 8)
  EXPECT_DOUBLE_EQ(c.compute_scale.at("H100-80GB"), 8.0);
  EXPECT_DOUBLE_EQ(c.tp_comm_scale.at("A6000"), 3.0);
  EXPECT_TRUE(c.attention_scale.empty());
  // Nothing measured per type: nothing to go on, nothing filled.
  RunCorrections none;
  none.iteration_fixed_s = 0.01;
  EXPECT_TRUE(ImputeUnmeasuredTypes({"A6000"}, &none).empty());
  EXPECT_TRUE(none.compute_scale.empty());
}

// The guessed correction counts against a switch only for the types the
// new plan adds: one the current plan runs too (off the measured plans'
// critical path) carries the same guess in both prices. scripts/demo's
// join (a pipeline of RTX-PRO-6000 and A6000 beside an A5000 replica, to a
// deeper pipeline on the same types) was kept on the 10% margin of two
// types the current plan runs, though the switch measured x1.12.
TEST(UnmeasuredTypesAgainstSwitch, OnlyTypesTheCurrentPlanDoesNotRun) {
  const std::vector<std::string> imputed = {"A5000", "A6000", "RTX-PRO-6000"};
  EXPECT_THAT(UnmeasuredTypesAgainstSwitch(imputed, {"A5000", "RTX-PRO-6000"},
                                           {"A5000", "A6000", "RTX-PRO-6000"}),
              ::testing::IsEmpty());
  EXPECT_THAT(UnmeasuredTypesAgainstSwitch(imputed, {"A6000", "RTX-PRO-6000"},
                                           {"RTX-PRO-6000"}),
              ::testing::ElementsAre("A6000"));
  // No current plan (it no longer fits): every guessed type of the new one.
  EXPECT_THAT(UnmeasuredTypesAgainstSwitch(imputed, {"A5000", "H100-80GB"}, {}),
              ::testing::ElementsAre("A5000"));
}

TEST(OnlineCorrections, NothingMeasuredEnoughIsARefusalThatSaysWhy) {
  const Job job;
  OnlineCorrections cal(job.catalog, job.model, job.training, "", 3);
  // 2 iterations after the warm-up: not yet a measured run.
  const CorrectionsFit fit = cal.Fit({job.Record(1, 2, 4 * job.raw_iteration_s)});
  EXPECT_EQ(fit.status.code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_EQ(fit.note,
            "refused: no generation measured 3 iterations after its warm-up "
            "yet");
  EXPECT_TRUE(fit.generations.empty());
  EXPECT_TRUE(fit.corrections.empty());
}

TEST(OnlineCorrections, OneMeasuredGenerationFitsItsComputeScale) {
  const Job job;
  ASSERT_GT(job.raw_iteration_s, 0);
  OnlineCorrections cal(job.catalog, job.model, job.training, "", 3);
  // Generation 1 ran 4 times slower than its raw prediction; generation 2
  // is not measured enough and is left out.
  const double measured = 4 * job.raw_iteration_s;
  const CorrectionsFit fit = cal.Fit(
      {job.Record(1, 5, measured), job.Record(2, 1, job.raw_iteration_s)});
  ASSERT_TRUE(fit.status.ok()) << fit.status << " " << fit.note;
  EXPECT_THAT(fit.generations, ElementsAre(1));
  ASSERT_EQ(fit.corrections.compute_scale.count("A6000"), 1u);
  // Compute is most but not all of the time: the scale exceeds 4.
  EXPECT_GT(fit.corrections.compute_scale.at("A6000"), 4);
  EXPECT_LT(fit.corrections.compute_scale.at("A6000"), 8);
  EXPECT_THAT(fit.note, StartsWith("fitted on 1 generation (1); time rms log "
                                   "error 1.386 -> "));
  ASSERT_EQ(fit.after.size(), 1u);
  EXPECT_NEAR(fit.after[0].iteration_s, measured, 0.1 * measured);
  // Priced again with the corrections, as a decision prices its plans.
  absl::StatusOr<RunPrediction> again =
      cal.Predict(job.cluster, job.plan, fit.corrections);
  ASSERT_TRUE(again.ok()) << again.status();
  EXPECT_DOUBLE_EQ(again->iteration_s, fit.after[0].iteration_s);
  absl::StatusOr<RunPrediction> raw = cal.Predict(job.cluster, job.plan, {});
  ASSERT_TRUE(raw.ok()) << raw.status();
  EXPECT_NEAR(raw->iteration_s, job.raw_iteration_s, 1e-12);
}

// CPU ranks standing in for A6000s run ~500 times slower than the
// profiles: the fit follows (one generation, one compute scale: exact), and
// its warning that the scale is far from 1 reaches the note an operator
// reads in `arachne status`.
TEST(OnlineCorrections, CpuRanksFitWithAWarningInTheNote) {
  const Job job;
  OnlineCorrections cal(job.catalog, job.model, job.training, "", 3);
  const double measured = 500 * job.raw_iteration_s;
  const CorrectionsFit fit = cal.Fit({job.Record(1, 5, measured)});
  ASSERT_TRUE(fit.status.ok()) << fit.status << " " << fit.note;
  EXPECT_FALSE(fit.warnings.empty());
  EXPECT_THAT(fit.note, HasSubstr("; warning: "));
  ASSERT_EQ(fit.after.size(), 1u);
  EXPECT_NEAR(fit.after[0].iteration_s / measured, 1.0, 1e-3);
  EXPECT_THAT(fit.note, HasSubstr("corrected iteration times within"));
}

// Beyond the bound (1e4) the bound, not the fit, decides, and says so.
TEST(OnlineCorrections, AFitHeldAtItsBoundSaysSoInTheNote) {
  const Job job;
  OnlineCorrections cal(job.catalog, job.model, job.training, "", 3);
  const double measured = 1e5 * job.raw_iteration_s;
  const CorrectionsFit fit = cal.Fit({job.Record(1, 5, measured)});
  ASSERT_TRUE(fit.status.ok()) << fit.status << " " << fit.note;
  EXPECT_THAT(fit.note, HasSubstr("; warning: "));
  ASSERT_EQ(fit.after.size(), 1u);
  EXPECT_LT(fit.after[0].iteration_s, 0.2 * measured);
}

TEST(OnlineCorrections, TheStoredFormReadsBackWithItsGenerations) {
  const Job job;
  OnlineCorrections cal(job.catalog, job.model, job.training, "", 3);
  RunCorrections c;
  c.compute_scale["A6000"] = 4.25;
  c.iteration_fixed_s = 0.012;
  c.context_reserve_gib = 0.2;
  const std::string json = cal.ToJson(c, {1, 3});
  std::vector<int64_t> generations;
  absl::StatusOr<RunCorrections> back = cal.FromJson(json, &generations);
  ASSERT_TRUE(back.ok()) << back.status();
  EXPECT_EQ(back->compute_scale, c.compute_scale);
  ASSERT_TRUE(back->iteration_fixed_s.has_value());
  EXPECT_NEAR(*back->iteration_fixed_s, 0.012, 1e-12);
  EXPECT_THAT(generations, ElementsAre(1, 3));
  EXPECT_EQ(cal.FromJson("{", &generations).status().code(),
            absl::StatusCode::kDataLoss);
  EXPECT_EQ(DescribeCorrections(c),
            "compute_scale A6000 4.250, iteration_fixed 12.000 ms, "
            "context_reserve 0.200 GiB");
  EXPECT_EQ(DescribeCorrections({}), "");
  // Exactly: a scale of CPU ranks (> 1000) read back to six digits would
  // reprice, and describe itself, differently after a restart.
  c.compute_scale["A6000"] = 1140.792345678;
  back = cal.FromJson(cal.ToJson(c, {1}), &generations);
  ASSERT_TRUE(back.ok()) << back.status();
  EXPECT_EQ(back->compute_scale, c.compute_scale);
  EXPECT_EQ(DescribeCorrections(*back), DescribeCorrections(c));
}

}  // namespace
}  // namespace arachne::controller
