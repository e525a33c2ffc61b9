// `arachne calibrate --runs FILE` end to end, `--calibration FILE` in plan
// and evaluate, and `arachne evaluate --measured-*`.
//
// test/data/measured_runs/a100_runs.yaml holds four gpt-neo-2.7b runs on
// 2 x 4 A100-80GB whose "measurements" are the cost model's predictions
// under known corrections (compute_scale[A100-80GB] = 1.25,
// micro_batch_fixed_ms = 3, context_reserve_gib = 2.5, the preset's
// fragmentation 0), rounded to four digits: the fit must find them again.
#include <unistd.h>

#include <algorithm>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <string>

#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "nlohmann/json.hpp"
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

TEST(CalibrateCliTest, FitsTheRunsAndWritesTheCalibration) {
  const std::string out = TempPath("cal.json");
  CliRun r = Cli({"calibrate", "--runs", Runs(), "--out", out});
  ASSERT_EQ(r.code, 0) << r.err;
  EXPECT_THAT(r.out, HasSubstr("calibrate: 4 runs from "));
  EXPECT_THAT(r.out, HasSubstr("(4 fitted on, 0 held out)"));
  EXPECT_THAT(r.out, HasSubstr("compute_scale[A100-80GB] = 1.2500"));
  EXPECT_THAT(r.out, HasSubstr("micro_batch_fixed_ms = 2.99"));
  EXPECT_THAT(r.out, HasSubstr("context_reserve_gib = 2.49"));
  EXPECT_THAT(r.out, HasSubstr("fragmentation = 0.000"));
  // Each run: measured, predicted before and after, the errors; memory
  // only where a peak was measured. The fit is exact up to the rounding.
  EXPECT_THAT(r.out,
              HasSubstr("pp2 mbs4  fitted    27.380      21.868      27.379 "
                        "     -20.1%      -0.0%       -           85.0      "
                        "  86.0        -           -  (predicted not to "
                        "fit)\n"));
  EXPECT_THAT(r.out,
              HasSubstr("pp4 mbs2  fitted    28.590      22.714      28.590 "
                        "     -20.6%      +0.0%       48.5        47.5      "
                        "  48.5        -2.1%       +0.0%\n"));
  EXPECT_THAT(r.out, HasSubstr("fitted runs: rms log error of time 0.2254 -> "
                               "0.0000, of peak memory 0.0265 -> 0.0000"));
  const nlohmann::json j = nlohmann::json::parse(ReadAll(out));
  EXPECT_EQ(j["format"], "arachne-run-calibration-1");
  EXPECT_NEAR(j["compute_scale"]["A100-80GB"].get<double>(), 1.25, 1e-3);
  EXPECT_NEAR(j["framework"]["micro_batch_fixed_ms"].get<double>(), 3, 1e-2);
  EXPECT_NEAR(j["framework"]["context_reserve_gib"].get<double>(), 2.5,
              1e-2);
  EXPECT_NEAR(j["framework"]["fragmentation"].get<double>(), 0, 1e-3);
  EXPECT_EQ(j["fitted_on"].size(), 4u);
  EXPECT_EQ(j["cluster_note"], "A100-80GB: 8 GPUs on 2 nodes, 200 Gb/s");
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
  ASSERT_EQ(Cli({"calibrate", "--runs", Runs(), "--out", cal}).code, 0);
  const std::string cluster =
      Source("test/data/measured_runs/a100_2x4.yaml");
  // A plan to evaluate: the exact planner's for the runs' model and cluster.
  CliRun plan = Cli({"plan", "--model", "gpt-neo-2.7b", "--cluster", cluster,
                     "--global-batch", "256", "--precision", "fp16",
                     "--framework", "megatron-deepspeed", "--planner",
                     "exact", "--format", "json", "--max-depth", "4"});
  ASSERT_EQ(plan.code, 0) << plan.err;
  const std::string plan_file = TempPath("plan.json");
  std::ofstream(plan_file) << plan.out;
  const std::vector<std::string> base = {
      "evaluate", "--model", "gpt-neo-2.7b", "--cluster", cluster,
      "--global-batch", "256", "--precision", "fp16", "--framework",
      "megatron-deepspeed", "--plan", plan_file, "--format", "json"};
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
  // A compute scale of 1.25 and 3 ms per micro-batch: slower.
  EXPECT_GT(ta, 1.2 * tb);
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
