// The learned policy as the planner core's PolicyModel: resolves a model's
// weights file (its own, else its declared relative's, else the
// model-conditioned one) and registers the factory LearnedPlanner uses
// (learned_planner.h). LibTorch-free (library arachne_policy_runtime): it
// reads the `<model>.weights` files (policy_weights_file.h) that every
// checkpoint has beside its LibTorch archive `<model>.pt`, so planning
// binaries do not load LibTorch. (The name is historical.)
#ifndef ARACHNE_PLANNER_SERVICE_POLICY_TORCH_POLICY_H_
#define ARACHNE_PLANNER_SERVICE_POLICY_TORCH_POLICY_H_

#include <string>

#include "planner_service/core/learned/learned_planner.h"

namespace arachne {

struct TorchPolicyOptions {
  // Where `<model>.weights` files are looked up; "" = DefaultPoliciesDir().
  std::string policies_dir;
  // Profiles directory the plans use ("" = built-in data): its
  // calibration.json enters the profile fingerprint.
  std::string profiles_dir;
};

// $ARACHNE_POLICIES_DIR when set, else the source tree's profiles/policies
// (compiled in).
std::string DefaultPoliciesDir();

// The factory: for a cost model of model M, loads `<dir>/M.weights`, else
// `<dir>/R.weights` with R = ModelSpec::policy_relative, else the
// model-conditioned `<dir>/general.weights` (kGeneralPolicyModel, any
// model), and
// checks that the checkpoint was made for that model (or is the
// conditioned one), this format version and the profile fingerprint of the
// cost model's catalog and calibration. A model's own or declared policy
// comes first: on its own models it is at least as good
// (docs/learned-policy.md, "Which policy plans a model"). Errors:
// FailedPrecondition (NoPolicyMessage) naming every path tried and why each
// failed. Loaded checkpoints are cached per path and modification time, so
// repeated plans read the file once; the cache is thread-safe.
PolicyModelFactory MakeTorchPolicyFactory(TorchPolicyOptions options = {});

// RegisterLearnedPolicyFactory(MakeTorchPolicyFactory(options)).
void RegisterTorchPolicy(TorchPolicyOptions options = {});

}  // namespace arachne

#endif  // ARACHNE_PLANNER_SERVICE_POLICY_TORCH_POLICY_H_
