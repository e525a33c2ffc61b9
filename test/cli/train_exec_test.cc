// The built binaries: `arachne` and `arachne-planner` do not load LibTorch
// (planning reads the .weights files), and `arachne train` execs the
// arachne-train beside `arachne` (LibTorch builds), naming the path when it
// is missing.
#include <sys/wait.h>

#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <string>

#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "test/cli/cli_runner.h"

namespace {

using ::testing::HasSubstr;
using ::testing::Not;

const std::string kBin = std::string(ARACHNE_BINARY_DIR);
const std::string kArachne = kBin + "/planner_service/cli/arachne";

using ::arachne::testing::Shell;
using Result = ::arachne::testing::ShellRun;
using ::arachne::testing::FreshDir;

TEST(PlanningBinariesTest, DoNotLoadLibTorch) {
  for (const std::string& binary :
       {kArachne, kBin + "/planner_service/server/arachne-planner"}) {
    if (!std::filesystem::exists(binary)) {
      ASSERT_NE(binary, kArachne) << "not built: " << binary;
      continue;
    }
    // ld.so lists the shared libraries it would load and exits.
    Result r = Shell("LD_TRACE_LOADED_OBJECTS=1 " + binary + " --help");
    ASSERT_EQ(r.code, 0) << r.out;
    EXPECT_THAT(r.out, HasSubstr("libc.so"));
    EXPECT_THAT(r.out, Not(HasSubstr("libtorch"))) << binary;
    EXPECT_THAT(r.out, Not(HasSubstr("libc10"))) << binary;
  }
}

bool HaveTrainer() {
  return std::filesystem::exists(kBin + "/planner_service/cli/arachne-train");
}

TEST(TrainExecTest, HelpRunsThroughArachneTrain) {
  if (!HaveTrainer()) GTEST_SKIP() << "a build without LibTorch";
  Result r = Shell(kArachne + " train --help");
  EXPECT_EQ(r.code, 0) << r.out;
  EXPECT_THAT(r.out, HasSubstr("--episodes"));
  EXPECT_THAT(r.out, HasSubstr("--export-weights"));
  // And `arachne --help` still lists it.
  EXPECT_THAT(Shell(kArachne + " --help").out, HasSubstr("train"));
}

TEST(TrainExecTest, TrainsAndWritesTheWeightsFile) {
  if (!HaveTrainer()) GTEST_SKIP() << "a build without LibTorch";
  const auto dir = FreshDir("train_exec_trains");
  const std::string out = (dir / "llama3-8b.pt").string();
  Result r = Shell(kArachne +
                 " train --model llama3-8b --episodes 32 --compositions 2 "
                 "--max-gpus 32 --seed 3 --out " +
                 out);
  ASSERT_EQ(r.code, 0) << r.out;
  EXPECT_THAT(r.out, HasSubstr("trained llama3-8b"));
  EXPECT_TRUE(std::filesystem::exists(dir / "llama3-8b.pt"));
  EXPECT_TRUE(std::filesystem::exists(dir / "llama3-8b.weights"));
  // The export one-liner rewrites it.
  std::filesystem::remove(dir / "llama3-8b.weights");
  Result e = Shell(kArachne + " train --export-weights " + out);
  ASSERT_EQ(e.code, 0) << e.out;
  EXPECT_THAT(e.out, HasSubstr("wrote " + (dir / "llama3-8b.weights").string()));
  EXPECT_TRUE(std::filesystem::exists(dir / "llama3-8b.weights"));
  // A planner reads it without the .pt.
  std::filesystem::remove(dir / "llama3-8b.pt");
  Result p = Shell("ARACHNE_POLICIES_DIR=" + dir.string() + " " + kArachne +
                 " plan --model llama3-8b --cluster " +
                 std::string(ARACHNE_SOURCE_DIR) +
                 "/examples/small-8.yaml --planner learned");
  EXPECT_EQ(p.code, 0) << p.out;
}

TEST(TrainExecTest, AMissingArachneTrainIsNamed) {
  // A copy of arachne in a directory without arachne-train.
  const auto dir = FreshDir("train_exec_missing");
  std::filesystem::copy_file(kArachne, dir / "arachne");
  std::filesystem::permissions(dir / "arachne",
                               std::filesystem::perms::owner_all);
  Result r = Shell((dir / "arachne").string() + " train --help");
  EXPECT_EQ(r.code, 2) << r.out;
  EXPECT_THAT(r.out,
              HasSubstr("arachne train runs " +
                        (dir / "arachne-train").string() +
                        ", which does not exist"));
}

}  // namespace
