// bench/plot_training_curve.py, the plot `arachne train` draws of its curve
// CSV: two runs of one policy laid end to end become one PNG; bad input is
// named. Skipped where /usr/bin/python3 has no matplotlib.
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

constexpr char kPython[] = "/usr/bin/python3";

std::string Script() {
  return std::string(ARACHNE_SOURCE_DIR) + "/bench/plot_training_curve.py";
}

bool HasMatplotlib() {
  const std::string probe =
      absl::StrCat(kPython, " -c 'import matplotlib' >/dev/null 2>&1");
  return std::system(probe.c_str()) == 0;
}

std::string ReadFile(const std::filesystem::path& path) {
  std::ifstream f(path, std::ios::binary);
  std::stringstream ss;
  ss << f.rdbuf();
  return ss.str();
}

// Exit status of `python3 script args`, its stderr in `*err`.
int RunScript(const std::string& args, const std::filesystem::path& dir,
              std::string* err) {
  const std::filesystem::path log = dir / "stderr.txt";
  const std::string command = absl::StrCat(kPython, " '", Script(), "' ", args,
                                           " 2>'", log.string(), "'");
  const int rc = std::system(command.c_str());
  *err = ReadFile(log);
  return WIFEXITED(rc) ? WEXITSTATUS(rc) : -1;
}

constexpr char kHeader[] =
    "iteration,episodes,elapsed_s,mean_reward,best_reward,greedy_reward,"
    "forced_probability,loss\n";

class PlotTrainingCurveTest : public ::testing::Test {
 protected:
  void SetUp() override {
    if (!HasMatplotlib()) {
      GTEST_SKIP() << kPython << " has no matplotlib (python3-matplotlib)";
    }
    // One directory per test: ctest runs the cases as parallel processes.
    dir_ = std::filesystem::path(::testing::TempDir()) /
           absl::StrCat("plot_training_curve_",
                        ::testing::UnitTest::GetInstance()
                            ->current_test_info()
                            ->name());
    std::filesystem::remove_all(dir_);
    std::filesystem::create_directories(dir_);
  }
  void TearDown() override { std::filesystem::remove_all(dir_); }
  std::filesystem::path dir_;
};

TEST_F(PlotTrainingCurveTest, TwoRunsMakeOnePng) {
  std::ofstream(dir_ / "m.stage1.curve.csv")
      << kHeader << "1,16,0.5,-0.4,0.1,-0.2,0.80,0.3\n"
      << "2,32,1.0,0.1,0.3,0.0,0.79,0.2\n"
      << "3,48,1.6,0.2,0.35,0.1,0.78,0.1\n";
  std::ofstream(dir_ / "m.curve.csv")
      << kHeader << "1,16,0.4,0.1,0.2,0.1,0.50,0.1\n"
      << "2,32,0.9,0.3,0.5,0.2,0.49,0.0\n";
  const std::filesystem::path png = dir_ / "m.curve.png";
  std::string err;
  ASSERT_EQ(RunScript(absl::StrCat("'", (dir_ / "m.stage1.curve.csv").string(),
                                   "' '", (dir_ / "m.curve.csv").string(), "'"),
                      dir_, &err),
            0)
      << err;
  EXPECT_EQ(err, "plot_training_curve: wrote " + png.string() + "\n");
  const std::string bytes = ReadFile(png);
  EXPECT_GT(bytes.size(), 10000u);
  EXPECT_EQ(bytes.substr(0, 8), "\x89PNG\r\n\x1a\n");
}

TEST_F(PlotTrainingCurveTest, NamesTheFileAndTheMissingColumns) {
  std::ofstream(dir_ / "bad.csv") << "iteration,episodes\n1,16\n";
  std::string err;
  EXPECT_EQ(RunScript(absl::StrCat("'", (dir_ / "bad.csv").string(),
                                   "' --out '", (dir_ / "x.png").string(), "'"),
                      dir_, &err),
            2);
  EXPECT_EQ(err, "plot_training_curve: " + (dir_ / "bad.csv").string() +
                     ": missing column(s) elapsed_s, mean_reward, "
                     "best_reward, greedy_reward\n");
  EXPECT_FALSE(std::filesystem::exists(dir_ / "x.png"));

  std::ofstream(dir_ / "empty.csv") << kHeader;
  EXPECT_EQ(RunScript("'" + (dir_ / "empty.csv").string() + "'", dir_, &err),
            2);
  EXPECT_THAT(err, HasSubstr("empty.csv: no rows"));
}

}  // namespace
}  // namespace arachne
