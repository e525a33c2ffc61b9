// The `arachne` command's checks shared with the service: planning options
// out of range (the same validation as a request's options), a profiles
// directory that is not one, a search stopped by a limit before any plan
// (its own exit code), the bounds of `profile show`, and a huge plan
// refused quickly.
#include <filesystem>
#include <fstream>
#include <string>
#include <vector>

#include "absl/time/clock.h"
#include "absl/time/time.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "nlohmann/json.hpp"
#include "test/cli/cli_runner.h"

namespace arachne {
namespace {

using ::arachne::testing::Cli;
using ::arachne::testing::CliRun;
using ::testing::HasSubstr;

std::string Example(const std::string& name) {
  return std::string(ARACHNE_SOURCE_DIR) + "/examples/" + name;
}

CliRun Plan(std::vector<std::string> extra,
            const std::string& model = "llama3-8b") {
  std::vector<std::string> args = {"plan", "--model", model, "--cluster",
                                   Example("small-8.yaml")};
  args.insert(args.end(), extra.begin(), extra.end());
  return Cli(args);
}

struct FlagCase {
  std::vector<std::string> flags;
  std::string message;
};

TEST(CliChecksTest, PlanningOptionsOutOfRangeNameTheFlag) {
  for (const FlagCase& c : std::vector<FlagCase>{
           {{"--max-depth", "1000000"},
            "error: --max-depth: must be in 1..64, got 1000000\n"},
           {{"--max-templates", "1000000"},
            "error: --max-templates: must be in 1..16, got 1000000\n"},
           {{"--max-evaluations", "-1"},
            "error: --max-evaluations: must be >= 0 (0: no limit), got -1\n"},
           {{"--budget", "inf"},
            "error: --budget: must be seconds in (0, 86400], got inf\n"},
           {{"--budget", "nan"},
            "error: --budget: must be seconds in (0, 86400], got nan\n"},
           {{"--budget", "0"},
            "error: --budget: must be seconds in (0, 86400], got 0\n"},
           {{"--planner", "learned", "--rollouts", "-1"},
            "error: --rollouts: must be in 0..1048576, got -1\n"},
           {{"--planner", "learned", "--rollouts", "2000000"},
            "error: --rollouts: must be in 0..1048576, got 2000000\n"},
       }) {
    CliRun r = Plan(c.flags);
    EXPECT_EQ(r.code, 2) << c.flags[0] << ": " << r.err;
    EXPECT_EQ(r.err, c.message);
  }
}

TEST(CliChecksTest, ProfilesDirMustBeADirectory) {
  const std::string file =
      std::string(ARACHNE_SOURCE_DIR) + "/profiles/gpus.yaml";
  for (const std::vector<std::string>& command :
       std::vector<std::vector<std::string>>{
           {"plan", "--model", "llama3-8b", "--cluster",
            Example("small-8.yaml")},
           {"models"},
           {"gpus"},
           {"profile", "show", "--model", "llama3-8b", "--gpu", "H100"}}) {
    std::vector<std::string> missing = command;
    missing.insert(missing.end(), {"--profiles-dir", "/nonexistent-arachne"});
    CliRun r = Cli(missing);
    EXPECT_EQ(r.code, 2) << command[0] << ": " << r.err;
    EXPECT_THAT(r.err, HasSubstr("--profiles-dir: \"/nonexistent-arachne\" "
                                 "does not exist"));
    std::vector<std::string> regular = command;
    regular.insert(regular.end(), {"--profiles-dir", file});
    r = Cli(regular);
    EXPECT_EQ(r.code, 2) << command[0] << ": " << r.err;
    EXPECT_THAT(r.err, HasSubstr("--profiles-dir: \"" + file +
                                 "\" is not a directory"));
  }
}

TEST(CliChecksTest, SearchStoppedBeforeAnyPlanExitsThreeAndSaysBy) {
  // LLaMA-3-70B fits on the 8 GPUs (one layer does) but the first few
  // candidates do not.
  CliRun evaluations =
      Plan({"--planner", "exact", "--max-evaluations", "1"}, "llama3-70b");
  EXPECT_EQ(evaluations.code, kExitSearchStopped) << evaluations.err;
  EXPECT_THAT(evaluations.err,
              HasSubstr("exact: the search was stopped before any plan was "
                        "found, by the evaluation limit (max_evaluations 1"));
  EXPECT_THAT(evaluations.err, ::testing::Not(HasSubstr("no plan fits")));

  CliRun budget = Plan({"--planner", "exact", "--budget", "0.000001"});
  EXPECT_EQ(budget.code, kExitSearchStopped) << budget.err;
  EXPECT_THAT(budget.err,
              HasSubstr("exact: the search was stopped before any plan was "
                        "found, by its time budget (1us"));

  // Not even one layer of GPT-3 fits on a 24 GiB card: no limit changes
  // that, so exit 2 as before.
  const std::string one_a5000 =
      (std::filesystem::temp_directory_path() / "arachne_cli_checks_a5000.yaml")
          .string();
  std::ofstream(one_a5000) << "nodes:\n  - {name: box, gpu: A5000, gpus: 1}\n";
  CliRun nowhere = Cli({"plan", "--model", "gpt3-175b", "--cluster", one_a5000,
                        "--max-evaluations", "1"});
  EXPECT_EQ(nowhere.code, 2) << nowhere.err;
  EXPECT_THAT(nowhere.err, HasSubstr("no plan fits gpt3-175b"));
  EXPECT_THAT(nowhere.err, HasSubstr("A5000: one layer needs"));
}

TEST(CliChecksTest, ProfileShowIsBounded) {
  for (const FlagCase& c : std::vector<FlagCase>{
           {{"--mbs", "2000000000"},
            "error: --mbs: must be in 1..128, got 2000000000\n"},
           {{"--mbs", "0"}, "error: --mbs: must be in 1..128, got 0\n"},
           {{"--tp", "3"},
            "error: --tp: must be a power of two in 1..16, got 3\n"},
           {{"--tp", "32"},
            "error: --tp: must be a power of two in 1..16, got 32\n"},
           {{"--seq", "2000000000"},
            "error: --seq: must be in 1..1048576, got 2000000000\n"},
       }) {
    std::vector<std::string> args = {"profile",   "show",  "--model",
                                     "llama3-8b", "--gpu", "H100"};
    args.insert(args.end(), c.flags.begin(), c.flags.end());
    CliRun r = Cli(args);
    EXPECT_EQ(r.code, 2) << c.flags[0] << ": " << r.err;
    EXPECT_EQ(r.err, c.message);
  }
  CliRun largest = Cli({"profile", "show", "--model", "llama3-8b", "--gpu",
                        "H100", "--mbs", "128", "--tp", "8"});
  EXPECT_EQ(largest.code, 0) << largest.err;
}

// A plan of 60,000 stages (a 32-layer model; within the readers' value
// limit) is refused within seconds by its counts, before it is built
// (200,000 took 17 s and 763 MB).
TEST(CliChecksTest, PlanWithFarTooManyStagesIsRejectedFast) {
  nlohmann::json stages = nlohmann::json::array();
  nlohmann::json row = nlohmann::json::array();
  for (int s = 0; s < 60000; ++s) {
    stages.push_back(
        {{"gpu_type", "A100-40GB"}, {"tp", 1}, {"layers", {s, s + 1}}});
    row.push_back({{"node", "a100-0"}, {"gpus", {0}}});
  }
  nlohmann::json plan = {{"templates",
                          {{{"replicas", 1},
                            {"micro_batch_size", 1},
                            {"total_micro_batches", 2048},
                            {"stages", std::move(stages)},
                            {"placement", {{{"stages", std::move(row)}}}}}}}};
  const std::string path =
      (std::filesystem::temp_directory_path() / "arachne_cli_checks_huge.json")
          .string();
  std::ofstream(path) << plan.dump();
  const absl::Time start = absl::Now();
  CliRun r = Cli({"evaluate", "--model", "llama3-8b", "--cluster",
                  Example("small-8.yaml"), "--plan", path});
  // ~2 s on a loaded 2-core machine, all of it reading the 6 MB file.
  EXPECT_LT(absl::Now() - start, absl::Seconds(10));
  EXPECT_EQ(r.code, 2) << r.err;
  EXPECT_THAT(r.err, HasSubstr("templates[0].stages: must have at most 1024 "
                               "stages, got 60000"));
  std::filesystem::remove(path);
}

}  // namespace
}  // namespace arachne
