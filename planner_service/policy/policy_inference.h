// The policy network's forward pass for one decision on plain float arrays
// (the inference snapshot of PolicyNetwork; LibTorch-free, so this
// translation unit compiles in a second and with -O3).
//
// Planning spends most of its time here (greedy, sampled and refinement
// rollouts each take one decision per action), so the layout is chosen for
// speed:
//  - weights are stored transposed, [in][out], so every layer is a sum of
//    input-weighted rows that the compiler vectorises over the outputs
//    (the [out][in] dot products LibTorch's layout gives are float
//    reductions, which it may not reorder);
//  - the FiLM generator depends only on the composition summary, which is
//    constant over a planning run, so a PolicyScratch keeps its output for
//    the last summary and network snapshot it saw;
//  - a PolicyScratch also keeps the working buffers, so a decision
//    allocates nothing.
#ifndef ARACHNE_PLANNER_SERVICE_POLICY_POLICY_INFERENCE_H_
#define ARACHNE_PLANNER_SERVICE_POLICY_POLICY_INFERENCE_H_

#include <array>
#include <cstdint>
#include <vector>

#include "absl/types/span.h"
#include "planner_service/core/learned/construction_env.h"

namespace arachne {

// Sizes of the network; stored in every checkpoint.
struct PolicyNetworkConfig {
  int hidden = 128;      // backbone width
  int layers = 2;        // backbone layers (each FiLM-conditioned)
  int head_hidden = 64;  // hidden width of each head's candidate scorer
  int film_hidden = 32;  // hidden width of the FiLM generator
  // Reads the model summary too (the backbone over the whole state, FiLM
  // over the composition and model summaries): one policy for every model.
  // false: the per-model layout, the state's first
  // kEnvUnconditionedStateSize entries and the composition summary.
  bool model_conditioned = false;
};

// State entries the network reads (a prefix of ConstructionEnv::State()).
inline int PolicyStateInputs(const PolicyNetworkConfig& c) {
  return c.model_conditioned ? kEnvStateSize : kEnvUnconditionedStateSize;
}
// Entries of its FiLM input, from kEnvSummaryOffset of the state.
inline int PolicyConditioningInputs(const PolicyNetworkConfig& c) {
  return kEnvSummarySize + (c.model_conditioned ? kEnvModelSummarySize : 0);
}

// Features of one TP-head candidate (TP 2^k of the pending device slot's
// type): relative speed α, effective speed φ and layer memory μ of the type
// at TP 2^k, then the one-hot of k (ConstructionEnv::TpCandidates).
inline constexpr int kTpCandidateFeatures = kEnvTpFeatures;
static_assert(kTpCandidateFeatures == 7, "the shipped policies' TP rows");

// Candidate features per row of each head (depth, device, TP).
inline constexpr std::array<int, 3> kHeadFeatures = {
    kEnvDepthFeatures, kEnvDeviceFeatures, kTpCandidateFeatures};

// Logit of an illegal action: exp underflows to exactly 0 in float, and
// 0 * logit stays finite in the entropy (unlike -inf).
inline constexpr float kMaskedLogit = -1e9f;

// Head index of the acting head: 0 depth, 1 device, 2 TP (CHECK-fails when
// the episode is done).
int HeadIndex(EnvHead head);
// Actions of head `head` (17, kEnvDeviceSlots, 4).
int HeadActions(int head);

// The acting head's candidate rows of `env` (not done): depth 17 x 7,
// device kEnvDeviceSlots x 9, TP 4 x kTpCandidateFeatures, appended row-major to
// `out` (cleared first). Returns the feature count per row.
int HeadCandidates(const ConstructionEnv& env, std::vector<float>* out);

// One dense layer, weights transposed: weight_t[i * out + o] is LibTorch's
// weight[o][i].
struct InferenceLayer {
  int in = 0, out = 0;
  std::vector<float> weight_t, bias;
  // From LibTorch's row-major [out][in] weight.
  static InferenceLayer FromRowMajor(int in, int out, const float* weight,
                                     const float* bias);
};

// An immutable copy of a network's parameters. `version` is unique per
// snapshot made in this process (PolicyScratch's cache key).
struct PolicyWeights {
  PolicyNetworkConfig config;
  uint64_t version = 0;
  InferenceLayer film_in, film_out;
  std::vector<InferenceLayer> backbone;
  std::array<InferenceLayer, 3> head_in, head_out;
  // A fresh version number for a new snapshot (thread-safe).
  static uint64_t NextVersion();
};

// Working memory of PolicyLogits for one caller (one thread); reusing it
// across the decisions of a planning run keeps the FiLM output and the
// buffers.
struct PolicyScratch {
  uint64_t film_version = 0;  // 0: nothing cached
  std::array<float, kEnvSummarySize + kEnvModelSummarySize> film_summary{};
  std::vector<float> film;  // film_out's whole output for film_summary
  std::vector<float> film_hidden, candidates, x, y, base, acc;
  std::vector<float> logits;  // for callers that want probabilities
};

// Log-probabilities of the acting head's actions of `env` (not done) into
// `out` (resized to the head's action count; kMaskedLogit where illegal).
void PolicyLogits(const PolicyWeights& weights, const ConstructionEnv& env,
                  PolicyScratch& scratch, std::vector<float>* out);

}  // namespace arachne

#endif  // ARACHNE_PLANNER_SERVICE_POLICY_POLICY_INFERENCE_H_
