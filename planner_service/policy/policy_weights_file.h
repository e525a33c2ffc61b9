// The LibTorch-free weights file `<model>.weights` beside every checkpoint
// `<model>.pt`: the inference snapshot (PolicyWeights) and the checkpoint
// metadata, which is all planning needs, so planning binaries never load
// LibTorch. Written by SavePolicyCheckpoint (checkpoint.h) and by
// `arachne train --export-weights CKPT.pt`.
//
// Layout, little-endian:
//   8 bytes   magic "ARCHNW01"
//   u32 n, n bytes  the metadata JSON (CheckpointInfoToJson)
//   per layer, in the order film_in, film_out, backbone[0..layers),
//   head_in[0..3), head_out[0..3):
//     u32 in, u32 out, in*out floats weight_t ([in][out], InferenceLayer's
//     transposed layout), out floats bias
//   u64 FNV-1a hash of every byte before it
#ifndef ARACHNE_PLANNER_SERVICE_POLICY_POLICY_WEIGHTS_FILE_H_
#define ARACHNE_PLANNER_SERVICE_POLICY_POLICY_WEIGHTS_FILE_H_

#include <memory>
#include <string>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "planner_service/policy/checkpoint_info.h"
#include "planner_service/policy/policy_inference.h"

namespace arachne {

inline constexpr char kPolicyWeightsMagic[] = "ARCHNW01";  // 8 bytes

// `checkpoint` with its extension replaced by ".weights".
std::string WeightsFilePath(const std::string& checkpoint);

// The file's bytes for `info` (info.network must be weights.config) and
// `weights`.
std::string SerializePolicyWeights(const PolicyCheckpointInfo& info,
                                   const PolicyWeights& weights);

// Writes SerializePolicyWeights to `path` (through a temporary file renamed
// over it). Internal naming the path on a write error.
absl::Status WritePolicyWeightsFile(const PolicyCheckpointInfo& info,
                                    const PolicyWeights& weights,
                                    const std::string& path);

struct LoadedPolicyWeights {
  PolicyCheckpointInfo info;
  std::shared_ptr<const PolicyWeights> weights;  // a fresh version
};

// Parses a weights file's bytes; `source` names it in errors. DataLoss for
// a wrong magic, a truncated file, a checksum mismatch, unreadable
// metadata, layer sizes that do not match the metadata's network or
// trailing bytes; FailedPrecondition for another format version
// (kPolicyFormatVersion). Allocates at most the size of `bytes`.
absl::StatusOr<LoadedPolicyWeights> ParsePolicyWeights(
    const std::string& bytes, const std::string& source);

// Reads `path`: NotFound "<path> does not exist" when it is missing, else
// ParsePolicyWeights's errors.
absl::StatusOr<LoadedPolicyWeights> ReadPolicyWeightsFile(
    const std::string& path);

}  // namespace arachne

#endif  // ARACHNE_PLANNER_SERVICE_POLICY_POLICY_WEIGHTS_FILE_H_
