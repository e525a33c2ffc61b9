// The policy network: sizes, masking (illegal actions get probability
// exactly 0), candidate-count independence and inference cost.
#include "planner_service/policy/policy_network.h"

#include <chrono>
#include <cmath>
#include <random>

#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "test/policy/policy_test_fixture.h"

namespace arachne {
namespace {

using ::testing::HasSubstr;

TEST(PolicyNetworkTest, RejectsBadSizes) {
  auto net = PolicyNetwork::Create({.hidden = 0}, 1);
  EXPECT_EQ(net.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(net.status().message(),
              HasSubstr("hidden must be in [1, 4096], got 0"));
}

TEST(PolicyNetworkTest, ParameterCountFollowsTheSizes) {
  auto net = PolicyNetwork::Create({}, 1);
  ASSERT_TRUE(net.ok()) << net.status();
  // FiLM 13->32->(2*128*2 + 2*64*3); backbone 137->128->128; heads
  // (128+7)->64->1, (128+9)->64->1, (128+7)->64->1.
  const int64_t film = (13 * 32 + 32) + (32 * 896 + 896);
  const int64_t backbone = (137 * 128 + 128) + (128 * 128 + 128);
  const int64_t heads = (135 * 64 + 64 + 65) + (137 * 64 + 64 + 65) +
                        (135 * 64 + 64 + 65);
  EXPECT_EQ((*net)->ParameterCount(), film + backbone + heads);
}

// Every head, along random legal episodes: one probability per action,
// exactly 0 where the mask says illegal, positive where legal, summing to 1.
TEST(PolicyNetworkTest, ProbabilitiesRespectTheMaskAtEveryHead) {
  testing::ToyComposition toy;
  ConstructionEnv env = toy.Env();
  auto net = PolicyNetwork::Create({.hidden = 32, .head_hidden = 16}, 7);
  ASSERT_TRUE(net.ok());
  std::seed_seq seq{5};
  std::mt19937_64 rng(seq);
  int seen[3] = {0, 0, 0};
  int masked = 0;
  for (int episode = 0; episode < 20; ++episode) {
    env.Reset();
    while (!env.done()) {
      absl::Span<const uint8_t> mask = env.LegalMask();
      const size_t expected = env.head() == EnvHead::kDepth    ? 17u
                              : env.head() == EnvHead::kDevice ? 16u
                                                               : 4u;
      ASSERT_EQ(mask.size(), expected);
      std::vector<float> p(mask.size(), -1);
      (*net)->ActionProbabilities(env, absl::MakeSpan(p));
      double sum = 0;
      for (size_t a = 0; a < p.size(); ++a) {
        if (mask[a]) {
          EXPECT_GT(p[a], 0);
        } else {
          EXPECT_EQ(p[a], 0.0f);
          ++masked;
        }
        sum += p[a];
      }
      EXPECT_NEAR(sum, 1.0, 1e-5);
      const std::vector<float> logits = (*net)->Logits(env);
      for (size_t a = 0; a < logits.size(); ++a) {
        if (!mask[a]) {
          EXPECT_EQ(logits[a], kMaskedLogit);
        }
      }
      ++seen[static_cast<int>(env.head())];
      env.Step(env.UniformLegalAction(rng));
    }
  }
  EXPECT_GT(seen[0], 0);
  EXPECT_GT(seen[1], 0);
  EXPECT_GT(seen[2], 0);
  EXPECT_GT(masked, 0);  // the toy cluster masks depths and TP 4, 8
}

TEST(PolicyNetworkTest, TpCandidatesReadThePendingTypeOfTheState) {
  testing::ToyComposition toy;
  ConstructionEnv env = toy.Env();
  env.Step(1);  // depth 1
  const int fast_slot = env.SlotOfType(testing::kFast);
  env.Step(fast_slot);
  ASSERT_EQ(env.head(), EnvHead::kTp);
  std::vector<float> rows;
  ASSERT_EQ(HeadCandidates(env, &rows), kTpCandidateFeatures);
  ASSERT_EQ(rows.size(), 4u * kTpCandidateFeatures);
  absl::Span<const float> s = env.State();
  const float* type = &s[fast_slot * kEnvTypeFeatures];
  for (int k = 0; k < 4; ++k) {
    const float* row = &rows[k * kTpCandidateFeatures];
    EXPECT_EQ(row[0], type[env_type_feature::kRelativeSpeed + k]);
    EXPECT_EQ(row[1], type[env_type_feature::kEffectiveSpeed + k]);
    EXPECT_EQ(row[2], type[env_type_feature::kLayerMemory + k]);
    for (int j = 0; j < 4; ++j) EXPECT_EQ(row[3 + j], j == k ? 1.0f : 0.0f);
  }
}

// The whole greedy episode of the default-size network on a toy cluster:
// well under a millisecond per decision on one core.
TEST(PolicyNetworkTest, InferenceIsFast) {
  testing::ToyComposition toy;
  ConstructionEnv env = toy.Env();
  auto net = PolicyNetwork::Create({}, 3);
  ASSERT_TRUE(net.ok());
  std::vector<float> p(17);
  int decisions = 0;
  const auto start = std::chrono::steady_clock::now();
  for (int episode = 0; episode < 50; ++episode) {
    env.Reset();
    while (!env.done()) {
      absl::Span<float> probs = absl::MakeSpan(p.data(), env.LegalMask().size());
      (*net)->ActionProbabilities(env, probs);
      int best = 0;
      for (size_t a = 1; a < probs.size(); ++a)
        if (probs[a] > probs[best]) best = static_cast<int>(a);
      env.Step(best);
      ++decisions;
    }
  }
  const double us = std::chrono::duration<double, std::micro>(
                        std::chrono::steady_clock::now() - start)
                        .count();
  RecordProperty("us_per_decision", static_cast<int>(us / decisions));
  EXPECT_LT(us / decisions, 1000.0);
}

}  // namespace
}  // namespace arachne
