// The model-conditioned ("general") policy: the network reads the model
// summary, its checkpoint says so, the factory serves any model with it
// after the model's own and its relative's, and `arachne train --models`
// trains it across catalog and generated models.
#include <algorithm>
#include <cmath>
#include <filesystem>
#include <fstream>
#include <random>
#include <sstream>

#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "planner_service/core/learned/learned_planner.h"
#include "planner_service/core/cost/plan_validation.h"
#include "planner_service/io/data_files.h"
#include "planner_service/policy/checkpoint.h"
#include "planner_service/policy/policy_network.h"
#include "planner_service/policy/torch_policy.h"
#include "planner_service/policy/train_command.h"
#include "test/policy/policy_test_fixture.h"

namespace arachne {
namespace {

using ::testing::HasSubstr;
using ::testing::Not;

std::filesystem::path FreshDir() {
  const auto dir =
      std::filesystem::path(::testing::TempDir()) /
      absl::StrCat("general_policy_",
                   ::testing::UnitTest::GetInstance()->current_test_info()->name());
  std::filesystem::remove_all(dir);
  std::filesystem::create_directories(dir);
  return dir;
}

PolicyNetworkConfig Small(bool conditioned) {
  return {.hidden = 32, .layers = 2, .head_hidden = 16, .film_hidden = 8,
          .model_conditioned = conditioned};
}

TEST(GeneralPolicyTest, ConditionedNetworkReadsTheWholeState) {
  auto net = PolicyNetwork::Create({.model_conditioned = true}, 1);
  ASSERT_TRUE(net.ok()) << net.status();
  // FiLM over 13 + 13 summary entries, the backbone over all 150 entries;
  // heads as in the per-model network.
  const int64_t film = (26 * 32 + 32) + (32 * 896 + 896);
  const int64_t backbone = (150 * 128 + 128) + (128 * 128 + 128);
  const int64_t heads = (135 * 64 + 64 + 65) + (137 * 64 + 64 + 65) +
                        (135 * 64 + 64 + 65);
  EXPECT_EQ((*net)->ParameterCount(), film + backbone + heads);
}

// The float snapshot and the LibTorch module agree for a conditioned
// network at every head of random episodes.
TEST(GeneralPolicyTest, SnapshotMatchesTheModuleWithTheModelSummary) {
  testing::ToyComposition toy;
  ConstructionEnv env = toy.Env();
  auto net = PolicyNetwork::Create(Small(true), 5);
  ASSERT_TRUE(net.ok());
  PolicyNetwork& n = **net;
  std::mt19937_64 rng(3);
  int decisions = 0;
  for (int episode = 0; episode < 5; ++episode) {
    env.Reset();
    while (!env.done()) {
      const std::vector<float> fast = n.Logits(env);
      const std::vector<float> torch = n.TorchLogits(env);
      ASSERT_EQ(fast.size(), torch.size());
      for (size_t a = 0; a < fast.size(); ++a)
        EXPECT_NEAR(fast[a], torch[a], 1e-4) << "action " << a;
      ++decisions;
      env.Step(env.UniformLegalAction(rng));
    }
  }
  EXPECT_GT(decisions, 10);
}

// A per-model network (the state's first kEnvUnconditionedStateSize
// entries) and a conditioned one (all of it) of one seed on the same state:
// both give a distribution over the legal actions, and not the same one.
TEST(GeneralPolicyTest, BothLayoutsGiveDistributionsOverTheLegalActions) {
  testing::ToyComposition toy;
  ConstructionEnv env = toy.Env();
  absl::Span<const float> m = env.ModelSummary();
  EXPECT_GT(*std::max_element(m.begin(), m.end()), 0);
  auto per_model = PolicyNetwork::Create(Small(false), 9);
  auto conditioned = PolicyNetwork::Create(Small(true), 9);
  ASSERT_TRUE(per_model.ok() && conditioned.ok());
  // Same seed, different first-layer input widths: the logits of the two
  // differ, and each is a proper distribution over the legal actions.
  for (PolicyNetwork* net : {per_model->get(), conditioned->get()}) {
    std::vector<float> p(env.LegalMask().size());
    net->ActionProbabilities(env, absl::MakeSpan(p));
    double sum = 0;
    for (size_t a = 0; a < p.size(); ++a) {
      if (!env.LegalMask()[a]) {
        EXPECT_EQ(p[a], 0);
      }
      sum += p[a];
    }
    EXPECT_NEAR(sum, 1, 1e-5);
  }
  EXPECT_NE((*per_model)->Logits(env), (*conditioned)->Logits(env));
}

TEST(GeneralPolicyTest, CheckpointKeepsTheConditioningAndTrainingModels) {
  const auto dir = FreshDir();
  auto net = PolicyNetwork::Create(Small(true), 4);
  ASSERT_TRUE(net.ok());
  PolicyCheckpointInfo info;
  info.model = kGeneralPolicyModel;
  info.profile_name = kGeneralPolicyProfiles;
  info.profile_fingerprint = "0123456789abcdef";
  info.training.models = {"llama3-8b", "mixtral-8x7b"};
  info.training.generated_models = 5;
  const std::string path = (dir / "general.pt").string();
  ASSERT_TRUE(SavePolicyCheckpoint(**net, info, path).ok());
  auto loaded = LoadPolicyCheckpoint(path);
  ASSERT_TRUE(loaded.ok()) << loaded.status();
  EXPECT_TRUE(loaded->info.network.model_conditioned);
  EXPECT_EQ(loaded->info.model, "general");
  EXPECT_EQ(loaded->info.profile_name, "*");
  EXPECT_THAT(loaded->info.training.models,
              ::testing::ElementsAre("llama3-8b", "mixtral-8x7b"));
  EXPECT_EQ(loaded->info.training.generated_models, 5);
  testing::ToyComposition toy;
  ConstructionEnv env = toy.Env();
  EXPECT_EQ(loaded->network->Logits(env), (*net)->Logits(env));
  // A per-model checkpoint's metadata carries neither field.
  PolicyCheckpointInfo plain;
  plain.model = "toy";
  const std::string json = CheckpointInfoToJson(plain);
  EXPECT_THAT(json, Not(HasSubstr("model_conditioned")));
  EXPECT_THAT(json, Not(HasSubstr("generated_models")));
  auto parsed = ParseCheckpointInfo(json, "toy.json");
  ASSERT_TRUE(parsed.ok());
  EXPECT_FALSE(parsed->network.model_conditioned);
}

class GeneralFactoryTest : public ::testing::Test {
 protected:
  void TearDown() override { RegisterLearnedPolicyFactory(nullptr); }
  void WriteGeneral(bool conditioned) {
    auto net = PolicyNetwork::Create(Small(conditioned), 2);
    ASSERT_TRUE(net.ok());
    auto calibration = ReadDataFile("calibration.json", "");
    ASSERT_TRUE(calibration.ok());
    PolicyCheckpointInfo info;
    info.model = kGeneralPolicyModel;
    info.profile_name = kGeneralPolicyProfiles;
    info.profile_fingerprint = ProfileSetFingerprint(
        testing::ToyCatalog(), kGeneralPolicyProfiles, *calibration);
    ASSERT_TRUE(
        SavePolicyCheckpoint(**net, info, (dir_ / "general.pt").string())
            .ok());
  }
  std::filesystem::path dir_ = FreshDir();
};

TEST_F(GeneralFactoryTest, ServesAModelWithNoPolicyOfItsOwn) {
  WriteGeneral(true);
  testing::ToyComposition toy;  // model "toy": no toy.pt in dir_
  EXPECT_TRUE(MakeTorchPolicyFactory({.policies_dir = dir_.string()})(
                  toy.cost_model())
                  .ok());
  RegisterTorchPolicy({.policies_dir = dir_.string()});
  LearnedPlanner planner({.sampled_rollouts = 4});
  PlannerOptions options;
  options.seed = 1;
  auto r = planner.Run(toy.cost_model(), options);
  ASSERT_TRUE(r.ok()) << r.status();
  EXPECT_TRUE(ValidatePlan(r->plan, toy.cost_model()).ok());
}

TEST_F(GeneralFactoryTest, RefusesAGeneralFileThatIsNotConditioned) {
  WriteGeneral(false);
  testing::ToyComposition toy;
  RegisterTorchPolicy({.policies_dir = dir_.string()});
  auto r = LearnedPlanner().Run(toy.cost_model(), PlannerOptions{});
  EXPECT_EQ(r.status().code(), absl::StatusCode::kFailedPrecondition);
  // Every path tried, in the order of the selection rule.
  EXPECT_THAT(r.status().message(),
              HasSubstr((dir_ / "toy.weights").string() + " does not exist; " +
                        (dir_ / "general.weights").string() +
                        ": not a model-conditioned policy"));
}

TEST(GeneralTrainTest, TrainsTheConditionedPolicyAcrossModels) {
  const auto dir = FreshDir();
  TrainOptions o;
  o.models = {"llama3-8b", "mixtral-8x7b"};
  o.generated_models = 2;
  o.compositions = 4;
  o.episodes = 32;
  o.max_gpus = 64;
  o.seed = 2;
  o.out = (dir / "general.pt").string();
  o.grpo.network = {.hidden = 16, .layers = 1, .head_hidden = 8,
                    .film_hidden = 4};
  std::ostringstream out, err;
  ASSERT_EQ(RunTrainCommand(o, out, err), 0) << err.str();
  EXPECT_THAT(out.str(), HasSubstr("train general: 4 compositions"));
  EXPECT_THAT(out.str(),
              HasSubstr("4 models (2 from the catalog: llama3-8b, "
                        "mixtral-8x7b; 2 generated)"));
  EXPECT_THAT(out.str(), HasSubstr("trained general in"));
  auto loaded = LoadPolicyCheckpoint(o.out);
  ASSERT_TRUE(loaded.ok()) << loaded.status();
  EXPECT_EQ(loaded->info.model, "general");
  EXPECT_TRUE(loaded->info.network.model_conditioned);
  EXPECT_EQ(loaded->info.network.hidden, 16);
  EXPECT_THAT(loaded->info.training.models,
              ::testing::ElementsAre("llama3-8b", "mixtral-8x7b"));
  EXPECT_EQ(loaded->info.training.generated_models, 2);
}

TEST(GeneralTrainTest, OneModelAndSeveralModelsAreExclusive) {
  TrainOptions o;
  o.model = "llama3-8b";
  o.models = {"mixtral-8x7b"};
  o.out = "/tmp/unused.pt";
  std::ostringstream out, err;
  EXPECT_EQ(RunTrainCommand(o, out, err), 2);
  EXPECT_THAT(err.str(), HasSubstr("--model \"llama3-8b\" trains one model's "
                                   "policy; --models / --generated-models"));
  TrainOptions u;
  u.models = {"no-such-model"};
  u.out = "/tmp/unused.pt";
  std::ostringstream err2;
  EXPECT_EQ(RunTrainCommand(u, out, err2), 2);
  EXPECT_THAT(err2.str(),
              HasSubstr("--models: unknown model \"no-such-model\""));
}

}  // namespace
}  // namespace arachne
