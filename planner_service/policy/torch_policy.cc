#include "planner_service/policy/torch_policy.h"

#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <filesystem>
#include <map>
#include <memory>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/synchronization/mutex.h"
#include "planner_service/io/data_files.h"
#include "planner_service/policy/checkpoint_info.h"
#include "planner_service/policy/policy_inference.h"
#include "planner_service/policy/policy_weights_file.h"

#ifndef ARACHNE_DEFAULT_POLICIES_DIR
#define ARACHNE_DEFAULT_POLICIES_DIR "profiles/policies"
#endif

namespace arachne {
namespace {

// Shares one loaded snapshot between plans; inference only reads it.
class SharedPolicy : public PolicyModel {
 public:
  SharedPolicy(std::shared_ptr<const PolicyWeights> weights, bool foreign,
               int max_gpu_types)
      : weights_(std::move(weights)),
        foreign_(foreign),
        max_gpu_types_(max_gpu_types) {}
  bool PlansAModelItWasNotTrainedOn() const override { return foreign_; }
  int MostGpuTypesTrainedOn() const override { return max_gpu_types_; }
  void ActionProbabilities(const ConstructionEnv& env,
                           absl::Span<float> probabilities) override {
    // As PolicyNetwork::ActionProbabilities: exp of the masked log-softmax.
    PolicyLogits(*weights_, env, scratch_, &scratch_.logits);
    absl::Span<const uint8_t> mask = env.LegalMask();
    const size_t n = std::min(probabilities.size(), scratch_.logits.size());
    for (size_t a = 0; a < n; ++a)
      probabilities[a] = mask[a] ? std::exp(scratch_.logits[a]) : 0.0f;
  }

 private:
  PolicyScratch scratch_;  // one planning run's inference buffers
  std::shared_ptr<const PolicyWeights> weights_;
  bool foreign_;
  int max_gpu_types_;
};

struct CachedCheckpoint {
  std::filesystem::file_time_type mtime;
  PolicyCheckpointInfo info;
  std::shared_ptr<const PolicyWeights> weights;
};

absl::Mutex cache_mu;
std::map<std::string, CachedCheckpoint>& Cache()
    ABSL_EXCLUSIVE_LOCKS_REQUIRED(cache_mu) {
  static auto* cache = new std::map<std::string, CachedCheckpoint>();
  return *cache;
}

absl::StatusOr<CachedCheckpoint> LoadCached(const std::string& path) {
  std::error_code ec;
  const auto mtime = std::filesystem::last_write_time(path, ec);
  if (ec) {
    return absl::NotFoundError(absl::StrCat(path, " does not exist"));
  }
  absl::MutexLock lock(&cache_mu);
  auto it = Cache().find(path);
  if (it != Cache().end() && it->second.mtime == mtime) return it->second;
  absl::StatusOr<LoadedPolicyWeights> loaded = ReadPolicyWeightsFile(path);
  if (!loaded.ok()) return loaded.status();
  CachedCheckpoint entry{mtime, loaded->info, std::move(loaded->weights)};
  Cache()[path] = entry;
  return entry;
}

}  // namespace

std::string DefaultPoliciesDir() {
  if (const char* env = std::getenv("ARACHNE_POLICIES_DIR");
      env != nullptr && env[0] != '\0') {
    return env;
  }
  return ARACHNE_DEFAULT_POLICIES_DIR;
}

PolicyModelFactory MakeTorchPolicyFactory(TorchPolicyOptions options) {
  if (options.policies_dir.empty()) options.policies_dir = DefaultPoliciesDir();
  return [options](const CostModel& cm)
             -> absl::StatusOr<std::unique_ptr<PolicyModel>> {
    const ModelSpec& model = cm.model();
    absl::StatusOr<std::string> calibration =
        ReadDataFile("calibration.json", options.profiles_dir);
    if (!calibration.ok()) {
      return absl::FailedPreconditionError(
          NoPolicyMessage(model.name, std::string(calibration.status().message())));
    }
    std::vector<std::string> names = {model.name};
    if (!model.policy_relative.empty() && model.policy_relative != model.name)
      names.push_back(model.policy_relative);
    std::vector<std::string> why;
    for (const std::string& name : names) {
      const std::string path =
          (std::filesystem::path(options.policies_dir) / (name + ".weights"))
              .string();
      absl::StatusOr<CachedCheckpoint> ckpt = LoadCached(path);
      if (!ckpt.ok()) {
        why.push_back(std::string(ckpt.status().message()));
        continue;
      }
      // The checkpoint's own profile name enters its fingerprint; for the
      // model's own checkpoint it must also be the model's profile set.
      const std::string own_profiles =
          model.profile_name.empty() ? model.name : model.profile_name;
      if (name == model.name && ckpt->info.profile_name != own_profiles) {
        why.push_back(absl::StrCat(path, ": trained on the profiles of \"",
                                   ckpt->info.profile_name, "\", model \"",
                                   model.name, "\" uses \"", own_profiles,
                                   "\""));
        continue;
      }
      const std::string fingerprint = ProfileSetFingerprint(
          cm.catalog(), ckpt->info.profile_name, *calibration);
      if (absl::Status fits =
              CheckCheckpointFits(ckpt->info, name, fingerprint, path);
          !fits.ok()) {
        why.push_back(std::string(fits.message()));
        continue;
      }
      // The model's own checkpoint, or its declared relative's: a close
      // model by declaration, planned with the usual exploration.
      return std::unique_ptr<PolicyModel>(
          std::make_unique<SharedPolicy>(ckpt->weights, /*foreign=*/false,
                                         ckpt->info.training.max_gpu_types));
    }
    // Then the model-conditioned policy, which serves any model.
    const std::string general_path =
        (std::filesystem::path(options.policies_dir) /
         (std::string(kGeneralPolicyModel) + ".weights"))
            .string();
    absl::StatusOr<CachedCheckpoint> general = LoadCached(general_path);
    if (!general.ok()) {
      why.push_back(std::string(general.status().message()));
    } else if (!general->info.network.model_conditioned) {
      why.push_back(absl::StrCat(general_path,
                                 ": not a model-conditioned policy"));
    } else if (absl::Status fits = CheckCheckpointFits(
                   general->info, kGeneralPolicyModel,
                   ProfileSetFingerprint(cm.catalog(), kGeneralPolicyProfiles,
                                         *calibration),
                   general_path);
               !fits.ok()) {
      why.push_back(std::string(fits.message()));
    } else {
      // Outside its training models the conditioned policy is trusted
      // less (LearnedPlannerConfig::foreign_exploration_*).
      const std::vector<std::string>& trained = general->info.training.models;
      const bool foreign =
          std::find(trained.begin(), trained.end(), model.name) == trained.end();
      return std::unique_ptr<PolicyModel>(
          std::make_unique<SharedPolicy>(
              general->weights, foreign, general->info.training.max_gpu_types));
    }
    return absl::FailedPreconditionError(
        NoPolicyMessage(model.name, absl::StrJoin(why, "; ")));
  };
}

void RegisterTorchPolicy(TorchPolicyOptions options) {
  RegisterLearnedPolicyFactory(MakeTorchPolicyFactory(std::move(options)));
}

}  // namespace arachne
