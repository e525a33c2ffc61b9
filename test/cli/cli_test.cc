// The `arachne` commands run in process: outputs, JSON fields, exit codes
// and error messages for bad input.
#include <filesystem>
#include <fstream>
#include <sstream>
#include <string>
#include <vector>

#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "nlohmann/json.hpp"
#include "test/cli/cli_runner.h"

namespace arachne {
namespace {

using ::testing::HasSubstr;

using ::arachne::testing::Cli;
using ::arachne::testing::CliRun;

std::string Example(const std::string& name) {
  return std::string(ARACHNE_SOURCE_DIR) + "/examples/" + name;
}

std::string WriteTemp(const std::string& name, const std::string& text) {
  const std::string path =
      (std::filesystem::temp_directory_path() / ("arachne_cli_test_" + name))
          .string();
  std::ofstream(path) << text;
  return path;
}

TEST(CliTest, EveryPlannerPrintsTheSameJsonAndAPlanEvaluateAccepts) {
  for (const std::string planner :
       {"exact", "amp", "espresso", "hexiscale", "metis", "sailor", "random"}) {
    CliRun r = Cli({"plan", "--model", "llama3-8b", "--cluster",
                    Example("a100-h100-64.yaml"), "--format", "json",
                    "--planner", planner, "--max-evaluations", "3000"});
    ASSERT_EQ(r.code, 0) << planner << ": " << r.err;
    nlohmann::json j = nlohmann::json::parse(r.out);
    EXPECT_EQ(j["planner"], planner);
    EXPECT_GT(j["throughput_iters_per_s"].get<double>(), 0) << planner;
    EXPECT_FALSE(j["templates"].empty()) << planner;
    // The plan it printed is a plan file `evaluate` prices to the same time.
    const std::string path = WriteTemp("plan_" + planner + ".json", r.out);
    CliRun e = Cli({"evaluate", "--model", "llama3-8b", "--cluster",
                    Example("a100-h100-64.yaml"), "--plan", path, "--format",
                    "json"});
    ASSERT_EQ(e.code, 0) << planner << ": " << e.err;
    EXPECT_NEAR(nlohmann::json::parse(e.out)["iteration_time_s"].get<double>(),
                j["iteration_time_s"].get<double>(), 1e-9)
        << planner;
  }
  CliRun bad = Cli({"plan", "--model", "llama3-8b", "--cluster",
                    Example("small-8.yaml"), "--planner", "alpa"});
  EXPECT_EQ(bad.code, 2);
  EXPECT_THAT(bad.err, HasSubstr("unknown planner \"alpa\"; known: exact, "
                                 "amp, espresso, hexiscale, metis, sailor, "
                                 "random"));
}

TEST(CliTest, PlanPrintsJsonWithTheDocumentedFields) {
  CliRun r =
      Cli({"plan", "--model", "llama3-8b", "--cluster", Example("small-8.yaml"),
           "--format", "json", "--planner", "exact", "--budget", "30"});
  ASSERT_EQ(r.code, 0) << r.err;
  nlohmann::json j = nlohmann::json::parse(r.out);
  for (const char* field :
       {"iteration_time_s", "throughput_iters_per_s", "tokens_per_s", "mfu",
        "planning_time_s", "planner", "unused_gpus", "templates"}) {
    EXPECT_TRUE(j.contains(field)) << field;
  }
  EXPECT_EQ(j["planner"], "exact");
  EXPECT_GT(j["throughput_iters_per_s"].get<double>(), 0);
  EXPECT_NEAR(j["throughput_iters_per_s"].get<double>() *
                  j["iteration_time_s"].get<double>(),
              1.0, 1e-9);
  const auto& t = j["templates"][0];
  for (const char* field : {"replicas", "micro_batch_size", "micro_batches", "stages"})
    EXPECT_TRUE(t.contains(field)) << field;
  const auto& s = t["stages"][0];
  for (const char* field : {"gpu_type", "tp", "layers", "memory_gib"})
    EXPECT_TRUE(s.contains(field)) << field;
  EXPECT_EQ(s["layers"][0], 0);
  EXPECT_TRUE(t.contains("placement"));
}

TEST(CliTest, EvaluateRepricesAPlannedPlanAndRejectsAnEditedOne) {
  CliRun planned = Cli({"plan", "--model", "llama3-8b", "--cluster",
                        Example("small-8.yaml"), "--format", "json",
                        "--planner", "exact", "--max-evaluations", "2000"});
  ASSERT_EQ(planned.code, 0) << planned.err;
  const std::string plan_path = WriteTemp("plan.json", planned.out);
  CliRun again = Cli({"evaluate", "--plan", plan_path, "--model", "llama3-8b",
                   "--cluster", Example("small-8.yaml"), "--format", "json"});
  ASSERT_EQ(again.code, 0) << again.err;
  nlohmann::json a = nlohmann::json::parse(planned.out);
  nlohmann::json b = nlohmann::json::parse(again.out);
  EXPECT_DOUBLE_EQ(a["iteration_time_s"].get<double>(),
                   b["iteration_time_s"].get<double>());
  // A user edit that drops the last layer is rejected with the reason.
  auto& stages = a["templates"][0]["stages"];
  stages[stages.size() - 1]["layers"][1] = 31;
  const std::string bad = WriteTemp("bad_plan.json", a.dump());
  CliRun rejected = Cli({"evaluate", "--plan", bad, "--model", "llama3-8b",
                      "--cluster", Example("small-8.yaml")});
  EXPECT_EQ(rejected.code, 2);
  EXPECT_THAT(rejected.err, HasSubstr("plan rejected"));
  EXPECT_THAT(rejected.err, HasSubstr("but the model has 32"));
}

TEST(CliTest, BadInputExitsTwoNamingTheFieldAndValue) {
  CliRun unknown_model = Cli({"plan", "--model", "llama9-1t", "--cluster",
                           Example("small-8.yaml")});
  EXPECT_EQ(unknown_model.code, 2);
  EXPECT_THAT(unknown_model.err, HasSubstr("llama9-1t"));

  const std::string bad_gpu = WriteTemp(
      "bad_gpu.yaml", "node_groups:\n  - {gpu: Z100, gpus_per_node: 4, count: 1}\n");
  CliRun gpu = Cli({"plan", "--model", "llama3-8b", "--cluster", bad_gpu});
  EXPECT_EQ(gpu.code, 2);
  EXPECT_THAT(gpu.err, HasSubstr("Z100"));
  EXPECT_THAT(gpu.err, HasSubstr("node_groups[0].gpu"));

  const std::string zero = WriteTemp(
      "zero.yaml", "node_groups:\n  - {gpu: H100, gpus_per_node: 0, count: 1}\n");
  CliRun z = Cli({"plan", "--model", "llama3-8b", "--cluster", zero});
  EXPECT_EQ(z.code, 2);
  EXPECT_THAT(z.err, HasSubstr("gpus_per_node"));

  const std::string malformed = WriteTemp("malformed.yaml", "nodes: [ {name: a\n");
  CliRun m = Cli({"plan", "--model", "llama3-8b", "--cluster", malformed});
  EXPECT_EQ(m.code, 2);
  EXPECT_THAT(m.err, HasSubstr("malformed.yaml"));

  CliRun missing = Cli({"plan", "--model", "llama3-8b", "--cluster", "/nonexistent.yaml"});
  EXPECT_EQ(missing.code, 2);
  EXPECT_THAT(missing.err, HasSubstr("/nonexistent.yaml"));

  CliRun batch = Cli({"plan", "--model", "llama3-8b", "--cluster",
                   Example("small-8.yaml"), "--global-batch", "-4"});
  EXPECT_EQ(batch.code, 2);
  EXPECT_THAT(batch.err, HasSubstr("global_batch: must be > 0, got -4"));

  CliRun planner = Cli({"plan", "--model", "llama3-8b", "--cluster",
                     Example("small-8.yaml"), "--planner", "magic"});
  EXPECT_EQ(planner.code, 2);
  EXPECT_THAT(planner.err, HasSubstr("unknown planner \"magic\""));

  CliRun flag = Cli({"plan", "--modle", "x"});
  EXPECT_EQ(flag.code, 2);
}

TEST(CliTest, RolloutsAreForTheLearnedPlannerAndNotNegative) {
  CliRun other =
      Cli({"plan", "--model", "llama3-8b", "--cluster", Example("small-8.yaml"),
           "--planner", "exact", "--rollouts", "8"});
  EXPECT_EQ(other.code, 2);
  EXPECT_THAT(other.err, HasSubstr("--rollouts: only for planner "
                                   "\"learned\", not \"exact\""));
  CliRun negative =
      Cli({"plan", "--model", "llama3-8b", "--cluster", Example("small-8.yaml"),
           "--planner", "learned", "--rollouts", "-3"});
  EXPECT_EQ(negative.code, 2);
  EXPECT_THAT(negative.err,
              HasSubstr("--rollouts: must be in 0..1048576, got -3"));
}

TEST(CliTest, AModelThatFitsNowhereSaysWhy) {
  // LLaMA-3-70B on one 24 GiB card: one layer with its optimizer state
  // alone does not fit.
  const std::string tiny = WriteTemp(
      "tiny.yaml", "nodes:\n  - {name: box, gpu: A10, gpus: 1}\n");
  CliRun r = Cli({"plan", "--model", "llama3-70b", "--cluster", tiny});
  EXPECT_EQ(r.code, 2);
  EXPECT_THAT(r.err, HasSubstr("no plan fits llama3-70b"));
  EXPECT_THAT(r.err, HasSubstr("A10: one layer needs"));
}

TEST(CliTest, ProfileShowGivesOneLayerEntry) {
  CliRun r = Cli({"profile", "show", "--model", "llama3-8b", "--gpu", "h100", "--tp",
               "2", "--mbs", "4", "--seq", "2048", "--format", "json"});
  ASSERT_EQ(r.code, 0) << r.err;
  nlohmann::json j = nlohmann::json::parse(r.out);
  EXPECT_EQ(j["gpu"], "H100-80GB");
  EXPECT_EQ(j["source"], "synthesized");
  EXPECT_GT(j["fwd_ms"].get<double>(), 0);
  EXPECT_GT(j["bwd_ms"].get<double>(), j["fwd_ms"].get<double>());
  EXPECT_GT(j["tp_comm_ms"].get<double>(), 0);
  // 34h + 4a bytes per token over tp 2, 4 x 2048 tokens.
  EXPECT_EQ(j["activation_bytes"].get<int64_t>(), 4 * 2048 * (34 * 4096 + 4 * 32) / 2);

  CliRun bad = Cli({"profile", "show", "--model", "llama3-8b", "--gpu", "h100",
                 "--tp", "0"});
  EXPECT_EQ(bad.code, 2);
  EXPECT_THAT(bad.err,
              HasSubstr("--tp: must be a power of two in 1..16, got 0"));
}

TEST(CliTest, CatalogsList) {
  CliRun gpus = Cli({"gpus"});
  ASSERT_EQ(gpus.code, 0);
  EXPECT_THAT(gpus.out, HasSubstr("A100-40GB"));
  EXPECT_THAT(gpus.out, HasSubstr("MI300X"));
  CliRun models = Cli({"models", "--format", "json"});
  ASSERT_EQ(models.code, 0);
  nlohmann::json j = nlohmann::json::parse(models.out);
  EXPECT_EQ(j.size(), 12u);  // the 10 published models, tiny-gpt, tiny-moe
}

}  // namespace
}  // namespace arachne

namespace arachne {
namespace {

TEST(CliTest, SvgDiagramShowsEveryTemplateAndType) {
  const std::string svg =
      (std::filesystem::temp_directory_path() / "arachne_cli_test_plan.svg")
          .string();
  CliRun r = Cli({"plan", "--model", "llama3-8b", "--cluster",
                  Example("small-8.yaml"), "--svg", svg});
  ASSERT_EQ(r.code, 0) << r.err;
  std::ifstream in(svg);
  std::stringstream text;
  text << in.rdbuf();
  EXPECT_THAT(text.str(), HasSubstr("<svg"));
  EXPECT_THAT(text.str(), HasSubstr("template 1:"));
  EXPECT_THAT(text.str(), HasSubstr("A100-40GB (4 GPUs)"));
  EXPECT_THAT(text.str(), HasSubstr("A6000 (4 GPUs)"));

  CliRun bad = Cli({"plan", "--model", "llama3-8b", "--cluster",
                    Example("small-8.yaml"), "--svg", "/nonexistent/dir/x.svg"});
  EXPECT_EQ(bad.code, 2);
  EXPECT_THAT(bad.err, HasSubstr("--svg: cannot write /nonexistent/dir/x.svg"));
}

}  // namespace
}  // namespace arachne
