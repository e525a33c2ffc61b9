// Policy checkpoints: a round trip keeps the logits, and checkpoints for
// another model, profile set or format version are refused with the reason.
#include "planner_service/policy/checkpoint.h"

#include <filesystem>
#include <fstream>

#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "planner_service/policy/torch_policy.h"
#include "test/policy/policy_test_fixture.h"

namespace arachne {
namespace {

using ::testing::HasSubstr;
using ::testing::Not;

class CheckpointTest : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = std::filesystem::path(::testing::TempDir()) /
           ::testing::UnitTest::GetInstance()->current_test_info()->name();
    std::filesystem::create_directories(dir_);
  }
  std::string Path(const std::string& name) { return (dir_ / name).string(); }
  std::filesystem::path dir_;
};

TEST_F(CheckpointTest, RoundTripKeepsTheLogits) {
  testing::ToyComposition toy;
  ConstructionEnv env = toy.Env();
  auto net = PolicyNetwork::Create({.hidden = 48, .layers = 3}, 11);
  ASSERT_TRUE(net.ok());
  PolicyCheckpointInfo info;
  info.model = "toy";
  info.profile_name = "toy";
  info.profile_fingerprint = "0123456789abcdef";
  info.training.episodes = 640;
  info.training.best_reward = 0.5;
  ASSERT_TRUE(SavePolicyCheckpoint(**net, info, Path("toy.pt")).ok());
  ASSERT_TRUE(std::filesystem::exists(Path("toy.json")));

  auto loaded = LoadPolicyCheckpoint(Path("toy.pt"));
  ASSERT_TRUE(loaded.ok()) << loaded.status();
  EXPECT_EQ(loaded->info.model, "toy");
  EXPECT_EQ(loaded->info.format_version, kPolicyFormatVersion);
  EXPECT_EQ(loaded->info.network.hidden, 48);
  EXPECT_EQ(loaded->info.network.layers, 3);
  EXPECT_EQ(loaded->info.training.episodes, 640);
  EXPECT_EQ(loaded->info.training.best_reward, 0.5);
  // The same logits at every head of an episode.
  int decisions = 0;
  while (!env.done()) {
    const std::vector<float> a = (*net)->Logits(env);
    const std::vector<float> b = loaded->network->Logits(env);
    ASSERT_EQ(a, b);
    env.Step(std::max_element(a.begin(), a.end()) - a.begin());
    ++decisions;
  }
  EXPECT_GT(decisions, 2);
}

TEST_F(CheckpointTest, MetadataJsonRoundTrips) {
  PolicyCheckpointInfo info;
  info.model = "llama3-8b";
  info.profile_name = "llama3-8b";
  info.profile_fingerprint = "00000000deadbeef";
  info.network.film_hidden = 8;
  info.training.seed = 9;
  auto parsed = ParseCheckpointInfo(CheckpointInfoToJson(info), "x.json");
  ASSERT_TRUE(parsed.ok()) << parsed.status();
  EXPECT_EQ(parsed->model, "llama3-8b");
  EXPECT_EQ(parsed->profile_fingerprint, "00000000deadbeef");
  EXPECT_EQ(parsed->network.film_hidden, 8);
  EXPECT_EQ(parsed->training.seed, 9u);
  // Not written at the legacy value, so older metadata reads the same...
  EXPECT_EQ(parsed->training.max_gpu_types, kLegacyMaxGpuTypes);
  EXPECT_THAT(CheckpointInfoToJson(info), Not(HasSubstr("max_gpu_types")));
  // ...and kept when a policy was trained on more types.
  info.training.max_gpu_types = 8;
  const std::string eight = CheckpointInfoToJson(info);
  EXPECT_THAT(eight, HasSubstr("\"max_gpu_types\": 8"));
  auto parsed8 = ParseCheckpointInfo(eight, "x.json");
  ASSERT_TRUE(parsed8.ok()) << parsed8.status();
  EXPECT_EQ(parsed8->training.max_gpu_types, 8);
  std::string zero = eight;
  zero.replace(zero.find("\"max_gpu_types\": 8"), 18, "\"max_gpu_types\": 0");
  EXPECT_EQ(ParseCheckpointInfo(zero, "x.json").status().message(),
            "x.json: checkpoint metadata: training.max_gpu_types must be >= "
            "1, got 0");
  auto bad = ParseCheckpointInfo("{\"model\": 1}", "x.json");
  EXPECT_EQ(bad.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(bad.status().message(), HasSubstr("x.json: checkpoint metadata"));
}

TEST_F(CheckpointTest, RefusesAnotherModelProfileSetOrFormat) {
  PolicyCheckpointInfo info;
  info.model = "qwen3-32b";
  info.profile_name = "qwen3-32b";
  info.profile_fingerprint = "aaaaaaaaaaaaaaaa";
  EXPECT_TRUE(CheckCheckpointFits(info, "qwen3-32b", "aaaaaaaaaaaaaaaa", "p.pt")
                  .ok());
  absl::Status model = CheckCheckpointFits(info, "llama3-8b",
                                           "aaaaaaaaaaaaaaaa", "p.pt");
  EXPECT_EQ(model.code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_THAT(model.message(),
              HasSubstr("p.pt: checkpoint is for model \"qwen3-32b\", not "
                        "\"llama3-8b\""));
  absl::Status profiles = CheckCheckpointFits(info, "qwen3-32b",
                                              "bbbbbbbbbbbbbbbb", "p.pt");
  EXPECT_EQ(profiles.code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_THAT(profiles.message(),
              HasSubstr("another profile set (profile fingerprint "
                        "aaaaaaaaaaaaaaaa, these profiles give "
                        "bbbbbbbbbbbbbbbb"));
  info.format_version = kPolicyFormatVersion + 1;
  absl::Status format = CheckCheckpointFits(info, "qwen3-32b",
                                            "aaaaaaaaaaaaaaaa", "p.pt");
  EXPECT_EQ(format.code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_THAT(format.message(), HasSubstr("checkpoint format version 2, this "
                                          "build reads version 1"));
}

TEST_F(CheckpointTest, LoadRefusesAnotherFormatVersionAndNonCheckpoints) {
  auto net = PolicyNetwork::Create({.hidden = 8, .head_hidden = 8}, 1);
  ASSERT_TRUE(net.ok());
  PolicyCheckpointInfo info;
  info.model = "toy";
  info.format_version = kPolicyFormatVersion + 1;
  ASSERT_TRUE(SavePolicyCheckpoint(**net, info, Path("future.pt")).ok());
  auto future = LoadPolicyCheckpoint(Path("future.pt"));
  EXPECT_EQ(future.status().code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_THAT(future.status().message(),
              HasSubstr("future.pt: checkpoint format version 2"));

  std::ofstream(Path("junk.pt")) << "not a checkpoint";
  auto junk = LoadPolicyCheckpoint(Path("junk.pt"));
  EXPECT_EQ(junk.status().code(), absl::StatusCode::kDataLoss);
  EXPECT_THAT(junk.status().message(), HasSubstr("junk.pt"));

  auto missing = LoadPolicyCheckpoint(Path("missing.pt"));
  EXPECT_EQ(missing.status().code(), absl::StatusCode::kNotFound);
}

TEST(ProfileFingerprintTest, ChangesWithCatalogProfileNameAndCalibration) {
  const GpuCatalog catalog = testing::ToyCatalog();
  const std::string a = ProfileSetFingerprint(catalog, "toy", "{}");
  EXPECT_EQ(a.size(), 16u);
  EXPECT_EQ(a, ProfileSetFingerprint(catalog, "toy", "{}"));
  EXPECT_NE(a, ProfileSetFingerprint(catalog, "toy2", "{}"));
  EXPECT_NE(a, ProfileSetFingerprint(catalog, "toy", "{ }"));
  std::vector<GpuType> types;
  for (int i = 0; i < catalog.size(); ++i) types.push_back(catalog.type(i));
  types[0].memory_gib += 1;
  auto other = GpuCatalog::Create(types);
  ASSERT_TRUE(other.ok());
  EXPECT_NE(a, ProfileSetFingerprint(*other, "toy", "{}"));
}

}  // namespace
}  // namespace arachne
