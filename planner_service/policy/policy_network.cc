// The LibTorch translation unit of the policy: the module, single-decision
// inference and the checkpoint archive.
#include "planner_service/policy/policy_network.h"

#include <torch/torch.h>

#include <algorithm>
#include <filesystem>
#include <fstream>
#include <sstream>

#include "absl/strings/str_cat.h"
#include "glog/logging.h"
#include "planner_service/policy/checkpoint.h"
#include "planner_service/policy/policy_network_module.h"

namespace arachne {
namespace {

constexpr char kMetadataKey[] = "arachne_metadata";

int Slots(int head) {
  return head == 0 ? kEnvDepthActions : (head == 1 ? kEnvTypeSlots
                                                   : kEnvTpSlots);
}

absl::Status CheckSize(const char* field, int value) {
  if (value < 1 || value > 4096) {
    return absl::InvalidArgumentError(absl::StrCat(
        "policy network: ", field, " must be in [1, 4096], got ", value));
  }
  return absl::OkStatus();
}

}  // namespace

int HeadCandidates(const ConstructionEnv& env, std::vector<float>* out) {
  out->clear();
  switch (env.head()) {
    case EnvHead::kDepth: {
      absl::Span<const float> rows = env.DepthCandidates();
      out->assign(rows.begin(), rows.end());
      return kEnvDepthFeatures;
    }
    case EnvHead::kDevice: {
      absl::Span<const float> rows = env.DeviceCandidates();
      out->assign(rows.begin(), rows.end());
      return kEnvDeviceFeatures;
    }
    case EnvHead::kTp: {
      absl::Span<const float> s = env.State();
      int slot = 0;
      for (int i = 1; i < kEnvTypeSlots; ++i) {
        if (s[kEnvGlobalOffset + env_global_feature::kPendingType + i] >
            s[kEnvGlobalOffset + env_global_feature::kPendingType + slot])
          slot = i;
      }
      const float* type = &s[slot * kEnvTypeFeatures];
      out->resize(kEnvTpSlots * kTpCandidateFeatures, 0.0f);
      for (int k = 0; k < kEnvTpSlots; ++k) {
        float* row = out->data() + k * kTpCandidateFeatures;
        row[0] = type[env_type_feature::kRelativeSpeed + k];
        row[1] = type[env_type_feature::kEffectiveSpeed + k];
        row[2] = type[env_type_feature::kLayerMemory + k];
        row[3 + k] = 1;
      }
      return kTpCandidateFeatures;
    }
    case EnvHead::kDone:
      break;
  }
  LOG(FATAL) << "HeadCandidates on a finished episode";
  return 0;
}

PolicyNetwork::Module::Module(const PolicyNetworkConfig& c) : config(c) {
  const int film_params = 2 * c.hidden * c.layers + 2 * c.head_hidden * 3;
  film_in = register_module(
      "film_in", torch::nn::Linear(kEnvSummarySize, c.film_hidden));
  film_out = register_module("film_out",
                             torch::nn::Linear(c.film_hidden, film_params));
  // Zero FiLM output: scale 1 + 0 and shift 0 until training moves it, so
  // the conditioning starts as the identity.
  {
    torch::NoGradGuard no_grad;
    film_out->weight.zero_();
    film_out->bias.zero_();
  }
  int in = kEnvStateSize;
  for (int l = 0; l < c.layers; ++l) {
    backbone.push_back(register_module(absl::StrCat("backbone", l),
                                       torch::nn::Linear(in, c.hidden)));
    in = c.hidden;
  }
  for (int h = 0; h < 3; ++h) {
    head_in[h] = register_module(
        absl::StrCat("head_in", h),
        torch::nn::Linear(c.hidden + kHeadFeatures[h], c.head_hidden));
    head_out[h] = register_module(absl::StrCat("head_out", h),
                                  torch::nn::Linear(c.head_hidden, 1));
  }
}

torch::Tensor PolicyNetwork::Module::LogProbabilities(
    int head, const torch::Tensor& state, const torch::Tensor& candidates,
    const torch::Tensor& legal) {
  const int64_t n = state.size(0);
  const int64_t rows = candidates.size(1);
  const torch::Tensor summary =
      state.narrow(1, kEnvSummaryOffset, kEnvSummarySize);
  const torch::Tensor film = film_out(torch::relu(film_in(summary)));
  torch::Tensor x = state;
  int64_t at = 0;
  for (auto& layer : backbone) {
    const torch::Tensor scale = film.narrow(1, at, config.hidden);
    const torch::Tensor shift = film.narrow(1, at + config.hidden, config.hidden);
    at += 2 * config.hidden;
    x = torch::relu(layer(x) * (1 + scale) + shift);
  }
  at += 2 * config.head_hidden * head;
  const torch::Tensor scale =
      film.narrow(1, at, config.head_hidden).unsqueeze(1);
  const torch::Tensor shift =
      film.narrow(1, at + config.head_hidden, config.head_hidden).unsqueeze(1);
  const torch::Tensor joined = torch::cat(
      {x.unsqueeze(1).expand({n, rows, config.hidden}), candidates}, 2);
  const torch::Tensor hidden =
      torch::relu(head_in[head](joined) * (1 + scale) + shift);
  const torch::Tensor logits =
      head_out[head](hidden).squeeze(2).masked_fill(legal.logical_not(),
                                                    kMaskedLogit);
  return torch::log_softmax(logits, 1);
}

PolicyNetwork::PolicyNetwork(const PolicyNetworkConfig& config,
                             std::shared_ptr<Module> module)
    : config_(config), module_(std::move(module)) {}

PolicyNetwork::~PolicyNetwork() = default;

absl::StatusOr<std::unique_ptr<PolicyNetwork>> PolicyNetwork::Create(
    const PolicyNetworkConfig& config, uint64_t seed) {
  if (absl::Status s = CheckSize("hidden", config.hidden); !s.ok()) return s;
  if (absl::Status s = CheckSize("layers", config.layers); !s.ok()) return s;
  if (absl::Status s = CheckSize("head_hidden", config.head_hidden); !s.ok())
    return s;
  if (absl::Status s = CheckSize("film_hidden", config.film_hidden); !s.ok())
    return s;
  torch::manual_seed(seed);
  auto module = std::make_shared<Module>(config);
  return std::unique_ptr<PolicyNetwork>(new PolicyNetwork(config, module));
}

int64_t PolicyNetwork::ParameterCount() const {
  int64_t n = 0;
  for (const torch::Tensor& p : module_->parameters()) n += p.numel();
  return n;
}

std::vector<float> PolicyNetwork::Logits(const ConstructionEnv& env) {
  CHECK(!env.done());
  torch::InferenceMode guard;
  const int head = HeadIndex(env.head());
  std::vector<float> candidates;
  const int features = HeadCandidates(env, &candidates);
  const int rows = Slots(head);
  absl::Span<const uint8_t> mask = env.LegalMask();
  absl::Span<const float> state = env.State();
  // from_blob does not copy; the spans outlive the forward pass.
  const torch::Tensor s =
      torch::from_blob(const_cast<float*>(state.data()), {1, kEnvStateSize});
  const torch::Tensor c = torch::from_blob(candidates.data(),
                                           {1, rows, features});
  const torch::Tensor legal =
      torch::from_blob(const_cast<uint8_t*>(mask.data()), {1, rows},
                       torch::kUInt8)
          .to(torch::kBool);
  const torch::Tensor lp = module_->LogProbabilities(head, s, c, legal);
  // Log-softmax differs from the logits by a constant per decision; the
  // masked entries keep their sentinel so callers can see them.
  std::vector<float> out(rows);
  const float* p = lp.data_ptr<float>();
  for (int a = 0; a < rows; ++a) out[a] = mask[a] ? p[a] : kMaskedLogit;
  return out;
}

void PolicyNetwork::ActionProbabilities(const ConstructionEnv& env,
                                        absl::Span<float> probabilities) {
  const std::vector<float> logp = Logits(env);
  CHECK_EQ(probabilities.size(), logp.size());
  absl::Span<const uint8_t> mask = env.LegalMask();
  for (size_t a = 0; a < logp.size(); ++a)
    probabilities[a] = mask[a] ? std::exp(logp[a]) : 0.0f;
}

void PolicyNetwork::CopyFrom(const PolicyNetwork& other) {
  torch::NoGradGuard no_grad;
  auto dst = module_->parameters();
  auto src = other.module_->parameters();
  CHECK_EQ(dst.size(), src.size());
  for (size_t i = 0; i < dst.size(); ++i) dst[i].copy_(src[i]);
}

absl::Status SavePolicyCheckpoint(const PolicyNetwork& network,
                                  const PolicyCheckpointInfo& info,
                                  const std::string& path) {
  PolicyCheckpointInfo meta = info;
  meta.network = network.config();
  const std::string json = CheckpointInfoToJson(meta);
  try {
    torch::serialize::OutputArchive archive;
    network.module().save(archive);
    archive.write(kMetadataKey, c10::IValue(json));
    archive.save_to(path);
  } catch (const c10::Error& e) {
    return absl::InternalError(
        absl::StrCat("cannot write checkpoint ", path, ": ",
                     e.what_without_backtrace()));
  }
  std::filesystem::path side(path);
  side.replace_extension(".json");
  std::ofstream f(side);
  f << json;
  if (!f.good()) {
    return absl::InternalError(
        absl::StrCat("cannot write checkpoint metadata ", side.string()));
  }
  return absl::OkStatus();
}

absl::StatusOr<LoadedPolicy> LoadPolicyCheckpoint(const std::string& path) {
  std::error_code ec;
  if (!std::filesystem::is_regular_file(path, ec)) {
    return absl::NotFoundError(
        absl::StrCat("policy checkpoint ", path, " does not exist"));
  }
  LoadedPolicy loaded;
  try {
    torch::serialize::InputArchive archive;
    archive.load_from(path);
    c10::IValue meta;
    if (!archive.try_read(kMetadataKey, meta) || !meta.isString()) {
      return absl::DataLossError(absl::StrCat(
          path, ": not an arachne policy checkpoint (no metadata)"));
    }
    absl::StatusOr<PolicyCheckpointInfo> info =
        ParseCheckpointInfo(meta.toStringRef(), path);
    if (!info.ok()) return absl::DataLossError(info.status().message());
    if (info->format_version != kPolicyFormatVersion) {
      return absl::FailedPreconditionError(absl::StrCat(
          path, ": checkpoint format version ", info->format_version,
          ", this build reads version ", kPolicyFormatVersion, "; retrain it"));
    }
    absl::StatusOr<std::unique_ptr<PolicyNetwork>> network =
        PolicyNetwork::Create(info->network, /*seed=*/0);
    if (!network.ok()) return absl::DataLossError(network.status().message());
    (*network)->module().load(archive);
    loaded.info = *std::move(info);
    loaded.network = *std::move(network);
  } catch (const c10::Error& e) {
    return absl::DataLossError(absl::StrCat(
        path, ": unreadable policy checkpoint: ", e.what_without_backtrace()));
  }
  return loaded;
}

}  // namespace arachne
