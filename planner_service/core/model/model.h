// Model architecture and training configuration: what is trained, and the
// arithmetic derived from it (parameter counts, FLOPs, layer kinds). Catalog
// entries live in profiles/models.yaml; Hugging Face config.json import is in
// planner_service/io.
#ifndef ARACHNE_PLANNER_SERVICE_CORE_MODEL_MODEL_H_
#define ARACHNE_PLANNER_SERVICE_CORE_MODEL_MODEL_H_

#include <cstdint>
#include <string>
#include "absl/strings/string_view.h"
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "planner_service/core/model/framework.h"

namespace arachne {

enum class MlpKind { kSwiGlu, kGelu };
enum class AttentionKind { kGqa, kMla };
enum class Precision { kBf16, kFp16 };
enum class Recompute { kNone, kSelective, kFull };

absl::string_view MlpKindName(MlpKind k);
absl::string_view PrecisionName(Precision p);
absl::string_view RecomputeName(Recompute r);
absl::StatusOr<Precision> ParsePrecision(absl::string_view s);
absl::StatusOr<Recompute> ParseRecompute(absl::string_view s);

// Mixture-of-experts part of a model. num_experts == 0 means dense.
struct MoeSpec {
  int num_experts = 0;
  int top_k = 0;
  int expert_ffn = 0;          // FFN width of one routed expert
  int shared_experts = 0;      // always-active experts per MoE layer
  int shared_expert_ffn = 0;   // width of one shared expert (0: expert_ffn)
  int dense_first_layers = 0;  // leading layers that are dense, not MoE
};

// Multi-head latent attention (DeepSeek-V2/V3) dimensions.
struct MlaSpec {
  int q_lora_rank = 0;  // 0: queries are projected directly
  int kv_lora_rank = 0;
  int qk_nope_head_dim = 0;
  int qk_rope_head_dim = 0;
  int v_head_dim = 0;
};

// The kinds of repeated layer a model is made of. Profiles hold one entry per
// kind, so a model needs at most a handful of profile series.
enum class LayerKind {
  kDense,          // attention + dense MLP block
  kMoeAttention,   // attention + router + shared experts of a MoE block
  kMoeExperts,     // routed experts of a MoE block (tiled EP x ETP x EDP)
  kEmbedding,      // token embedding (first stage)
  kLmHead,         // final norm + output projection + loss (last stage)
};
inline constexpr int kNumLayerKinds = 5;
absl::string_view LayerKindName(LayerKind k);
absl::StatusOr<LayerKind> ParseLayerKind(absl::string_view s);

struct ModelSpec {
  std::string name;          // catalog id, e.g. "llama3-8b"
  std::string architecture;  // Hugging Face class, e.g. "LlamaForCausalLM"
  std::string profile_name;  // model whose profiles it uses (default: name)
  std::string policy_relative;  // declared close relative (for policies)
  int num_layers = 0;
  int hidden = 0;
  int num_heads = 0;
  int num_kv_heads = 0;
  int head_dim = 0;
  int ffn = 0;  // dense MLP width (dense layers of a MoE model too)
  int64_t vocab = 0;
  MlpKind mlp = MlpKind::kSwiGlu;
  AttentionKind attention = AttentionKind::kGqa;
  bool tied_embeddings = false;
  MoeSpec moe;
  MlaSpec mla;

  bool is_moe() const { return moe.num_experts > 0; }
  // True when layer `i` (0-based) is a MoE block.
  bool IsMoeLayer(int i) const {
    return is_moe() && i >= moe.dense_first_layers;
  }
  // Number of MoE layers in [begin, end).
  int MoeLayersIn(int begin, int end) const;

  // Parameter counts (elements), unsharded.
  int64_t AttentionParams() const;  // incl. norms
  int64_t DenseMlpParams() const;
  int64_t DenseLayerParams() const { return AttentionParams() + DenseMlpParams(); }
  int64_t RouterAndSharedParams() const;  // router + shared experts
  int64_t ExpertParams() const;           // one routed expert
  int64_t EmbeddingParams() const { return vocab * hidden; }
  int64_t LmHeadParams() const;  // final norm + output projection (0 if tied)
  int64_t TotalParams() const;
  // Parameters a token activates (dense + top_k experts), for FLOPs.
  int64_t ActiveParams() const;

  // Training FLOPs per token of one layer `i` (forward + backward, no
  // recompute): 6 * active matmul params + attention score/value FLOPs.
  double LayerTrainFlopsPerToken(int layer, int seq_len) const;
  // Whole model, incl. LM head: Megatron's num_floating_point_operations
  // divided by tokens (see docs/cost-model.md).
  double ModelTrainFlopsPerToken(int seq_len) const;

  // InvalidArgument naming the field when a dimension is missing or
  // inconsistent (e.g. heads not divisible by kv heads).
  absl::Status Validate() const;
};

struct TrainingConfig {
  int seq_len = 2048;
  int global_batch = 2048;  // sequences per iteration
  Precision precision = Precision::kBf16;
  Recompute recompute = Recompute::kNone;
  // Megatron's --use-distributed-optimizer: the optimizer state is sharded
  // over the data-parallel group whatever framework.sharding says.
  bool distributed_optimizer = false;
  // How the framework runs a step (kernels, state bytes, overlap, fixed
  // costs, allocator): see framework.h.
  FrameworkConfig framework;

  // framework.sharding, raised to kOptimizer by distributed_optimizer.
  StateSharding EffectiveSharding() const;

  absl::Status Validate() const;
};

}  // namespace arachne

#endif  // ARACHNE_PLANNER_SERVICE_CORE_MODEL_MODEL_H_
