// GRPO training of the template policy (paper §5.5). Each iteration takes
// a batch of training compositions and plays a group of G rollouts on each
// with the current policy, then updates the policy with
//  - PPO's clipped objective on group-relative advantages (each rollout's
//    normalised return against its group's mean and standard deviation; no
//    value network, so compositions of any throughput scale compare);
//  - forced feasible depth: with a probability decaying linearly from 0.8
//    to 0.25 over training, a rollout's first depth is drawn uniformly from
//    the feasible ones (ConstructionEnv::UniformFeasibleDepth) instead of
//    from the policy, so deep pipelines stay in every group;
//  - one uniform-type rollout per group (the device head draws uniformly);
//  - an entropy bonus per decision divided by the decision count of its
//    step (template), so deep templates do not earn more bonus;
//  - self-imitation: per composition and first-template depth, a replay
//    buffer of the best rollouts; every sil_interval iterations the policy
//    imitates the buffered rollouts that beat the current group mean, and
//    those of the sil_similar most similar compositions (nearest
//    composition summary), replayed action by action on this composition,
//    when every action is legal here and the replay beats the group mean;
//  - gradient surgery (PCGrad): each composition's gradient has the
//    components that conflict with another composition's projected out
//    before they are summed.
// Decisions drawn by the forcing rules are not in the PPO term (the policy
// did not choose them) but their rollouts keep their advantages for the
// policy's decisions and enter the replay buffers.
//
// Deterministic for a seed: LibTorch runs on one thread, draws use
// std::mt19937_64 seeded from GrpoConfig::seed.
#ifndef ARACHNE_PLANNER_SERVICE_POLICY_GRPO_TRAINER_H_
#define ARACHNE_PLANNER_SERVICE_POLICY_GRPO_TRAINER_H_

#include <cstdint>
#include <functional>
#include <memory>
#include <vector>

#include "absl/status/statusor.h"
#include "planner_service/core/learned/construction_env.h"
#include "planner_service/core/cost/cost_model.h"
#include "planner_service/policy/policy_network.h"

namespace arachne {

struct GrpoConfig {
  // Rollouts to play in total (training stops after the iteration that
  // reaches it); also the horizon of the forced-depth schedule.
  int64_t episodes = 4000;
  uint64_t seed = 1;
  int group_size = 8;          // G rollouts per composition per iteration
  int batch_compositions = 4;  // compositions per update
  int ppo_epochs = 4;          // passes over an iteration's decisions
  double clip = 0.2;           // PPO ratio clip ε
  double learning_rate = 3e-3;  // Adam
  double max_grad_norm = 1.0;
  double entropy_coef = 0.01;
  double forced_depth_start = 0.8;
  double forced_depth_end = 0.25;
  bool uniform_type_rollout = true;
  double sil_coef = 0.5;
  int sil_interval = 2;  // iterations between imitation terms
  int sil_per_depth = 1;  // best rollouts kept per (composition, depth)
  // Similar compositions (nearest composition summaries) whose buffered
  // rollouts are replayed and imitated too, when legal and better here.
  int sil_similar = 1;
  bool pcgrad = true;
  PolicyNetworkConfig network;
  ConstructionEnvConfig env;
};

// One iteration's figures (normalised returns, ConstructionEnv).
struct GrpoIteration {
  int iteration = 0;
  int64_t episodes = 0;  // rollouts played so far
  double mean_reward = 0;  // mean return of this iteration's rollouts
  double best_reward = 0;  // best single return so far
  double greedy_reward = 0;  // mean greedy return on this batch (pre-update)
  double forced_probability = 0;
  double loss = 0;
  double elapsed_s = 0;
  // Rollouts of similar compositions imitated in this iteration.
  int similar_imitated = 0;
};

class GrpoTrainer {
 public:
  // `compositions` are the training compositions' cost models (each must
  // outlive the trainer). InvalidArgument naming the field for a bad config
  // (group_size < 2, batch_compositions < 1, episodes < 1, ppo_epochs < 1,
  // clip <= 0, learning_rate <= 0, probabilities outside [0, 1],
  // sil_interval < 1, sil_per_depth < 0, sil_similar < 0) or an empty
  // composition list; a
  // composition's ConstructionEnv::Create error, naming its index.
  static absl::StatusOr<std::unique_ptr<GrpoTrainer>> Create(
      const GrpoConfig& config, std::vector<const CostModel*> compositions);
  ~GrpoTrainer();

  // Plays and learns from one iteration.
  GrpoIteration RunIteration();
  // Iterations until config.episodes rollouts are played or `keep_going`
  // (when set) returns false; `on_iteration` (when set) sees each one.
  std::vector<GrpoIteration> Train(
      const std::function<void(const GrpoIteration&)>& on_iteration = nullptr,
      const std::function<bool()>& keep_going = nullptr);

  // Mean return of one greedy rollout on each of `compositions` (indices;
  // empty: all), no learning.
  double GreedyReward(const std::vector<int>& compositions = {});
  // Mean return of `rollouts` sampled rollouts per composition drawn with a
  // generator seeded by `seed` (no forcing, no learning).
  double SampledReward(int rollouts, uint64_t seed,
                       const std::vector<int>& compositions = {});

  PolicyNetwork& network();
  int64_t episodes() const;
  int iteration() const;
  double best_reward() const;

 private:
  struct State;
  explicit GrpoTrainer(std::unique_ptr<State> state);
  std::unique_ptr<State> s_;
};

}  // namespace arachne

#endif  // ARACHNE_PLANNER_SERVICE_POLICY_GRPO_TRAINER_H_
