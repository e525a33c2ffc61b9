// The LibTorch-free weights file: a round trip gives the network's logits
// (per-model and model-conditioned), damaged files are refused with the
// reason, and the factory plans from `.weights` files alone.
#include "planner_service/policy/policy_weights_file.h"

#include <algorithm>
#include <filesystem>
#include <fstream>
#include <sstream>

#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "planner_service/core/learned/learned_planner.h"
#include "planner_service/core/cost/plan_validation.h"
#include "planner_service/io/data_files.h"
#include "planner_service/policy/checkpoint.h"
#include "planner_service/policy/torch_policy.h"
#include "test/policy/policy_test_fixture.h"

namespace arachne {
namespace {

using ::testing::HasSubstr;

class PolicyWeightsFileTest : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = std::filesystem::path(::testing::TempDir()) /
           ("policy_weights_file_" +
            std::string(::testing::UnitTest::GetInstance()
                            ->current_test_info()
                            ->name()));
    std::filesystem::remove_all(dir_);
    std::filesystem::create_directories(dir_);
  }
  void TearDown() override { RegisterLearnedPolicyFactory(nullptr); }
  std::string Path(const std::string& name) { return (dir_ / name).string(); }
  std::string Read(const std::string& path) {
    std::ifstream f(path, std::ios::binary);
    std::stringstream s;
    s << f.rdbuf();
    return s.str();
  }
  void Write(const std::string& path, const std::string& bytes) {
    std::ofstream(path, std::ios::binary | std::ios::trunc) << bytes;
  }
  // A saved checkpoint `<name>.pt` (+ .weights); returns the network.
  std::unique_ptr<PolicyNetwork> Save(const std::string& name,
                                      PolicyNetworkConfig config,
                                      const std::string& model,
                                      const std::string& profiles,
                                      const std::string& fingerprint) {
    auto net = PolicyNetwork::Create(config, 5);
    EXPECT_TRUE(net.ok());
    PolicyCheckpointInfo info;
    info.model = model;
    info.profile_name = profiles;
    info.profile_fingerprint = fingerprint;
    info.training.episodes = 77;
    EXPECT_TRUE(SavePolicyCheckpoint(**net, info, Path(name + ".pt")).ok());
    return *std::move(net);
  }
  std::string ToyFingerprint(const std::string& profiles) {
    auto calibration = ReadDataFile("calibration.json", "");
    EXPECT_TRUE(calibration.ok());
    return ProfileSetFingerprint(testing::ToyCatalog(), profiles,
                                 *calibration);
  }
  std::filesystem::path dir_;
};

void ExpectSameLogits(const PolicyNetwork& net, const PolicyWeights& loaded) {
  testing::ToyComposition toy;
  ConstructionEnv env = toy.Env();
  int decisions = 0;
  PolicyScratch scratch;
  while (!env.done()) {
    const std::vector<float> a = net.Logits(env);
    std::vector<float> b;
    PolicyLogits(loaded, env, scratch, &b);
    ASSERT_EQ(a, b);
    env.Step(std::max_element(a.begin(), a.end()) - a.begin());
    ++decisions;
  }
  EXPECT_GT(decisions, 2);
}

TEST_F(PolicyWeightsFileTest, RoundTripKeepsTheLogits) {
  for (bool conditioned : {false, true}) {
    SCOPED_TRACE(conditioned ? "model-conditioned" : "per-model");
    const std::string name = conditioned ? "general" : "toy";
    auto net = Save(name,
                    {.hidden = 24, .layers = 3, .head_hidden = 12,
                     .film_hidden = 6, .model_conditioned = conditioned},
                    name, conditioned ? "*" : "toy", "0123456789abcdef");
    ASSERT_TRUE(std::filesystem::exists(Path(name + ".weights")));
    EXPECT_EQ(WeightsFilePath(Path(name + ".pt")), Path(name + ".weights"));
    auto loaded = ReadPolicyWeightsFile(Path(name + ".weights"));
    ASSERT_TRUE(loaded.ok()) << loaded.status();
    EXPECT_EQ(loaded->info.model, name);
    EXPECT_EQ(loaded->info.profile_fingerprint, "0123456789abcdef");
    EXPECT_EQ(loaded->info.training.episodes, 77);
    EXPECT_EQ(loaded->info.network.hidden, 24);
    EXPECT_EQ(loaded->info.network.layers, 3);
    EXPECT_EQ(loaded->info.network.model_conditioned, conditioned);
    EXPECT_EQ(loaded->weights->config.model_conditioned, conditioned);
    EXPECT_NE(loaded->weights->version, net->inference_weights()->version);
    ExpectSameLogits(*net, *loaded->weights);
  }
}

TEST_F(PolicyWeightsFileTest, ExportWritesTheSameFileAsSave) {
  Save("toy", {.hidden = 16, .layers = 2, .head_hidden = 8, .film_hidden = 4},
       "toy", "toy", "0123456789abcdef");
  const std::string saved = Read(Path("toy.weights"));
  std::filesystem::remove(Path("toy.weights"));
  auto exported = ExportPolicyWeights(Path("toy.pt"));
  ASSERT_TRUE(exported.ok()) << exported.status();
  EXPECT_EQ(*exported, Path("toy.weights"));
  EXPECT_EQ(Read(Path("toy.weights")), saved);
  EXPECT_EQ(ExportPolicyWeights(Path("missing.pt")).status().code(),
            absl::StatusCode::kNotFound);
}

TEST_F(PolicyWeightsFileTest, DamagedFilesAreRefusedWithTheReason) {
  Save("toy", {.hidden = 16, .layers = 2, .head_hidden = 8, .film_hidden = 4},
       "toy", "toy", "0123456789abcdef");
  const std::string good = Read(Path("toy.weights"));
  auto expect = [&](const std::string& bytes, absl::StatusCode code,
                    const std::string& what) {
    Write(Path("bad.weights"), bytes);
    auto r = ReadPolicyWeightsFile(Path("bad.weights"));
    ASSERT_FALSE(r.ok()) << what;
    EXPECT_EQ(r.status().code(), code) << r.status();
    EXPECT_THAT(r.status().message(), HasSubstr(Path("bad.weights")));
    EXPECT_THAT(r.status().message(), HasSubstr(what));
  };
  // Truncated anywhere: in the layers, in the metadata, in the header.
  expect(good.substr(0, good.size() - 100), absl::StatusCode::kDataLoss,
         "truncated policy weights file");
  expect(good.substr(0, 40), absl::StatusCode::kDataLoss,
         "truncated policy weights file");
  expect(good.substr(0, 10), absl::StatusCode::kDataLoss,
         "truncated policy weights file");
  expect("", absl::StatusCode::kDataLoss, "not an arachne policy weights file");
  std::string magic = good;
  magic[7] = '2';
  expect(magic, absl::StatusCode::kDataLoss,
         "not an arachne policy weights file");
  std::string flipped = good;
  flipped[good.size() / 2] ^= 0x40;
  expect(flipped, absl::StatusCode::kDataLoss, "checksum mismatch");
  expect(good + "x", absl::StatusCode::kDataLoss, "after the last layer");
  // Layers of another network than the metadata says: a .weights of a
  // hidden-16 network with the metadata of a hidden-32 one.
  PolicyCheckpointInfo info;
  info.model = "toy";
  info.profile_name = "toy";
  auto other = PolicyNetwork::Create(
      {.hidden = 16, .layers = 2, .head_hidden = 8, .film_hidden = 4}, 1);
  ASSERT_TRUE(other.ok());
  PolicyWeights mismatched = *(*other)->inference_weights();
  mismatched.config.hidden = 32;
  expect(SerializePolicyWeights(info, mismatched), absl::StatusCode::kDataLoss,
         "layer film_out is 4x");
  PolicyWeights huge = *(*other)->inference_weights();
  huge.config.hidden = 5000;
  expect(SerializePolicyWeights(info, huge), absl::StatusCode::kDataLoss,
         "network.hidden must be in [1, 4096], got 5000");
  // Another format version.
  info.format_version = kPolicyFormatVersion + 1;
  expect(SerializePolicyWeights(info, *(*other)->inference_weights()),
         absl::StatusCode::kFailedPrecondition, "checkpoint format version");
  EXPECT_EQ(ReadPolicyWeightsFile(Path("none.weights")).status().message(),
            Path("none.weights") + " does not exist");
}

TEST_F(PolicyWeightsFileTest, TheFactoryPlansFromWeightsFilesAlone) {
  Save("toy", {.hidden = 16, .layers = 2, .head_hidden = 8, .film_hidden = 4},
       "toy", "toy", ToyFingerprint("toy"));
  // No LibTorch archive: only the .weights file is read.
  std::filesystem::remove(Path("toy.pt"));
  std::filesystem::remove(Path("toy.json"));
  RegisterTorchPolicy({.policies_dir = dir_.string()});
  testing::ToyComposition toy;
  PlannerOptions options;
  options.seed = 1;
  auto r = LearnedPlanner({.sampled_rollouts = 4}).Run(toy.cost_model(),
                                                       options);
  ASSERT_TRUE(r.ok()) << r.status();
  EXPECT_TRUE(ValidatePlan(r->plan, toy.cost_model()).ok());
  // A damaged one is named in the reason.
  Write(Path("toy.weights"), "garbage");
  auto bad = LearnedPlanner().Run(toy.cost_model(), options);
  ASSERT_FALSE(bad.ok());
  EXPECT_THAT(bad.status().message(),
              HasSubstr(Path("toy.weights") +
                        ": not an arachne policy weights file"));
}

}  // namespace
}  // namespace arachne
