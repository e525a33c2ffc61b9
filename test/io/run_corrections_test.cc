// Measured-runs files, the fit of the cost model's corrections to measured
// runs, and the calibration file (planner_service/io/measured_runs_io.h,
// planner_service/core/calibration/run_corrections.h,
// planner_service/io/run_corrections_io.h).
#include "planner_service/core/calibration/run_corrections.h"

#include <cmath>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "planner_service/io/cluster_io.h"
#include "planner_service/io/gpu_catalog_io.h"
#include "planner_service/io/measured_runs_io.h"
#include "planner_service/io/model_io.h"
#include "planner_service/io/run_corrections_io.h"

namespace arachne {
namespace {

using ::testing::HasSubstr;

class RunCorrectionsTest : public ::testing::Test {
 protected:
  void SetUp() override {
    absl::StatusOr<GpuCatalog> c = LoadGpuCatalog("");
    ASSERT_TRUE(c.ok()) << c.status();
    catalog_ = *std::move(c);
  }

  Cluster MakeCluster(const std::string& text) {
    absl::StatusOr<Cluster> c = ParseCluster(text, "test cluster", catalog_);
    EXPECT_TRUE(c.ok()) << c.status();
    return *c;
  }

  // gpt-neo-2.7b on `nodes` nodes of 4 GPUs of `gpu`, Megatron layout.
  MeasuredRun MakeRun(const std::string& label, const std::string& gpu,
                      int nodes, int tp, int pp, int dp, int mbs,
                      int global_batch = 256) {
    MeasuredRun run;
    run.label = label;
    run.source = "synthetic";
    absl::StatusOr<ModelSpec> m = ResolveModel("gpt-neo-2.7b");
    EXPECT_TRUE(m.ok()) << m.status();
    run.model = *m;
    run.training.seq_len = 2048;
    run.training.global_batch = global_batch;
    run.training.precision = Precision::kFp16;
    run.cluster = MakeCluster(
        "inter_node_gbps: 200\nnode_groups: [{gpu: " + gpu +
        ", gpus_per_node: 4, count: " + std::to_string(nodes) + "}]\n");
    absl::StatusOr<Plan> p = MegatronUniformPlan(run.model, run.training,
                                                 run.cluster, tp, pp, dp, mbs);
    EXPECT_TRUE(p.ok()) << p.status();
    run.plan = *p;
    return run;
  }

  // Sets each run's measurements to the prediction under `truth`.
  void Measure(std::vector<MeasuredRun>& runs, const RunCorrections& truth,
               bool memory) {
    for (MeasuredRun& r : runs) {
      absl::StatusOr<RunPrediction> p = PredictRun(r, truth, built_in_);
      ASSERT_TRUE(p.ok()) << p.status();
      r.measured_iteration_s = p->iteration_s;
      if (memory) r.measured_peak_gib = p->peak_gib;
    }
  }

  // A fit's options, priced over the built-in profiles.
  FitOptions Options() const {
    FitOptions o;
    o.pricing = built_in_;
    return o;
  }

  GpuCatalog catalog_;
  const RunPricingData built_in_ = ProfilesDirPricing("");
};

// --- Runs file -------------------------------------------------------------

constexpr char kRunsYaml[] = R"(
source: "test"
runs:
  - label: "pp2"
    source: "table 1 row 1"
    model: gpt-neo-2.7b
    cluster: {inter_node_gbps: 200, node_groups: [{gpu: A100-80GB, gpus_per_node: 4, count: 2}]}
    training: {seq_len: 2048, global_batch: 256, precision: fp16, framework: megatron-deepspeed}
    plan: {tp: 1, pp: 2, dp: 4, micro_batch: 4}
    measured: {iteration_s: 3.21, peak_memory_gib: 41.5}
)";

TEST_F(RunCorrectionsTest, ParsesARunWithAUniformPlan) {
  absl::StatusOr<MeasuredRunsFile> f =
      ParseMeasuredRuns(kRunsYaml, "runs.yaml", "", catalog_);
  ASSERT_TRUE(f.ok()) << f.status();
  EXPECT_EQ(f->source, "test");
  ASSERT_EQ(f->runs.size(), 1u);
  const MeasuredRun& r = f->runs[0];
  EXPECT_EQ(r.label, "pp2");
  EXPECT_EQ(r.source, "table 1 row 1");
  EXPECT_EQ(r.model.name, "gpt-neo-2.7b");
  EXPECT_EQ(r.training.global_batch, 256);
  EXPECT_EQ(r.training.precision, Precision::kFp16);
  EXPECT_EQ(r.training.framework.preset, FrameworkPreset::kMegatronDeepSpeed);
  EXPECT_EQ(r.cluster.total_gpus(), 8);
  EXPECT_DOUBLE_EQ(r.measured_iteration_s, 3.21);
  ASSERT_TRUE(r.measured_peak_gib.has_value());
  EXPECT_DOUBLE_EQ(*r.measured_peak_gib, 41.5);
  ASSERT_EQ(r.plan.templates.size(), 1u);
  const Template& t = r.plan.templates[0];
  EXPECT_EQ(t.depth(), 2);
  EXPECT_EQ(t.replicas, 4);
  EXPECT_EQ(t.micro_batch_size, 4);
  EXPECT_EQ(t.total_micro_batches, 64);
  EXPECT_EQ(t.stages[0].layer_begin, 0);
  EXPECT_EQ(t.stages[0].layer_end, 16);
  EXPECT_EQ(t.stages[1].layer_end, 32);
  // Megatron's rank order: tp, then dp, then pp. Stage 0 of the four
  // replicas is node 0's GPUs 0..3, stage 1 node 1's.
  EXPECT_EQ(t.at(0, 0).node, 0);
  EXPECT_EQ(t.at(3, 0).node, 0);
  EXPECT_EQ(t.at(3, 0).gpus[0], 3);
  EXPECT_EQ(t.at(0, 1).node, 1);
  EXPECT_EQ(t.at(2, 1).gpus[0], 2);
}

TEST_F(RunCorrectionsTest, UniformPlanSplitsUnevenLayersFrontFirst) {
  MeasuredRun run = MakeRun("x", "A100-80GB", 3, 1, 3, 4, 1, 256);
  const Template& t = run.plan.templates[0];
  ASSERT_EQ(t.depth(), 3);
  // 32 layers over 3 stages: 11, 11, 10.
  EXPECT_EQ(t.stages[0].num_layers(), 11);
  EXPECT_EQ(t.stages[1].num_layers(), 11);
  EXPECT_EQ(t.stages[2].num_layers(), 10);
}

TEST_F(RunCorrectionsTest, UniformPlanErrorsNameTheField) {
  MeasuredRun run = MakeRun("x", "A100-80GB", 2, 1, 2, 4, 1);
  absl::StatusOr<Plan> p =
      MegatronUniformPlan(run.model, run.training, run.cluster, 1, 2, 2, 1);
  EXPECT_EQ(p.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(p.status().message(),
              HasSubstr("tp * pp * dp: must be the cluster's GPU count 8, "
                        "got 1 * 2 * 2 = 4"));
  p = MegatronUniformPlan(run.model, run.training, run.cluster, 8, 1, 1, 1);
  EXPECT_THAT(p.status().message(), HasSubstr("tp: the TP group of stage 0"));
  p = MegatronUniformPlan(run.model, run.training, run.cluster, 1, 2, 4, 3);
  EXPECT_THAT(p.status().message(),
              HasSubstr("micro_batch: micro_batch * dp = 12 must divide the "
                        "global batch 256"));
}

// Parses kRunsYaml with `from` replaced by `to`; the error message.
std::string ErrorOf(const GpuCatalog& catalog, const std::string& from,
                    const std::string& to) {
  std::string text = kRunsYaml;
  const size_t at = text.find(from);
  EXPECT_NE(at, std::string::npos) << from;
  text.replace(at, from.size(), to);
  absl::StatusOr<MeasuredRunsFile> f =
      ParseMeasuredRuns(text, "runs.yaml", "", catalog);
  EXPECT_EQ(f.status().code(), absl::StatusCode::kInvalidArgument);
  return std::string(f.status().message());
}

TEST_F(RunCorrectionsTest, RunsFileErrorsNameTheRunAndField) {
  EXPECT_EQ(ErrorOf(catalog_, "iteration_s: 3.21", "iteration_s: 0"),
            "runs.yaml: runs[0] (\"pp2\"): measured.iteration_s: must be a "
            "number > 0, got 0");
  EXPECT_THAT(ErrorOf(catalog_, "iteration_s: 3.21, ", ""),
              HasSubstr("runs[0] (\"pp2\"): measured: missing required field "
                        "\"iteration_s\""));
  EXPECT_THAT(ErrorOf(catalog_, "dp: 4", "dp: 3"),
              HasSubstr("runs[0] (\"pp2\"): plan: tp * pp * dp: must be the "
                        "cluster's GPU count 8, got 1 * 2 * 3 = 6"));
  EXPECT_THAT(ErrorOf(catalog_, "    source: \"table 1 row 1\"\n", ""),
              HasSubstr("runs[0] (\"pp2\"): missing required field "
                        "\"source\""));
  EXPECT_THAT(ErrorOf(catalog_, "model: gpt-neo-2.7b", "model: gpt-7"),
              HasSubstr("runs[0] (\"pp2\"): model: "));
  EXPECT_THAT(ErrorOf(catalog_, "plan: {", "plan_file: x.json\n    plan: {"),
              HasSubstr("runs[0] (\"pp2\"): give one of plan and plan_file, "
                        "not both"));
  EXPECT_THAT(ErrorOf(catalog_, "measured:", "meassured:"),
              HasSubstr("unknown field \"meassured\""));
  // A second run with the same label.
  std::string twice = kRunsYaml;
  twice += twice.substr(twice.find("  - label"));
  absl::StatusOr<MeasuredRunsFile> f =
      ParseMeasuredRuns(twice, "runs.yaml", "", catalog_);
  EXPECT_EQ(f.status().message(),
            "runs.yaml: runs[1].label: duplicate label \"pp2\" (also "
            "runs[0])");
}

TEST_F(RunCorrectionsTest, InlineModelEntry) {
  std::string text = kRunsYaml;
  const std::string from = "model: gpt-neo-2.7b";
  text.replace(text.find(from), from.size(),
               "model: {name: small, architecture: LlamaForCausalLM, "
               "num_layers: 4, hidden: 1024, num_heads: 8, num_kv_heads: 8, "
               "ffn: 4096, vocab: 32000, profile_name: gpt-neo-2.7b}");
  absl::StatusOr<MeasuredRunsFile> f =
      ParseMeasuredRuns(text, "runs.yaml", "", catalog_);
  ASSERT_TRUE(f.ok()) << f.status();
  EXPECT_EQ(f->runs[0].model.name, "small");
  EXPECT_EQ(f->runs[0].model.num_layers, 4);
}

// --- Fit -------------------------------------------------------------------

TEST_F(RunCorrectionsTest, PredictRunAppliesTheCorrections) {
  MeasuredRun run = MakeRun("x", "A100-80GB", 2, 1, 2, 4, 2);
  absl::StatusOr<RunPrediction> base = PredictRun(run, {}, built_in_);
  ASSERT_TRUE(base.ok()) << base.status();
  EXPECT_EQ(base->micro_batches_per_replica, 32);
  RunCorrections c;
  c.micro_batch_fixed_s = 0.01;
  c.context_reserve_gib = run.training.framework.context_reserve_gib + 3;
  absl::StatusOr<RunPrediction> fixed = PredictRun(run, c, built_in_);
  ASSERT_TRUE(fixed.ok()) << fixed.status();
  // 1F1B over 2 stages: (32 + 2 - 1) micro-batch slots, each 10 ms longer.
  EXPECT_NEAR(fixed->iteration_s - base->iteration_s, 33 * 0.01, 1e-9);
  EXPECT_NEAR(fixed->peak_gib - base->peak_gib, 3.0, 1e-9);
  c = {};
  c.compute_scale["A100-80GB"] = 2.0;
  absl::StatusOr<RunPrediction> slow = PredictRun(run, c, built_in_);
  ASSERT_TRUE(slow.ok()) << slow.status();
  EXPECT_GT(slow->iteration_s, 1.5 * base->iteration_s);
}

TEST_F(RunCorrectionsTest, RecoversComputeScaleAndFixedCost) {
  std::vector<MeasuredRun> runs = {
      MakeRun("pp2 mbs4", "A100-80GB", 2, 1, 2, 4, 4),
      MakeRun("pp2 mbs1", "A100-80GB", 2, 1, 2, 4, 1),
      MakeRun("tp2 mbs2", "A100-80GB", 2, 2, 1, 4, 2),
      MakeRun("pp4 mbs8", "A100-80GB", 2, 1, 4, 2, 8),
  };
  RunCorrections truth;
  truth.compute_scale["A100-80GB"] = 1.3;
  truth.micro_batch_fixed_s = 0.002;
  Measure(runs, truth, false);
  FitOptions o = Options();
  o.parameters = {"compute_scale", "micro_batch_fixed_ms"};
  absl::StatusOr<FitResult> r = FitCorrections(runs, o);
  ASSERT_TRUE(r.ok()) << r.status();
  ASSERT_EQ(r->corrections.compute_scale.count("A100-80GB"), 1u);
  EXPECT_NEAR(r->corrections.compute_scale.at("A100-80GB"), 1.3, 1e-3);
  ASSERT_TRUE(r->corrections.micro_batch_fixed_s.has_value());
  EXPECT_NEAR(*r->corrections.micro_batch_fixed_s * 1e3, 2.0, 1e-3);
  EXPECT_FALSE(r->corrections.iteration_fixed_s.has_value());
  EXPECT_LT(r->time_rms_log_error_after, 1e-6);
  EXPECT_GT(r->time_rms_log_error_before, 0.1);
  ASSERT_EQ(r->parameters.size(), 2u);
  EXPECT_EQ(r->parameters[0].name, "compute_scale[A100-80GB]");
  EXPECT_NEAR(r->parameters[0].value, 1.3, 1e-3);
  EXPECT_EQ(r->parameters[1].name, "micro_batch_fixed_ms");
  EXPECT_NEAR(r->parameters[1].value, 2.0, 1e-3);
  // Automatic mode fits the same two here (no peak: memory is left out).
  o.parameters.clear();
  r = FitCorrections(runs, o);
  ASSERT_TRUE(r.ok()) << r.status();
  EXPECT_NEAR(r->corrections.compute_scale.at("A100-80GB"), 1.3, 1e-3);
  EXPECT_NEAR(*r->corrections.micro_batch_fixed_s * 1e3, 2.0, 1e-3);
  EXPECT_FALSE(r->corrections.context_reserve_gib.has_value());
}

// Fitted on as many runs as parameters, a fixed cost passes through every
// run whatever error they share: the automatic fit leaves it out (named, it
// is fitted).
TEST_F(RunCorrectionsTest, AutomaticFitNeedsARunMoreThanParameters) {
  std::vector<MeasuredRun> runs = {
      MakeRun("pp2 mbs4", "A100-80GB", 2, 1, 2, 4, 4),
      MakeRun("pp2 mbs1", "A100-80GB", 2, 1, 2, 4, 1),
  };
  RunCorrections truth;
  truth.compute_scale["A100-80GB"] = 1.3;
  truth.micro_batch_fixed_s = 0.002;
  Measure(runs, truth, false);
  absl::StatusOr<FitResult> r = FitCorrections(runs, Options());
  ASSERT_TRUE(r.ok()) << r.status();
  EXPECT_FALSE(r->corrections.micro_batch_fixed_s.has_value());
  ASSERT_EQ(r->parameters.size(), 4u);  // + context reserve, fragmentation
  EXPECT_EQ(r->parameters[1].name, "micro_batch_fixed_ms");
  EXPECT_FALSE(r->parameters[1].fitted);
  EXPECT_EQ(r->parameters[1].reason,
            "2 fitted runs for 2 parameters (compute_scale[A100-80GB], "
            "micro_batch_fixed_ms): the fit would pass through every run "
            "with none left to check it; fit on one run more, or name it in "
            "--fit");
  FitOptions o = Options();
  o.parameters = {"compute_scale", "micro_batch_fixed_ms"};
  r = FitCorrections(runs, o);
  ASSERT_TRUE(r.ok()) << r.status();
  EXPECT_NEAR(*r->corrections.micro_batch_fixed_s * 1e3, 2.0, 1e-3);
}

// A fixed cost the runs determine but that predicts each run from the
// others worse than the compute scale alone does is left out.
TEST_F(RunCorrectionsTest, AutomaticFitLeavesOutWhatLeaveOneOutRejects) {
  std::vector<MeasuredRun> runs = {
      MakeRun("pp2 mbs4", "A100-80GB", 2, 1, 2, 4, 4),
      MakeRun("pp2 mbs2", "A100-80GB", 2, 1, 2, 4, 2),
      MakeRun("pp2 mbs1", "A100-80GB", 2, 1, 2, 4, 1),
  };
  RunCorrections truth;
  truth.compute_scale["A100-80GB"] = 1.3;
  Measure(runs, truth, false);
  // An error no parameter models, on the middle run only: a fixed cost
  // bends through it, and then misses the two others.
  runs[1].measured_iteration_s *= 1.10;
  absl::StatusOr<FitResult> r = FitCorrections(runs, Options());
  ASSERT_TRUE(r.ok()) << r.status();
  EXPECT_FALSE(r->corrections.micro_batch_fixed_s.has_value());
  EXPECT_EQ(r->parameters[1].name, "micro_batch_fixed_ms");
  EXPECT_FALSE(r->parameters[1].fitted);
  EXPECT_THAT(r->parameters[1].reason,
              HasSubstr("predicting each fitted run from the others "
                        "(leave-one-out), it raises the rms log error of "
                        "time from "));
  // Without the outlier the same three runs support it.
  truth.micro_batch_fixed_s = 0.002;
  Measure(runs, truth, false);
  r = FitCorrections(runs, Options());
  ASSERT_TRUE(r.ok()) << r.status();
  ASSERT_TRUE(r->corrections.micro_batch_fixed_s.has_value());
  EXPECT_NEAR(*r->corrections.micro_batch_fixed_s * 1e3, 2.0, 1e-3);
  // The report says what kept it.
  EXPECT_EQ(r->parameters[1].name, "micro_batch_fixed_ms");
  EXPECT_THAT(r->parameters[1].evidence,
              HasSubstr("leave-one-out rms log error of time "));
  EXPECT_EQ(r->parameters[0].evidence, "");  // the compute scale needs none
}

// Past ten runs the check holds out ten folds, not each run: its cost stays
// bounded however many generations the controller has measured.
TEST_F(RunCorrectionsTest, ManyRunsAreCrossValidatedInTenFolds) {
  std::vector<MeasuredRun> runs;
  for (int mbs : {1, 2, 4, 8}) {
    runs.push_back(MakeRun(absl::StrCat("pp2 mbs", mbs), "A100-80GB", 2, 1, 2,
                           4, mbs));
    runs.push_back(MakeRun(absl::StrCat("pp4 mbs", mbs), "A100-80GB", 2, 1, 4,
                           2, mbs));
    runs.push_back(MakeRun(absl::StrCat("tp2 mbs", mbs), "A100-80GB", 2, 2, 1,
                           4, mbs));
  }
  RunCorrections truth;
  truth.compute_scale["A100-80GB"] = 1.3;
  truth.micro_batch_fixed_s = 0.002;
  Measure(runs, truth, false);
  absl::StatusOr<FitResult> r = FitCorrections(runs, Options());
  ASSERT_TRUE(r.ok()) << r.status();
  ASSERT_TRUE(r->corrections.micro_batch_fixed_s.has_value());
  EXPECT_NEAR(*r->corrections.micro_batch_fixed_s * 1e3, 2.0, 1e-3);
  EXPECT_THAT(r->parameters[1].evidence,
              HasSubstr("10-fold cross-validation rms log error of time "));
}

TEST_F(RunCorrectionsTest, RecoversTwoGpuTypesAndHoldsOutARun) {
  std::vector<MeasuredRun> runs = {
      MakeRun("a100 pp2", "A100-80GB", 2, 1, 2, 4, 2),
      MakeRun("h100 pp2", "H100-80GB", 2, 1, 2, 4, 2),
      MakeRun("h100 tp2", "H100-80GB", 2, 2, 1, 4, 4),
  };
  RunCorrections truth;
  truth.compute_scale["A100-80GB"] = 0.9;
  truth.compute_scale["H100-80GB"] = 1.4;
  Measure(runs, truth, false);
  FitOptions o = Options();
  o.fit_on = {"a100 pp2", "h100 pp2"};
  absl::StatusOr<FitResult> r = FitCorrections(runs, o);
  ASSERT_TRUE(r.ok()) << r.status();
  EXPECT_NEAR(r->corrections.compute_scale.at("A100-80GB"), 0.9, 1e-3);
  EXPECT_NEAR(r->corrections.compute_scale.at("H100-80GB"), 1.4, 1e-3);
  // Two runs, one micro-batch count (32 each): the fixed cost is left out.
  EXPECT_FALSE(r->corrections.micro_batch_fixed_s.has_value());
  ASSERT_EQ(r->runs.size(), 3u);
  EXPECT_TRUE(r->runs[0].fitted_on);
  EXPECT_FALSE(r->runs[2].fitted_on);
  // The held-out run is predicted by the fitted H100 scale.
  EXPECT_NEAR(r->runs[2].after.iteration_s / r->runs[2].measured_iteration_s,
              1.0, 1e-3);
  EXPECT_EQ(r->fitted_on, (std::vector<std::string>{"a100 pp2", "h100 pp2"}));
}

TEST_F(RunCorrectionsTest, AutomaticFitDropsAFixedCostThatDominates) {
  std::vector<MeasuredRun> runs = {
      MakeRun("pp2 mbs4", "A100-80GB", 2, 1, 2, 4, 4),
      MakeRun("pp2 mbs1", "A100-80GB", 2, 1, 2, 4, 1),
      MakeRun("tp2 mbs2", "A100-80GB", 2, 2, 1, 4, 2),
  };
  // Half a second per micro-batch: most of each run's time.
  RunCorrections truth;
  truth.micro_batch_fixed_s = 0.5;
  Measure(runs, truth, false);
  absl::StatusOr<FitResult> r = FitCorrections(runs, Options());
  ASSERT_TRUE(r.ok()) << r.status();
  EXPECT_FALSE(r->corrections.micro_batch_fixed_s.has_value());
  bool noted = false;
  for (const FittedParameter& p : r->parameters) {
    if (p.name != "micro_batch_fixed_ms") continue;
    noted = true;
    EXPECT_FALSE(p.fitted);
    EXPECT_THAT(p.reason, HasSubstr("fitted (500 ms), it made up"));
  }
  EXPECT_TRUE(noted);
  // Named, it is kept, with a warning.
  FitOptions o = Options();
  o.parameters = {"compute_scale", "micro_batch_fixed_ms"};
  r = FitCorrections(runs, o);
  ASSERT_TRUE(r.ok()) << r.status();
  EXPECT_NEAR(*r->corrections.micro_batch_fixed_s, 0.5, 1e-6);
  ASSERT_FALSE(r->warnings.empty());
  EXPECT_THAT(r->warnings[0], HasSubstr("the fitted fixed costs are"));
}

TEST_F(RunCorrectionsTest, RefusesOneRunForTwoParameters) {
  std::vector<MeasuredRun> runs = {MakeRun("only", "A100-80GB", 2, 1, 2, 4, 4)};
  runs[0].measured_iteration_s = 10;
  FitOptions o = Options();
  o.parameters = {"compute_scale", "iteration_fixed_ms"};
  absl::StatusOr<FitResult> r = FitCorrections(runs, o);
  EXPECT_EQ(r.status().code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_EQ(r.status().message(),
            "iteration_fixed_ms: 1 fitted run for 2 parameters "
            "(compute_scale[A100-80GB], iteration_fixed_ms); a fit needs at "
            "least one run per parameter");
}

TEST_F(RunCorrectionsTest, RefusesFixedCostWithOneMicroBatchCount) {
  // 256 / (4 * 4) = 16 micro-batches per replica in both.
  std::vector<MeasuredRun> runs = {
      MakeRun("pp2", "A100-80GB", 2, 1, 2, 4, 4),
      MakeRun("tp2", "A100-80GB", 2, 2, 1, 4, 4),
  };
  Measure(runs, {}, false);
  FitOptions o = Options();
  o.parameters = {"compute_scale", "micro_batch_fixed_ms"};
  absl::StatusOr<FitResult> r = FitCorrections(runs, o);
  EXPECT_EQ(r.status().code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_EQ(r.status().message(),
            "micro_batch_fixed_ms: every fitted run has 16 micro-batches per "
            "replica, so it cannot be told apart from the A100-80GB compute "
            "scale");
  // Automatically it is left out, with that reason.
  o.parameters.clear();
  r = FitCorrections(runs, o);
  ASSERT_TRUE(r.ok()) << r.status();
  EXPECT_NEAR(r->corrections.compute_scale.at("A100-80GB"), 1.0, 1e-3);
  bool noted = false;
  for (const FittedParameter& p : r->parameters) {
    if (p.name == "micro_batch_fixed_ms") {
      noted = true;
      EXPECT_FALSE(p.fitted);
      EXPECT_THAT(p.reason, HasSubstr("16 micro-batches per replica"));
    }
  }
  EXPECT_TRUE(noted);
}

TEST_F(RunCorrectionsTest, RefusesFixedCostProportionalToCompute) {
  // Same micro-batch size, counts 8 / 16 / 32: the fixed cost per
  // micro-batch grows exactly as the compute does.
  std::vector<MeasuredRun> runs = {
      MakeRun("b128", "A100-80GB", 2, 1, 2, 4, 4, 128),
      MakeRun("b256", "A100-80GB", 2, 1, 2, 4, 4, 256),
      MakeRun("b512", "A100-80GB", 2, 1, 2, 4, 4, 512),
  };
  Measure(runs, {}, false);
  FitOptions o = Options();
  o.parameters = {"compute_scale", "micro_batch_fixed_ms"};
  absl::StatusOr<FitResult> r = FitCorrections(runs, o);
  EXPECT_EQ(r.status().code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_THAT(r.status().message(),
              HasSubstr("micro_batch_fixed_ms: the runs' micro-batch counts "
                        "per replica grow in proportion to their compute, so "
                        "it cannot be told apart from the A100-80GB compute "
                        "scale"));
}

// One run on A100 and H100 stages: two compute scales, one run. Named,
// the second scale refuses the fit; the automatic fit leaves it out with
// the reason and fits the first (the controller's online fit, which had
// refused every generation after a mixed plan's).
TEST_F(RunCorrectionsTest, TwoTypesThatOnlyRunTogetherFitOneScale) {
  MeasuredRun run = MakeRun("a", "A100-80GB", 2, 1, 2, 4, 2);
  run.cluster = MakeCluster(
      "node_groups: [{gpu: A100-80GB, gpus_per_node: 4, count: 1}, "
      "{gpu: H100-80GB, gpus_per_node: 4, count: 1}]");
  absl::StatusOr<Plan> p =
      MegatronUniformPlan(run.model, run.training, run.cluster, 1, 2, 4, 2);
  ASSERT_TRUE(p.ok()) << p.status();
  run.plan = *p;
  run.measured_iteration_s = 5;
  FitOptions named = Options();
  named.parameters = {"compute_scale"};
  absl::StatusOr<FitResult> refused = FitCorrections({run}, named);
  EXPECT_EQ(refused.status().code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_THAT(refused.status().message(),
              HasSubstr("compute_scale[H100-80GB]: 1 fitted run for 2 "
                        "parameters"));

  absl::StatusOr<FitResult> r = FitCorrections({run}, Options());
  ASSERT_TRUE(r.ok()) << r.status();
  EXPECT_THAT(r->corrections.compute_scale,
              ::testing::ElementsAre(::testing::Key("A100-80GB")));
  const FittedParameter* h100 = nullptr;
  for (const FittedParameter& q : r->parameters)
    if (q.name == "compute_scale[H100-80GB]") h100 = &q;
  ASSERT_NE(h100, nullptr);
  EXPECT_FALSE(h100->fitted);
  EXPECT_EQ(h100->reason,
            "1 fitted run for 2 parameters (compute_scale[A100-80GB], "
            "compute_scale[H100-80GB]); a fit needs at least one run per "
            "parameter");
  // The one scale fitted passes through the run.
  ASSERT_EQ(r->runs.size(), 1u);
  EXPECT_NEAR(r->runs[0].after.iteration_s, 5, 5e-3);
}

// The attention scale separates the flash-attention kernel from the rest
// of a GPU type's compute: runs of two sequence lengths determine both.
// H100-80GB has no measured profiles, so its layers are synthesized and
// carry their attention share.
TEST_F(RunCorrectionsTest, RecoversAttentionScaleFromTwoSequenceLengths) {
  auto at_seq = [&](const std::string& label, int seq) {
    MeasuredRun r = MakeRun(label, "H100-80GB", 1, 1, 1, 4, 1, 64);
    r.training.seq_len = seq;
    return r;
  };
  std::vector<MeasuredRun> runs = {at_seq("s2048", 2048), at_seq("s8192", 8192),
                                   at_seq("s4096", 4096)};
  RunCorrections truth;
  truth.compute_scale["H100-80GB"] = 1.3;
  truth.attention_scale["H100-80GB"] = 1.6;
  Measure(runs, truth, false);
  FitOptions o = Options();
  o.fit_on = {"s2048", "s8192"};
  o.parameters = {"compute_scale", "attention_scale"};
  absl::StatusOr<FitResult> r = FitCorrections(runs, o);
  ASSERT_TRUE(r.ok()) << r.status();
  EXPECT_NEAR(r->corrections.compute_scale.at("H100-80GB"), 1.3, 1e-3);
  EXPECT_NEAR(r->corrections.attention_scale.at("H100-80GB"), 1.6, 1e-3);
  ASSERT_EQ(r->parameters.size(), 2u);
  EXPECT_EQ(r->parameters[1].name, "attention_scale[H100-80GB]");
  // The held-out length is predicted as measured; a compute scale alone
  // could not fit both lengths.
  ASSERT_FALSE(r->runs[2].fitted_on);
  EXPECT_NEAR(r->runs[2].after.iteration_s / runs[2].measured_iteration_s, 1.0,
              1e-4);
  o.parameters = {"compute_scale"};
  r = FitCorrections(runs, o);
  ASSERT_TRUE(r.ok()) << r.status();
  EXPECT_GT(r->time_rms_log_error_after, 0.01);
}

TEST_F(RunCorrectionsTest, RefusesAttentionScaleTheRunsDoNotDetermine) {
  // One sequence length: every run spends the same share in attention.
  std::vector<MeasuredRun> runs = {
      MakeRun("b64", "H100-80GB", 1, 1, 1, 4, 1, 64),
      MakeRun("b128", "H100-80GB", 1, 1, 1, 4, 1, 128)};
  Measure(runs, RunCorrections{}, false);
  FitOptions o = Options();
  o.parameters = {"compute_scale", "attention_scale"};
  absl::StatusOr<FitResult> r = FitCorrections(runs, o);
  EXPECT_EQ(r.status().code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_THAT(r.status().message(),
              HasSubstr("attention_scale[H100-80GB]: the fitted runs spend the "
                        "same share of their time in attention (fit it on runs "
                        "of different sequence lengths), so it cannot be told "
                        "apart from the H100-80GB compute scale"));
  // Materialized attention has no flash kernel to scale.
  for (MeasuredRun& run : runs) {
    run.training.framework.attention = AttentionKernel::kMaterialized;
  }
  runs[1].training.seq_len = 4096;
  Measure(runs, RunCorrections{}, false);
  r = FitCorrections(runs, o);
  EXPECT_EQ(r.status().code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_THAT(r.status().message(),
              HasSubstr("attention_scale[H100-80GB]: no fitted run's predicted "
                        "time depends on it (its layers have no flash-attention "
                        "time to scale"));
}

// The TP-communication scale: runs of different TP degrees spend different
// shares in TP collectives, so they tell it from the compute scale.
TEST_F(RunCorrectionsTest, RecoversTpCommScaleFromTwoTpDegrees) {
  std::vector<MeasuredRun> runs = {
      MakeRun("tp1", "H100-80GB", 1, 1, 1, 4, 1, 64),
      MakeRun("tp4", "H100-80GB", 1, 4, 1, 1, 1, 64),
      MakeRun("tp2", "H100-80GB", 1, 2, 1, 2, 1, 64)};
  RunCorrections truth;
  truth.compute_scale["H100-80GB"] = 1.2;
  truth.tp_comm_scale["H100-80GB"] = 2.0;
  Measure(runs, truth, false);
  FitOptions o = Options();
  o.fit_on = {"tp1", "tp4"};
  o.parameters = {"compute_scale", "tp_comm_scale"};
  absl::StatusOr<FitResult> r = FitCorrections(runs, o);
  ASSERT_TRUE(r.ok()) << r.status();
  EXPECT_NEAR(r->corrections.compute_scale.at("H100-80GB"), 1.2, 1e-3);
  EXPECT_NEAR(r->corrections.tp_comm_scale.at("H100-80GB"), 2.0, 1e-3);
  EXPECT_NEAR(r->runs[2].after.iteration_s / runs[2].measured_iteration_s, 1.0,
              1e-4);
  // TP 1 only: nothing to scale.
  runs = {MakeRun("a", "H100-80GB", 1, 1, 1, 4, 1, 64),
          MakeRun("b", "H100-80GB", 1, 1, 1, 4, 2, 64)};
  Measure(runs, RunCorrections{}, false);
  o.fit_on.clear();
  r = FitCorrections(runs, o);
  EXPECT_EQ(r.status().code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_THAT(r.status().message(),
              HasSubstr("tp_comm_scale[H100-80GB]: no fitted run's predicted "
                        "time depends on it (its stages run at TP 1: no TP "
                        "communication)"));
}

TEST_F(RunCorrectionsTest, FitsMemoryOverheadFromOneRun) {
  std::vector<MeasuredRun> runs = {MakeRun("pp2", "A100-80GB", 2, 1, 2, 4, 2)};
  RunCorrections truth;
  truth.context_reserve_gib = 4.25;
  Measure(runs, truth, true);
  absl::StatusOr<FitResult> r = FitCorrections(runs, Options());
  ASSERT_TRUE(r.ok()) << r.status();
  ASSERT_TRUE(r->corrections.context_reserve_gib.has_value());
  EXPECT_NEAR(*r->corrections.context_reserve_gib, 4.25, 1e-3);
  EXPECT_FALSE(r->corrections.fragmentation.has_value());
  bool noted = false;
  for (const FittedParameter& p : r->parameters) {
    if (p.name == "fragmentation") {
      noted = true;
      EXPECT_FALSE(p.fitted);
      EXPECT_THAT(p.reason, HasSubstr("1 fitted run with a measured peak for "
                                      "2 parameters"));
    }
  }
  EXPECT_TRUE(noted);
  EXPECT_NEAR(r->runs[0].after.peak_gib, *runs[0].measured_peak_gib, 1e-3);
}

TEST_F(RunCorrectionsTest, FitsOverheadAndFragmentationFromTwoSizes) {
  std::vector<MeasuredRun> runs = {
      MakeRun("mbs1", "A100-80GB", 2, 1, 2, 4, 1),
      MakeRun("mbs8", "A100-80GB", 2, 1, 2, 4, 8),
  };
  RunCorrections truth;
  truth.context_reserve_gib = 2.0;
  truth.fragmentation = 0.08;
  Measure(runs, truth, true);
  FitOptions o = Options();
  o.parameters = {"compute_scale", "context_reserve_gib", "fragmentation"};
  absl::StatusOr<FitResult> r = FitCorrections(runs, o);
  ASSERT_TRUE(r.ok()) << r.status();
  EXPECT_NEAR(*r->corrections.context_reserve_gib, 2.0, 1e-3);
  EXPECT_NEAR(*r->corrections.fragmentation, 0.08, 1e-3);
}

TEST_F(RunCorrectionsTest, FitErrorsNameTheOption) {
  std::vector<MeasuredRun> runs = {MakeRun("a", "A100-80GB", 2, 1, 2, 4, 2)};
  runs[0].measured_iteration_s = 1;
  FitOptions o = Options();
  o.fit_on = {"b"};
  EXPECT_EQ(FitCorrections(runs, o).status().message(),
            "fit_on: unknown run label \"b\" (runs: a)");
  o = Options();
  o.parameters = {"compute"};
  EXPECT_THAT(FitCorrections(runs, o).status().message(),
              HasSubstr("parameters: unknown parameter \"compute\""));
  o = Options();
  o.parameters = {"fragmentation"};
  EXPECT_EQ(FitCorrections(runs, o).status().message(),
            "fragmentation: no fitted run has a measured peak_memory_gib");
}

TEST_F(RunCorrectionsTest, ApplyCorrectionsSetsOnlyWhatIsPresent) {
  TrainingConfig t;
  t.framework.iteration_fixed_s = 0.5;
  CostParams p;
  p.compute_scale["H100-80GB"] = 1.1;
  RunCorrections c;
  c.compute_scale["A100-80GB"] = 1.3;
  c.micro_batch_fixed_s = 0.002;
  ApplyCorrections(c, &t, &p);
  EXPECT_DOUBLE_EQ(p.compute_scale.at("A100-80GB"), 1.3);
  EXPECT_DOUBLE_EQ(p.compute_scale.at("H100-80GB"), 1.1);
  EXPECT_DOUBLE_EQ(t.framework.micro_batch_fixed_s, 0.002);
  EXPECT_DOUBLE_EQ(t.framework.iteration_fixed_s, 0.5);
}

// --- Calibration file ------------------------------------------------------

TEST_F(RunCorrectionsTest, CalibrationFileRoundTrip) {
  RunCalibrationFile f;
  f.corrections.compute_scale["A100-80GB"] = 1.31;
  f.corrections.attention_scale["H100"] = 1.62;
  f.corrections.tp_comm_scale["V100-16GB"] = 2.5;
  f.corrections.micro_batch_fixed_s = 0.0012;
  f.corrections.context_reserve_gib = 2.5;
  f.corrections.fragmentation = 0.07;
  f.fitted_on = {"a", "b"};
  f.cluster_note = "A100-80GB: 8 GPUs on 2 nodes, 200 Gb/s";
  const nlohmann::json j = RunCalibrationToJson(f);
  EXPECT_EQ(j["format"], "arachne-run-calibration-1");
  EXPECT_DOUBLE_EQ(j["framework"]["micro_batch_fixed_ms"].get<double>(), 1.2);
  absl::StatusOr<RunCalibrationFile> back =
      RunCalibrationFromJson(j, catalog_, "cal.json");
  ASSERT_TRUE(back.ok()) << back.status();
  EXPECT_EQ(back->fitted_on, f.fitted_on);
  EXPECT_EQ(back->cluster_note, f.cluster_note);
  EXPECT_DOUBLE_EQ(back->corrections.compute_scale.at("A100-80GB"), 1.31);
  // An alias is read back as the canonical id.
  EXPECT_DOUBLE_EQ(back->corrections.attention_scale.at("H100-80GB"), 1.62);
  EXPECT_DOUBLE_EQ(back->corrections.tp_comm_scale.at("V100-16GB"), 2.5);
  EXPECT_NEAR(*back->corrections.micro_batch_fixed_s, 0.0012, 1e-15);
  EXPECT_DOUBLE_EQ(*back->corrections.context_reserve_gib, 2.5);
  EXPECT_DOUBLE_EQ(*back->corrections.fragmentation, 0.07);
  EXPECT_FALSE(back->corrections.iteration_fixed_s.has_value());
}

std::string CalibrationError(const GpuCatalog& catalog,
                             const std::string& text) {
  absl::StatusOr<RunCalibrationFile> f =
      RunCalibrationFromJson(nlohmann::json::parse(text), catalog, "cal.json");
  EXPECT_EQ(f.status().code(), absl::StatusCode::kInvalidArgument) << text;
  return std::string(f.status().message());
}

TEST_F(RunCorrectionsTest, CalibrationFileErrorsNameTheField) {
  EXPECT_EQ(CalibrationError(catalog_, R"({"format": "x"})"),
            "cal.json: format: must be \"arachne-run-calibration-1\", got "
            "\"x\"");
  EXPECT_THAT(
      CalibrationError(catalog_, R"({"format": "arachne-run-calibration-1",
                                     "compute_scale": {"Z100": 1}})"),
      HasSubstr("cal.json: compute_scale.Z100: "));
  EXPECT_EQ(
      CalibrationError(catalog_, R"({"format": "arachne-run-calibration-1",
                                     "compute_scale": {"A100-80GB": -1}})"),
      "cal.json: compute_scale.A100-80GB: must be a number > 0, got -1");
  EXPECT_THAT(
      CalibrationError(catalog_, R"({"format": "arachne-run-calibration-1",
                                     "framework": {"fragmentation": 2}})"),
      HasSubstr("cal.json: framework.fragmentation: "));
  EXPECT_THAT(
      CalibrationError(catalog_, R"({"format": "arachne-run-calibration-1",
                                     "framework": {"attention": 1}})"),
      HasSubstr("cal.json: framework: unknown field \"attention\""));
  EXPECT_THAT(CalibrationError(catalog_, R"({"format":
      "arachne-run-calibration-1", "scale": {}})"),
              HasSubstr("unknown field \"scale\""));
}

}  // namespace
}  // namespace arachne
