#include "planner_service/core/model/model.h"

#include "absl/strings/ascii.h"
#include "absl/strings/str_cat.h"

namespace arachne {

absl::string_view MlpKindName(MlpKind k) {
  return k == MlpKind::kSwiGlu ? "swiglu" : "gelu";
}
absl::string_view PrecisionName(Precision p) {
  return p == Precision::kBf16 ? "bf16" : "fp16";
}
absl::string_view RecomputeName(Recompute r) {
  switch (r) {
    case Recompute::kNone:
      return "none";
    case Recompute::kSelective:
      return "selective";
    case Recompute::kFull:
      return "full";
  }
  return "none";
}

absl::StatusOr<Precision> ParsePrecision(absl::string_view s) {
  std::string v = absl::AsciiStrToLower(s);
  if (v == "bf16" || v == "bfloat16") return Precision::kBf16;
  if (v == "fp16" || v == "float16") return Precision::kFp16;
  return absl::InvalidArgumentError(
      absl::StrCat("precision: expected bf16 or fp16, got \"", s, "\""));
}

absl::StatusOr<Recompute> ParseRecompute(absl::string_view s) {
  std::string v = absl::AsciiStrToLower(s);
  if (v == "none") return Recompute::kNone;
  if (v == "selective") return Recompute::kSelective;
  if (v == "full") return Recompute::kFull;
  return absl::InvalidArgumentError(absl::StrCat(
      "recompute: expected none, selective or full, got \"", s, "\""));
}

absl::string_view LayerKindName(LayerKind k) {
  switch (k) {
    case LayerKind::kDense:
      return "dense";
    case LayerKind::kMoeAttention:
      return "moe_attention";
    case LayerKind::kMoeExperts:
      return "moe_experts";
    case LayerKind::kEmbedding:
      return "embedding";
    case LayerKind::kLmHead:
      return "lm_head";
  }
  return "dense";
}

absl::StatusOr<LayerKind> ParseLayerKind(absl::string_view s) {
  for (LayerKind k : {LayerKind::kDense, LayerKind::kMoeAttention,
                      LayerKind::kMoeExperts, LayerKind::kEmbedding,
                      LayerKind::kLmHead}) {
    if (s == LayerKindName(k)) return k;
  }
  return absl::InvalidArgumentError(absl::StrCat(
      "layer_kind: expected dense, moe_attention, moe_experts, embedding or "
      "lm_head, got \"",
      s, "\""));
}

int ModelSpec::MoeLayersIn(int begin, int end) const {
  if (!is_moe()) return 0;
  int first = std::max(begin, moe.dense_first_layers);
  return std::max(0, end - first);
}

int64_t ModelSpec::AttentionParams() const {
  const int64_t h = hidden;
  int64_t p = 0;
  if (attention == AttentionKind::kMla) {
    const int64_t qk = mla.qk_nope_head_dim + mla.qk_rope_head_dim;
    if (mla.q_lora_rank > 0) {
      p += h * mla.q_lora_rank + mla.q_lora_rank +
           int64_t{mla.q_lora_rank} * num_heads * qk;
    } else {
      p += h * num_heads * qk;
    }
    p += h * (mla.kv_lora_rank + mla.qk_rope_head_dim) + mla.kv_lora_rank +
         int64_t{mla.kv_lora_rank} * num_heads *
             (mla.qk_nope_head_dim + mla.v_head_dim);
    p += int64_t{num_heads} * mla.v_head_dim * h;
  } else {
    const int64_t q = int64_t{num_heads} * head_dim;
    const int64_t kv = int64_t{num_kv_heads} * head_dim;
    p += h * (q + 2 * kv) + q * h;
    if (mlp == MlpKind::kGelu) p += q + 2 * kv + h;  // GPT-style biases
  }
  // Two norms per block (LayerNorm carries a bias too).
  p += (mlp == MlpKind::kGelu ? 4 : 2) * h;
  return p;
}

int64_t ModelSpec::DenseMlpParams() const {
  const int64_t h = hidden;
  if (mlp == MlpKind::kSwiGlu) return 3 * h * ffn;
  return 2 * h * ffn + ffn + h;  // up/down with biases
}

int64_t ModelSpec::RouterAndSharedParams() const {
  if (!is_moe()) return 0;
  const int64_t h = hidden;
  const int64_t shared_ffn =
      moe.shared_expert_ffn > 0 ? moe.shared_expert_ffn : moe.expert_ffn;
  return h * moe.num_experts + int64_t{moe.shared_experts} * 3 * h * shared_ffn;
}

int64_t ModelSpec::ExpertParams() const {
  return 3 * int64_t{hidden} * moe.expert_ffn;
}

int64_t ModelSpec::LmHeadParams() const {
  return hidden + (tied_embeddings ? 0 : vocab * hidden);
}

int64_t ModelSpec::TotalParams() const {
  const int moe_layers = MoeLayersIn(0, num_layers);
  const int dense_layers = num_layers - moe_layers;
  int64_t p = EmbeddingParams() + LmHeadParams();
  p += dense_layers * DenseLayerParams();
  p += moe_layers * (AttentionParams() + RouterAndSharedParams() +
                     int64_t{moe.num_experts} * ExpertParams());
  return p;
}

int64_t ModelSpec::ActiveParams() const {
  const int moe_layers = MoeLayersIn(0, num_layers);
  const int dense_layers = num_layers - moe_layers;
  int64_t p = EmbeddingParams() + LmHeadParams();
  p += dense_layers * DenseLayerParams();
  p += moe_layers * (AttentionParams() + RouterAndSharedParams() +
                     int64_t{moe.top_k} * ExpertParams());
  return p;
}

double ModelSpec::LayerTrainFlopsPerToken(int layer, int seq_len) const {
  double matmul = static_cast<double>(AttentionParams());
  if (IsMoeLayer(layer)) {
    matmul += static_cast<double>(RouterAndSharedParams()) +
              static_cast<double>(moe.top_k) * ExpertParams();
  } else {
    matmul += static_cast<double>(DenseMlpParams());
  }
  // Scores (QK^T) and values (AV): 2 FLOPs per multiply-add, full s x s as
  // Megatron counts it; x3 for forward + backward.
  double qk_dim, v_dim;
  if (attention == AttentionKind::kMla) {
    qk_dim = mla.qk_nope_head_dim + mla.qk_rope_head_dim;
    v_dim = mla.v_head_dim;
  } else {
    qk_dim = v_dim = head_dim;
  }
  const double attn = 2.0 * seq_len * num_heads * (qk_dim + v_dim);
  return 6.0 * matmul + 3.0 * attn;
}

double ModelSpec::ModelTrainFlopsPerToken(int seq_len) const {
  double f = 6.0 * static_cast<double>(vocab) * hidden;  // logits
  for (int i = 0; i < num_layers; ++i) f += LayerTrainFlopsPerToken(i, seq_len);
  return f;
}

absl::Status ModelSpec::Validate() const {
  auto bad = [&](absl::string_view field, int64_t v, absl::string_view want) {
    return absl::InvalidArgumentError(absl::StrCat(
        "model ", name, ": ", field, " ", want, ", got ", v));
  };
  if (num_layers <= 0) return bad("num_layers", num_layers, "must be > 0");
  if (hidden <= 0) return bad("hidden", hidden, "must be > 0");
  if (num_heads <= 0) return bad("num_heads", num_heads, "must be > 0");
  if (vocab <= 0) return bad("vocab", vocab, "must be > 0");
  if (attention == AttentionKind::kGqa) {
    if (num_kv_heads <= 0)
      return bad("num_kv_heads", num_kv_heads, "must be > 0");
    if (num_heads % num_kv_heads != 0)
      return bad("num_kv_heads", num_kv_heads,
                 absl::StrCat("must divide num_heads (", num_heads, ")"));
    if (head_dim <= 0) return bad("head_dim", head_dim, "must be > 0");
  } else {
    if (mla.kv_lora_rank <= 0)
      return bad("mla.kv_lora_rank", mla.kv_lora_rank, "must be > 0");
    if (mla.qk_nope_head_dim + mla.qk_rope_head_dim <= 0)
      return bad("mla.qk_nope_head_dim", mla.qk_nope_head_dim, "must be > 0");
    if (mla.v_head_dim <= 0)
      return bad("mla.v_head_dim", mla.v_head_dim, "must be > 0");
  }
  const bool has_dense_layers =
      !is_moe() || moe.dense_first_layers > 0;
  if (has_dense_layers && ffn <= 0) return bad("ffn", ffn, "must be > 0");
  if (moe.num_experts < 0)
    return bad("moe.num_experts", moe.num_experts, "must be >= 0");
  if (is_moe()) {
    if (moe.top_k <= 0 || moe.top_k > moe.num_experts)
      return bad("moe.top_k", moe.top_k,
                 absl::StrCat("must be in [1, num_experts=", moe.num_experts,
                              "]"));
    if (moe.expert_ffn <= 0)
      return bad("moe.expert_ffn", moe.expert_ffn, "must be > 0");
    if (moe.shared_experts < 0)
      return bad("moe.shared_experts", moe.shared_experts, "must be >= 0");
    if (moe.dense_first_layers < 0 || moe.dense_first_layers >= num_layers)
      return bad("moe.dense_first_layers", moe.dense_first_layers,
                 absl::StrCat("must be in [0, num_layers=", num_layers, ")"));
  }
  return absl::OkStatus();
}

absl::Status TrainingConfig::Validate() const {
  if (seq_len <= 0)
    return absl::InvalidArgumentError(
        absl::StrCat("seq_len: must be > 0, got ", seq_len));
  if (global_batch <= 0)
    return absl::InvalidArgumentError(
        absl::StrCat("global_batch: must be > 0, got ", global_batch));
  return framework.Validate();
}

StateSharding TrainingConfig::EffectiveSharding() const {
  if (distributed_optimizer && framework.sharding == StateSharding::kNone)
    return StateSharding::kOptimizer;
  return framework.sharding;
}

}  // namespace arachne
