// The training framework as the cost model sees it: which kernels the layers
// run (attention, sequence parallelism), how many bytes of state each
// parameter costs and how it is sharded, which collectives overlap compute,
// the fixed costs per micro-batch and per iteration, and what the allocator
// adds on top of the tensors. A preset fills every field; files, flags and
// the API may override any of them by name (SetFrameworkField).
//
// Each preset's values and their sources are in docs/cost-model.md,
// "Frameworks". The defaults of this struct are the megatron-core preset.
#ifndef ARACHNE_PLANNER_SERVICE_CORE_MODEL_FRAMEWORK_H_
#define ARACHNE_PLANNER_SERVICE_CORE_MODEL_FRAMEWORK_H_

#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"

namespace arachne {

enum class FrameworkPreset {
  kMegatronCore,       // Megatron-LM / Megatron-Core (Transformer Engine)
  kMegatronDeepSpeed,  // Megatron-DeepSpeed (DeepSpeed fp16 engine, ZeRO-1)
  kDeepSpeedZero1,     // DeepSpeed ZeRO stage 1 on a Megatron-style model
  kFsdp,               // PyTorch FSDP, full sharding (ZeRO-3)
  kArachneReference,   // Arachne's reference engine (worker_agent/engine)
};
inline constexpr FrameworkPreset kAllFrameworkPresets[] = {
    FrameworkPreset::kMegatronCore, FrameworkPreset::kMegatronDeepSpeed,
    FrameworkPreset::kDeepSpeedZero1, FrameworkPreset::kFsdp,
    FrameworkPreset::kArachneReference};

absl::string_view FrameworkPresetName(FrameworkPreset p);
// InvalidArgument listing the presets when `name` is none of them.
absl::StatusOr<FrameworkPreset> ParseFrameworkPreset(absl::string_view name);

enum class AttentionKernel {
  // Fused attention built for the GPU's generation (no s x s tensor in HBM):
  // FlashAttention-3 or cuDNN fused attention (Transformer Engine) on
  // Hopper, FlashAttention-2 before it.
  kFlash,
  // FlashAttention-2-generation kernels on every GPU (flash-attn 2.x,
  // PyTorch SDPA's flash backend, Triton's fused attention): the same as
  // kFlash before Hopper; on Hopper they leave its asynchronous tensor cores
  // unused and run slower (profile_synthesizer.cc).
  kFlash2,
  kMaterialized,  // QK^T written to HBM, softmax (+ dropout), then x V
};
absl::string_view AttentionKernelName(AttentionKernel k);

// What is sharded over the data-parallel group (ZeRO stage numbering).
enum class StateSharding {
  kNone = 0,        // every replica holds all state
  kOptimizer = 1,   // ZeRO-1 / Megatron distributed optimizer
  kGradients = 2,   // ZeRO-2: + gradients
  kParameters = 3,  // ZeRO-3 / FSDP full shard: + parameters
};
absl::string_view StateShardingName(StateSharding s);

struct FrameworkConfig {
  FrameworkPreset preset = FrameworkPreset::kMegatronCore;

  // --- Kernels (applied to synthesized profile entries) ---------------------
  AttentionKernel attention = AttentionKernel::kFlash;
  // Dropout on the attention probabilities (materialized kernel only): its
  // mask and output are kept for the backward.
  bool attention_dropout = false;
  // Megatron sequence parallelism: norms, dropouts and residuals run on the
  // TP group's 1/t share of the tokens, and their activations are sharded.
  bool sequence_parallel = true;

  // --- State per parameter (bytes) -----------------------------------------
  double weight_bytes_per_param = 2;   // the 16-bit weights the kernels use
  // Gradient accumulation buffer. megatron-core's 2 is Megatron with
  // --grad-reduce-in-bf16; Megatron's own bf16 default is fp32 (4), see
  // docs/cost-model.md "Frameworks".
  double grad_bytes_per_param = 2;
  double optimizer_bytes_per_param = 12;  // fp32 master, Adam m and v
  // A further gradient copy the optimizer steps from (DeepSpeed's fp32
  // partition of the gradients), sharded like the optimizer state.
  double optimizer_grad_bytes_per_param = 0;
  // Bytes per parameter the data-parallel gradient reduction moves.
  double grad_reduce_bytes_per_param = 2;
  StateSharding sharding = StateSharding::kNone;

  // --- Time ------------------------------------------------------------------
  // The data-parallel gradient reduction overlaps the backward of the last
  // micro-batch (bucketed, as Megatron's --overlap-grad-reduce / DDP).
  bool overlap_grad_reduce = false;
  // Megatron's scatter/gather of the activation a pipeline stage sends
  // (Narayanan et al. 2021, section 4.1; on unless
  // --no-scatter-gather-tensors-in-pipeline): each TP rank sends its 1/t
  // slice across a node boundary and the receivers all-gather it over
  // NVLink. Off, each of the t ranks sends the whole tensor through the
  // node's NIC. Sequence parallelism shards the tensor either way.
  bool pipeline_scatter_gather = true;
  // Fraction of the TP collectives that stays on the critical path (1: none
  // overlapped; Transformer Engine's userbuffer overlap hides most).
  double tp_comm_exposed_fraction = 1.0;
  // Host-side cost per micro-batch per pipeline stage (schedule step,
  // kernel launches not hidden behind the GPU), seconds.
  double micro_batch_fixed_s = 0;
  // Per iteration (zero-grad, grad-norm, loss-scale check, logging, the
  // optimizer's launches), seconds.
  double iteration_fixed_s = 0;
  // HBM bytes per parameter the optimizer step touches.
  double optimizer_step_bytes_per_param = 30;

  // --- Memory ----------------------------------------------------------------
  // Per GPU, outside the tensors: CUDA context, cuBLAS / NCCL workspaces.
  double context_reserve_gib = 1.5;
  // Communication buckets the framework allocates (DeepSpeed's reduce and
  // all-gather buckets), GiB per GPU.
  double comm_buffer_gib = 0;
  // Caching-allocator overhead as a fraction of the allocated tensors
  // (reserved / allocated - 1).
  double fragmentation = 0;

  // InvalidArgument naming the field and value when one is out of range.
  absl::Status Validate() const;

  friend bool operator==(const FrameworkConfig&,
                         const FrameworkConfig&) = default;
};

// Every field of the preset (docs/cost-model.md "Frameworks").
FrameworkConfig FrameworkPresetConfig(FrameworkPreset preset);

// The overridable fields by name, in a stable order (the order of the struct,
// without `preset`). Times are written in ms (micro_batch_fixed_ms,
// iteration_fixed_ms), memory in GiB, booleans true/false, enums by name.
const std::vector<std::string>& FrameworkFieldNames();
// Sets field `name` from its text form. InvalidArgument naming the field and
// value when the name is unknown or the value does not parse or is out of
// range; `framework` is unchanged then.
absl::Status SetFrameworkField(FrameworkConfig& framework,
                               absl::string_view name,
                               absl::string_view value);
// The text form of field `name` (as SetFrameworkField reads it);
// InvalidArgument for an unknown name.
absl::StatusOr<std::string> FrameworkFieldValue(
    const FrameworkConfig& framework, absl::string_view name);
// The fields of `framework` that differ from its preset's, as name=value
// pairs in FrameworkFieldNames order.
std::vector<std::pair<std::string, std::string>> FrameworkOverrides(
    const FrameworkConfig& framework);

}  // namespace arachne

#endif  // ARACHNE_PLANNER_SERVICE_CORE_MODEL_FRAMEWORK_H_
