// Analytical per-layer profiles: a roofline with efficiency curves, fitted to
// published per-layer measurements (see calibration/synthesizer_fit.h,
// docs/calibration.md).
//
// A synthesized ProfileEntry has exactly the semantics of profile_store.h:
// costs of ONE layer of a kind on ONE GPU of a TP group, for ONE micro-batch
// of `mbs` sequences of `seq` tokens, 16-bit precision, no recomputation.
//
//   time = sum over GEMMs  (flops_i + gemm_half_gflop*1e9)
//                          * (1 + tp_loss_per_degree*(tp-1)) / (peak*eff_max)
//        + fused attention flops / (peak * eff_max * attn_eff_rel)
//        + memory-bound bytes / (hbm * mem_eff)
//        + layer_overhead_us
//
// The GEMM term is the efficiency curve eff(w) = eff_max * w / (w + w_half)
// (w = FLOPs of that GEMM on this GPU) written as a time. Backward runs two
// GEMMs (dgrad, wgrad) per forward GEMM at efficiency eff * bwd_eff_rel,
// fused (flash) attention backward is 2.5x its forward FLOPs, memory-bound
// traffic is bwd_elementwise_ratio x the forward one plus the gradient
// accumulation, and the fixed overhead doubles.
#ifndef ARACHNE_PLANNER_SERVICE_CORE_COST_PROFILE_SYNTHESIZER_H_
#define ARACHNE_PLANNER_SERVICE_CORE_COST_PROFILE_SYNTHESIZER_H_

#include <cstdint>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/types/span.h"
#include "planner_service/core/model/gpu_catalog.h"
#include "planner_service/core/model/model.h"
#include "planner_service/core/cost/profile_store.h"

namespace arachne {

// Every constant of the synthesizer. The first group is fitted per GPU type
// by Calibrate() (calibration/synthesizer_fit.h); the second keeps its
// default (the Cephalo data has no tensor parallelism and no communication).
struct CalibrationParams {
  // --- Fitted ---------------------------------------------------------------
  // Fraction of peak_bf16_tflops a large 16-bit GEMM reaches.
  double gemm_eff_max = 0.75;
  // GEMM size (GFLOP on this GPU) at which the efficiency is half of
  // gemm_eff_max: the small-GEMM (small batch) inefficiency.
  double gemm_half_gflop = 1.0;
  // Fraction of peak_fp32_tflops a large plain-FP32 GEMM reaches. Only used
  // to fit the FP32 rows of the calibration data (profiles are 16-bit).
  double fp32_gemm_eff_max = 0.8;
  // Efficiency of fused (flash / memory-efficient) attention FLOPs relative
  // to gemm_eff_max.
  double attn_eff_rel = 0.6;
  // Fraction of hbm_gbps reached by element-wise / norm / softmax kernels.
  double mem_eff = 0.7;
  // Backward GEMM and attention efficiency relative to forward.
  double bwd_eff_rel = 0.9;
  // Fixed kernel time per layer and forward pass (tails, tiny kernels), us;
  // the backward pays twice this.
  double layer_overhead_us = 20;

  // --- Not fitted (defaults) --------------------------------------------------
  // Extra GEMM time per TP degree beyond 1 (skinnier sliced GEMMs, SP
  // gather/scatter copies): GEMM time x (1 + tp_loss_per_degree*(tp-1)).
  double tp_loss_per_degree = 0.03;
  // Memory-bound traffic of the backward relative to the forward.
  double bwd_elementwise_ratio = 2.0;
  // HBM bytes per parameter per backward for the gradient accumulation
  // (Megatron gradient_accumulation_fusion: fp32 main_grad read + write).
  double grad_accum_bytes_per_param = 8;
  // Achieved fraction of intra_node_gbps by ring all-gather/reduce-scatter
  // (8xA100 NVSwitch all-reduce bus bandwidth 200-232 of 300 GB/s, PCIe4
  // about 24 of 32: nccl-tests all-reduce figures from nccl / nccl-tests
  // issues).
  double comm_bw_eff = 0.75;
  // NCCL tuning-model latencies (NCCL src/graph/tuning.cc, older release):
  // per collective base, and per ring step over NVLink / PCIe.
  double collective_base_us = 8.4;
  double nvlink_step_us = 3.4;
  double pcie_step_us = 5.7;

  friend bool operator==(const CalibrationParams&,
                         const CalibrationParams&) = default;
};

// --- Low-level workload description (shared with the calibration) ---------

// One GEMM of the forward pass on this GPU: [m x k] x [k x n], `count` times.
struct GemmShape {
  double m = 0, n = 0, k = 0;
  double count = 1;
  double flops() const { return 2.0 * m * n * k * count; }
};

// Work of one layer for one micro-batch on one GPU.
struct LayerWork {
  std::vector<GemmShape> gemms;     // forward GEMMs (backward: 2 each)
  double fused_attn_fwd_flops = 0;  // flash/memory-efficient attention core
  double fused_attn_bwd_flops = 0;
  double fwd_bytes = 0;             // memory-bound HBM traffic, forward
  double bwd_bytes = 0;             // memory-bound HBM traffic, backward
};

struct LayerTime {
  double fwd_ms = 0;
  double bwd_ms = 0;
  // Of fwd_ms / bwd_ms: the fused (flash) attention kernel.
  double attention_fwd_ms = 0;
  double attention_bwd_ms = 0;
};

// Applies the roofline above. `peak_tflops` and `gemm_eff_max` are those of
// the precision in use (16-bit: peak_bf16_tflops / params.gemm_eff_max).
LayerTime EstimateLayerTime(const LayerWork& work, const CalibrationParams& p,
                            double peak_tflops, double gemm_eff_max,
                            double hbm_gbps, int tp);

// Time of one ring all-gather or reduce-scatter of `bytes` (the full,
// unsharded size) over `n` GPUs of `gpu`'s node link, in ms; 0 when n == 1:
// base + (n-1) * (step + bytes / (n * B * comm_bw_eff)).
double RingCollectiveMs(double bytes, int n, const GpuType& gpu,
                        const CalibrationParams& p);

// --- The synthesizer --------------------------------------------------------

// The kernels a framework runs the layers with (framework.h); the entries
// of the default (flash attention, sequence parallel) are those of the
// calibration above.
struct SynthesisKernels {
  bool flash_attention = true;
  // FlashAttention-2 generation (AttentionKernel::kFlash2): on Hopper its
  // attention efficiency is kFlash2OnHopperAttentionFactor of the one
  // calibrated.
  bool flash2 = false;
  bool attention_dropout = false;  // materialized attention only
  bool sequence_parallel = true;
};
SynthesisKernels KernelsOf(const FrameworkConfig& framework);

// FlashAttention-2 on Hopper, as a factor on CalibrationParams::attn_eff_rel
// (docs/cost-model.md "Frameworks"). FlashAttention-2 reaches 35% of
// H100's dense peak (Shah et al. 2024, FlashAttention-3, arXiv 2407.08608)
// against 50-73% of A100's (Dao 2023, FlashAttention-2, arXiv 2307.08691;
// midpoint 61.5%): on Hopper its share of peak is 0.35 / 0.615 of the one
// on Ampere. The Hopper entries of profiles/calibration.json keep the
// Ampere ratio of attention to GEMM efficiency (attn_eff_rel) instead, while
// their GEMMs reach 0.694 / 0.784 of the Ampere share (H100-80GB's derived
// gemm_eff_max against the mean of the two fitted A100s'); the factor is the
// first ratio over the second: 0.643.
inline constexpr double kFlash2OnHopperAttentionFactor =
    (0.35 / 0.615) / (0.694 / 0.784);

class ProfileSynthesizer {
 public:
  explicit ProfileSynthesizer(CalibrationParams params = {},
                              SynthesisKernels kernels = {})
      : params_(params), kernels_(kernels) {}

  const CalibrationParams& params() const { return params_; }
  const SynthesisKernels& kernels() const { return kernels_; }

  // One entry (source kSynthesized, key.model = profile_name or name).
  // InvalidArgument naming the field when mbs/seq/tp <= 0, when tp does not
  // divide num_heads, num_kv_heads (GQA) or ffn (dense, shared experts), when
  // tp (ETP) does not divide moe.expert_ffn for kMoeExperts, or when the
  // model lacks the kind (kMoe* on a dense model, kDense on a MoE model
  // without dense_first_layers). The vocabulary is padded to a multiple of
  // tp (as Megatron does), so it need not divide.
  absl::StatusOr<ProfileEntry> Synthesize(const ModelSpec& model,
                                          LayerKind kind, const GpuType& gpu,
                                          int tp, int mbs, int seq) const;

  // Adds (AddIfAbsent, so measured entries win) every layer kind the model
  // has for every (tp, mbs) at `seq`. Combinations Synthesize rejects (e.g.
  // tp not dividing the heads) are skipped. Returns the number added.
  int Fill(const ModelSpec& model, const GpuType& gpu,
           absl::Span<const int> tps, absl::Span<const int> mbss, int seq,
           ProfileStore* store) const;

  // The layer kinds `model` is made of.
  static std::vector<LayerKind> KindsOf(const ModelSpec& model);

 private:
  CalibrationParams params_;
  SynthesisKernels kernels_;
};

// Activation bytes stored for backward per GPU (16-bit, TP + sequence
// parallel, flash attention), per token of the micro-batch BEFORE dividing
// by tp, for the attention + norms part and the MLP part of a block; see
// docs/calibration.md "Activation memory". Exposed for tests and docs.
double AttentionActivationBytesPerToken(const ModelSpec& m);
double DenseMlpActivationBytesPerToken(const ModelSpec& m);

}  // namespace arachne

#endif  // ARACHNE_PLANNER_SERVICE_CORE_COST_PROFILE_SYNTHESIZER_H_
