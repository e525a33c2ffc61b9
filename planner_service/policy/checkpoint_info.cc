// The LibTorch-free half of checkpoints: metadata and fingerprint. The
// LibTorch archive is written and read in policy_network.cc, the weights
// file in policy_weights_file.cc.
#include "planner_service/policy/checkpoint_info.h"

#include <cstdio>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "nlohmann/json.hpp"

namespace arachne {
namespace {

void Mix(uint64_t& h, const std::string& s) {
  for (unsigned char c : s) {
    h ^= c;
    h *= 1099511628211ull;
  }
  // A separator byte so "ab"+"c" and "a"+"bc" differ.
  h ^= 0xff;
  h *= 1099511628211ull;
}

}  // namespace

std::string ProfileSetFingerprint(const GpuCatalog& catalog,
                                  const std::string& profile_name,
                                  const std::string& calibration_json) {
  uint64_t h = 14695981039346656037ull;
  for (int i = 0; i < catalog.size(); ++i) {
    const GpuType& t = catalog.type(i);
    // %.17g: the exact double, so any change of a figure changes the hash.
    Mix(h, absl::StrFormat("%s|%.17g|%.17g|%.17g|%.17g|%.17g|%d", t.id,
                           t.peak_bf16_tflops, t.peak_fp32_tflops,
                           t.memory_gib, t.hbm_gbps, t.intra_node_gbps,
                           t.default_gpus_per_node));
  }
  Mix(h, profile_name);
  Mix(h, calibration_json);
  return absl::StrFormat("%016x", h);
}

std::string CheckpointInfoToJson(const PolicyCheckpointInfo& info) {
  nlohmann::ordered_json j;
  j["format_version"] = info.format_version;
  j["model"] = info.model;
  j["profile_name"] = info.profile_name;
  j["profile_fingerprint"] = info.profile_fingerprint;
  j["network"] = {{"hidden", info.network.hidden},
                  {"layers", info.network.layers},
                  {"head_hidden", info.network.head_hidden},
                  {"film_hidden", info.network.film_hidden}};
  // Written only when set, so the per-model checkpoints' metadata reads as
  // it did before the conditioned policy existed.
  if (info.network.model_conditioned)
    j["network"]["model_conditioned"] = true;
  j["training"] = {{"episodes", info.training.episodes},
                   {"compositions", info.training.compositions},
                   {"seed", info.training.seed},
                   {"wall_s", info.training.wall_s},
                   {"final_mean_reward", info.training.final_mean_reward},
                   {"best_reward", info.training.best_reward}};
  // Written only when it differs from the rule of the checkpoints that
  // predate it, so their metadata reads as before.
  if (info.training.max_gpu_types != kLegacyMaxGpuTypes)
    j["training"]["max_gpu_types"] = info.training.max_gpu_types;
  if (!info.training.models.empty() || info.training.generated_models > 0) {
    j["training"]["models"] = info.training.models;
    j["training"]["generated_models"] = info.training.generated_models;
  }
  return j.dump(2) + "\n";
}

absl::StatusOr<PolicyCheckpointInfo> ParseCheckpointInfo(
    const std::string& json, const std::string& source) {
  nlohmann::json j = nlohmann::json::parse(json, nullptr, /*allow_exceptions=*/
                                           false);
  if (j.is_discarded() || !j.is_object()) {
    return absl::InvalidArgumentError(
        absl::StrCat(source, ": checkpoint metadata is not a JSON object"));
  }
  PolicyCheckpointInfo info;
  try {
    info.format_version = j.at("format_version").get<int>();
    info.model = j.at("model").get<std::string>();
    info.profile_name = j.at("profile_name").get<std::string>();
    info.profile_fingerprint = j.at("profile_fingerprint").get<std::string>();
    const nlohmann::json& n = j.at("network");
    info.network.hidden = n.at("hidden").get<int>();
    info.network.layers = n.at("layers").get<int>();
    info.network.head_hidden = n.at("head_hidden").get<int>();
    info.network.film_hidden = n.at("film_hidden").get<int>();
    info.network.model_conditioned = n.value("model_conditioned", false);
    if (j.contains("training")) {
      const nlohmann::json& t = j.at("training");
      info.training.episodes = t.value("episodes", int64_t{0});
      info.training.compositions = t.value("compositions", 0);
      info.training.seed = t.value("seed", uint64_t{0});
      info.training.wall_s = t.value("wall_s", 0.0);
      info.training.final_mean_reward = t.value("final_mean_reward", 0.0);
      info.training.best_reward = t.value("best_reward", 0.0);
      info.training.models =
          t.value("models", std::vector<std::string>{});
      info.training.generated_models = t.value("generated_models", 0);
      info.training.max_gpu_types =
          t.value("max_gpu_types", kLegacyMaxGpuTypes);
      if (info.training.max_gpu_types < 1) {
        return absl::InvalidArgumentError(absl::StrCat(
            source, ": checkpoint metadata: training.max_gpu_types must be "
            ">= 1, got ", info.training.max_gpu_types));
      }
    }
  } catch (const nlohmann::json::exception& e) {
    return absl::InvalidArgumentError(
        absl::StrCat(source, ": checkpoint metadata: ", e.what()));
  }
  return info;
}

absl::Status CheckCheckpointFits(const PolicyCheckpointInfo& info,
                                 const std::string& model,
                                 const std::string& fingerprint,
                                 const std::string& source) {
  if (info.format_version != kPolicyFormatVersion) {
    return absl::FailedPreconditionError(absl::StrCat(
        source, ": checkpoint format version ", info.format_version,
        ", this build reads version ", kPolicyFormatVersion, "; retrain it"));
  }
  if (info.model != model) {
    return absl::FailedPreconditionError(
        absl::StrCat(source, ": checkpoint is for model \"", info.model,
                     "\", not \"", model, "\""));
  }
  if (info.profile_fingerprint != fingerprint) {
    return absl::FailedPreconditionError(absl::StrCat(
        source, ": checkpoint was trained on another profile set (profile "
        "fingerprint ", info.profile_fingerprint, ", these profiles give ",
        fingerprint, ": the GPU catalog, the calibration or the profile name \"",
        info.profile_name, "\" changed); retrain it"));
  }
  return absl::OkStatus();
}

}  // namespace arachne
