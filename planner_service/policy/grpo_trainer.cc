#include "planner_service/policy/grpo_trainer.h"

#include <torch/torch.h>

#include <algorithm>
#include <array>
#include <chrono>
#include <cmath>
#include <numeric>
#include <random>
#include <utility>

#include "absl/random/bit_gen_ref.h"
#include "absl/strings/str_cat.h"
#include "glog/logging.h"
#include "planner_service/policy/policy_network_module.h"

namespace arachne {
namespace {

constexpr int kMaxRows = std::max(kEnvDepthActions, kEnvDeviceSlots);
constexpr int kMaxFeatures = kEnvDeviceFeatures;  // widest candidate row

// One decision of a rollout, with everything the update needs to re-score
// it under the current weights.
struct Decision {
  int head = 0;  // HeadIndex
  int action = 0;
  float old_log_probability = 0;
  bool on_policy = true;       // drawn from the policy (not forced)
  float entropy_weight = 0;    // 1 / decisions of its template
  std::array<float, kEnvStateSize> state{};
  std::array<float, kMaxRows * kMaxFeatures> candidates{};
  std::array<uint8_t, kMaxRows> legal{};
};

struct Rollout {
  std::vector<Decision> decisions;
  double reward = 0;     // normalised episode return
  int first_depth = 0;   // depth of the first template (0: none)
  double advantage = 0;  // group-relative
};

int Rows(int head) {
  return head == 0 ? kEnvDepthActions
                   : (head == 1 ? kEnvDeviceSlots : kEnvTpSlots);
}

double Uniform01(std::mt19937_64& rng) {
  return static_cast<double>(rng() >> 11) * 0x1.0p-53;
}

int SampleFrom(const std::vector<float>& log_p, absl::Span<const uint8_t> mask,
               std::mt19937_64& rng) {
  const double u = Uniform01(rng);
  double acc = 0;
  int last = -1;
  for (size_t a = 0; a < log_p.size(); ++a) {
    if (!mask[a]) continue;
    acc += std::exp(static_cast<double>(log_p[a]));
    last = static_cast<int>(a);
    if (u < acc) return last;
  }
  CHECK_GE(last, 0);
  return last;
}

int ArgMax(const std::vector<float>& log_p, absl::Span<const uint8_t> mask) {
  int best = -1;
  for (size_t a = 0; a < log_p.size(); ++a) {
    if (mask[a] && (best < 0 || log_p[a] > log_p[best]))
      best = static_cast<int>(a);
  }
  CHECK_GE(best, 0);
  return best;
}

// Decisions of one head in tensors, for a batched forward pass.
struct HeadBatch {
  torch::Tensor state, candidates, legal, action, old_log_probability,
      advantage, on_policy, entropy_weight, imitation_weight;
};

}  // namespace

struct GrpoTrainer::State {
  GrpoConfig config;
  std::vector<const CostModel*> cost_models;
  std::vector<ConstructionEnv> envs;
  std::unique_ptr<PolicyNetwork> network;
  PolicyScratch scratch;  // Play's inference buffers
  std::unique_ptr<torch::optim::Adam> optimizer;
  std::mt19937_64 rng;
  std::vector<int> order;  // composition visiting order (reshuffled)
  size_t next = 0;
  int64_t episodes = 0;
  int iteration = 0;
  double best_reward = -1e300;
  std::chrono::steady_clock::time_point start;
  // Replay buffers: [composition][depth] best rollouts, best first.
  std::vector<std::vector<std::vector<Rollout>>> replay;
  // Per composition, the sil_similar others with the nearest composition
  // summaries (Euclidean), nearest first.
  std::vector<std::vector<int>> similar;

  std::vector<int> NextBatch();
  // With `script`, plays its actions instead (all forced-off-policy
  // decisions are still scored by the policy); *followed is false when an
  // action of the script is illegal here or the episode ends before or after
  // the script does.
  Rollout Play(int composition, bool force_depth, bool uniform_types,
               bool greedy, std::mt19937_64& gen,
               const std::vector<int>* script = nullptr,
               bool* followed = nullptr);
  void Remember(int composition, const Rollout& r);
  // Loss of one composition: PPO on `rollouts` plus imitation of `imitate`
  // (weights in Rollout::advantage).
  torch::Tensor Loss(const std::vector<Rollout>& rollouts,
                     const std::vector<Rollout>& imitate);
};

std::vector<int> GrpoTrainer::State::NextBatch() {
  std::vector<int> batch;
  const int n = std::min<int>(config.batch_compositions, envs.size());
  while (static_cast<int>(batch.size()) < n) {
    if (next >= order.size()) {
      std::shuffle(order.begin(), order.end(), rng);
      next = 0;
    }
    const int c = order[next++];
    if (std::find(batch.begin(), batch.end(), c) == batch.end())
      batch.push_back(c);
  }
  return batch;
}

Rollout GrpoTrainer::State::Play(int composition, bool force_depth,
                                 bool uniform_types, bool greedy,
                                 std::mt19937_64& gen,
                                 const std::vector<int>* script,
                                 bool* followed) {
  if (followed != nullptr) *followed = true;
  ConstructionEnv& env = envs[composition];
  env.Reset();
  Rollout r;
  std::vector<float> candidates, log_p;
  int template_start = 0;
  while (!env.done()) {
    Decision d;
    d.head = HeadIndex(env.head());
    network->Logits(env, scratch, &log_p);
    absl::Span<const uint8_t> mask = env.LegalMask();
    const bool first_depth = env.head() == EnvHead::kDepth &&
                             env.templates_placed() == 0;
    if (script != nullptr) {
      const size_t i = r.decisions.size();
      if (i >= script->size() || (*script)[i] < 0 ||
          (*script)[i] >= static_cast<int>(mask.size()) ||
          !mask[(*script)[i]]) {
        *followed = false;
        return r;
      }
      d.action = (*script)[i];
      d.on_policy = false;
    } else if (force_depth && first_depth) {
      d.action = env.UniformFeasibleDepth(absl::BitGenRef(gen));
      d.on_policy = false;
    } else if (uniform_types && env.head() == EnvHead::kDevice) {
      d.action = env.UniformLegalAction(absl::BitGenRef(gen));
      d.on_policy = false;
    } else {
      d.action = greedy ? ArgMax(log_p, mask) : SampleFrom(log_p, mask, gen);
    }
    if (first_depth) r.first_depth = d.action;
    d.old_log_probability = log_p[d.action];
    absl::Span<const float> state = env.State();
    std::copy(state.begin(), state.end(), d.state.begin());
    const int features = HeadCandidates(env, &candidates);
    CHECK_LE(features, kMaxFeatures);
    // Rows are stored at the widest stride so one layout serves all heads.
    for (int row = 0; row < Rows(d.head); ++row) {
      std::copy_n(candidates.data() + row * features, features,
                  d.candidates.data() + row * kMaxFeatures);
      d.legal[row] = mask[row];
    }
    const bool is_depth = env.head() == EnvHead::kDepth;
    if (is_depth) template_start = static_cast<int>(r.decisions.size());
    r.decisions.push_back(d);
    const StepOutcome step = env.Step(r.decisions.back().action);
    // A step (template) ends at STOP, at its last TP decision, or with the
    // episode: spread one unit of entropy weight over its decisions.
    if (step.template_completed || step.done || (is_depth && d.action == 0)) {
      const int count = static_cast<int>(r.decisions.size()) - template_start;
      for (size_t i = template_start; i < r.decisions.size(); ++i)
        r.decisions[i].entropy_weight = 1.0f / count;
      template_start = static_cast<int>(r.decisions.size());
    }
  }
  r.reward = env.episode_return();
  if (script != nullptr && r.decisions.size() != script->size())
    *followed = false;
  return r;
}

void GrpoTrainer::State::Remember(int composition, const Rollout& r) {
  if (config.sil_per_depth == 0 || r.first_depth <= 0) return;
  std::vector<Rollout>& buffer = replay[composition][r.first_depth];
  if (static_cast<int>(buffer.size()) == config.sil_per_depth &&
      buffer.back().reward >= r.reward)
    return;
  buffer.push_back(r);
  std::stable_sort(buffer.begin(), buffer.end(),
                   [](const Rollout& a, const Rollout& b) {
                     return a.reward > b.reward;
                   });
  if (static_cast<int>(buffer.size()) > config.sil_per_depth)
    buffer.resize(config.sil_per_depth);
}

torch::Tensor GrpoTrainer::State::Loss(const std::vector<Rollout>& rollouts,
                                       const std::vector<Rollout>& imitate) {
  // Gather decisions per head.
  std::array<std::vector<const Decision*>, 3> by_head;
  std::array<std::vector<float>, 3> advantage, imitation;
  double templates = 0;
  int on_policy = 0;
  for (const Rollout& r : rollouts) {
    for (const Decision& d : r.decisions) {
      by_head[d.head].push_back(&d);
      advantage[d.head].push_back(static_cast<float>(r.advantage));
      imitation[d.head].push_back(0);
      templates += d.entropy_weight;
      on_policy += d.on_policy;
    }
  }
  int imitated = 0;
  for (const Rollout& r : imitate) {
    for (const Decision& d : r.decisions) {
      by_head[d.head].push_back(&d);
      advantage[d.head].push_back(0);
      imitation[d.head].push_back(static_cast<float>(r.advantage));
      ++imitated;
    }
  }
  torch::Tensor policy_term = torch::zeros({});
  torch::Tensor entropy_term = torch::zeros({});
  torch::Tensor imitation_term = torch::zeros({});
  for (int h = 0; h < 3; ++h) {
    const int64_t n = static_cast<int64_t>(by_head[h].size());
    if (n == 0) continue;
    const int rows = Rows(h);
    const int features = kHeadFeatures[h];
    torch::Tensor state = torch::empty({n, kEnvStateSize});
    torch::Tensor cand = torch::empty({n, rows, features});
    torch::Tensor legal = torch::empty({n, rows}, torch::kBool);
    torch::Tensor action = torch::empty({n}, torch::kLong);
    torch::Tensor old_lp = torch::empty({n});
    torch::Tensor on = torch::empty({n});
    torch::Tensor ent_w = torch::empty({n});
    float* sp = state.data_ptr<float>();
    float* cp = cand.data_ptr<float>();
    bool* lp = legal.data_ptr<bool>();
    int64_t* ap = action.data_ptr<int64_t>();
    float* op = old_lp.data_ptr<float>();
    float* onp = on.data_ptr<float>();
    float* ep = ent_w.data_ptr<float>();
    for (int64_t i = 0; i < n; ++i) {
      const Decision& d = *by_head[h][i];
      std::copy(d.state.begin(), d.state.end(), sp + i * kEnvStateSize);
      for (int row = 0; row < rows; ++row) {
        std::copy_n(d.candidates.data() + row * kMaxFeatures, features,
                    cp + (i * rows + row) * features);
        lp[i * rows + row] = d.legal[row] != 0;
      }
      ap[i] = d.action;
      op[i] = d.old_log_probability;
      // Imitated decisions carry no PPO or entropy term.
      const bool imitation_row = imitation[h][i] != 0;
      onp[i] = (!imitation_row && d.on_policy) ? 1.0f : 0.0f;
      ep[i] = imitation_row ? 0.0f : d.entropy_weight;
    }
    const torch::Tensor adv = torch::from_blob(advantage[h].data(), {n}).clone();
    const torch::Tensor imit =
        torch::from_blob(imitation[h].data(), {n}).clone();
    const torch::Tensor log_p =
        network->module().LogProbabilities(h, state, cand, legal);
    const torch::Tensor chosen = log_p.gather(1, action.unsqueeze(1)).squeeze(1);
    const torch::Tensor ratio = torch::exp(chosen - old_lp);
    const torch::Tensor surrogate = torch::min(
        ratio * adv,
        torch::clamp(ratio, 1 - config.clip, 1 + config.clip) * adv);
    policy_term = policy_term + (surrogate * on).sum();
    // Entropy over legal actions only (masked ones have p = 0 exactly).
    const torch::Tensor entropy =
        -(log_p.exp() * log_p.masked_fill(legal.logical_not(), 0)).sum(1);
    entropy_term = entropy_term + (entropy * ent_w).sum();
    imitation_term = imitation_term + (chosen * imit).sum();
  }
  torch::Tensor loss = -policy_term / std::max(on_policy, 1) -
                       config.entropy_coef * entropy_term /
                           std::max(templates, 1.0);
  if (imitated > 0)
    loss = loss - config.sil_coef * imitation_term / imitated;
  return loss;
}

GrpoTrainer::GrpoTrainer(std::unique_ptr<State> state) : s_(std::move(state)) {}
GrpoTrainer::~GrpoTrainer() = default;

absl::StatusOr<std::unique_ptr<GrpoTrainer>> GrpoTrainer::Create(
    const GrpoConfig& config, std::vector<const CostModel*> compositions) {
  auto bad = [](const char* field, auto value) {
    return absl::InvalidArgumentError(
        absl::StrCat("GRPO trainer: ", field, " is out of range, got ", value));
  };
  if (config.group_size < 2) return bad("group_size (>= 2)", config.group_size);
  if (config.batch_compositions < 1)
    return bad("batch_compositions (>= 1)", config.batch_compositions);
  if (config.episodes < 1) return bad("episodes (>= 1)", config.episodes);
  if (config.ppo_epochs < 1) return bad("ppo_epochs (>= 1)", config.ppo_epochs);
  if (!(config.clip > 0)) return bad("clip (> 0)", config.clip);
  if (!(config.learning_rate > 0))
    return bad("learning_rate (> 0)", config.learning_rate);
  for (double p : {config.forced_depth_start, config.forced_depth_end}) {
    if (!(p >= 0 && p <= 1)) return bad("forced_depth probability ([0, 1])", p);
  }
  if (config.sil_interval < 1)
    return bad("sil_interval (>= 1)", config.sil_interval);
  if (config.sil_per_depth < 0)
    return bad("sil_per_depth (>= 0)", config.sil_per_depth);
  if (config.sil_similar < 0)
    return bad("sil_similar (>= 0)", config.sil_similar);
  if (compositions.empty()) {
    return absl::InvalidArgumentError(
        "GRPO trainer: no training compositions");
  }
  // One thread: reductions in a fixed order, so a seed reproduces a run
  // (and the 2 cores here are shared).
  torch::set_num_threads(1);
  auto s = std::make_unique<State>();
  s->config = config;
  s->cost_models = std::move(compositions);
  for (size_t c = 0; c < s->cost_models.size(); ++c) {
    absl::StatusOr<ConstructionEnv> env =
        ConstructionEnv::Create(*s->cost_models[c], config.env);
    if (!env.ok()) {
      return absl::Status(env.status().code(),
                          absl::StrCat("GRPO trainer: composition ", c, ": ",
                                       env.status().message()));
    }
    s->envs.push_back(*std::move(env));
  }
  absl::StatusOr<std::unique_ptr<PolicyNetwork>> network =
      PolicyNetwork::Create(config.network, config.seed);
  if (!network.ok()) return network.status();
  s->network = *std::move(network);
  s->optimizer = std::make_unique<torch::optim::Adam>(
      s->network->module().parameters(),
      torch::optim::AdamOptions(config.learning_rate));
  s->rng.seed(config.seed);
  s->order.resize(s->envs.size());
  std::iota(s->order.begin(), s->order.end(), 0);
  s->next = s->order.size();  // shuffle on first use
  s->replay.assign(s->envs.size(),
                   std::vector<std::vector<Rollout>>(kEnvMaxDepth + 1));
  const int n = static_cast<int>(s->envs.size());
  s->similar.resize(n);
  for (int c = 0; c < n; ++c) {
    std::vector<std::pair<double, int>> by_distance;
    absl::Span<const float> a = s->envs[c].CompositionSummary();
    for (int o = 0; o < n; ++o) {
      if (o == c) continue;
      absl::Span<const float> b = s->envs[o].CompositionSummary();
      double d2 = 0;
      for (size_t i = 0; i < a.size(); ++i) d2 += (a[i] - b[i]) * (a[i] - b[i]);
      by_distance.push_back({d2, o});
    }
    std::sort(by_distance.begin(), by_distance.end());
    for (int k = 0; k < std::min<int>(config.sil_similar, by_distance.size());
         ++k)
      s->similar[c].push_back(by_distance[k].second);
  }
  s->start = std::chrono::steady_clock::now();
  return std::unique_ptr<GrpoTrainer>(new GrpoTrainer(std::move(s)));
}

GrpoIteration GrpoTrainer::RunIteration() {
  State& s = *s_;
  const GrpoConfig& cfg = s.config;
  GrpoIteration it;
  it.iteration = ++s.iteration;
  const double progress =
      std::min(1.0, static_cast<double>(s.episodes) / cfg.episodes);
  it.forced_probability = cfg.forced_depth_start +
                          (cfg.forced_depth_end - cfg.forced_depth_start) *
                              progress;
  const std::vector<int> batch = s.NextBatch();
  it.greedy_reward = GreedyReward(batch);

  std::vector<std::vector<Rollout>> groups(batch.size());
  std::vector<std::vector<Rollout>> imitate(batch.size());
  double reward_sum = 0;
  int rollouts = 0;
  const bool imitation_round =
      cfg.sil_per_depth > 0 && s.iteration % cfg.sil_interval == 0;
  for (size_t b = 0; b < batch.size(); ++b) {
    const int c = batch[b];
    std::vector<Rollout>& group = groups[b];
    for (int g = 0; g < cfg.group_size; ++g) {
      const bool uniform_types =
          cfg.uniform_type_rollout && g == cfg.group_size - 1;
      const bool force = Uniform01(s.rng) < it.forced_probability;
      group.push_back(s.Play(c, force, uniform_types, /*greedy=*/false, s.rng));
    }
    double mean = 0, var = 0;
    for (const Rollout& r : group) mean += r.reward;
    mean /= group.size();
    for (const Rollout& r : group) var += (r.reward - mean) * (r.reward - mean);
    const double sd = std::sqrt(var / group.size());
    for (Rollout& r : group) {
      // Equal returns carry no signal; the small floor keeps near-equal ones
      // from blowing up into ±large advantages.
      r.advantage = sd > 1e-6 ? (r.reward - mean) / (sd + 1e-3) : 0.0;
      reward_sum += r.reward;
      ++rollouts;
      s.best_reward = std::max(s.best_reward, r.reward);
      s.Remember(c, r);
    }
    if (imitation_round) {
      // (R - baseline)+ of self-imitation learning, the group mean as the
      // baseline, in units of the group's spread.
      const double spread = std::max(sd, 1e-3 * std::abs(mean) + 1e-6);
      for (const auto& buffer : s.replay[c]) {
        for (const Rollout& r : buffer) {
          if (r.reward <= mean) continue;
          Rollout copy = r;
          copy.advantage = std::min((r.reward - mean) / spread, 5.0);
          imitate[b].push_back(std::move(copy));
        }
      }
      // The best plans of similar compositions: their action sequences
      // replayed here (the decisions re-scored on this composition's
      // states), imitated when they are legal here and beat the group.
      for (int other : s.similar[c]) {
        for (const auto& buffer : s.replay[other]) {
          for (const Rollout& r : buffer) {
            std::vector<int> script;
            for (const Decision& d : r.decisions) script.push_back(d.action);
            bool followed = false;
            Rollout here =
                s.Play(c, false, false, false, s.rng, &script, &followed);
            if (!followed || here.reward <= mean) continue;
            here.advantage = std::min((here.reward - mean) / spread, 5.0);
            ++it.similar_imitated;
            imitate[b].push_back(std::move(here));
          }
        }
      }
    }
  }
  s.episodes += rollouts;
  it.episodes = s.episodes;
  it.mean_reward = reward_sum / std::max(rollouts, 1);
  it.best_reward = s.best_reward;

  auto params = s.network->module().parameters();
  double loss_sum = 0;
  for (int epoch = 0; epoch < cfg.ppo_epochs; ++epoch) {
    // One gradient per composition, flattened.
    std::vector<torch::Tensor> grads;
    for (size_t b = 0; b < batch.size(); ++b) {
      s.optimizer->zero_grad();
      torch::Tensor loss = s.Loss(groups[b], imitate[b]);
      if (!loss.requires_grad()) continue;
      loss.backward();
      loss_sum += loss.item<double>();
      std::vector<torch::Tensor> flat;
      for (const torch::Tensor& p : params) {
        flat.push_back(p.grad().defined() ? p.grad().reshape(-1).clone()
                                          : torch::zeros({p.numel()}));
      }
      grads.push_back(torch::cat(flat));
    }
    if (grads.empty()) break;
    std::vector<torch::Tensor> projected = grads;
    if (cfg.pcgrad && grads.size() > 1) {
      torch::NoGradGuard no_grad;
      for (size_t i = 0; i < grads.size(); ++i) {
        std::vector<size_t> others;
        for (size_t j = 0; j < grads.size(); ++j)
          if (j != i) others.push_back(j);
        std::shuffle(others.begin(), others.end(), s.rng);
        for (size_t j : others) {
          const double dot = (projected[i] * grads[j]).sum().item<double>();
          const double norm2 = (grads[j] * grads[j]).sum().item<double>();
          if (dot < 0 && norm2 > 0)
            projected[i] = projected[i] - (dot / norm2) * grads[j];
        }
      }
    }
    torch::Tensor total = projected[0];
    for (size_t i = 1; i < projected.size(); ++i) total = total + projected[i];
    total = total / static_cast<double>(projected.size());
    {
      torch::NoGradGuard no_grad;
      int64_t at = 0;
      for (torch::Tensor& p : params) {
        const int64_t n = p.numel();
        p.mutable_grad() = total.narrow(0, at, n).view_as(p).clone();
        at += n;
      }
    }
    torch::nn::utils::clip_grad_norm_(params, cfg.max_grad_norm);
    s.optimizer->step();
    s.network->SyncInference();
  }
  it.loss = loss_sum / std::max<size_t>(1, batch.size() * cfg.ppo_epochs);
  it.elapsed_s = std::chrono::duration<double>(
                     std::chrono::steady_clock::now() - s.start)
                     .count();
  return it;
}

std::vector<GrpoIteration> GrpoTrainer::Train(
    const std::function<void(const GrpoIteration&)>& on_iteration,
    const std::function<bool()>& keep_going) {
  std::vector<GrpoIteration> curve;
  while (s_->episodes < s_->config.episodes) {
    if (keep_going && !keep_going()) break;
    curve.push_back(RunIteration());
    if (on_iteration) on_iteration(curve.back());
  }
  return curve;
}

double GrpoTrainer::GreedyReward(const std::vector<int>& compositions) {
  std::vector<int> which = compositions;
  if (which.empty()) {
    which.resize(s_->envs.size());
    std::iota(which.begin(), which.end(), 0);
  }
  std::mt19937_64 unused(0);
  double sum = 0;
  for (int c : which)
    sum += s_->Play(c, false, false, /*greedy=*/true, unused).reward;
  return sum / which.size();
}

double GrpoTrainer::SampledReward(int rollouts, uint64_t seed,
                                  const std::vector<int>& compositions) {
  std::vector<int> which = compositions;
  if (which.empty()) {
    which.resize(s_->envs.size());
    std::iota(which.begin(), which.end(), 0);
  }
  std::mt19937_64 gen(seed);
  double sum = 0;
  int n = 0;
  for (int c : which) {
    for (int r = 0; r < rollouts; ++r, ++n)
      sum += s_->Play(c, false, false, /*greedy=*/false, gen).reward;
  }
  return n > 0 ? sum / n : 0;
}

PolicyNetwork& GrpoTrainer::network() { return *s_->network; }
int64_t GrpoTrainer::episodes() const { return s_->episodes; }
int GrpoTrainer::iteration() const { return s_->iteration; }
double GrpoTrainer::best_reward() const { return s_->best_reward; }

}  // namespace arachne
