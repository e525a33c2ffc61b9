// The template policy network (paper §5.4): a shared MLP backbone over the
// construction environment's state, conditioned on the composition summary
// by FiLM (a scale and a shift per backbone layer and per head), and three
// heads that each score their candidates:
//  - depth head: each of the 17 actions (STOP, 1..16) from its own row of
//    ConstructionEnv::DepthCandidates() next to the backbone output;
//  - device head: each GPU-type slot from its DeviceCandidates() row;
//  - TP head: each of the 4 TP degrees from TpCandidates() below (the
//    pending type's speed and memory at that degree).
// Scoring candidates by their own features keeps the candidate count out
// of the weights. Illegal actions get logit -1e9, so probability exactly 0.
//
// This header is LibTorch-free (the module lives behind a pimpl in
// policy_network_module.h), so code that only runs a policy needs no
// LibTorch include.
#ifndef ARACHNE_PLANNER_SERVICE_POLICY_POLICY_NETWORK_H_
#define ARACHNE_PLANNER_SERVICE_POLICY_POLICY_NETWORK_H_

#include <array>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/types/span.h"
#include "planner_service/core/learned/construction_env.h"
#include "planner_service/core/learned/learned_planner.h"
#include "planner_service/policy/policy_inference.h"

namespace arachne {

class PolicyNetwork : public PolicyModel {
 public:
  struct Module;  // the LibTorch module (policy_network_module.h)

  // A freshly initialised network: LibTorch's default initialisation drawn
  // after torch::manual_seed(seed), the FiLM output layer zero (identity
  // conditioning at the start). InvalidArgument naming the field when a size
  // is < 1 or above 4096.
  static absl::StatusOr<std::unique_ptr<PolicyNetwork>> Create(
      const PolicyNetworkConfig& config, uint64_t seed);
  ~PolicyNetwork() override;

  const PolicyNetworkConfig& config() const { return config_; }
  int64_t ParameterCount() const;

  // PolicyModel: softmax over the acting head's masked logits.
  void ActionProbabilities(const ConstructionEnv& env,
                           absl::Span<float> probabilities) override;
  // The same with `scratch`'s buffers and cached FiLM output (one scratch
  // per caller and thread; see policy_inference.h).
  void ActionProbabilities(const ConstructionEnv& env,
                           absl::Span<float> probabilities,
                           PolicyScratch& scratch) const;
  // Log-probabilities of the acting head's actions (kMaskedLogit where
  // illegal), computed on a plain float copy of the weights (the inference
  // snapshot, policy_inference.h): LibTorch's per-operator overhead makes
  // one decision ~18x slower (policy_inference_bench). The snapshot is
  // taken by Create, the
  // checkpoint loader, CopyFrom and SyncInference.
  std::vector<float> Logits(const ConstructionEnv& env) const;
  void Logits(const ConstructionEnv& env, PolicyScratch& scratch,
              std::vector<float>* out) const;
  // The same through the LibTorch module (for tests of the snapshot).
  std::vector<float> TorchLogits(const ConstructionEnv& env);
  // Refreshes the inference snapshot from the module's parameters; the
  // trainer calls it after every optimizer step.
  void SyncInference();
  // The current inference snapshot (what Logits reads; the weights file
  // stores it).
  std::shared_ptr<const PolicyWeights> inference_weights() const {
    return weights_;
  }

  // Copies every parameter of `other` (same config) into this network.
  void CopyFrom(const PolicyNetwork& other);

  Module& module() { return *module_; }
  const Module& module() const { return *module_; }
  std::shared_ptr<Module> shared_module() const { return module_; }

 private:
  PolicyNetwork(const PolicyNetworkConfig& config,
                std::shared_ptr<Module> module);
  PolicyNetworkConfig config_;
  std::shared_ptr<Module> module_;
  // Replaced whole by SyncInference (never modified in place), so a
  // scratch's cached FiLM output is keyed by its version.
  std::shared_ptr<const PolicyWeights> weights_;
};

}  // namespace arachne

#endif  // ARACHNE_PLANNER_SERVICE_POLICY_POLICY_NETWORK_H_
