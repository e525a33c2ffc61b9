// bench/learned_summary.py, the learned planner against the bar
// from a bench results.csv: the counts, the shortfalls, and the
// template-search ablation kept out of the baselines.
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <string>

#include "absl/strings/str_cat.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace arachne {
namespace {

using ::testing::HasSubstr;
using ::testing::Not;

std::string ReadFile(const std::filesystem::path& path) {
  std::ifstream f(path, std::ios::binary);
  std::stringstream ss;
  ss << f.rdbuf();
  return ss.str();
}

constexpr char kHeader[] =
    "scenario,figure,kind,model,composition,gpus,planner,status,"
    "throughput_iters_per_s,tokens_per_s,iteration_time_s,planning_time_s,"
    "evaluations,exhaustive,gpus_used,max_depth,templates,plan,message\n";

std::string Row(const std::string& scenario, const std::string& composition,
                const std::string& planner, double throughput,
                double planning_s) {
  return absl::StrCat(scenario, ",7a,compare,m,", composition, ",64,",
                      planner, ",ok,", throughput, ",1,1,", planning_s,
                      ",10,false,64,4,1,T1,\n");
}

TEST(LearnedSummaryTest, CountsShortfallsAndKeepsTheAblationOut) {
  const std::filesystem::path dir =
      std::filesystem::path(::testing::TempDir()) / "learned_summary_test";
  std::filesystem::remove_all(dir);
  std::filesystem::create_directories(dir);
  // a: learned 1.0 against sailor 0.99 and exact 1.01 (both bars met),
  // template-search 1.05 (an ablation, not a baseline: no shortfall).
  // b: learned 0.9 against random 1.0 and exact 1.0 (short on both).
  std::ofstream(dir / "results.csv")
      << kHeader << Row("s", "a", "learned", 1.0, 0.5)
      << Row("s", "a", "sailor", 0.99, 0.1) << Row("s", "a", "exact", 1.01, 20)
      << Row("s", "a", "template-search", 1.05, 0.9)
      << Row("s", "b", "learned", 0.9, 0.7) << Row("s", "b", "random", 1.0, 20)
      << Row("s", "b", "exact", 1.0, 20)
      << Row("s", "b", "template-search", 0.9, 0.9);
  const std::string command = absl::StrCat(
      "/usr/bin/python3 '", ARACHNE_SOURCE_DIR, "/bench/learned_summary.py' '",
      (dir / "results.csv").string(), "' >'", (dir / "out.txt").string(),
      "' 2>&1");
  ASSERT_EQ(std::system(command.c_str()), 0) << ReadFile(dir / "out.txt");
  const std::string out = ReadFile(dir / "out.txt");
  EXPECT_THAT(out, HasSubstr("| 7a | 2 | 1 | 1 |"));
  EXPECT_THAT(out, HasSubstr("both bars met on 1"));
  EXPECT_THAT(out, HasSubstr("short: s b: ÷best 0.900, ÷exact 0.900"));
  EXPECT_THAT(out, Not(HasSubstr("short: s a")));
  EXPECT_THAT(out, HasSubstr("ablation: learned / template-search (uniform "
                             "policy, same search) on 2 compositions: "
                             "geomean 0.976, min 0.952, max 1.000; learned "
                             "faster on 0, slower on 1"));
  std::filesystem::remove_all(dir);
}

}  // namespace
}  // namespace arachne
