// Policy checkpoint metadata (LibTorch-free): what a checkpoint is for, and
// the checks that keep a policy from planning a model or a profile set it
// was not trained on. Reading and writing the LibTorch archive is in
// checkpoint.h; the LibTorch-free weights file in policy_weights_file.h.
//
// A checkpoint is one file `<model>.pt` (weights plus the metadata, as the
// archive entry "arachne_metadata", for training), the LibTorch-free
// `<model>.weights` (the same weights and metadata, for planning) and a copy
// of the metadata beside them, `<model>.json`, for people and scripts. The shipped ones live in
// profiles/policies/. The metadata:
//   format_version   kPolicyFormatVersion when written; another is refused
//   model            ModelSpec::name the policy was trained for
//   profile_name     that model's profile set (ModelSpec::profile_name)
//   profile_fingerprint  ProfileSetFingerprint: GPU catalog + profile_name +
//                    calibration; another fingerprint is refused
//   network          PolicyNetworkConfig sizes (model_conditioned only when
//                    true)
//   training         PolicyTrainingStats
#ifndef ARACHNE_PLANNER_SERVICE_POLICY_CHECKPOINT_INFO_H_
#define ARACHNE_PLANNER_SERVICE_POLICY_CHECKPOINT_INFO_H_

#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "planner_service/core/model/gpu_catalog.h"
#include "planner_service/policy/policy_inference.h"

namespace arachne {

// The model-conditioned policy, trained across models
// (PolicyNetworkConfig::model_conditioned): its checkpoint is
// `<kGeneralPolicyModel>.pt`, its metadata's model is kGeneralPolicyModel
// and its profile_name kGeneralPolicyProfiles (the profiles of whichever
// model it plans: the fingerprint covers the GPU catalog and calibration).
inline constexpr char kGeneralPolicyModel[] = "general";
inline constexpr char kGeneralPolicyProfiles[] = "*";

// Bumped whenever the state layout, the candidate features or the network
// structure change: an old checkpoint would read the wrong inputs.
inline constexpr int kPolicyFormatVersion = 1;

// The most GPU types per training composition before `arachne train` took
// --max-types (the trainer's fixed rule then); a checkpoint without
// training.max_gpu_types was trained under it.
inline constexpr int kLegacyMaxGpuTypes = 4;

struct PolicyTrainingStats {
  int64_t episodes = 0;  // rollouts played in training
  int compositions = 0;  // training compositions
  uint64_t seed = 0;
  double wall_s = 0;
  // Mean normalised return of the last iteration's rollouts, and the best
  // single return seen.
  double final_mean_reward = 0;
  double best_reward = 0;
  // The conditioned policy's training models (catalog ids; all others are
  // held out) and how many generated shapes it also saw.
  std::vector<std::string> models;
  int generated_models = 0;
  // The most GPU types in one training composition (--max-types). A
  // checkpoint written before the field existed was trained on at most
  // kLegacyMaxGpuTypes: its trainer drew 2 to 4 types per composition.
  int max_gpu_types = kLegacyMaxGpuTypes;
};

struct PolicyCheckpointInfo {
  int format_version = kPolicyFormatVersion;
  std::string model;
  std::string profile_name;
  std::string profile_fingerprint;
  PolicyNetworkConfig network;
  PolicyTrainingStats training;
};

// 16 hex digits of a 64-bit FNV-1a hash over every GPU type's id and
// figures, `profile_name` and the calibration file's text: what the
// profiles the policy trained on were synthesized from.
std::string ProfileSetFingerprint(const GpuCatalog& catalog,
                                  const std::string& profile_name,
                                  const std::string& calibration_json);

std::string CheckpointInfoToJson(const PolicyCheckpointInfo& info);
// InvalidArgument naming `source` and the field on malformed metadata.
absl::StatusOr<PolicyCheckpointInfo> ParseCheckpointInfo(
    const std::string& json, const std::string& source);

// OK when `info` is a policy for `model` with `fingerprint`; otherwise
// FailedPrecondition naming `source`, the expected and the found value.
absl::Status CheckCheckpointFits(const PolicyCheckpointInfo& info,
                                 const std::string& model,
                                 const std::string& fingerprint,
                                 const std::string& source);

}  // namespace arachne

#endif  // ARACHNE_PLANNER_SERVICE_POLICY_CHECKPOINT_INFO_H_
