// Policy checkpoints (LibTorch side): the network's weights as a
// torch::save archive `<model>.pt`, with the metadata (checkpoint_info.h)
// as its entry "arachne_metadata", a copy of the metadata `<model>.json` and
// the LibTorch-free weights file `<model>.weights` (policy_weights_file.h)
// that planning reads.
#ifndef ARACHNE_PLANNER_SERVICE_POLICY_CHECKPOINT_H_
#define ARACHNE_PLANNER_SERVICE_POLICY_CHECKPOINT_H_

#include <memory>
#include <string>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "planner_service/policy/checkpoint_info.h"
#include "planner_service/policy/policy_network.h"

namespace arachne {

// Writes `network` and `info` to `path`, the metadata to `path` with its
// extension replaced by ".json" and the inference snapshot with the metadata
// to WeightsFilePath(path) (".weights"). Internal naming the path on a write
// error.
absl::Status SavePolicyCheckpoint(const PolicyNetwork& network,
                                  const PolicyCheckpointInfo& info,
                                  const std::string& path);

struct LoadedPolicy {
  PolicyCheckpointInfo info;
  std::unique_ptr<PolicyNetwork> network;
};
// Reads a checkpoint written by SavePolicyCheckpoint. NotFound when `path`
// does not exist; FailedPrecondition when its format version is not
// kPolicyFormatVersion; DataLoss when it is not a readable checkpoint.
// Checks nothing about the model: CheckCheckpointFits does.
absl::StatusOr<LoadedPolicy> LoadPolicyCheckpoint(const std::string& path);

// Writes the weights file of an existing checkpoint (`arachne train
// --export-weights CKPT.pt`): WeightsFilePath(checkpoint), returned.
// LoadPolicyCheckpoint's errors, or Internal on a write error.
absl::StatusOr<std::string> ExportPolicyWeights(const std::string& checkpoint);

}  // namespace arachne

#endif  // ARACHNE_PLANNER_SERVICE_POLICY_CHECKPOINT_H_
