// The `arachne` command's checks shared with the service: planning options
// out of range (the same validation as a request's options), a profiles
// directory that is not one, a search stopped by a limit before any plan
// (its own exit code), and the bounds of `profile show`.
#include <filesystem>
#include <fstream>
#include <string>
#include <vector>

#include "gmock/gmock.h"
#include "gtest/gtest.h"
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
           {"plan", "--model", "llama3-8b", "--cluster", Example("small-8.yaml")},
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
  CliRun evaluations = Plan({"--max-evaluations", "1"}, "llama3-70b");
  EXPECT_EQ(evaluations.code, kExitSearchStopped) << evaluations.err;
  EXPECT_THAT(evaluations.err,
              HasSubstr("exact: the search was stopped before any plan was "
                        "found, by the evaluation limit (max_evaluations 1"));
  EXPECT_THAT(evaluations.err, ::testing::Not(HasSubstr("no plan fits")));

  CliRun budget = Plan({"--budget", "0.000001"});
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
    std::vector<std::string> args = {"profile", "show", "--model", "llama3-8b",
                                     "--gpu", "H100"};
    args.insert(args.end(), c.flags.begin(), c.flags.end());
    CliRun r = Cli(args);
    EXPECT_EQ(r.code, 2) << c.flags[0] << ": " << r.err;
    EXPECT_EQ(r.err, c.message);
  }
  CliRun largest = Cli({"profile", "show", "--model", "llama3-8b", "--gpu",
                        "H100", "--mbs", "128", "--tp", "8"});
  EXPECT_EQ(largest.code, 0) << largest.err;
}

}  // namespace
}  // namespace arachne
