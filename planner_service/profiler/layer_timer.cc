// The profiler's LibTorch part: builds one rank's slice of a layer and times
// it. The only translation unit of planner_service/profiler/ that includes
// torch (each such unit takes ~30 s to compile).
//
// Shapes follow Megatron-LM's tensor parallelism with sequence parallelism
// (what the synthesizer prices, profile_synthesizer.h): a rank holds the
// columns / tp of the QKV and MLP up (and gate) projections, the rows / tp
// of the output and down projections, heads / tp, and vocab / tp (padded up)
// of the embedding and LM head; norms and residuals run on its seq / tp
// tokens. The collectives are not run (one device): an all-gather is stood
// in for by a copy of the shard (repeat, the bytes an all-gather writes) and
// a reduce-scatter by keeping the rank's share of the rows; their time is
// the caller's (tp_comm_ms from the ring formula).
#include "planner_service/profiler/layer_timer.h"

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cmath>
#include <functional>
#include <mutex>
#include <unordered_map>
#include <vector>

#include <c10/core/CPUAllocator.h>
#include <torch/torch.h>
#include <torch/version.h>

#ifdef ARACHNE_PROFILER_CUDA
#include <c10/cuda/CUDACachingAllocator.h>
#endif

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"

namespace arachne {
namespace {

using torch::Tensor;
using torch::autograd::AutogradContext;
using torch::autograd::variable_list;

// --- Allocator accounting -----------------------------------------------------

// Wraps LibTorch's CPU allocator to count the bytes it holds: CPU LibTorch
// keeps no statistics of its own (the CUDA caching allocator does). The
// pointers it hands out are their own context with one raw deleter, as the
// default CPU allocator's are, because some kernels (raw_allocate) require
// it; sizes and the inner deleters are kept beside them.
class CountingCpuAllocator final : public c10::Allocator {
 public:
  explicit CountingCpuAllocator(c10::Allocator* inner) : inner_(inner) {}

#if TORCH_VERSION_MAJOR > 2 || (TORCH_VERSION_MAJOR == 2 && TORCH_VERSION_MINOR >= 3)
  c10::DataPtr allocate(size_t n) override { return Wrap(n); }
  void copy_data(void* dest, const void* src, std::size_t count) const override {
    default_copy_data(dest, src, count);
  }
#else
  c10::DataPtr allocate(size_t n) const override { return Wrap(n); }
#endif
  c10::DeleterFnPtr raw_deleter() const override { return &Release; }

  static int64_t live_bytes() { return live_.load(); }

 private:
  struct Held {
    size_t bytes;
    c10::DeleterFnPtr deleter;
  };
  c10::DataPtr Wrap(size_t n) const {
    c10::DataPtr inner = inner_->allocate(n);
    void* data = inner.get();
    // An inner pointer that is not its own context cannot be re-wrapped
    // this way: hand it out uncounted (the default allocator's always is).
    if (data == nullptr || data != inner.get_context()) return inner;
    const c10::DeleterFnPtr deleter = inner.get_deleter();
    inner.release_context();
    {
      std::lock_guard<std::mutex> lock(mu());
      held()[data] = Held{n, deleter};
    }
    live_ += static_cast<int64_t>(n);
    return c10::DataPtr(data, data, &Release, c10::Device(c10::DeviceType::CPU));
  }
  static void Release(void* ptr) {
    Held h{0, nullptr};
    {
      std::lock_guard<std::mutex> lock(mu());
      auto it = held().find(ptr);
      if (it == held().end()) return;  // not ours: cannot happen
      h = it->second;
      held().erase(it);
    }
    live_ -= static_cast<int64_t>(h.bytes);
    if (h.deleter != nullptr) h.deleter(ptr);
  }
  // Never destroyed: tensors may be freed during static destruction.
  static std::mutex& mu() {
    static auto* m = new std::mutex;
    return *m;
  }
  static std::unordered_map<void*, Held>& held() {
    static auto* m = new std::unordered_map<void*, Held>;
    return *m;
  }

  c10::Allocator* inner_;
  static inline std::atomic<int64_t> live_{0};
};

// Installed once, before any tensor of a measurement is allocated (tensors
// from before keep their own deleter).
void InstallCountingAllocator() {
  static CountingCpuAllocator* counting = [] {
    auto* a = new CountingCpuAllocator(c10::GetDefaultCPUAllocator());
    c10::SetCPUAllocator(a, /*priority=*/100);
    return a;
  }();
  (void)counting;
}

int64_t LiveBytes(const torch::Device& device) {
#ifdef ARACHNE_PROFILER_CUDA
  if (device.is_cuda()) {
    return c10::cuda::CUDACachingAllocator::getDeviceStats(device.index())
        .allocated_bytes[0]  // StatType::AGGREGATE
        .current;
  }
#endif
  return CountingCpuAllocator::live_bytes();
}

void Sync(const torch::Device& device) {
  if (device.is_cuda()) torch::cuda::synchronize(device.index());
}

// --- Tensor-parallel building blocks ----------------------------------------

// Stand-in for the sequence-parallel all-gather of a [b, s/t, h] shard.
Tensor Gather(const Tensor& shard, int64_t t) {
  return t == 1 ? shard : shard.repeat({1, t, 1});
}

// Megatron's column-parallel linear under sequence parallelism: all-gathers
// the input shard, multiplies, and saves only the SHARD for the backward,
// re-gathering it there for the weight gradient (Megatron's
// LinearWithGradAccumulationAndAsyncCommunication), so the activation
// memory is that of the shard, as the synthesizer assumes.
struct GatherLinear : public torch::autograd::Function<GatherLinear> {
  static Tensor forward(AutogradContext* ctx, Tensor shard, Tensor weight,
                        int64_t t) {
    ctx->save_for_backward({shard, weight});
    ctx->saved_data["t"] = t;
    return torch::matmul(Gather(shard, t), weight.t());
  }
  static variable_list backward(AutogradContext* ctx, variable_list grads) {
    const variable_list saved = ctx->get_saved_variables();
    const int64_t t = ctx->saved_data["t"].toInt();
    const Tensor& shard = saved[0];
    const Tensor& weight = saved[1];
    const Tensor gy = grads[0];
    const Tensor full = Gather(shard, t);
    const int64_t n = weight.size(0), k = weight.size(1);
    Tensor gx = torch::matmul(gy, weight);  // [b, s, k]
    // The reduce-scatter of the input gradient: keep this rank's rows.
    if (t > 1) gx = gx.narrow(1, 0, shard.size(1)).contiguous();
    Tensor gw = gy.reshape({-1, n}).t().mm(full.reshape({-1, k}));
    return {gx, gw, Tensor()};
  }
};

// Row-parallel linear: the partial sums of all ranks are reduce-scattered
// over the sequence; this rank keeps its rows.
Tensor RowParallel(const Tensor& in, const Tensor& weight, const Tensor& bias,
                   int64_t t) {
  Tensor y = torch::matmul(in, weight.t());
  if (t > 1) y = y.narrow(1, 0, y.size(1) / t);
  if (bias.defined()) y = y + bias;
  return y;
}

int64_t CeilDiv(int64_t a, int64_t b) { return (a + b - 1) / b; }

struct Builder {
  torch::TensorOptions options;
  std::vector<Tensor> params;

  // N(0, 0.02) like the usual initialisations, so values stay finite.
  Tensor Weight(std::vector<int64_t> shape) {
    Tensor w = (torch::randn(shape, options.dtype(torch::kFloat)) * 0.02)
                   .to(options.dtype().toScalarType())
                   .requires_grad_(true);
    params.push_back(w);
    return w;
  }
  Tensor Ones(std::vector<int64_t> shape) {
    Tensor w = torch::ones(shape, options).requires_grad_(true);
    params.push_back(w);
    return w;
  }
  Tensor Zeros(std::vector<int64_t> shape) {
    Tensor w = torch::zeros(shape, options).requires_grad_(true);
    params.push_back(w);
    return w;
  }
  int64_t Count() const {
    int64_t n = 0;
    for (const Tensor& p : params) n += p.numel();
    return n;
  }
};

// RMSNorm as the fused kernels (Apex / Transformer Engine) run it: fp32
// math, and only the input and the fp32 reciprocal RMS kept for the
// backward. Plain ops would keep the fp32 copy and the normalised values as
// well, overstating activation memory.
struct RmsNormFn : public torch::autograd::Function<RmsNormFn> {
  static constexpr double kEps = 1e-5;
  // fp32 for 16-bit inputs, else the input's own type.
  static torch::ScalarType Math(const Tensor& x) {
    return at::promote_types(x.scalar_type(), torch::kFloat);
  }
  static Tensor forward(AutogradContext* ctx, Tensor x, Tensor weight) {
    const Tensor xf = x.to(Math(x));
    const Tensor rstd = torch::rsqrt(xf.pow(2).mean(-1, true) + kEps);
    ctx->save_for_backward({x, weight, rstd});
    return (xf * rstd).to(x.scalar_type()) * weight;
  }
  static variable_list backward(AutogradContext* ctx, variable_list grads) {
    const variable_list saved = ctx->get_saved_variables();
    const Tensor& x = saved[0];
    const Tensor& weight = saved[1];
    const Tensor& rstd = saved[2];
    const Tensor g = grads[0].to(Math(x));
    const Tensor xhat = x.to(Math(x)) * rstd;
    const Tensor gw = (g * xhat).reshape({-1, x.size(-1)}).sum(0);
    const Tensor gxhat = g * weight.to(Math(x));
    const Tensor gx = rstd * (gxhat - xhat * (gxhat * xhat).mean(-1, true));
    return {gx.to(x.scalar_type()), gw.to(weight.scalar_type())};
  }
};

// Rotary embedding as a fused kernel runs it: the backward needs only the
// constant cos / sin tables, not the input.
struct RotaryFn : public torch::autograd::Function<RotaryFn> {
  static Tensor RotateHalf(const Tensor& x) {  // (x1, x2) -> (-x2, x1)
    const int64_t half = x.size(-1) / 2;
    return torch::cat({-x.narrow(-1, half, half), x.narrow(-1, 0, half)}, -1);
  }
  static Tensor forward(AutogradContext* ctx, Tensor x, Tensor cos,
                        Tensor sin) {
    ctx->save_for_backward({cos, sin});
    return x * cos + RotateHalf(x) * sin;
  }
  static variable_list backward(AutogradContext* ctx, variable_list grads) {
    const variable_list saved = ctx->get_saved_variables();
    const Tensor& g = grads[0];
    // The adjoint of RotateHalf: (g1, g2) -> (g2, -g1).
    const Tensor gs = g * saved[1];
    const int64_t half = g.size(-1) / 2;
    const Tensor back =
        torch::cat({gs.narrow(-1, half, half), -gs.narrow(-1, 0, half)}, -1);
    return {g * saved[0] + back, Tensor(), Tensor()};
  }
};

// GPT-style models (GeLU MLP) use LayerNorm with biases, learned absolute
// positions (in the embedding, no rotary) and biases on every projection;
// LLaMA-style ones (SwiGLU) RMSNorm, rotary embeddings and no biases: the
// split ModelSpec and the synthesizer make (model.h: AttentionParams).
struct Norm {
  Tensor weight, bias;  // bias: LayerNorm only
  bool layer_norm = false;
  Norm(Builder& b, int64_t h, bool gpt, bool with_bias) : layer_norm(gpt) {
    weight = b.Ones({h});
    if (gpt && with_bias) bias = b.Zeros({h});
  }
  Tensor operator()(const Tensor& x) const {
    if (layer_norm)
      return torch::layer_norm(x, {x.size(-1)}, weight, bias, 1e-5);
    return RmsNormFn::apply(x, weight);
  }
};

// Causal attention over [b, heads, s, d]: fused (flash / memory-efficient
// where the device has it) from LibTorch 2.0, materialised before.
Tensor CausalAttention(const Tensor& q, const Tensor& k, const Tensor& v) {
#if TORCH_VERSION_MAJOR >= 2
  return at::scaled_dot_product_attention(q, k, v, {}, 0.0, /*is_causal=*/true);
#else
  const int64_t s = q.size(-2);
  const double scale = 1.0 / std::sqrt(double(q.size(-1)));
  Tensor scores = torch::matmul(q, k.transpose(-2, -1)) * scale;
  const Tensor mask = torch::ones({s, s}, q.options().dtype(torch::kBool))
                          .triu(1);
  scores = scores.masked_fill(mask, -std::numeric_limits<double>::infinity());
  // In the input's type, as Megatron's fused scale-mask-softmax: the one
  // probabilities tensor is what both the softmax and x V keep (2 bytes per
  // score in 16-bit, the synthesizer's materialised-attention figure).
  return torch::matmul(torch::softmax(scores, -1), v);
#endif
}

// One layer on one rank: its parameters, a forward and what the backward
// starts from.
struct RankLayer {
  Builder builder;
  std::function<Tensor()> forward;
  // Runs the backward from the forward's output.
  std::function<void(const Tensor&)> backward;
  // Bytes of the layer's input that its backward keeps (the first norm
  // saves it): allocated before the forward, so the allocator's growth
  // misses them.
  int64_t saved_input_bytes = 0;
};

absl::StatusOr<std::unique_ptr<RankLayer>> BuildLayer(
    const LayerTimingRequest& r, const torch::TensorOptions& options) {
  const ModelSpec& m = r.model;
  const int64_t t = r.tp, b = r.mbs, s = r.seq, h = m.hidden;
  const int64_t s_t = s / t;
  const bool gpt = m.mlp == MlpKind::kGelu;
  auto layer = std::make_unique<RankLayer>();
  layer->builder.options = options;
  Builder& B = layer->builder;
  switch (r.kind) {
    case LayerKind::kDense: {
      const int64_t hd = m.head_dim, heads_t = m.num_heads / t,
                    kv_t = m.num_kv_heads / t, f_t = m.ffn / t;
      const int64_t qd = heads_t * hd, kvd = kv_t * hd;
      Norm n1(B, h, gpt, true);
      Tensor w_qkv = B.Weight({qd + 2 * kvd, h});
      Tensor b_qkv = gpt ? B.Zeros({qd + 2 * kvd}) : Tensor();
      Tensor w_o = B.Weight({h, qd});
      Tensor b_o = gpt ? B.Zeros({h}) : Tensor();
      Norm n2(B, h, gpt, true);
      const int64_t up = gpt ? f_t : 2 * f_t;
      Tensor w_up = B.Weight({up, h});
      Tensor b_up = gpt ? B.Zeros({up}) : Tensor();
      Tensor w_down = B.Weight({h, f_t});
      Tensor b_down = gpt ? B.Zeros({h}) : Tensor();
      // Rotary tables (not parameters), theta 10000.
      Tensor cos, sin;
      if (!gpt) {
        const Tensor inv = 1.0 / torch::pow(10000.0, torch::arange(0, hd, 2,
                                                   options.dtype(torch::kFloat)) /
                                                   double(hd));
        const Tensor pos = torch::arange(s, options.dtype(torch::kFloat));
        const Tensor ang = torch::outer(pos, inv);
        const Tensor emb = torch::cat({ang, ang}, -1);
        cos = emb.cos().to(options.dtype().toScalarType());
        sin = emb.sin().to(options.dtype().toScalarType());
      }
      const Tensor x = torch::randn({b, s_t, h}, options).requires_grad_(true);
      const Tensor grad = torch::randn({b, s_t, h}, options);
      const int64_t groups = heads_t / kv_t;
      layer->forward = [=]() {
        Tensor qkv = GatherLinear::apply(n1(x), w_qkv, t);
        if (b_qkv.defined()) qkv = qkv + b_qkv;
        auto heads = [&](int64_t off, int64_t width, int64_t n) {
          return qkv.narrow(-1, off, width).view({b, s, n, hd}).transpose(1, 2);
        };
        Tensor q = heads(0, qd, heads_t), k = heads(qd, kvd, kv_t),
               v = heads(qd + kvd, kvd, kv_t);
        if (!gpt) {
          q = RotaryFn::apply(q, cos, sin);
          k = RotaryFn::apply(k, cos, sin);
        }
        // GQA: each KV head serves `groups` query heads (copies; flash
        // attention kernels with native GQA keep only the KV heads).
        // Otherwise a contiguous copy, so that the saved V is not a view
        // keeping the whole QKV output alive.
        if (groups > 1) {
          k = k.repeat_interleave(groups, 1);
          v = v.repeat_interleave(groups, 1);
        } else {
          v = v.contiguous();
        }
        const Tensor a =
            CausalAttention(q, k, v).transpose(1, 2).reshape({b, s, qd});
        const Tensor h1 = x + RowParallel(a, w_o, b_o, t);
        Tensor u = GatherLinear::apply(n2(h1), w_up, t);
        if (b_up.defined()) u = u + b_up;
        const Tensor act =
            gpt ? torch::gelu(u, "tanh")
                : torch::silu(u.narrow(-1, 0, f_t)) * u.narrow(-1, f_t, f_t);
        return h1 + RowParallel(act, w_down, b_down, t);
      };
      layer->backward = [grad](const Tensor& out) { out.backward(grad); };
      layer->saved_input_bytes = x.numel() * x.element_size();
      return layer;
    }
    case LayerKind::kEmbedding: {
      // Vocab-parallel embedding of rank 0 (rows [0, V/t)): ids outside the
      // shard are masked to row 0 and their outputs zeroed, then the sum
      // over ranks is reduce-scattered over the sequence.
      const int64_t v_t = CeilDiv(m.vocab, t);
      Tensor table = B.Weight({v_t, h});
      const Tensor ids = torch::randint(
          m.vocab, {b, s}, options.dtype(torch::kLong));
      const Tensor grad = torch::randn({b, s_t, h}, options);
      layer->forward = [=]() {
        const Tensor outside = ids >= v_t;
        const Tensor local = ids.masked_fill(outside, 0);
        Tensor y = torch::embedding(table, local)
                       .masked_fill(outside.unsqueeze(-1), 0);
        // A copy, not a view: a view would keep the whole [b, s, h] buffer
        // alive, where the reduce-scatter's output is [b, s/t, h].
        if (t > 1) y = y.narrow(1, 0, s_t).clone();
        return y;
      };
      layer->backward = [grad](const Tensor& out) { out.backward(grad); };
      return layer;
    }
    case LayerKind::kLmHead: {
      // Final norm, the vocab-parallel output projection, and this rank's
      // part of Megatron's vocab-parallel cross entropy (the max, the sum of
      // exponentials and the target logit are all-reduced there; here each
      // is the shard's).
      const int64_t v_t = CeilDiv(m.vocab, t);
      Norm norm(B, h, gpt, false);
      Tensor w_out = B.Weight({v_t, h});
      const Tensor x = torch::randn({b, s_t, h}, options).requires_grad_(true);
      const Tensor targets = torch::randint(
          m.vocab, {b, s, 1}, options.dtype(torch::kLong));
      layer->forward = [=]() {
        const Tensor logits =
            GatherLinear::apply(norm(x), w_out, t).to(torch::kFloat);
        const Tensor max = std::get<0>(logits.max(-1, true)).detach();
        const Tensor shifted = logits - max;
        const Tensor sum_exp = shifted.exp().sum(-1);
        const Tensor outside = targets >= v_t;
        const Tensor picked = shifted.gather(-1, targets.masked_fill(outside, 0))
                                  .masked_fill(outside, 0)
                                  .squeeze(-1);
        return (sum_exp.log() - picked).mean();
      };
      layer->backward = [](const Tensor& loss) { loss.backward(); };
      layer->saved_input_bytes = x.numel() * x.element_size();
      return layer;
    }
    case LayerKind::kMoeAttention:
    case LayerKind::kMoeExperts:
      break;
  }
  return absl::UnimplementedError(absl::StrCat(
      "--layers: ", LayerKindName(r.kind), " is not supported yet"));
}

double Median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  const size_t n = v.size();
  return n % 2 == 1 ? v[n / 2] : 0.5 * (v[n / 2 - 1] + v[n / 2]);
}

double MsSince(std::chrono::steady_clock::time_point a,
               std::chrono::steady_clock::time_point b) {
  return std::chrono::duration<double, std::milli>(b - a).count();
}

}  // namespace

absl::Status CheckHandWrittenBackwards() {
  try {
    torch::manual_seed(7);
    const auto f64 = torch::TensorOptions().dtype(torch::kDouble);
    // Max |difference| of the gradients of sum(out * probe) w.r.t. `inputs`
    // between the hand-written function and the plain ops it replaces.
    auto compare = [&](const std::string& name, std::vector<Tensor> inputs,
                       const std::function<Tensor(std::vector<Tensor>&)>& mine,
                       const std::function<Tensor(std::vector<Tensor>&)>& ref)
        -> absl::Status {
      std::vector<Tensor> a, b;
      for (const Tensor& t : inputs) {
        a.push_back(t.clone().requires_grad_(true));
        b.push_back(t.clone().requires_grad_(true));
      }
      const Tensor out_a = mine(a), out_b = ref(b);
      const Tensor probe = torch::randn(out_a.sizes(), f64);
      double worst = (out_a - out_b).abs().max().item<double>();
      (out_a * probe).sum().backward();
      (out_b * probe).sum().backward();
      for (size_t i = 0; i < a.size(); ++i)
        worst = std::max(
            worst, (a[i].grad() - b[i].grad()).abs().max().item<double>());
      if (worst > 1e-9)
        return absl::InternalError(absl::StrCat(
            name, ": the hand-written backward differs from autograd's by ",
            worst));
      return absl::OkStatus();
    };
    const int64_t b = 2, s = 8, h = 6, t = 2;
    if (absl::Status st = compare(
            "RMSNorm", {torch::randn({b, s, h}, f64), torch::randn({h}, f64)},
            [](std::vector<Tensor>& x) { return RmsNormFn::apply(x[0], x[1]); },
            [](std::vector<Tensor>& x) {
              return x[0] * torch::rsqrt(x[0].pow(2).mean(-1, true) +
                                         RmsNormFn::kEps) * x[1];
            });
        !st.ok())
      return st;
    const Tensor cos = torch::randn({s, h}, f64), sin = torch::randn({s, h}, f64);
    if (absl::Status st = compare(
            "rotary", {torch::randn({b, 3, s, h}, f64)},
            [&](std::vector<Tensor>& x) {
              return RotaryFn::apply(x[0], cos, sin);
            },
            [&](std::vector<Tensor>& x) {
              return x[0] * cos + RotaryFn::RotateHalf(x[0]) * sin;
            });
        !st.ok())
      return st;
    return compare(
        "column-parallel linear",
        {torch::randn({b, s / t, h}, f64), torch::randn({5, h}, f64)},
        [&](std::vector<Tensor>& x) {
          return GatherLinear::apply(x[0], x[1], t);
        },
        [&](std::vector<Tensor>& x) {
          // The stand-in's semantics: the other ranks' shards (copies of
          // this one) are constants, so the input gradient is this rank's
          // rows of the full one (its part of the reduce-scatter).
          std::vector<Tensor> parts = {x[0]};
          for (int64_t i = 1; i < t; ++i) parts.push_back(x[0].detach());
          return torch::matmul(torch::cat(parts, 1), x[1].t());
        });
  } catch (const c10::Error& e) {
    return absl::InternalError(e.what_without_backtrace());
  }
}

bool CudaAvailable() { return torch::cuda::is_available(); }

std::string TorchDescription() {
  const bool cuda = torch::cuda::is_available();
  return absl::StrCat("LibTorch ", TORCH_VERSION,
                      cuda ? absl::StrCat(" (CUDA, ", torch::cuda::device_count(),
                                          " devices)")
                           : std::string(" (no CUDA device)"));
}

absl::StatusOr<LayerTiming> TimeLayer(const LayerTimingRequest& r) {
  if (r.iters < 1 || r.warmup < 0)
    return absl::InvalidArgumentError(absl::StrCat(
        "--iters must be >= 1 and --warmup >= 0, got ", r.iters, " and ",
        r.warmup));
  if (r.kind == LayerKind::kMoeAttention || r.kind == LayerKind::kMoeExperts)
    return absl::UnimplementedError(absl::StrCat(
        "--layers: ", LayerKindName(r.kind),
        " is not supported yet (the profiler measures dense, embedding and "
        "lm_head)"));
  if (r.kind == LayerKind::kDense && r.model.attention == AttentionKind::kMla)
    return absl::UnimplementedError(absl::StrCat(
        "--layers: dense: multi-head latent attention (model ", r.model.name,
        ") is not supported yet"));
  if (r.device == ProfileDevice::kCuda && !torch::cuda::is_available())
    return absl::FailedPreconditionError(absl::StrCat(
        "--device cuda: ", TorchDescription(),
        " sees no CUDA device (a CPU-only LibTorch, or no GPU here)"));
  try {
    InstallCountingAllocator();
    torch::manual_seed(r.seed);
    const torch::Device device = r.device == ProfileDevice::kCuda
                                     ? torch::Device(torch::kCUDA, 0)
                                     : torch::Device(torch::kCPU);
    const torch::ScalarType dtype = r.dtype == ProfileDtype::kBf16
                                        ? torch::kBFloat16
                                    : r.dtype == ProfileDtype::kFp16
                                        ? torch::kHalf
                                        : torch::kFloat;
    const auto options = torch::TensorOptions().device(device).dtype(dtype);
    absl::StatusOr<std::unique_ptr<RankLayer>> built = BuildLayer(r, options);
    if (!built.ok()) return built.status();
    RankLayer& layer = **built;

    // One pass allocates the gradients, so that the accounting below sees
    // only what a forward keeps; then the warm-up (kernel selection, caches).
    for (int i = 0; i < 1 + r.warmup; ++i) layer.backward(layer.forward());
    Sync(device);

    LayerTiming timing;
    timing.module_params = layer.builder.Count();
    {
      const int64_t before = LiveBytes(device);
      Tensor out = layer.forward();
      Sync(device);
      // The output is the next layer's input (its entry counts it, as this
      // one counts its own input).
      timing.activation_bytes = LiveBytes(device) - before -
                                out.numel() * out.element_size() +
                                layer.saved_input_bytes;
      layer.backward(out);
      Sync(device);
    }
    std::vector<double> fwd, bwd;
    for (int i = 0; i < r.iters; ++i) {
      Sync(device);
      const auto t0 = std::chrono::steady_clock::now();
      Tensor out = layer.forward();
      Sync(device);
      const auto t1 = std::chrono::steady_clock::now();
      layer.backward(out);
      Sync(device);
      const auto t2 = std::chrono::steady_clock::now();
      fwd.push_back(MsSince(t0, t1));
      bwd.push_back(MsSince(t1, t2));
    }
    timing.fwd_ms = Median(fwd);
    timing.bwd_ms = Median(bwd);
    return timing;
  } catch (const c10::Error& e) {
    // CPU kernels of older LibTorch releases lack 16-bit types (1.13: no
    // fp16 addmm).
    const bool cpu_16 = r.device == ProfileDevice::kCpu &&
                        r.dtype != ProfileDtype::kFp32;
    return absl::InternalError(absl::StrCat(
        "LibTorch failed timing ", LayerKindName(r.kind), " (tp ", r.tp,
        ", micro-batch ", r.mbs, "): ", e.what_without_backtrace(),
        cpu_16 ? " (on CPU, try --dtype fp32)" : ""));
  }
}

}  // namespace arachne
