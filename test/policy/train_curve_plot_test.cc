// `arachne train` draws its curve CSV as <out>.curve.png at the end of
// training (bench/plot_training_curve.py) and names it in its summary.
// Skipped where /usr/bin/python3 has no matplotlib (training then only
// notes it; the CSV is the curve).
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <sstream>

#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "planner_service/policy/train_command.h"

namespace arachne {
namespace {

using ::testing::HasSubstr;

TEST(TrainCurvePlotTest, TrainingWritesThePngNextToTheCurve) {
  if (std::system("/usr/bin/python3 -c 'import matplotlib' >/dev/null 2>&1") !=
      0) {
    GTEST_SKIP() << "/usr/bin/python3 has no matplotlib";
  }
  const std::filesystem::path dir =
      std::filesystem::path(::testing::TempDir()) / "train_curve_plot_test";
  std::filesystem::remove_all(dir);
  std::filesystem::create_directories(dir);
  TrainOptions o;
  o.model = "llama3-8b";
  o.compositions = 2;
  o.episodes = 16;
  o.max_gpus = 16;
  o.out = (dir / "policy.pt").string();
  o.grpo.network = {
      .hidden = 16, .layers = 1, .head_hidden = 8, .film_hidden = 4};
  std::ostringstream out, err;
  ASSERT_EQ(RunTrainCommand(o, out, err), 0) << err.str();
  const std::filesystem::path png = dir / "policy.curve.png";
  EXPECT_THAT(out.str(), HasSubstr("wrote " + o.out + " and " +
                                   (dir / "policy.curve.csv").string() +
                                   " (plot: " + png.string() + ")\n"));
  ASSERT_TRUE(std::filesystem::exists(png));
  std::ifstream f(png, std::ios::binary);
  std::string magic(8, '\0');
  f.read(magic.data(), 8);
  EXPECT_EQ(magic, "\x89PNG\r\n\x1a\n");
  EXPECT_GT(std::filesystem::file_size(png), 10000u);
  std::filesystem::remove_all(dir);
}

}  // namespace
}  // namespace arachne
