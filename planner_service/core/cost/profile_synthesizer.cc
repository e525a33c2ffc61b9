#include "planner_service/core/cost/profile_synthesizer.h"

#include <algorithm>
#include <cmath>
#include <string>

#include "absl/status/status.h"
#include "absl/strings/ascii.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"

namespace arachne {
namespace {

bool ContainsNoCase(absl::string_view hay, absl::string_view needle) {
  return absl::AsciiStrToLower(hay).find(absl::AsciiStrToLower(needle)) !=
         std::string::npos;
}

// Bytes of a 16-bit element.
constexpr double kB16 = 2.0;
// Flash attention backward runs five s x s matmuls (recomputes QK^T) where
// the forward runs two.
constexpr double kFlashBwdFlopRatio = 2.5;
// Cross-entropy HBM bytes per logit (vocab-parallel, fp32 math): forward
// reads the 16-bit logits and makes max / exp / sum passes in fp32; the
// backward reads the softmax and writes the 16-bit gradient.
constexpr double kCrossEntropyFwdBytesPerLogit = 18;
constexpr double kCrossEntropyBwdBytesPerLogit = 10;
// Router softmax / top-k traffic per token and expert (fp32, a few passes).
constexpr double kRouterBytesPerTokenExpert = 16;
// Embedding backward per table element: zero the dense 16-bit gradient,
// then accumulate it into the fp32 main gradient (read 2 + 4, write 4).
constexpr double kEmbeddingBwdBytesPerTableElement = 12;

int64_t CeilDiv(int64_t a, int64_t b) { return (a + b - 1) / b; }

bool IsNvLink(const GpuType& g) {
  return ContainsNoCase(g.intra_node_link, "nvlink") ||
         ContainsNoCase(g.intra_node_link, "nvswitch");
}

struct AttnDims {
  double q = 0;       // query width (heads * qk head dim)
  double k = 0;       // key width
  double v = 0;       // value width
  double out_in = 0;  // input width of the output projection
  double qk_head = 0, v_head = 0;
  double latent = 0;  // MLA latent widths stored (q_lora + kv_lora + rope)
};

AttnDims AttentionDims(const ModelSpec& m) {
  AttnDims d;
  if (m.attention == AttentionKind::kMla) {
    const double qk = m.mla.qk_nope_head_dim + m.mla.qk_rope_head_dim;
    d.qk_head = qk;
    d.v_head = m.mla.v_head_dim;
    d.q = m.num_heads * qk;
    d.k = m.num_heads * qk;
    d.v = m.num_heads * d.v_head;
    d.out_in = d.v;
    d.latent = m.mla.q_lora_rank + m.mla.kv_lora_rank + m.mla.qk_rope_head_dim;
  } else {
    d.qk_head = d.v_head = m.head_dim;
    d.q = double(m.num_heads) * m.head_dim;
    d.k = d.v = double(m.num_kv_heads) * m.head_dim;
    d.out_in = d.q;
  }
  return d;
}

bool GptStyle(const ModelSpec& m) { return m.mlp == MlpKind::kGelu; }

// Forward GEMMs of the attention of one micro-batch (T tokens) at tp.
void AddAttentionGemms(const ModelSpec& m, double T, int tp,
                       LayerWork* w) {
  const double h = m.hidden;
  if (m.attention == AttentionKind::kMla) {
    const double qk = m.mla.qk_nope_head_dim + m.mla.qk_rope_head_dim;
    const double heads_t = double(m.num_heads) / tp;
    if (m.mla.q_lora_rank > 0) {
      w->gemms.push_back({T, double(m.mla.q_lora_rank), h});
      w->gemms.push_back({T, heads_t * qk, double(m.mla.q_lora_rank)});
    } else {
      w->gemms.push_back({T, heads_t * qk, h});
    }
    w->gemms.push_back(
        {T, double(m.mla.kv_lora_rank + m.mla.qk_rope_head_dim), h});
    w->gemms.push_back(
        {T, heads_t * (m.mla.qk_nope_head_dim + m.mla.v_head_dim),
         double(m.mla.kv_lora_rank)});
    w->gemms.push_back({T, h, heads_t * m.mla.v_head_dim});
  } else {
    const AttnDims d = AttentionDims(m);
    w->gemms.push_back({T, (d.q + d.k + d.v) / tp, h});
    w->gemms.push_back({T, h, d.q / tp});
  }
}

// Causal flash attention core of one micro-batch.
void AddFlashAttention(const ModelSpec& m, int tp, int mbs, int seq,
                       LayerWork* w) {
  const AttnDims d = AttentionDims(m);
  const double heads_t = double(m.num_heads) / tp;
  // QK^T and AV: 2 FLOPs per multiply-add, half of the s x s work skipped
  // by the causal mask.
  const double fwd = 2.0 * double(seq) * seq * mbs * heads_t *
                     (d.qk_head + d.v_head) * 0.5;
  w->fused_attn_fwd_flops += fwd;
  w->fused_attn_bwd_flops += kFlashBwdFlopRatio * fwd;
}

// Materialized attention (Megatron's non-flash path): QK^T and x V as
// batched GEMMs over the full s x s (the causal mask is applied by the
// softmax, no work skipped), the scores written to HBM and re-read. Adds the
// GEMMs and the score traffic to `w`; returns the bytes per GPU kept for the
// backward (softmax output, and with dropout its mask and output:
// Korthikanti et al. 2022, 5·a·s²·b with dropout).
double AddMaterializedAttention(const ModelSpec& m, int tp, int mbs, int seq,
                                bool dropout, LayerWork* w) {
  const AttnDims d = AttentionDims(m);
  const double heads_t = double(m.num_heads) / tp;
  const double batches = double(mbs) * heads_t;
  // One batched GEMM each (baddbmm / bmm): the small-GEMM penalty is paid
  // once per kernel, on its total work, not once per (sequence, head).
  w->gemms.push_back({double(seq) * batches, double(seq), d.qk_head});
  w->gemms.push_back({double(seq) * batches, d.v_head, double(seq)});
  const double scores = batches * double(seq) * seq;
  // QK^T written, fused scale-mask-softmax read + written, read by x V;
  // dropout reads and writes the probabilities and writes a 1-byte mask.
  const double accesses = 4 + (dropout ? 2.5 : 0);
  w->fwd_bytes += scores * kB16 * accesses;
  return scores * (dropout ? 5.0 : kB16);
}

// Per token (before dividing by tp) what a TP group without sequence
// parallelism holds on every rank instead of 1/tp of it (Korthikanti et al.
// 2022: the 10·s·b·h of sbh(10 + 24/t) for a GPT block): the two norm
// inputs, the QKV and MLP inputs, and GPT-style dropout masks.
double ReplicatedActivationBytesPerToken(const ModelSpec& m) {
  const double h = m.hidden;
  return 2 * kB16 * h + 2 * kB16 * h + (m.mlp == MlpKind::kGelu ? 2 * h : 0);
}
// Element accesses per token of a block's two norms (read + write) and two
// residual adds (2 reads + 1 write): what sequence parallelism shards, and
// what runs on every rank without it.
double NormAndResidualElementsPerToken(const ModelSpec& m) {
  return 2 * 2 * double(m.hidden) + 2 * 3 * double(m.hidden);
}

// Element accesses per token (16-bit) of the attention half of a block at
// tp = 1 with Megatron's fused kernels: two norms (read + write), two
// residual adds (2 reads + 1 write), RoPE on q and k (read + write).
double AttentionElementwisePerToken(const ModelSpec& m) {
  const AttnDims d = AttentionDims(m);
  return NormAndResidualElementsPerToken(m) + 2 * (d.q + d.k);
}

double MlpActElementsPerToken(MlpKind kind, double ffn) {
  // SwiGLU: read gate and up, write product; GeLU: read, write.
  return kind == MlpKind::kSwiGlu ? 3 * ffn : 2 * ffn;
}

void AddMlpGemms(MlpKind kind, double T, double h, double ffn_t, double count,
                 LayerWork* w) {
  const double up = kind == MlpKind::kSwiGlu ? 2 * ffn_t : ffn_t;
  w->gemms.push_back({T, up, h, count});
  w->gemms.push_back({T, h, ffn_t, count});
}

absl::Status Invalid(const ModelSpec& m, absl::string_view field,
                     absl::string_view msg) {
  return absl::InvalidArgumentError(
      absl::StrCat("synthesize ", m.name, ": ", field, " ", msg));
}

}  // namespace

double AttentionActivationBytesPerToken(const ModelSpec& m) {
  const AttnDims d = AttentionDims(m);
  const double h = m.hidden;
  double b = 2 * kB16 * h;           // inputs of the two norms
  b += kB16 * h;                     // QKV projection input (norm output)
  b += kB16 * (d.q + d.k + d.v);     // Q, K, V (after RoPE)
  b += kB16 * d.out_in;              // output projection input
  b += 4.0 * m.num_heads;            // flash softmax statistics (fp32 LSE)
  b += kB16 * d.latent;              // MLA compressed latents
  if (GptStyle(m)) b += 1.0 * h;     // attention output dropout mask
  return b;
}

double DenseMlpActivationBytesPerToken(const ModelSpec& m) {
  const double h = m.hidden, f = m.ffn;
  double b = kB16 * h;  // MLP input (second norm output)
  if (m.mlp == MlpKind::kSwiGlu) {
    b += kB16 * 3 * f;  // gate and up outputs, their product (down input)
  } else {
    b += kB16 * 2 * f;  // GeLU input, down-projection input
    b += 1.0 * h;       // MLP output dropout mask
  }
  return b;
}

LayerTime EstimateLayerTime(const LayerWork& work, const CalibrationParams& p,
                            double peak_tflops, double gemm_eff_max,
                            double hbm_gbps, int tp) {
  const double peak = peak_tflops * 1e12;
  const double tp_factor = 1.0 + p.tp_loss_per_degree * std::max(0, tp - 1);
  const double half = p.gemm_half_gflop * 1e9;
  double gemm_s = 0;
  for (const GemmShape& g : work.gemms) {
    const double one = 2.0 * g.m * g.n * g.k;
    gemm_s += g.count * (one + half);
  }
  gemm_s *= tp_factor / (peak * gemm_eff_max);
  const double attn_eff = gemm_eff_max * p.attn_eff_rel;
  const double attn_fwd_s = work.fused_attn_fwd_flops / (peak * attn_eff);
  const double attn_bwd_s =
      work.fused_attn_bwd_flops / (peak * attn_eff * p.bwd_eff_rel);
  const double bw = hbm_gbps * 1e9 * p.mem_eff;
  LayerTime t;
  t.fwd_ms = 1e3 * (gemm_s + attn_fwd_s + work.fwd_bytes / bw) +
             p.layer_overhead_us * 1e-3;
  t.bwd_ms = 1e3 * (2.0 * gemm_s / p.bwd_eff_rel + attn_bwd_s +
                    work.bwd_bytes / bw) +
             2.0 * p.layer_overhead_us * 1e-3;
  t.attention_fwd_ms = 1e3 * attn_fwd_s;
  t.attention_bwd_ms = 1e3 * attn_bwd_s;
  return t;
}

double RingCollectiveMs(double bytes, int n, const GpuType& gpu,
                        const CalibrationParams& p) {
  if (n <= 1) return 0;
  const double step_us = IsNvLink(gpu) ? p.nvlink_step_us : p.pcie_step_us;
  const double bw = gpu.intra_node_gbps * 1e9 * p.comm_bw_eff;
  const double s = p.collective_base_us * 1e-6 +
                   (n - 1) * (step_us * 1e-6 + bytes / (double(n) * bw));
  return 1e3 * s;
}

SynthesisKernels KernelsOf(const FrameworkConfig& framework) {
  SynthesisKernels k;
  k.flash_attention = framework.attention != AttentionKernel::kMaterialized;
  k.flash2 = framework.attention == AttentionKernel::kFlash2;
  k.attention_dropout = framework.attention_dropout;
  k.sequence_parallel = framework.sequence_parallel;
  return k;
}

std::vector<LayerKind> ProfileSynthesizer::KindsOf(const ModelSpec& model) {
  std::vector<LayerKind> kinds;
  if (model.is_moe()) {
    kinds.push_back(LayerKind::kMoeAttention);
    kinds.push_back(LayerKind::kMoeExperts);
    if (model.moe.dense_first_layers > 0) kinds.push_back(LayerKind::kDense);
  } else {
    kinds.push_back(LayerKind::kDense);
  }
  kinds.push_back(LayerKind::kEmbedding);
  kinds.push_back(LayerKind::kLmHead);
  return kinds;
}

absl::StatusOr<ProfileEntry> ProfileSynthesizer::Synthesize(
    const ModelSpec& m, LayerKind kind, const GpuType& gpu, int tp, int mbs,
    int seq) const {
  CalibrationParams p = params_;
  if (kernels_.flash_attention && kernels_.flash2 &&
      gpu.architecture == "hopper") {
    p.attn_eff_rel *= kFlash2OnHopperAttentionFactor;
  }
  if (mbs <= 0) return Invalid(m, "mbs", absl::StrCat("must be > 0, got ", mbs));
  if (seq <= 0) return Invalid(m, "seq", absl::StrCat("must be > 0, got ", seq));
  if (tp <= 0) return Invalid(m, "tp", absl::StrCat("must be > 0, got ", tp));
  if (m.hidden <= 0 || m.num_heads <= 0)
    return Invalid(m, "hidden", "and num_heads must be > 0");
  if (gpu.peak_bf16_tflops <= 0 || gpu.hbm_gbps <= 0)
    return absl::InvalidArgumentError(absl::StrCat(
        "synthesize: GPU ", gpu.id, " needs peak_bf16_tflops and hbm_gbps"));
  const bool has_attention = kind == LayerKind::kDense ||
                             kind == LayerKind::kMoeAttention;
  if (kind == LayerKind::kMoeAttention || kind == LayerKind::kMoeExperts) {
    if (!m.is_moe())
      return Invalid(m, "layer_kind",
                     absl::StrCat(LayerKindName(kind),
                                  " needs a MoE model (moe.num_experts > 0)"));
  }
  if (kind == LayerKind::kDense && m.is_moe() && m.moe.dense_first_layers <= 0)
    return Invalid(m, "layer_kind",
                   "dense: MoE model has no dense layers (dense_first_layers 0)");
  if (has_attention) {
    if (m.num_heads % tp != 0)
      return Invalid(m, "tp", absl::StrCat(tp, " must divide num_heads (",
                                           m.num_heads, ")"));
    if (m.attention == AttentionKind::kGqa && m.num_kv_heads % tp != 0)
      return Invalid(m, "tp", absl::StrCat(tp, " must divide num_kv_heads (",
                                           m.num_kv_heads, ")"));
  }
  if (kind == LayerKind::kDense && (m.ffn <= 0 || m.ffn % tp != 0))
    return Invalid(m, "tp",
                   absl::StrCat(tp, " must divide ffn (", m.ffn, ")"));
  const int shared_ffn = m.moe.shared_expert_ffn > 0 ? m.moe.shared_expert_ffn
                                                     : m.moe.expert_ffn;
  if (kind == LayerKind::kMoeAttention && m.moe.shared_experts > 0 &&
      shared_ffn % tp != 0)
    return Invalid(m, "tp", absl::StrCat(tp, " must divide the shared expert ffn (",
                                         shared_ffn, ")"));
  if (kind == LayerKind::kMoeExperts &&
      (m.moe.expert_ffn <= 0 || m.moe.expert_ffn % tp != 0))
    return Invalid(m, "tp", absl::StrCat("(ETP) ", tp,
                                         " must divide moe.expert_ffn (",
                                         m.moe.expert_ffn, ")"));

  ProfileEntry e;
  e.key.model = m.profile_name.empty() ? m.name : m.profile_name;
  e.key.kind = kind;
  e.key.gpu = gpu.id;
  e.key.tp = tp;
  e.key.mbs = mbs;
  e.key.seq = seq;
  e.source = ProfileSource::kSynthesized;

  const double T = double(mbs) * seq;
  const double h = m.hidden;
  const double S_AGRS = T * h * kB16;  // one SP all-gather/reduce-scatter
  // The attention core with the framework's kernel, and what a TP group
  // without sequence parallelism runs and keeps on every rank; returns the
  // activation bytes it adds to the block's.
  const SynthesisKernels& k = kernels_;
  auto AddAttentionCore = [&](LayerWork* work) {
    double extra = 0;
    if (k.flash_attention) {
      AddFlashAttention(m, tp, mbs, seq, work);
    } else {
      extra += AddMaterializedAttention(m, tp, mbs, seq, k.attention_dropout,
                                        work);
      extra -= T * 4.0 * m.num_heads / tp;  // no flash softmax statistics
    }
    if (!k.sequence_parallel && tp > 1) {
      const double replicated = 1.0 - 1.0 / tp;
      extra += T * ReplicatedActivationBytesPerToken(m) * replicated;
      work->fwd_bytes +=
          T * kB16 * NormAndResidualElementsPerToken(m) * replicated;
    }
    return extra;
  };
  LayerWork w;
  double params = 0;      // parameters per GPU
  double act_bytes = 0;   // per GPU
  double comm_ms = 0;

  switch (kind) {
    case LayerKind::kDense: {
      params = double(CeilDiv(m.DenseLayerParams(), tp));
      AddAttentionGemms(m, T, tp, &w);
      AddMlpGemms(m.mlp, T, h, double(m.ffn) / tp, 1, &w);
      const double elems = AttentionElementwisePerToken(m) +
                           MlpActElementsPerToken(m.mlp, m.ffn);
      w.fwd_bytes = T * kB16 * elems / tp;
      act_bytes = T * (AttentionActivationBytesPerToken(m) +
                       DenseMlpActivationBytesPerToken(m)) / tp;
      act_bytes += AddAttentionCore(&w);
      // Sequence parallel: attention and MLP each all-gather their input
      // and reduce-scatter their output; the backward mirrors it.
      comm_ms = 8 * RingCollectiveMs(S_AGRS, tp, gpu, p);
      break;
    }
    case LayerKind::kMoeAttention: {
      params = double(
          CeilDiv(m.AttentionParams() + m.RouterAndSharedParams(), tp));
      const double E = m.moe.num_experts;
      const double n_shared = m.moe.shared_experts;
      AddAttentionGemms(m, T, tp, &w);
      const double core_act = AddAttentionCore(&w);
      // Router on this rank's sequence-parallel share of the tokens.
      w.gemms.push_back({T / tp, E, h});
      if (n_shared > 0)
        AddMlpGemms(MlpKind::kSwiGlu, T, h, n_shared * shared_ffn / tp, 1, &w);
      const double elems =
          AttentionElementwisePerToken(m) +
          MlpActElementsPerToken(MlpKind::kSwiGlu, n_shared * shared_ffn);
      w.fwd_bytes = T * (kB16 * elems + kRouterBytesPerTokenExpert * E) / tp;
      double act = AttentionActivationBytesPerToken(m) + kB16 * h  // MLP in
                   + 8.0 * E                                       // router
                   + kB16 * 3 * n_shared * shared_ffn;             // shared
      act_bytes = T * act / tp + core_act;
      comm_ms = (n_shared > 0 ? 8 : 4) * RingCollectiveMs(S_AGRS, tp, gpu, p);
      break;
    }
    case LayerKind::kMoeExperts: {
      const int etp = tp;
      params = double(m.moe.num_experts) * double(m.ExpertParams()) / etp;
      const double E = m.moe.num_experts;
      const double pairs = T * m.moe.top_k;
      const double fe_t = double(m.moe.expert_ffn) / etp;
      // Uniform routing: each expert sees pairs / E rows.
      AddMlpGemms(MlpKind::kSwiGlu, pairs / E, h, fe_t, E, &w);
      // Permute + unpermute copies (read + write h each) and the SwiGLU.
      w.fwd_bytes = pairs * kB16 * (4 * h + 3 * fe_t);
      // Permuted input, expert output (for the weighted combine), routing
      // probability (fp32), SwiGLU intermediates sliced by ETP.
      act_bytes = pairs * (2 * kB16 * h + 4.0 + kB16 * 3 * fe_t);
      // ETP: all-gather before and reduce-scatter after the experts, forward
      // and backward, of the full token-expert pairs.
      comm_ms = 4 * RingCollectiveMs(pairs * h * kB16, etp, gpu, p);
      break;
    }
    case LayerKind::kEmbedding: {
      const double vocab_t = double(CeilDiv(m.vocab, tp));
      params = vocab_t * h;
      // Gather the rows of this rank's vocabulary shard, write the full
      // (masked) output that the reduce-scatter then sums.
      w.fwd_bytes = T * h * kB16 * 2;
      w.bwd_bytes = vocab_t * h * kEmbeddingBwdBytesPerTableElement +
                    T * h * kB16 * 2;
      act_bytes = T * 8.0;  // int64 token ids
      comm_ms = 2 * RingCollectiveMs(S_AGRS, tp, gpu, p);
      LayerWork only = w;
      // No GEMMs; grad accumulation already counted in bwd_bytes.
      LayerTime t = EstimateLayerTime(only, p, gpu.peak_bf16_tflops,
                                      p.gemm_eff_max, gpu.hbm_gbps, tp);
      e.fwd_ms = t.fwd_ms;
      e.bwd_ms = t.bwd_ms;
      e.tp_comm_ms = comm_ms;
      e.activation_bytes = static_cast<int64_t>(act_bytes);
      e.param_count = static_cast<int64_t>(params);
      return e;
    }
    case LayerKind::kLmHead: {
      const double vocab_t = double(CeilDiv(m.vocab, tp));
      params = double(CeilDiv(m.LmHeadParams(), tp));
      w.gemms.push_back({T, vocab_t, h});
      const double logits = T * vocab_t;
      w.fwd_bytes = T * kB16 * 2 * h / tp +  // final norm (sequence parallel)
                    logits * kCrossEntropyFwdBytesPerLogit;
      w.bwd_bytes = logits * kCrossEntropyBwdBytesPerLogit;
      // Norm input and projection input (sharded by SP, re-gathered in the
      // backward), fp32 logits / softmax and their 16-bit copy.
      act_bytes = T * 2 * kB16 * h / tp + logits * (4.0 + kB16);
      // All-gather of the norm output (fwd), reduce-scatter of its gradient
      // (bwd), and three small all-reduces in the vocab-parallel loss.
      comm_ms = 2 * RingCollectiveMs(S_AGRS, tp, gpu, p) +
                3 * 2 * RingCollectiveMs(T * 4.0, tp, gpu, p);
      break;
    }
  }
  w.bwd_bytes += p.bwd_elementwise_ratio * w.fwd_bytes +
                 params * p.grad_accum_bytes_per_param;
  const LayerTime t = EstimateLayerTime(w, p, gpu.peak_bf16_tflops,
                                        p.gemm_eff_max, gpu.hbm_gbps, tp);
  e.fwd_ms = t.fwd_ms;
  e.bwd_ms = t.bwd_ms;
  e.attention_fwd_ms = t.attention_fwd_ms;
  e.attention_bwd_ms = t.attention_bwd_ms;
  e.tp_comm_ms = comm_ms;
  e.activation_bytes = static_cast<int64_t>(std::llround(act_bytes));
  e.param_count = static_cast<int64_t>(std::llround(params));
  return e;
}

int ProfileSynthesizer::Fill(const ModelSpec& model, const GpuType& gpu,
                             absl::Span<const int> tps,
                             absl::Span<const int> mbss, int seq,
                             ProfileStore* store) const {
  int added = 0;
  for (LayerKind kind : KindsOf(model)) {
    for (int tp : tps) {
      for (int mbs : mbss) {
        absl::StatusOr<ProfileEntry> e =
            Synthesize(model, kind, gpu, tp, mbs, seq);
        if (!e.ok()) continue;
        if (store->AddIfAbsent(*std::move(e))) ++added;
      }
    }
  }
  return added;
}

}  // namespace arachne
