// A PolicyModel uniform over the legal actions: the learned planner without
// LibTorch, so the code around it (bench, service) is tested in every build.
#ifndef ARACHNE_TEST_CORE_UNIFORM_POLICY_H_
#define ARACHNE_TEST_CORE_UNIFORM_POLICY_H_

#include <cstdint>

#include "absl/types/span.h"
#include "planner_service/core/construction_env.h"
#include "planner_service/core/learned_planner.h"

namespace arachne::testing {

class UniformPolicy : public PolicyModel {
 public:
  void ActionProbabilities(const ConstructionEnv& env,
                           absl::Span<float> probabilities) override {
    absl::Span<const uint8_t> mask = env.LegalMask();
    float legal = 0;
    for (uint8_t m : mask) legal += m;
    for (size_t a = 0; a < probabilities.size(); ++a) {
      probabilities[a] = mask[a] ? 1.0f / legal : 0.0f;
    }
  }
};

}  // namespace arachne::testing

#endif  // ARACHNE_TEST_CORE_UNIFORM_POLICY_H_
