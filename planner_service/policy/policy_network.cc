// The LibTorch translation unit of the policy: the module, single-decision
// inference and the checkpoint archive.
#include "planner_service/policy/policy_network.h"

#include <torch/torch.h>

#include <algorithm>
#include <cmath>
#include <filesystem>
#include <fstream>
#include <sstream>

#include "absl/strings/str_cat.h"
#include "glog/logging.h"
#include "planner_service/policy/checkpoint.h"
#include "planner_service/policy/policy_network_module.h"
#include "planner_service/policy/policy_weights_file.h"

namespace arachne {
namespace {

constexpr char kMetadataKey[] = "arachne_metadata";

absl::Status CheckSize(const char* field, int value) {
  if (value < 1 || value > 4096) {
    return absl::InvalidArgumentError(absl::StrCat(
        "policy network: ", field, " must be in [1, 4096], got ", value));
  }
  return absl::OkStatus();
}

}  // namespace

PolicyNetwork::Module::Module(const PolicyNetworkConfig& c) : config(c) {
  const int film_params = 2 * c.hidden * c.layers + 2 * c.head_hidden * 3;
  film_in = register_module(
      "film_in", torch::nn::Linear(PolicyConditioningInputs(c), c.film_hidden));
  film_out = register_module("film_out",
                             torch::nn::Linear(c.film_hidden, film_params));
  // Zero FiLM output: scale 1 + 0 and shift 0 until training moves it, so
  // the conditioning starts as the identity.
  {
    torch::NoGradGuard no_grad;
    film_out->weight.zero_();
    film_out->bias.zero_();
  }
  int in = PolicyStateInputs(c);
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
  // `state` holds the whole kEnvStateSize layout; a per-model network
  // reads its prefix.
  const torch::Tensor summary = state.narrow(1, kEnvSummaryOffset,
                                             PolicyConditioningInputs(config));
  const torch::Tensor film = film_out(torch::relu(film_in(summary)));
  torch::Tensor x = state.narrow(1, 0, PolicyStateInputs(config));
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
  // head_in over [backbone, candidate] as two products: the backbone part
  // once per decision, not once per candidate (the same parameters).
  const torch::Tensor& w = head_in[head]->weight;
  const torch::Tensor base = torch::nn::functional::linear(
      x, w.narrow(1, 0, config.hidden), head_in[head]->bias);
  const torch::Tensor per_candidate = torch::nn::functional::linear(
      candidates, w.narrow(1, config.hidden, kHeadFeatures[head]));
  const torch::Tensor hidden = torch::relu(
      (base.unsqueeze(1) + per_candidate) * (1 + scale) + shift);
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
  auto network =
      std::unique_ptr<PolicyNetwork>(new PolicyNetwork(config, module));
  network->SyncInference();
  return network;
}

int64_t PolicyNetwork::ParameterCount() const {
  int64_t n = 0;
  for (const torch::Tensor& p : module_->parameters()) n += p.numel();
  return n;
}

std::vector<float> PolicyNetwork::TorchLogits(const ConstructionEnv& env) {
  CHECK(!env.done());
  torch::InferenceMode guard;
  const int head = HeadIndex(env.head());
  std::vector<float> candidates;
  const int features = HeadCandidates(env, &candidates);
  const int rows = HeadActions(head);
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
  std::vector<float> out(rows);
  const float* p = lp.data_ptr<float>();
  for (int a = 0; a < rows; ++a) out[a] = mask[a] ? p[a] : kMaskedLogit;
  return out;
}

void PolicyNetwork::SyncInference() {
  torch::NoGradGuard no_grad;
  auto copy = [](const torch::nn::Linear& from) {
    const torch::Tensor w = from->weight.detach().contiguous();
    const torch::Tensor b = from->bias.detach().contiguous();
    return InferenceLayer::FromRowMajor(static_cast<int>(w.size(1)),
                                        static_cast<int>(w.size(0)),
                                        w.data_ptr<float>(),
                                        b.data_ptr<float>());
  };
  auto weights = std::make_shared<PolicyWeights>();
  weights->config = config_;
  weights->version = PolicyWeights::NextVersion();
  weights->film_in = copy(module_->film_in);
  weights->film_out = copy(module_->film_out);
  for (const torch::nn::Linear& layer : module_->backbone)
    weights->backbone.push_back(copy(layer));
  for (int h = 0; h < 3; ++h) {
    weights->head_in[h] = copy(module_->head_in[h]);
    weights->head_out[h] = copy(module_->head_out[h]);
  }
  weights_ = std::move(weights);
}

std::vector<float> PolicyNetwork::Logits(const ConstructionEnv& env) const {
  PolicyScratch scratch;
  std::vector<float> out;
  PolicyLogits(*weights_, env, scratch, &out);
  return out;
}

void PolicyNetwork::Logits(const ConstructionEnv& env, PolicyScratch& scratch,
                           std::vector<float>* out) const {
  PolicyLogits(*weights_, env, scratch, out);
}

void PolicyNetwork::ActionProbabilities(const ConstructionEnv& env,
                                        absl::Span<float> probabilities,
                                        PolicyScratch& scratch) const {
  PolicyLogits(*weights_, env, scratch, &scratch.logits);
  CHECK_EQ(probabilities.size(), scratch.logits.size());
  absl::Span<const uint8_t> mask = env.LegalMask();
  for (size_t a = 0; a < scratch.logits.size(); ++a)
    probabilities[a] = mask[a] ? std::exp(scratch.logits[a]) : 0.0f;
}

void PolicyNetwork::ActionProbabilities(const ConstructionEnv& env,
                                        absl::Span<float> probabilities) {
  PolicyScratch scratch;
  ActionProbabilities(env, probabilities, scratch);
}

void PolicyNetwork::CopyFrom(const PolicyNetwork& other) {
  torch::NoGradGuard no_grad;
  auto dst = module_->parameters();
  auto src = other.module_->parameters();
  CHECK_EQ(dst.size(), src.size());
  for (size_t i = 0; i < dst.size(); ++i) dst[i].copy_(src[i]);
  SyncInference();
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
  return WritePolicyWeightsFile(meta, *network.inference_weights(),
                                WeightsFilePath(path));
}

absl::StatusOr<std::string> ExportPolicyWeights(const std::string& checkpoint) {
  absl::StatusOr<LoadedPolicy> loaded = LoadPolicyCheckpoint(checkpoint);
  if (!loaded.ok()) return loaded.status();
  const std::string path = WeightsFilePath(checkpoint);
  PolicyCheckpointInfo meta = loaded->info;
  meta.network = loaded->network->config();
  if (absl::Status s = WritePolicyWeightsFile(
          meta, *loaded->network->inference_weights(), path);
      !s.ok()) {
    return s;
  }
  return path;
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
    (*network)->SyncInference();
    loaded.info = *std::move(info);
    loaded.network = *std::move(network);
  } catch (const c10::Error& e) {
    return absl::DataLossError(absl::StrCat(
        path, ": unreadable policy checkpoint: ", e.what_without_backtrace()));
  }
  return loaded;
}

}  // namespace arachne
