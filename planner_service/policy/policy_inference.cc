#include "planner_service/policy/policy_inference.h"

#include <algorithm>
#include <atomic>
#include <cmath>

#include "glog/logging.h"

namespace arachne {
namespace {

// y[o] += sum_i x[i] W[first + i][o] for i < count, over the layer's
// outputs: the inner loop runs over contiguous outputs, independent lanes
// the compiler vectorises. Zero inputs (many state features, ReLU outputs)
// are skipped.
// Compiled for AVX2 as well as the baseline on x86-64, chosen at load time
// by the CPU (function multi-versioning): twice the lanes on the machines
// that have it. The clone has no FMA (a separate ISA flag), so each output
// sums the same products in the same order and the logits are the same
// bits on every machine.
#if defined(__x86_64__) && defined(__GNUC__)
#define ARACHNE_AVX2_CLONE __attribute__((target_clones("avx2", "default")))
#else
#define ARACHNE_AVX2_CLONE
#endif
ARACHNE_AVX2_CLONE
void AddRows(const InferenceLayer& layer, int first, int count,
             const float* __restrict x, float* __restrict y) {
  const int out = layer.out;
  const float* __restrict w =
      layer.weight_t.data() + static_cast<size_t>(first) * out;
  for (int i = 0; i < count; ++i) {
    const float xi = x[i];
    if (xi == 0.0f) continue;
    const float* __restrict row = w + static_cast<size_t>(i) * out;
    for (int o = 0; o < out; ++o) y[o] += xi * row[o];
  }
}

// y = b + W^T x over all of the layer's inputs.
void AffineT(const InferenceLayer& layer, const float* __restrict x,
             float* __restrict y) {
  std::copy(layer.bias.begin(), layer.bias.end(), y);
  AddRows(layer, 0, layer.in, x, y);
}

}  // namespace

int HeadIndex(EnvHead head) {
  switch (head) {
    case EnvHead::kDepth:
      return 0;
    case EnvHead::kDevice:
      return 1;
    case EnvHead::kTp:
      return 2;
    case EnvHead::kDone:
      break;
  }
  LOG(FATAL) << "no head acts in a finished episode";
  return -1;
}

int HeadActions(int head) {
  return head == 0 ? kEnvDepthActions
                   : (head == 1 ? kEnvDeviceSlots : kEnvTpSlots);
}

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
      absl::Span<const float> rows = env.TpCandidates();
      out->assign(rows.begin(), rows.end());
      return kTpCandidateFeatures;
    }
    case EnvHead::kDone:
      break;
  }
  LOG(FATAL) << "HeadCandidates on a finished episode";
  return 0;
}

InferenceLayer InferenceLayer::FromRowMajor(int in, int out,
                                            const float* weight,
                                            const float* bias) {
  InferenceLayer layer;
  layer.in = in;
  layer.out = out;
  layer.weight_t.resize(static_cast<size_t>(in) * out);
  for (int o = 0; o < out; ++o)
    for (int i = 0; i < in; ++i)
      layer.weight_t[static_cast<size_t>(i) * out + o] =
          weight[static_cast<size_t>(o) * in + i];
  layer.bias.assign(bias, bias + out);
  return layer;
}

uint64_t PolicyWeights::NextVersion() {
  static std::atomic<uint64_t> next{1};
  return next.fetch_add(1);
}

void PolicyLogits(const PolicyWeights& w, const ConstructionEnv& env,
                  PolicyScratch& s, std::vector<float>* out) {
  CHECK(!env.done());
  const PolicyNetworkConfig& c = w.config;
  const int head = HeadIndex(env.head());
  const int rows = HeadActions(head);
  const int features = HeadCandidates(env, &s.candidates);
  absl::Span<const uint8_t> mask = env.LegalMask();
  absl::Span<const float> state = env.State();
  const float* summary = state.data() + kEnvSummaryOffset;
  const int conditioning = PolicyConditioningInputs(c);

  // FiLM, once per composition (and model) summary and snapshot.
  if (s.film_version != w.version ||
      !std::equal(s.film_summary.begin(),
                  s.film_summary.begin() + conditioning, summary)) {
    s.film_hidden.resize(c.film_hidden);
    AffineT(w.film_in, summary, s.film_hidden.data());
    for (float& v : s.film_hidden) v = std::max(v, 0.0f);
    s.film.resize(w.film_out.out);
    AffineT(w.film_out, s.film_hidden.data(), s.film.data());
    std::copy(summary, summary + conditioning, s.film_summary.begin());
    s.film_version = w.version;
  }

  s.x.assign(state.begin(), state.begin() + PolicyStateInputs(c));
  s.y.resize(c.hidden);
  for (int l = 0; l < c.layers; ++l) {
    AffineT(w.backbone[l], s.x.data(), s.y.data());
    const float* scale = s.film.data() + 2 * c.hidden * l;
    const float* shift = scale + c.hidden;
    for (int i = 0; i < c.hidden; ++i)
      s.y[i] = std::max(s.y[i] * (1 + scale[i]) + shift[i], 0.0f);
    s.x.swap(s.y);
    s.y.resize(c.hidden);
  }

  // head_in over [backbone, candidate]: the backbone part (the first
  // `hidden` input rows) once, then each candidate's rows on top.
  const InferenceLayer& in = w.head_in[head];
  const InferenceLayer& out_layer = w.head_out[head];
  const int hh = c.head_hidden;
  s.base.assign(in.bias.begin(), in.bias.end());
  AddRows(in, 0, c.hidden, s.x.data(), s.base.data());
  const float* scale = s.film.data() + 2 * c.hidden * c.layers + 2 * hh * head;
  const float* shift = scale + hh;
  s.acc.resize(hh);
  out->assign(rows, kMaskedLogit);
  float top = kMaskedLogit;
  for (int r = 0; r < rows; ++r) {
    if (!mask[r]) continue;
    float* acc = s.acc.data();
    std::copy(s.base.begin(), s.base.end(), acc);
    AddRows(in, c.hidden, features, s.candidates.data() + r * features, acc);
    float logit = out_layer.bias[0];
    for (int o = 0; o < hh; ++o)
      logit += out_layer.weight_t[o] *
               std::max(acc[o] * (1 + scale[o]) + shift[o], 0.0f);
    (*out)[r] = logit;
    top = std::max(top, logit);
  }
  double sum = 0;
  for (int r = 0; r < rows; ++r)
    if (mask[r]) sum += std::exp(static_cast<double>((*out)[r] - top));
  const float log_sum = top + static_cast<float>(std::log(sum));
  for (int r = 0; r < rows; ++r)
    if (mask[r]) (*out)[r] -= log_sum;
}

}  // namespace arachne
