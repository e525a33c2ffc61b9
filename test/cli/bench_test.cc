// `arachne bench`: an end-to-end run over the tiny suite in test/data/bench
// (exact planner, a few hundred evaluations), the files it writes, the
// markdown normalisation, the plan summary, and the errors for bad input;
// the learned planner with and without a registered policy factory.
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <string>
#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/str_split.h"
#include "bench/harness/bench_runner.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "planner_service/core/learned/learned_planner.h"
#include "planner_service/core/planners.h"
#include "planner_service/io/gpu_catalog_io.h"
#include "test/cli/cli_runner.h"
#include "test/core/uniform_policy.h"

namespace arachne {
namespace {

using ::testing::ElementsAre;
using ::testing::HasSubstr;
using ::testing::Not;
using ::testing::StartsWith;

using ::arachne::testing::Cli;
using ::arachne::testing::CliRun;

std::string TinySuite() {
  return std::string(ARACHNE_SOURCE_DIR) + "/test/data/bench";
}

std::filesystem::path TempDir(const std::string& name) {
  const std::filesystem::path dir =
      std::filesystem::temp_directory_path() / ("arachne_bench_test_" + name);
  std::filesystem::remove_all(dir);
  return dir;
}

std::string ReadFile(const std::filesystem::path& path) {
  std::ifstream f(path);
  std::stringstream ss;
  ss << f.rdbuf();
  return ss.str();
}

std::vector<std::string> Lines(const std::string& text) {
  return absl::StrSplit(text, '\n', absl::SkipEmpty());
}

constexpr char kResultsHeader[] =
    "scenario,figure,kind,model,composition,gpus,planner,status,"
    "throughput_iters_per_s,tokens_per_s,iteration_time_s,planning_time_s,"
    "evaluations,exhaustive,gpus_used,max_depth,templates,plan,message";

TEST(BenchCommandTest, TinySuiteWritesResultsForEveryRun) {
  const std::filesystem::path out = TempDir("tiny");
  CliRun r = Cli({"bench", "--suite", TinySuite(), "--planners", "exact",
                  "--max-evaluations", "500", "--jobs", "2", "--out",
                  out.string(), "--no-plots"});
  ASSERT_EQ(r.code, 0) << r.err;
  EXPECT_THAT(r.out, HasSubstr("bench: 5 runs (4 ok, 1 no plan, 0 error)"));
  EXPECT_THAT(r.err, HasSubstr("bench: 4 scenarios, 5 compositions, 1 "
                               "planners: 5 runs + 1 random-structure "
                               "samplings on 2 threads"));
  EXPECT_THAT(r.err, HasSubstr("/6] tiny-compare | A100 node (4 GPUs) | "
                               "exact: "));
  EXPECT_THAT(r.err, HasSubstr("/6] tiny-scatter | A100 + A6000 (8 GPUs) | "
                               "random structures: "));
  EXPECT_THAT(r.err, HasSubstr("plots skipped (--no-plots)"));

  const std::vector<std::string> csv = Lines(ReadFile(out / "results.csv"));
  ASSERT_EQ(csv.size(), 6u);
  EXPECT_EQ(csv[0], kResultsHeader);
  // Scenarios in file-name order, compositions in file order.
  EXPECT_THAT(csv[1], StartsWith("tiny-compare,7a,compare,llama3-8b,"
                                 "A100 node (4 GPUs),4,exact,ok,"));
  EXPECT_THAT(csv[2], StartsWith("tiny-compare,7a,compare,llama3-8b,"
                                 "A100 + A6000 (8 GPUs),8,exact,ok,"));
  EXPECT_THAT(csv[3], StartsWith("tiny-curve,11,search_curve,llama3-8b,"
                                 "A100 + A6000 (8 GPUs),8,exact,ok,"));
  EXPECT_THAT(csv[4], StartsWith("tiny-nofit,9a,compare,qwen3-32b,"
                                 "2 A5000 (2 GPUs),2,exact,no_plan,,,,"));
  EXPECT_THAT(csv[4], HasSubstr("no plan fits qwen3-32b"));
  EXPECT_THAT(csv[5], StartsWith("tiny-scatter,4,scatter,llama3-8b,"
                                 "A100 + A6000 (8 GPUs),8,exact,ok,"));
  // The 4-GPU run's plan uses the node's GPUs and is summarised.
  EXPECT_THAT(csv[1], HasSubstr(",T1: "));
  EXPECT_THAT(csv[1], HasSubstr("A100-40GB tp"));
  // The search curve stops at its own max_evaluations (300), the others at
  // the flag's 500 (or earlier when the space is exhausted).
  const std::vector<std::string> curve_fields = absl::StrSplit(csv[3], ',');
  EXPECT_LE(std::stoll(curve_fields[12]), 300 + 16);

  // The rows written as runs finished are dropped once results.csv exists.
  EXPECT_FALSE(std::filesystem::exists(out / "results.partial.csv"));

  const std::string md = ReadFile(out / "results.md");
  EXPECT_THAT(md, HasSubstr("## Figure 7\n"));
  EXPECT_THAT(md, HasSubstr("### Figure 7(a): tiny-compare (llama3-8b)"));
  EXPECT_THAT(md,
              HasSubstr("| composition | GPUs | exact | best | best iter/s |"));
  EXPECT_THAT(md, HasSubstr("| A100 node (4 GPUs) | 4 | **1.000** ("));
  EXPECT_THAT(md, HasSubstr("| 2 A5000 (2 GPUs) | 2 | no_plan ("));
  EXPECT_THAT(md, HasSubstr("Best-so-far throughput (iter/s) after N plan "
                            "evaluations"));

  const std::vector<std::string> progress =
      Lines(ReadFile(out / "progress.csv"));
  ASSERT_GE(progress.size(), 2u);
  EXPECT_EQ(progress[0],
            "scenario,figure,composition,gpus,planner,evaluations,wall_s,"
            "best_throughput_iters_per_s");
  for (size_t i = 1; i < progress.size(); ++i) {
    EXPECT_THAT(progress[i],
                StartsWith("tiny-curve,11,A100 + A6000 (8 GPUs),8,exact,"));
  }
  const std::vector<std::string> samples =
      Lines(ReadFile(out / "fig4_samples.csv"));
  ASSERT_GE(samples.size(), 2u);
  EXPECT_LE(samples.size(), 201u);
  EXPECT_EQ(samples[0],
            "scenario,figure,model,composition,gpus,max_depth,templates,"
            "throughput_iters_per_s");
  for (size_t i = 1; i < samples.size(); ++i) {
    EXPECT_THAT(samples[i], StartsWith("tiny-scatter,4,llama3-8b,"
                                       "A100 + A6000 (8 GPUs),8,"));
  }
  EXPECT_THAT(md, HasSubstr("random plan structures feasible"));
  EXPECT_THAT(md, HasSubstr("| planner | relative throughput | pipeline depth "
                            "| samples it beats |\n|---|---:|---:|---:|\n"
                            "| exact | "));
  std::filesystem::remove_all(out);
}

TEST(BenchCommandTest, PlotsOneImagePerScenarioCurveAndScatter) {
  const std::filesystem::path out = TempDir("plots");
  CliRun r =
      Cli({"bench", "--suite", TinySuite(), "--planners", "exact",
           "--max-evaluations", "100", "--out", out.string(), "--plot-script",
           std::string(ARACHNE_SOURCE_DIR) + "/bench/plot_results.py"});
  ASSERT_EQ(r.code, 0) << r.err;
  if (r.err.find("plots skipped: no python3 with matplotlib") !=
      std::string::npos) {
    GTEST_SKIP() << "python3-matplotlib is not installed";
  }
  EXPECT_THAT(r.out, HasSubstr("(results.csv, results.md, plots)")) << r.err;
  for (const char* png :
       {"tiny-compare.png", "tiny-curve.png", "tiny-curve-curve.png",
        "tiny-nofit.png", "tiny-scatter.png", "tiny-scatter-scatter.png"}) {
    EXPECT_GT(std::filesystem::file_size(out / png), 1000u) << png;
  }
  std::filesystem::remove_all(out);
}

TEST(BenchCommandTest, ScenarioFilterRunsOnlyTheMatchingScenarios) {
  const std::filesystem::path out = TempDir("filter");
  CliRun r =
      Cli({"bench", "--suite", TinySuite(), "--scenarios", "tiny-n*,tiny-curve",
           "--planners", "EXACT", "--max-evaluations", "100", "--out",
           out.string(), "--no-plots"});
  ASSERT_EQ(r.code, 0) << r.err;
  const std::vector<std::string> csv = Lines(ReadFile(out / "results.csv"));
  ASSERT_EQ(csv.size(), 3u);
  EXPECT_THAT(csv[1], StartsWith("tiny-curve,"));
  EXPECT_THAT(csv[2], StartsWith("tiny-nofit,"));
  std::filesystem::remove_all(out);
}

TEST(BenchRunnerTest, PartialCsvHoldsEveryFinishedRun) {
  const std::filesystem::path out = TempDir("partial");
  BenchOptions options;
  options.suite_dir = TinySuite();
  options.scenario_patterns = {"tiny-compare"};
  options.planners = {"exact"};
  options.max_evaluations = 50;
  options.jobs = 1;
  options.partial_csv = (out / "sub" / "results.partial.csv").string();
  std::ostringstream log;
  absl::StatusOr<BenchResults> results = RunBench(options, log);
  ASSERT_TRUE(results.ok()) << results.status();
  // Same rows as the final results.csv (one job: the same order).
  EXPECT_EQ(ReadFile(options.partial_csv), ResultsCsv(*results));
  EXPECT_EQ(Lines(ReadFile(options.partial_csv)).size(), 3u);
  std::filesystem::remove_all(out);
}

TEST(BenchCommandTest, BadInputExitsTwoNamingTheFlagFileOrField) {
  const std::string out = TempDir("bad").string();
  CliRun r = Cli({"bench", "--suite", "/nonexistent/suite", "--out", out});
  EXPECT_EQ(r.code, kExitBadInput);
  EXPECT_EQ(r.err, "error: --suite: /nonexistent/suite is not a directory\n");

  r = Cli({"bench", "--suite", TinySuite(), "--planners", "exact,magic",
           "--out", out});
  EXPECT_EQ(r.code, kExitBadInput);
  EXPECT_THAT(r.err, StartsWith("error: --planners: unknown planner \"magic\"; "
                                "known: exact"));

  r = Cli({"bench", "--suite", TinySuite(), "--planners", "exact,exact",
           "--out", out});
  EXPECT_EQ(r.code, kExitBadInput);
  EXPECT_EQ(r.err, "error: --planners: \"exact\" is listed twice\n");

  r = Cli({"bench", "--suite", TinySuite(), "--budget", "0", "--out", out});
  EXPECT_EQ(r.code, kExitBadInput);
  EXPECT_EQ(r.err, "error: --budget: must be > 0 seconds, got 0\n");

  r = Cli(
      {"bench", "--suite", TinySuite(), "--scenarios", "fig01*", "--out", out});
  EXPECT_EQ(r.code, kExitBadInput);
  EXPECT_THAT(r.err, HasSubstr("error: --scenarios: \"fig01*\" matches no "
                               "scenario in "));

  const std::filesystem::path suite = TempDir("bad_suite");
  std::filesystem::create_directories(suite);
  std::ofstream(suite / "broken.yaml")
      << "name: broken\nfigure: \"1\"\nkind: compare\nmodel: llama3-8b\n"
         "compositions:\n  - {label: a, gpus: 4, cluster: {nodes: [{name: n, "
         "gpu: A6000, gpus: four}]}}\n";
  r = Cli({"bench", "--suite", suite.string(), "--out", out});
  EXPECT_EQ(r.code, kExitBadInput);
  EXPECT_EQ(r.err, "error: " + (suite / "broken.yaml").string() +
                       ": compositions[0].cluster: nodes[0].gpus: must be an "
                       "integer, got \"four\"\n");
  EXPECT_FALSE(std::filesystem::exists(out));
  std::filesystem::remove_all(suite);
}

// A hand-made result set: the markdown normalises each composition to its
// best planner and marks the winner.
TEST(BenchOutputTest, MarkdownNormalisesToTheBestPlannerOfEachComposition) {
  BenchResults results;
  results.options.planners = {"exact", "random"};
  results.options.jobs = 1;
  Scenario s;
  s.name = "demo";
  s.figure = "10b";
  s.model = "qwen3-64b";
  s.description = "two planners";
  Composition c;
  c.label = "64+64 (128 GPUs)";
  c.gpus = 128;
  s.compositions = {c};
  results.scenarios = {s};
  BenchRun exact;
  exact.planner = "exact";
  exact.status = RunStatus::kOk;
  exact.prediction.throughput_iters_per_s = 0.2;
  exact.planning_time_s = 1.5;
  BenchRun random = exact;
  random.planner = "random";
  random.prediction.throughput_iters_per_s = 0.05;
  random.planning_time_s = 250;
  results.runs = {exact, random};

  const std::string md = ResultsMarkdown(results);
  EXPECT_THAT(md, HasSubstr("## Figure 10\n\n### Figure 10(b): demo "
                            "(qwen3-64b)\n\ntwo planners\n\n"));
  EXPECT_THAT(md, HasSubstr("| composition | GPUs | exact | random | best | "
                            "best iter/s |\n|---|---:|---:|---:|---|---:|\n"
                            "| 64+64 (128 GPUs) | 128 | **1.000** (1.5 s) | "
                            "0.250 (250 s) | exact | 0.2000 |\n"));
  EXPECT_THAT(md, HasSubstr("\n**Summary** (1 compositions). Best plan: "
                            "exact 1. The exact planner's lead over the best "
                            "other planner: min +300.0%, median +300.0%, max "
                            "+300.0%. Ahead of exact: none.\n"));

  // A baseline ahead of the exact planner is named with its margin.
  results.runs[1].prediction.throughput_iters_per_s = 0.25;
  EXPECT_THAT(ResultsMarkdown(results),
              HasSubstr("Best plan: random 1. The exact planner's lead over "
                        "the best other planner: min -20.0%, median -20.0%, "
                        "max -20.0%. Ahead of exact: demo 64+64 (128 GPUs): "
                        "random +25.0%.\n"));
  results.runs[1].prediction.throughput_iters_per_s = 0.05;

  const std::vector<std::string> csv = Lines(ResultsCsv(results));
  ASSERT_EQ(csv.size(), 3u);
  EXPECT_EQ(csv[2],
            "demo,10b,compare,qwen3-64b,64+64 (128 GPUs),128,random,ok,0.05,0,"
            "0,250,0,false,0,0,0,,");
}

TEST(BenchOutputTest, PlanSummaryListsTemplatesStagesAndExpertTiling) {
  absl::StatusOr<GpuCatalog> catalog = LoadGpuCatalog();
  ASSERT_TRUE(catalog.ok()) << catalog.status();
  Plan plan;
  Template t;
  t.replicas = 12;
  t.micro_batch_size = 4;
  Stage a;
  a.gpu_type = *catalog->IndexOf("A100-40GB");
  a.tp = 4;
  a.layer_begin = 0;
  a.layer_end = 3;
  Stage h;
  h.gpu_type = *catalog->IndexOf("H100");
  h.tp = 2;
  h.layer_begin = 3;
  h.layer_end = 32;
  h.tiling = ExpertTiling{4, 2, 3};
  t.stages = {a, h};
  plan.templates = {t};
  t.replicas = 1;
  t.micro_batch_size = 1;
  t.stages = {a};
  plan.templates.push_back(t);
  EXPECT_EQ(PlanSummary(plan, *catalog),
            "T1: 12x mbs4 [A100-40GB tp4 L0-3 > H100-80GB tp2 ep4/etp2/edp3 "
            "L3-32]; T2: 1x mbs1 [A100-40GB tp4 L0-3]");
}

TEST(BenchOutputTest, PlotsAreSkippedWithAMessageWhenTheScriptIsMissing) {
  std::ostringstream log;
  EXPECT_FALSE(DrawPlots("/nonexistent/plot_results.py", "/tmp/out", log));
  EXPECT_EQ(log.str(),
            "bench: plots skipped: plot script /nonexistent/plot_results.py "
            "not found; draw them with: python3 "
            "'/nonexistent/plot_results.py' '/tmp/out'\n");
}

// --- The learned planner in the bench ---

using ::arachne::testing::UniformPolicy;

// A policy for llama3-8b only; any other model gets the factory's
// no-policy error, as a model without a checkpoint or relative does.
PolicyModelFactory Llama3Only() {
  return
      [](const CostModel& cm) -> absl::StatusOr<std::unique_ptr<PolicyModel>> {
        if (cm.model().name != "llama3-8b") {
          return absl::FailedPreconditionError(
              NoPolicyMessage(cm.model().name, "no checkpoint in the test"));
        }
        return std::unique_ptr<PolicyModel>(std::make_unique<UniformPolicy>());
      };
}

// A policies directory like profiles/policies: llama3-8b trained in two
// runs (the .json holds the last run; stage1's curve the earlier one).
std::filesystem::path FakePoliciesDir(const std::string& name) {
  const std::filesystem::path dir = TempDir(name);
  std::filesystem::create_directories(dir);
  std::ofstream(dir / "llama3-8b.pt") << "weights";
  std::ofstream(dir / "llama3-8b.json")
      << R"({"format_version": 1, "model": "llama3-8b", "training": )"
      << R"({"episodes": 1000, "compositions": 8, "seed": 2, "wall_s": 12.5}})";
  std::ofstream(dir / "llama3-8b.stage1.curve.csv")
      << "iteration,episodes,elapsed_s,mean_reward,best_reward,"
         "greedy_reward,forced_probability,loss\n"
         "1,32,0.4,0.1,0.2,0.1,0.8,0.5\n"
         "2,500,7.5,0.3,0.4,0.2,0.7,0.1\n";
  // Another model's curve and the last run's own curve are not stages.
  std::ofstream(dir / "llama3-8b.curve.csv") << "iteration,episodes\n";
  std::ofstream(dir / "llama3-70b.curve.csv") << "iteration,episodes\n";
  return dir;
}

TEST(BenchLearnedTest, WithoutAPolicyFactoryLearnedIsNotListedAndIsSkipped) {
  RegisterLearnedPolicyFactory(nullptr);
  EXPECT_THAT(PlannerNames(), Not(::testing::Contains("learned")));
  const std::filesystem::path out = TempDir("no_factory");

  // Named explicitly: left out with a note, the other planners run.
  CliRun r =
      Cli({"bench", "--suite", TinySuite(), "--scenarios", "tiny-compare",
           "--planners", "exact,learned", "--max-evaluations", "50", "--out",
           out.string(), "--no-plots"});
  ASSERT_EQ(r.code, 0) << r.err;
  EXPECT_THAT(r.err, HasSubstr("bench: note: learned skipped: no learned "
                               "policy in this build (it needs LibTorch: "
                               "-DARACHNE_WITH_TORCH=ON)\n"));
  EXPECT_THAT(r.out, HasSubstr("bench: 2 runs (2 ok, 0 no plan, 0 error)"));
  const std::string csv = ReadFile(out / "results.csv");
  EXPECT_THAT(csv, Not(HasSubstr(",learned,")));
  const std::string md = ReadFile(out / "results.md");
  EXPECT_THAT(md, HasSubstr("Planners: exact. "));
  EXPECT_THAT(md, HasSubstr("\nlearned skipped: no learned policy in this "
                            "build (it needs LibTorch: "
                            "-DARACHNE_WITH_TORCH=ON).\n"));
  EXPECT_FALSE(std::filesystem::exists(out / "learned_policies.csv"));

  // Nothing else to run: bad input.
  r = Cli({"bench", "--suite", TinySuite(), "--planners", "learned", "--out",
           out.string()});
  EXPECT_EQ(r.code, kExitBadInput);
  EXPECT_EQ(r.err,
            "error: --planners: no planner left to run (learned: no learned "
            "policy in this build (it needs LibTorch: "
            "-DARACHNE_WITH_TORCH=ON))\n");
  std::filesystem::remove_all(out);
}

class BenchWithPolicyTest : public ::testing::Test {
 protected:
  void SetUp() override { RegisterLearnedPolicyFactory(Llama3Only()); }
  void TearDown() override {
    RegisterLearnedPolicyFactory(nullptr);
    unsetenv("ARACHNE_POLICIES_DIR");
  }
};

TEST_F(BenchWithPolicyTest, LearnedRunsByDefaultAndIsSkippedWithoutAPolicy) {
  EXPECT_THAT(PlannerNames(),
              ElementsAre("exact", "amp", "espresso", "hexiscale", "metis",
                          "sailor", "random", "learned"));
  const std::filesystem::path policies = FakePoliciesDir("policies");
  BenchOptions options;
  options.suite_dir = TinySuite();
  options.scenario_patterns = {"tiny-compare", "tiny-curve", "tiny-nofit"};
  options.budget_s = 5;
  options.max_evaluations = 200;
  options.jobs = 2;
  options.policies_dir = policies.string();
  std::ostringstream log;
  absl::StatusOr<BenchResults> results = RunBench(options, log);
  ASSERT_TRUE(results.ok()) << results.status();
  EXPECT_EQ(results->options.planners, PlannerNames());

  // qwen3-32b (tiny-nofit) has no policy: one note, no learned run there.
  const std::string note =
      "learned planner: no policy for model \"qwen3-32b\": no checkpoint in "
      "the test; plan with --planner template-search instead "
      "(docs/learned-policy.md, Inference)";
  EXPECT_THAT(
      log.str(),
      HasSubstr("bench: note: learned skipped on tiny-nofit: " + note + "\n"));
  ASSERT_EQ(results->skipped.size(), 1u);
  EXPECT_EQ(results->scenarios[results->skipped[0].scenario].name,
            "tiny-nofit");
  EXPECT_EQ(results->skipped[0].reason, note);
  // 4 compositions x 7 planners + learned on the 3 llama3-8b ones.
  EXPECT_EQ(results->runs.size(), 4u * 7 + 3);

  int learned = 0;
  for (const BenchRun& run : results->runs) {
    if (run.planner != "learned") continue;
    ++learned;
    EXPECT_EQ(results->scenarios[run.scenario].model, "llama3-8b");
    EXPECT_EQ(run.status, RunStatus::kOk) << run.message;
    EXPECT_GT(run.planning_time_s, 0);
    EXPECT_GT(run.stats.evaluations, 0);
    EXPECT_FALSE(run.stats.progress.empty());
  }
  EXPECT_EQ(learned, 3);

  // Learned rows in results.csv like every planner's, with planning time and
  // evaluations.
  bool row = false;
  for (const std::string& line : Lines(ResultsCsv(*results))) {
    if (!absl::StrContains(line, ",learned,")) continue;
    const std::vector<std::string> f = absl::StrSplit(line, ',');
    ASSERT_GE(f.size(), 13u) << line;
    EXPECT_EQ(f[7], "ok") << line;
    EXPECT_GT(std::stod(f[11]), 0) << line;   // planning_time_s
    EXPECT_GT(std::stoll(f[12]), 0) << line;  // evaluations
    row = true;
  }
  EXPECT_TRUE(row);
  EXPECT_THAT(ProgressCsv(*results),
              HasSubstr("\ntiny-curve,11,A100 + A6000 (8 GPUs),8,learned,"));

  // The training behind the policy: the .json's last run plus stage1's.
  ASSERT_EQ(results->policies.size(), 1u);
  EXPECT_EQ(PoliciesCsv(*results),
            "model,policy,checkpoint,training_runs,training_rollouts,"
            "training_wall_s\nllama3-8b,llama3-8b," +
                (policies / "llama3-8b.pt").string() + ",2,1500,20\n");

  const std::string md = ResultsMarkdown(*results);
  EXPECT_THAT(md, HasSubstr("| composition | GPUs | exact | amp | espresso | "
                            "hexiscale | metis | sailor | random | learned | "
                            "best | best iter/s |\n"));
  // The nofit composition has no learned cell.
  EXPECT_THAT(md,
              HasSubstr(" - | none | - |\n\nlearned skipped: " + note + "\n"));
  EXPECT_THAT(md, HasSubstr("\nlearned: planning time only. Its policy (" +
                            (policies / "llama3-8b.pt").string() +
                            ") was trained offline before: 1500 rollouts "
                            "(one candidate plan built and scored each) in "
                            "20.0 s over 2 runs, on generated compositions "
                            "(none of this suite).\n"));
  std::filesystem::remove_all(policies);
}

TEST_F(BenchWithPolicyTest, CommandWritesLearnedRowsPoliciesAndCurvePlot) {
  const std::filesystem::path policies = FakePoliciesDir("cli_policies");
  setenv("ARACHNE_POLICIES_DIR", policies.c_str(), 1);
  const std::filesystem::path out = TempDir("cli_learned");
  CliRun r = Cli({"bench", "--suite", TinySuite(), "--scenarios", "tiny-curve",
                  "--planners", "exact,learned", "--budget", "5", "--out",
                  out.string(), "--plot-script",
                  std::string(ARACHNE_SOURCE_DIR) + "/bench/plot_results.py"});
  ASSERT_EQ(r.code, 0) << r.err;
  EXPECT_THAT(r.out, HasSubstr("bench: 2 runs (2 ok, 0 no plan, 0 error)"));
  const std::vector<std::string> csv = Lines(ReadFile(out / "results.csv"));
  ASSERT_EQ(csv.size(), 3u);
  EXPECT_THAT(csv[2], StartsWith("tiny-curve,11,search_curve,llama3-8b,"
                                 "A100 + A6000 (8 GPUs),8,learned,ok,"));
  EXPECT_EQ(ReadFile(out / "learned_policies.csv"),
            "model,policy,checkpoint,training_runs,training_rollouts,"
            "training_wall_s\nllama3-8b,llama3-8b," +
                (policies / "llama3-8b.pt").string() + ",2,1500,20\n");
  if (r.err.find("plots skipped: no python3 with matplotlib") ==
      std::string::npos) {
    EXPECT_GT(std::filesystem::file_size(out / "tiny-curve-curve.png"), 1000u)
        << r.err;
  }
  std::filesystem::remove_all(out);
  std::filesystem::remove_all(policies);
}

TEST(BenchLearnedTest, FindPolicyTrainingFollowsTheRelativeAndNamesBadFiles) {
  const std::filesystem::path dir = FakePoliciesDir("find");
  ModelSpec model;
  model.name = "llama3-8b-long";
  model.policy_relative = "llama3-8b";
  absl::StatusOr<BenchPolicy> p = FindPolicyTraining(dir.string(), model);
  ASSERT_TRUE(p.ok()) << p.status();
  EXPECT_EQ(p->policy, "llama3-8b");
  EXPECT_EQ(p->training_runs, 2);
  EXPECT_EQ(p->training_rollouts, 1500);
  EXPECT_DOUBLE_EQ(p->training_wall_s, 20.0);

  model.policy_relative = "";
  p = FindPolicyTraining(dir.string(), model);
  EXPECT_EQ(p.status().code(), absl::StatusCode::kNotFound);
  EXPECT_EQ(p.status().message(),
            "no checkpoint with metadata for "
            "llama3-8b-long in " +
                dir.string());

  std::ofstream(dir / "llama3-8b.json") << R"({"model": "llama3-8b"})";
  model.name = "llama3-8b";
  p = FindPolicyTraining(dir.string(), model);
  EXPECT_EQ(p.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(p.status().message(),
            (dir / "llama3-8b.json").string() + ": no \"training\" object");
  std::filesystem::remove_all(dir);
}

}  // namespace
}  // namespace arachne
