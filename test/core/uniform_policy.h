// A PolicyModel uniform over the legal actions (the core's
// UniformPolicyModel): the learned planner without LibTorch, so the code
// around it (bench, service) is tested in every build.
#ifndef ARACHNE_TEST_CORE_UNIFORM_POLICY_H_
#define ARACHNE_TEST_CORE_UNIFORM_POLICY_H_

#include "planner_service/core/learned/learned_planner.h"

namespace arachne::testing {

using UniformPolicy = UniformPolicyModel;

}  // namespace arachne::testing

#endif  // ARACHNE_TEST_CORE_UNIFORM_POLICY_H_
