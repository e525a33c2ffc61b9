// `arachne calibrate --runs FILE` end to end, `--calibration FILE` in plan
// and evaluate, and `arachne evaluate --measured-*`.
//
// test/data/measured_runs/a100_runs.yaml holds four gpt-neo-2.7b runs on
// 2 x 4 A100-80GB. Its figures are not measurements; tests that need a
// known answer replace them by the current cost model's predictions under
// known corrections (SyntheticRuns), so they do not depend on the model's
// figures of the day.
#include <unistd.h>

#include <algorithm>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <string>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "nlohmann/json.hpp"
#include "planner_service/io/gpu_catalog_io.h"
#include "planner_service/io/measured_runs_io.h"
#include "planner_service/io/run_corrections_io.h"
#include "test/cli/cli_runner.h"

namespace arachne {
namespace {

using ::arachne::testing::Cli;
using ::arachne::testing::CliRun;
using ::testing::HasSubstr;
using ::testing::Not;

std::string Source(const std::string& relative) {
  return std::string(ARACHNE_SOURCE_DIR) + "/" + relative;
}

std::string Runs() { return Source("test/data/measured_runs/a100_runs.yaml"); }

std::string TempPath(const std::string& name) {
  const std::filesystem::path dir =
      std::filesystem::temp_directory_path() /
      ("calibrate_cli_test_" + std::to_string(::getpid()));
  std::filesystem::create_directories(dir);
  return (dir / name).string();
}

std::string ReadAll(const std::string& path) {
  std::ifstream in(path);
  std::stringstream s;
  s << in.rdbuf();
  return s.str();
}

// The runs of a100_runs.yaml with their measurements replaced by the cost
// model's predictions under `truth` (full precision), in a temporary file:
// what a fit must recover whatever the cost model's current figures are.
std::string SyntheticRuns(const RunCorrections& truth) {
  absl::StatusOr<GpuCatalog> catalog = LoadGpuCatalog("");
  EXPECT_TRUE(catalog.ok()) << catalog.status();
  absl::StatusOr<MeasuredRunsFile> file =
      LoadMeasuredRunsFile(Runs(), *catalog);
  EXPECT_TRUE(file.ok()) << file.status();
  std::string text = ReadAll(Runs());
  size_t at = 0;
  for (const MeasuredRun& run : file->runs) {
    absl::StatusOr<RunPrediction> p =
        PredictRun(run, truth, ProfilesDirPricing(""));
    EXPECT_TRUE(p.ok()) << p.status();
    at = text.find("measured: {", at);
    const size_t close = text.find('}', at);
    std::string m =
        absl::StrFormat("measured: {iteration_s: %.17g", p->iteration_s);
    if (run.measured_peak_gib) {
      m += absl::StrFormat(", peak_memory_gib: %.17g", p->peak_gib);
    }
    text.replace(at, close - at, m);
    at += m.size();
  }
  const std::string rel = "cluster_file: a100_2x4.yaml";
  for (size_t c = text.find(rel); c != std::string::npos;
       c = text.find(rel, c)) {
    const std::string abs =
        "cluster_file: " + Source("test/data/measured_runs/a100_2x4.yaml");
    text.replace(c, rel.size(), abs);
    c += abs.size();
  }
  const std::string path = TempPath("synthetic_runs.yaml");
  std::ofstream(path) << text;
  return path;
}

TEST(CalibrateCliTest, FitsTheRunsFileAndWritesTheCalibration) {
  const std::string out = TempPath("cal.json");
  CliRun r = Cli({"calibrate", "--runs", Runs(), "--out", out});
  ASSERT_EQ(r.code, 0) << r.err;
  EXPECT_THAT(r.out, HasSubstr("calibrate: 4 runs from " + Runs() +
                               " (4 fitted on, 0 held out)\n"));
  EXPECT_THAT(r.out, HasSubstr("run       set       measured s  before s    "
                               "after s     err before  err after   meas GiB"));
  // The measured figures of the file, in the rows of their runs.
  EXPECT_THAT(r.out, HasSubstr("pp2 mbs4  fitted    11.950 "));
  EXPECT_THAT(r.out, HasSubstr("pp4 mbs2  fitted    13.530 "));
  EXPECT_THAT(r.out, HasSubstr("\nfitted:\n  compute_scale[A100-80GB] = "));
  // The fit lowers the error of the runs it is fitted on.
  const size_t rms = r.out.find("fitted runs: rms log error of time ");
  ASSERT_NE(rms, std::string::npos) << r.out;
  double before = 0, after = 0;
  ASSERT_EQ(std::sscanf(r.out.c_str() + rms,
                        "fitted runs: rms log error of time %lf -> %lf",
                        &before, &after),
            2);
  EXPECT_LT(after, before);
  EXPECT_THAT(r.out, HasSubstr("wrote " + out));
  const nlohmann::json j = nlohmann::json::parse(ReadAll(out));
  EXPECT_EQ(j["format"], "arachne-run-calibration-1");
  EXPECT_TRUE(j["compute_scale"].contains("A100-80GB"));
  EXPECT_EQ(j["fitted_on"].size(), 4u);
  EXPECT_EQ(j["cluster_note"], "A100-80GB: 8 GPUs on 2 nodes, 200 Gb/s");
}

TEST(CalibrateCliTest, RecoversKnownCorrections) {
  RunCorrections truth;
  truth.compute_scale["A100-80GB"] = 1.25;
  truth.micro_batch_fixed_s = 0.003;
  truth.context_reserve_gib = 2.5;
  truth.fragmentation = 0.05;
  const std::string out = TempPath("recovered.json");
  CliRun r = Cli({"calibrate", "--runs", SyntheticRuns(truth), "--out", out});
  ASSERT_EQ(r.code, 0) << r.err;
  // The optional ones with the leave-one-out errors that kept them.
  EXPECT_THAT(r.out, HasSubstr("\nfitted:\n"
                               "  compute_scale[A100-80GB] = 1.25\n"
                               "  micro_batch_fixed_ms = 3 (kept: leave-one-out "
                               "rms log error of time "));
  EXPECT_THAT(r.out, HasSubstr("  context_reserve_gib = 2.5\n"
                               "  fragmentation = 0.05 (kept: leave-one-out "
                               "rms log error of peak memory "));
  EXPECT_THAT(r.out, HasSubstr("-> 0.0000, of peak memory "));
  EXPECT_THAT(r.out, Not(HasSubstr("warning:")));
  EXPECT_THAT(r.out, Not(HasSubstr("not fitted:")));
  const nlohmann::json j = nlohmann::json::parse(ReadAll(out));
  EXPECT_NEAR(j["compute_scale"]["A100-80GB"].get<double>(), 1.25, 1e-4);
  EXPECT_NEAR(j["framework"]["micro_batch_fixed_ms"].get<double>(), 3, 1e-3);
  EXPECT_NEAR(j["framework"]["context_reserve_gib"].get<double>(), 2.5, 1e-4);
  EXPECT_NEAR(j["framework"]["fragmentation"].get<double>(), 0.05, 1e-5);
}

TEST(CalibrateCliTest, HeldOutRunsAreMarked) {
  CliRun r = Cli({"calibrate", "--runs", Runs(), "--fit-on",
                  "pp2 mbs4,pp2 mbs1,tp2 mbs2"});
  ASSERT_EQ(r.code, 0) << r.err;
  EXPECT_THAT(r.out, HasSubstr("(3 fitted on, 1 held out)"));
  EXPECT_THAT(r.out, HasSubstr("pp4 mbs2  held-out"));
  EXPECT_THAT(r.out, HasSubstr("held-out runs: rms log error of time"));
}

TEST(CalibrateCliTest, RefusalExitsWithTheReason) {
  CliRun r = Cli({"calibrate", "--runs", Runs(), "--fit-on", "pp2 mbs4",
                  "--fit", "compute_scale,micro_batch_fixed_ms"});
  EXPECT_EQ(r.code, 2);
  EXPECT_EQ(r.err,
            "error: micro_batch_fixed_ms: the only fitted run has 16 "
            "micro-batches per replica, so it cannot be told apart from the "
            "A100-80GB compute scale\n");
  r = Cli({"calibrate", "--runs", Runs(), "--fit-on", "nope"});
  EXPECT_EQ(r.code, 2);
  EXPECT_THAT(r.err, HasSubstr("error: --fit-on: unknown run label \"nope\""));
  r = Cli({"calibrate", "--runs", Source("test/data/measured_runs/none.yaml")});
  EXPECT_EQ(r.code, 2);
}

TEST(CalibrateCliTest, CalibrationAppliesInEvaluate) {
  const std::string cal = TempPath("eval_cal.json");
  std::ofstream(cal) << R"({"format": "arachne-run-calibration-1",
                           "compute_scale": {"A100-80GB": 1.5},
                           "framework": {"micro_batch_fixed_ms": 3}})";
  const std::string cluster = Source("test/data/measured_runs/a100_2x4.yaml");
  // A plan to evaluate: the exact planner's for the runs' model and cluster.
  CliRun plan = Cli({"plan", "--model", "gpt-neo-2.7b", "--cluster", cluster,
                     "--global-batch", "256", "--precision", "fp16",
                     "--framework", "megatron-deepspeed", "--planner", "exact",
                     "--format", "json", "--max-depth", "4"});
  ASSERT_EQ(plan.code, 0) << plan.err;
  const std::string plan_file = TempPath("plan.json");
  std::ofstream(plan_file) << plan.out;
  const std::vector<std::string> base = {"evaluate",
                                         "--model",
                                         "gpt-neo-2.7b",
                                         "--cluster",
                                         cluster,
                                         "--global-batch",
                                         "256",
                                         "--precision",
                                         "fp16",
                                         "--framework",
                                         "megatron-deepspeed",
                                         "--plan",
                                         plan_file,
                                         "--format",
                                         "json"};
  CliRun before = Cli(base);
  ASSERT_EQ(before.code, 0) << before.err;
  std::vector<std::string> with = base;
  with.insert(with.end(), {"--calibration", cal});
  CliRun after = Cli(with);
  ASSERT_EQ(after.code, 0) << after.err;
  const double tb =
      nlohmann::json::parse(before.out)["iteration_time_s"].get<double>();
  const double ta =
      nlohmann::json::parse(after.out)["iteration_time_s"].get<double>();
  // A compute scale of 1.5 and 3 ms per micro-batch: slower.
  EXPECT_GT(ta, 1.3 * tb);
  // --measured-*: relative error lines (on stderr in json format).
  std::vector<std::string> measured = with;
  measured.insert(measured.end(),
                  {"--measured-iteration-s", std::to_string(ta * 1.1),
                   "--measured-peak-gib", "30"});
  CliRun m = Cli(measured);
  ASSERT_EQ(m.code, 0) << m.err;
  EXPECT_THAT(m.err, HasSubstr("measured iteration: "));
  EXPECT_THAT(m.err, HasSubstr("error -9.1%"));
  EXPECT_THAT(m.err, HasSubstr("measured peak memory: 30 GiB per GPU"));
  // In table format, on stdout after the plan.
  measured.erase(std::find(measured.begin(), measured.end(), "--format"),
                 std::find(measured.begin(), measured.end(), "--format") + 2);
  m = Cli(measured);
  ASSERT_EQ(m.code, 0) << m.err;
  EXPECT_THAT(m.out, HasSubstr("error -9.1%"));
  EXPECT_THAT(m.err, Not(HasSubstr("measured")));
  // A measurement that is not a finite number > 0 is refused, naming the
  // flag and the value; nothing is printed as if it had not been given.
  using FlagValue = std::pair<std::string, std::string>;
  for (const auto& [flag, value] : std::vector<FlagValue>{
           {"--measured-iteration-s", "-3"},
           {"--measured-iteration-s", "0"},
           {"--measured-iteration-s", "nan"},
           {"--measured-peak-gib", "inf"},
           {"--measured-peak-gib", "lots"}}) {
    std::vector<std::string> bad = with;
    bad.insert(bad.end(), {flag, value});
    CliRun r = Cli(bad);
    EXPECT_EQ(r.code, 2) << flag << " " << value;
    EXPECT_EQ(r.err, absl::StrCat("error: ", flag,
                                  ": must be a finite number > 0, got \"",
                                  value, "\"\n"))
        << flag << " " << value;
    EXPECT_EQ(r.out, "") << flag << " " << value;
  }
}

TEST(CalibrateCliTest, FrameworkSetWinsOverTheCalibration) {
  const std::string cal = TempPath("set_cal.json");
  std::ofstream(cal) << R"({"format": "arachne-run-calibration-1",
                           "compute_scale": {"A100-80GB": 1.5},
                           "framework": {"micro_batch_fixed_ms": 3,
                                         "context_reserve_gib": 2.5}})";
  CliRun r =
      Cli({"plan", "--model", "gpt-neo-2.7b", "--cluster",
           Source("test/data/measured_runs/a100_2x4.yaml"), "--global-batch",
           "256", "--planner", "exact", "--max-depth", "2", "--format", "json",
           "--calibration", cal, "--framework-set", "micro_batch_fixed_ms=1"});
  ASSERT_EQ(r.code, 0) << r.err;
  const nlohmann::json fw =
      nlohmann::json::parse(r.out)["training"]["framework"];
  EXPECT_DOUBLE_EQ(fw["micro_batch_fixed_ms"].get<double>(), 1) << fw;
  EXPECT_DOUBLE_EQ(fw["context_reserve_gib"].get<double>(), 2.5) << fw;
}

TEST(CalibrateCliTest, BadCalibrationFileNamesTheField) {
  const std::string cal = TempPath("bad_cal.json");
  std::ofstream(cal) << R"({"format": "arachne-run-calibration-1",
                           "compute_scale": {"A100-80GB": 0}})";
  CliRun r = Cli({"plan", "--model", "gpt-neo-2.7b", "--cluster",
                  Source("test/data/measured_runs/a100_2x4.yaml"),
                  "--calibration", cal});
  EXPECT_EQ(r.code, 2);
  EXPECT_THAT(r.err,
              HasSubstr("error: --calibration: " + cal +
                        ": compute_scale.A100-80GB: must be a number > 0, "
                        "got 0"));
}

}  // namespace
}  // namespace arachne
