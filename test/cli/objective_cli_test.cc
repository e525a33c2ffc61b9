// `arachne plan --objective`: throughput versus $ per token on the smallest
// heterogeneous example (4 x A100-40GB at $1.48/h, 4 x A6000 at $2.00/h),
// and the errors for a bad value and an unpriced GPU type (the objective
// over --server: test/client/remote_cli_test.cc).
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

std::string Source(const std::string& relative) {
  return std::string(ARACHNE_SOURCE_DIR) + "/" + relative;
}

CliRun PlanSmall(const std::string& objective) {
  return Cli({"plan", "--model", "llama3-8b", "--cluster",
              Source("examples/small-8.yaml"), "--format", "json",
              "--objective", objective, "--planner", "exact", "--budget",
              "60"});
}

TEST(ObjectiveCliTest, UsdPerTokenPlansOnTheCheaperGpusOnly) {
  CliRun fast = PlanSmall("throughput");
  CliRun cheap = PlanSmall("usd_per_token");
  ASSERT_EQ(fast.code, 0) << fast.err;
  ASSERT_EQ(cheap.code, 0) << cheap.err;
  const nlohmann::json f = nlohmann::json::parse(fast.out);
  const nlohmann::json c = nlohmann::json::parse(cheap.out);
  EXPECT_TRUE(f["exhaustive"].get<bool>());
  EXPECT_TRUE(c["exhaustive"].get<bool>());
  // Throughput takes all eight GPUs: 4 x 1.48 + 4 x 2.00 $/h.
  EXPECT_EQ(f["unused_gpus"], 0);
  EXPECT_NEAR(f["usd_per_hour"].get<double>(), 13.92, 1e-9);
  EXPECT_NEAR(f["tokens_per_s"].get<double>(), 20529.6, 1);
  EXPECT_NEAR(f["usd_per_mtoken"].get<double>(), 0.18835, 1e-4);
  // $ per token leaves the A6000s idle (dearer per token than the A100s)
  // and pays for the four A100-40GB only.
  EXPECT_EQ(c["unused_gpus"], 4);
  EXPECT_NEAR(c["usd_per_hour"].get<double>(), 5.92, 1e-9);
  EXPECT_NEAR(c["tokens_per_s"].get<double>(), 12882.5, 1);
  EXPECT_NEAR(c["usd_per_mtoken"].get<double>(), 0.12765, 1e-4);
  for (const auto& t : c["templates"])
    for (const auto& s : t["stages"]) EXPECT_EQ(s["gpu_type"], "A100-40GB");
  // usd_per_mtoken is usd_per_hour / tokens per hour, per million tokens.
  EXPECT_NEAR(c["usd_per_mtoken"].get<double>(),
              c["usd_per_hour"].get<double>() /
                  (c["tokens_per_s"].get<double>() * 3600) * 1e6,
              1e-12);
}

TEST(ObjectiveCliTest, UnknownObjectiveIsBadInputNamingFlagAndValue) {
  CliRun r = PlanSmall("cheapest");
  EXPECT_EQ(r.code, 2);
  EXPECT_THAT(r.err, HasSubstr("--objective: unknown value \"cheapest\"; "
                               "expected throughput or usd_per_token"));
  EXPECT_EQ(r.out, "");
}

TEST(ObjectiveCliTest, UnpricedGpuTypeIsBadInputUnderUsdPerToken) {
  // A profiles directory whose GPU catalog leaves the A6000 unpriced.
  std::ifstream in(Source("profiles/gpus.yaml"));
  std::stringstream text;
  text << in.rdbuf();
  std::string gpus = text.str();
  const std::string price = "usd_per_hour: 2.00";  // the A6000's
  const size_t at = gpus.find(price);
  ASSERT_NE(at, std::string::npos);
  ASSERT_EQ(gpus.find(price, at + 1), std::string::npos);
  gpus.replace(at, price.size(), "usd_per_hour: 0");
  const std::filesystem::path dir =
      std::filesystem::temp_directory_path() / "arachne_objective_cli_test";
  std::filesystem::create_directories(dir);
  std::ofstream(dir / "gpus.yaml") << gpus;
  auto plan = [&](const std::string& objective) {
    return Cli({"plan", "--model", "llama3-8b", "--cluster",
                Source("examples/small-8.yaml"), "--format", "json",
                "--objective", objective, "--profiles-dir", dir.string(),
                "--planner", "exact", "--max-evaluations", "2000"});
  };
  CliRun cheap = plan("usd_per_token");
  EXPECT_EQ(cheap.code, 2);
  EXPECT_THAT(cheap.err,
              HasSubstr("exact: objective usd_per_token: GPU type A6000 of "
                        "the cluster has no price"));
  // Throughput needs no price; the plan's $/Mtoken is then unknown (null)
  // when it uses the unpriced type.
  CliRun fast = plan("throughput");
  ASSERT_EQ(fast.code, 0) << fast.err;
  const nlohmann::json f = nlohmann::json::parse(fast.out);
  EXPECT_EQ(f["unused_gpus"], 0);
  EXPECT_TRUE(f["usd_per_mtoken"].is_null());
  std::filesystem::remove_all(dir);
}

}  // namespace
}  // namespace arachne
