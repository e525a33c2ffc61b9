// The LibTorch module behind PolicyNetwork (policy_network.h). Included only
// by the policy library's own .cc files that need tensors (the network, the
// checkpoint and the trainer).
#ifndef ARACHNE_PLANNER_SERVICE_POLICY_POLICY_NETWORK_MODULE_H_
#define ARACHNE_PLANNER_SERVICE_POLICY_POLICY_NETWORK_MODULE_H_

#include <torch/torch.h>

#include <array>
#include <vector>

#include "planner_service/core/learned/construction_env.h"
#include "planner_service/policy/policy_network.h"

namespace arachne {

struct PolicyNetwork::Module : torch::nn::Module {
  explicit Module(const PolicyNetworkConfig& config);

  // Log-probabilities [N, C] of head `head` for a batch of N decisions:
  // `state` [N, kEnvStateSize], `candidates` [N, C, features of the head],
  // `legal` [N, C] bool. Illegal actions get log-probability about -1e9.
  torch::Tensor LogProbabilities(int head, const torch::Tensor& state,
                                 const torch::Tensor& candidates,
                                 const torch::Tensor& legal);

  PolicyNetworkConfig config;
  torch::nn::Linear film_in{nullptr}, film_out{nullptr};
  std::vector<torch::nn::Linear> backbone;
  std::array<torch::nn::Linear, 3> head_in{nullptr, nullptr, nullptr};
  std::array<torch::nn::Linear, 3> head_out{nullptr, nullptr, nullptr};
};

}  // namespace arachne

#endif  // ARACHNE_PLANNER_SERVICE_POLICY_POLICY_NETWORK_MODULE_H_
