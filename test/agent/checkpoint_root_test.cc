// The agent's checkpoint root end to end (issue 36): a real arachne-agent
// on 127.0.0.1 with engine processes, started with --checkpoint-root (the
// harness gives every agent its test directory as the root). Every
// checkpoint path a caller gives (SaveCheckpoint's dir, Prepare's
// checkpoint_dir) must be absolute and, normalised and with its symlinks
// resolved, inside the root: else INVALID_ARGUMENT naming the field and
// the value, and nothing is written. A path inside the root that the file
// system refuses for good (not a directory, no permission) is
// FAILED_PRECONDITION, not the retryable UNAVAILABLE. A path inside the
// root still writes, and loads.
#include <sys/stat.h>
#include <unistd.h>

#include <cstdlib>
#include <filesystem>
#include <string>
#include <vector>

#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "test/agent/agent_harness.h"

namespace arachne::agent {
namespace {

using ::testing::AnyOf;
using ::testing::HasSubstr;
using testing::Driver;
using testing::NamedCluster;
using testing::Place;
using testing::TinyJob;

namespace fs = std::filesystem;

std::string TempDir(const std::string& name) {
  std::string d = std::string(::testing::TempDir()) + "arachne-ckroot-" +
                  name + "-" + std::to_string(getpid());
  fs::remove_all(d);
  fs::create_directories(d);
  return fs::canonical(d).string();
}

// DP 2 on node a's two GPUs, and TP 2 on the same GPUs.
Plan Dp2() { return Plan{{Place({{1, 0, 4}}, 2, 4, 4, {{0, 0}, {0, 1}})}}; }
Plan Tp2() { return Plan{{Place({{2, 0, 4}}, 1, 2, 8, {{0, 0}, {0, 1}})}}; }

class CheckpointRoot : public ::testing::Test {
 protected:
  void SetUp() override {
    root_ = TempDir("root");
    outside_ = TempDir("outside");
    d_ = std::make_unique<Driver>(TinyJob(), root_);
    a_ = d_->Agent("a", 2);
    cluster_ = NamedCluster({{"a", 2}});
    ASSERT_TRUE(d_->Start(Dp2(), cluster_).ok());
    ASSERT_TRUE(d_->TrainUntil(2).ok());
  }
  void TearDown() override {
    d_.reset();
    fs::remove_all(outside_);
  }
  absl::Status Save(const std::string& dir) {
    return a_->client().SaveCheckpoint(d_->generation(), dir);
  }

  std::string root_, outside_;
  std::unique_ptr<Driver> d_;
  testing::AgentProcess* a_ = nullptr;
  Cluster cluster_;
};

TEST_F(CheckpointRoot, PathsOutsideTheRootAreInvalidArgumentAndWriteNothing) {
  absl::Status s = Save("relative/ckpt");
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument) << s;
  EXPECT_THAT(s.message(),
              HasSubstr("dir: must be an absolute path inside the checkpoint "
                        "root \"" + root_ + "\", got \"relative/ckpt\""));

  s = Save(root_ + "/a/../../escape");
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument) << s;
  EXPECT_THAT(s.message(),
              HasSubstr("dir: must be inside the checkpoint root \"" + root_ +
                        "\", got \"" + root_ + "/a/../../escape\""));
  EXPECT_FALSE(fs::exists(fs::path(root_).parent_path() / "escape"));

  // A symlink inside the root to a directory outside it.
  fs::create_directory_symlink(outside_, root_ + "/link");
  s = Save(root_ + "/link/ckpt");
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument) << s;
  EXPECT_THAT(s.message(), HasSubstr("dir: must be inside the checkpoint root"));
  EXPECT_THAT(s.message(),
              HasSubstr("(resolved to \"" + outside_ + "/ckpt\")"));
  EXPECT_FALSE(fs::exists(outside_ + "/ckpt"));

  // A long value comes back abbreviated.
  const std::string long_dir = "x/" + std::string(10000, 'y');
  s = Save(long_dir);
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument) << s;
  EXPECT_THAT(s.message(), HasSubstr("...\" (10002 bytes)"));

  // Prepare's checkpoint_dir: the same check, naming that field; the
  // switch is refused before anything is built, and training goes on.
  absl::Status p = d_->Switch(Tp2(), cluster_, testing::SwitchStep::kNone,
                              nullptr, outside_ + "/ckpt");
  EXPECT_EQ(p.code(), absl::StatusCode::kInvalidArgument) << p;
  EXPECT_THAT(p.message(),
              HasSubstr("checkpoint_dir: must be inside the checkpoint root \"" +
                        root_ + "\", got \"" + outside_ + "/ckpt\""));
  ASSERT_TRUE(d_->TrainUntil(3).ok());
}

TEST_F(CheckpointRoot, PermanentFileSystemErrorsAreFailedPrecondition) {
  // A file where a directory must be.
  { std::ofstream(root_ + "/file") << "x"; }
  absl::Status s = Save(root_ + "/file/ckpt");
  EXPECT_EQ(s.code(), absl::StatusCode::kFailedPrecondition) << s;
  EXPECT_THAT(s.message(), HasSubstr("Not a directory"));

  // A directory inside the root the agent may not write to: mode 0555, and
  // immutable when the test runs as root (which mode bits do not stop).
  const std::string ro = root_ + "/read-only";
  fs::create_directories(ro);
  ASSERT_EQ(chmod(ro.c_str(), 0555), 0);
  bool immutable = false;
  if (geteuid() == 0) {
    immutable = std::system(("chattr +i '" + ro + "' 2>/dev/null").c_str()) == 0;
    if (!immutable) {
      GTEST_SKIP() << "running as root without chattr +i: cannot make an "
                      "unwritable directory";
    }
  }
  s = Save(ro + "/ckpt");
  if (immutable) std::system(("chattr -i '" + ro + "'").c_str());
  chmod(ro.c_str(), 0755);
  EXPECT_EQ(s.code(), absl::StatusCode::kFailedPrecondition) << s;
  EXPECT_THAT(s.message(), AnyOf(HasSubstr("Permission denied"),
                                 HasSubstr("Operation not permitted")));
  EXPECT_THAT(s.message(), HasSubstr(ro + "/ckpt"));
  EXPECT_FALSE(fs::exists(ro + "/ckpt"));
  ASSERT_TRUE(d_->TrainUntil(3).ok());
}

TEST_F(CheckpointRoot, APathInsideTheRootWritesAndLoads) {
  // Normalised and through a symlink that stays inside: written where it
  // resolves to.
  fs::create_directories(root_ + "/jobs/j1");
  fs::create_directory_symlink("jobs/j1", root_ + "/latest");
  ASSERT_TRUE(Save(root_ + "/latest/./x/../g1").ok());
  ASSERT_TRUE(fs::exists(root_ + "/jobs/j1/g1/shard-a-0.bin"));
  absl::StatusOr<FullState> saved =
      ReadCheckpoint(root_ + "/jobs/j1/g1", *ReferenceModelState(TinyJob()));
  ASSERT_TRUE(saved.ok()) << saved.status();
  // Generation 2 on another plan restored from it: its state is the saved
  // one, bit for bit.
  absl::Status p = d_->Switch(Tp2(), cluster_, testing::SwitchStep::kNone,
                              nullptr, root_ + "/latest/g1");
  ASSERT_TRUE(p.ok()) << p;
  absl::StatusOr<FullState> restored = d_->Gather("restored");
  ASSERT_TRUE(restored.ok()) << restored.status();
  EXPECT_TRUE(*restored == *saved)
      << FirstDifference(*ReferenceModelState(TinyJob()), *saved, *restored);
}

}  // namespace
}  // namespace arachne::agent
