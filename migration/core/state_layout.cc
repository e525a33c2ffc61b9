#include "migration/core/state_layout.h"

#include <algorithm>
#include <utility>

#include "absl/container/flat_hash_set.h"
#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "glog/logging.h"

namespace arachne::migration {

absl::string_view StateKindName(StateKind k) {
  switch (k) {
    case StateKind::kWeight:
      return "weight";
    case StateKind::kMasterWeight:
      return "master";
    case StateKind::kAdamM:
      return "adam_m";
    case StateKind::kAdamV:
      return "adam_v";
    case StateKind::kScalars:
      return "scalars";
  }
  return "?";
}

absl::StatusOr<StateKind> StateKindFromName(absl::string_view name,
                                            absl::string_view field) {
  for (int k = 0; k < kNumStateKinds; ++k) {
    if (StateKindName(static_cast<StateKind>(k)) == name) {
      return static_cast<StateKind>(k);
    }
  }
  return absl::InvalidArgumentError(absl::StrCat(
      field, ": must be weight, master, adam_m, adam_v or scalars, got \"",
      name.substr(0, 64), "\""));
}

absl::string_view TpSplitName(TpSplit s) {
  switch (s) {
    case TpSplit::kReplicated:
      return "replicated";
    case TpSplit::kColumn:
      return "column";
    case TpSplit::kRow:
      return "row";
  }
  return "?";
}

absl::StatusOr<TpSplit> TpSplitFromName(absl::string_view name,
                                        absl::string_view field) {
  for (TpSplit s : {TpSplit::kReplicated, TpSplit::kColumn, TpSplit::kRow}) {
    if (TpSplitName(s) == name) return s;
  }
  return absl::InvalidArgumentError(
      absl::StrCat(field, ": must be replicated, column or row, got \"",
                   name.substr(0, 64), "\""));
}

int BytesPerElement(StateKind k) {
  switch (k) {
    case StateKind::kWeight:
      return 2;
    case StateKind::kScalars:
      return 8;
    default:
      return 4;
  }
}

ByteRange Intersect(const ByteRange& a, const ByteRange& b) {
  ByteRange r{std::max(a.begin, b.begin), std::min(a.end, b.end)};
  if (r.end < r.begin) r.end = r.begin;
  return r;
}

int64_t TensorSpec::elements() const {
  int64_t n = 1;
  for (int64_t d : shape) n *= d;
  return n;
}

ByteRange TensorSpec::ShardRange(int rank, int degree) const {
  CHECK_GE(rank, 0);
  CHECK_LT(rank, degree);
  if (split == TpSplit::kReplicated || degree == 1) return {0, bytes()};
  const int dim = split == TpSplit::kColumn ? 0 : 1;
  CHECK_LT(dim, static_cast<int>(shape.size())) << name;
  const int64_t rows = shape[dim];
  const int64_t row_bytes = bytes() / rows;  // the other dims, in bytes
  return {rows * rank / degree * row_bytes,
          rows * (rank + 1) / degree * row_bytes};
}

namespace {

// Adds the four state tensors of one parameter.
class TensorLister {
 public:
  explicit TensorLister(std::vector<TensorSpec>* out) : out_(out) {}
  void Add(const std::string& name, int layer, int expert,
           std::vector<int64_t> shape, TpSplit split) {
    for (StateKind k : {StateKind::kWeight, StateKind::kMasterWeight,
                        StateKind::kAdamM, StateKind::kAdamV}) {
      out_->push_back(TensorSpec{.name = absl::StrCat(name, ":",
                                                      StateKindName(k)),
                                 .kind = k,
                                 .layer = layer,
                                 .expert = expert,
                                 .shape = shape,
                                 .split = split});
    }
  }

 private:
  std::vector<TensorSpec>* out_;
};

void AddAttention(const ModelSpec& m, int layer, TensorLister& add) {
  const std::string p = absl::StrCat("layers.", layer, ".");
  const int64_t h = m.hidden;
  const bool gelu = m.mlp == MlpKind::kGelu;
  add.Add(p + "input_norm.weight", layer, -1, {h}, TpSplit::kReplicated);
  if (gelu) add.Add(p + "input_norm.bias", layer, -1, {h}, TpSplit::kReplicated);
  if (m.attention == AttentionKind::kMla) {
    const MlaSpec& a = m.mla;
    const int64_t qk = a.qk_nope_head_dim + a.qk_rope_head_dim;
    if (a.q_lora_rank > 0) {
      add.Add(p + "attn.q_a.weight", layer, -1, {a.q_lora_rank, h},
              TpSplit::kReplicated);
      add.Add(p + "attn.q_a_norm.weight", layer, -1, {a.q_lora_rank},
              TpSplit::kReplicated);
      add.Add(p + "attn.q_b.weight", layer, -1,
              {int64_t{m.num_heads} * qk, a.q_lora_rank}, TpSplit::kColumn);
    } else {
      add.Add(p + "attn.q.weight", layer, -1, {int64_t{m.num_heads} * qk, h},
              TpSplit::kColumn);
    }
    add.Add(p + "attn.kv_a.weight", layer, -1,
            {a.kv_lora_rank + a.qk_rope_head_dim, h}, TpSplit::kReplicated);
    add.Add(p + "attn.kv_a_norm.weight", layer, -1, {a.kv_lora_rank},
            TpSplit::kReplicated);
    add.Add(p + "attn.kv_b.weight", layer, -1,
            {int64_t{m.num_heads} * (a.qk_nope_head_dim + a.v_head_dim),
             a.kv_lora_rank},
            TpSplit::kColumn);
    add.Add(p + "attn.o.weight", layer, -1,
            {h, int64_t{m.num_heads} * a.v_head_dim}, TpSplit::kRow);
  } else {
    const int64_t q = int64_t{m.num_heads} * m.head_dim;
    const int64_t kv = int64_t{m.num_kv_heads} * m.head_dim;
    add.Add(p + "attn.q.weight", layer, -1, {q, h}, TpSplit::kColumn);
    add.Add(p + "attn.k.weight", layer, -1, {kv, h}, TpSplit::kColumn);
    add.Add(p + "attn.v.weight", layer, -1, {kv, h}, TpSplit::kColumn);
    if (gelu) {
      add.Add(p + "attn.q.bias", layer, -1, {q}, TpSplit::kColumn);
      add.Add(p + "attn.k.bias", layer, -1, {kv}, TpSplit::kColumn);
      add.Add(p + "attn.v.bias", layer, -1, {kv}, TpSplit::kColumn);
    }
    add.Add(p + "attn.o.weight", layer, -1, {h, q}, TpSplit::kRow);
    if (gelu) add.Add(p + "attn.o.bias", layer, -1, {h}, TpSplit::kReplicated);
  }
  add.Add(p + "post_norm.weight", layer, -1, {h}, TpSplit::kReplicated);
  if (gelu) add.Add(p + "post_norm.bias", layer, -1, {h}, TpSplit::kReplicated);
}

// A SwiGLU MLP of width `ffn` under `prefix` (dense MLP, shared or routed
// expert).
void AddSwiGlu(const std::string& prefix, int layer, int expert, int64_t h,
               int64_t ffn, TensorLister& add) {
  add.Add(prefix + "gate.weight", layer, expert, {ffn, h}, TpSplit::kColumn);
  add.Add(prefix + "up.weight", layer, expert, {ffn, h}, TpSplit::kColumn);
  add.Add(prefix + "down.weight", layer, expert, {h, ffn}, TpSplit::kRow);
}

}  // namespace

absl::StatusOr<ModelState> ModelState::Create(
    const ModelSpec& model, const ModelStateOptions& options) {
  if (absl::Status s = model.Validate(); !s.ok()) return s;
  if (options.training_scalars < 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("training_scalars: must be >= 0, got ",
                     options.training_scalars));
  }
  ModelState state;
  state.model_ = model;
  TensorLister add(&state.tensors_);
  const int64_t h = model.hidden;
  add.Add("embedding.weight", kEmbeddingLayer, -1, {model.vocab, h},
          TpSplit::kColumn);
  for (int l = 0; l < model.num_layers; ++l) {
    AddAttention(model, l, add);
    const std::string p = absl::StrCat("layers.", l, ".");
    if (model.IsMoeLayer(l)) {
      const MoeSpec& moe = model.moe;
      add.Add(p + "router.weight", l, -1, {moe.num_experts, h},
              TpSplit::kReplicated);
      const int64_t shared_ffn =
          moe.shared_expert_ffn > 0 ? moe.shared_expert_ffn : moe.expert_ffn;
      for (int s = 0; s < moe.shared_experts; ++s) {
        AddSwiGlu(absl::StrCat(p, "shared.", s, "."), l, -1, h, shared_ffn,
                  add);
      }
      for (int e = 0; e < moe.num_experts; ++e) {
        AddSwiGlu(absl::StrCat(p, "experts.", e, "."), l, e, h,
                  moe.expert_ffn, add);
      }
    } else if (model.mlp == MlpKind::kSwiGlu) {
      AddSwiGlu(p + "mlp.", l, -1, h, model.ffn, add);
    } else {
      add.Add(p + "mlp.fc1.weight", l, -1, {model.ffn, h}, TpSplit::kColumn);
      add.Add(p + "mlp.fc1.bias", l, -1, {model.ffn}, TpSplit::kColumn);
      add.Add(p + "mlp.fc2.weight", l, -1, {h, model.ffn}, TpSplit::kRow);
      add.Add(p + "mlp.fc2.bias", l, -1, {h}, TpSplit::kReplicated);
    }
  }
  add.Add("final_norm.weight", kHeadLayer, -1, {h}, TpSplit::kReplicated);
  if (!model.tied_embeddings) {
    add.Add("lm_head.weight", kHeadLayer, -1, {model.vocab, h},
            TpSplit::kColumn);
  }
  if (options.training_scalars > 0) {
    state.tensors_.push_back(
        TensorSpec{.name = std::string(kTrainStateTensor),
                   .kind = StateKind::kScalars,
                   .layer = kEveryGpuLayer,
                   .shape = {options.training_scalars},
                   .split = TpSplit::kReplicated});
  }
  return state;
}

absl::StatusOr<ModelState> ModelState::FromTensors(
    const ModelSpec& model, std::vector<TensorSpec> tensors) {
  if (absl::Status s = model.Validate(); !s.ok()) return s;
  if (tensors.empty() || tensors.size() > static_cast<size_t>(kMaxTensors)) {
    return absl::InvalidArgumentError(
        absl::StrCat("tensors: must list 1 to ", kMaxTensors, " tensors, got ",
                     tensors.size()));
  }
  const int experts = model.moe.num_experts;
  absl::flat_hash_set<std::string> names;
  for (size_t i = 0; i < tensors.size(); ++i) {
    const TensorSpec& t = tensors[i];
    const std::string at = absl::StrCat("tensors[", i, "]");
    if (t.name.empty() || t.name.size() > static_cast<size_t>(kMaxTensorName)) {
      return absl::InvalidArgumentError(
          absl::StrCat(at, ".name: must have 1 to ", kMaxTensorName,
                       " characters, got ", t.name.size()));
    }
    if (!names.insert(t.name).second) {
      return absl::InvalidArgumentError(absl::StrCat(
          at, ".name: \"", t.name, "\" is listed twice"));
    }
    if (t.layer < kEveryGpuLayer || t.layer >= model.num_layers) {
      return absl::InvalidArgumentError(absl::StrCat(
          at, ".layer: must be in [", kEveryGpuLayer, ", ", model.num_layers,
          ") for this model, got ", t.layer));
    }
    if (t.expert < -1 || t.expert >= std::max(experts, 0) ||
        (t.expert >= 0 && t.layer < 0)) {
      return absl::InvalidArgumentError(absl::StrCat(
          at, ".expert: must be -1, or a routed expert in [0, ", experts,
          ") of a transformer block, got ", t.expert, " (layer ", t.layer,
          ")"));
    }
    if (t.shape.empty() || t.shape.size() > 8) {
      return absl::InvalidArgumentError(absl::StrCat(
          at, ".shape: must have 1 to 8 dimensions, got ", t.shape.size()));
    }
    int64_t elements = 1;
    for (int64_t d : t.shape) {
      if (d < 1 || d > (int64_t{1} << 40) || elements > (int64_t{1} << 40) / d) {
        return absl::InvalidArgumentError(
            absl::StrCat(at, ".shape: every dimension must be >= 1 and the "
                             "tensor at most 2^40 elements, got a dimension ",
                         d));
      }
      elements *= d;
    }
    if (t.split == TpSplit::kRow && t.shape.size() != 2) {
      return absl::InvalidArgumentError(absl::StrCat(
          at, ".tp_split: row splits a 2-D [out, in] tensor, got ",
          t.shape.size(), " dimensions"));
    }
    if (t.kind == StateKind::kScalars &&
        (t.layer != kEveryGpuLayer || t.split != TpSplit::kReplicated)) {
      return absl::InvalidArgumentError(absl::StrCat(
          at, ".kind: scalars are held by every GPU (layer ", kEveryGpuLayer,
          ", replicated), got layer ", t.layer, ", ", TpSplitName(t.split)));
    }
  }
  ModelState state;
  state.model_ = model;
  state.tensors_ = std::move(tensors);
  return state;
}

int64_t ModelState::TotalParams() const {
  int64_t n = 0;
  for (const TensorSpec& t : tensors_) {
    if (t.kind == StateKind::kWeight) n += t.elements();
  }
  return n;
}

int64_t ModelState::TotalBytes() const {
  int64_t n = 0;
  for (const TensorSpec& t : tensors_) n += t.bytes();
  return n;
}

std::string GpuIdName(const GpuId& g) { return absl::StrCat(g.node, ":", g.index); }

namespace {

absl::Status CheckStructure(const ModelSpec& model, const Plan& plan,
                            const Cluster& cluster) {
  absl::flat_hash_set<std::pair<int, int>> used;
  if (plan.templates.empty()) {
    return absl::InvalidArgumentError("plan has no templates");
  }
  for (size_t ti = 0; ti < plan.templates.size(); ++ti) {
    const Template& t = plan.templates[ti];
    const std::string tw = absl::StrCat("templates[", ti, "]");
    if (t.depth() == 0) return absl::InvalidArgumentError(tw + ": no stages");
    if (t.replicas <= 0) {
      return absl::InvalidArgumentError(
          absl::StrCat(tw, ".replicas: must be > 0, got ", t.replicas));
    }
    if (static_cast<int>(t.placement.size()) != t.replicas * t.depth()) {
      return absl::InvalidArgumentError(absl::StrCat(
          tw, ".placement: ", t.placement.size(), " entries, expected ",
          t.replicas * t.depth(), " (replicas x depth)"));
    }
    int next_layer = 0;
    for (int s = 0; s < t.depth(); ++s) {
      const Stage& st = t.stages[s];
      const std::string sw = absl::StrCat(tw, ".stages[", s, "]");
      if (st.layer_begin != next_layer || st.layer_end <= st.layer_begin) {
        return absl::InvalidArgumentError(absl::StrCat(
            sw, ": layers [", st.layer_begin, ", ", st.layer_end,
            ") do not continue the pipeline at layer ", next_layer));
      }
      next_layer = st.layer_end;
      if (st.tp <= 0) {
        return absl::InvalidArgumentError(
            absl::StrCat(sw, ".tp: must be > 0, got ", st.tp));
      }
      const ExpertTiling& x = st.tiling;
      if (model.MoeLayersIn(st.layer_begin, st.layer_end) > 0) {
        if (x.ep <= 0 || x.etp <= 0 || x.edp <= 0 ||
            x.ep * x.etp * x.edp != st.tp * t.replicas) {
          return absl::InvalidArgumentError(absl::StrCat(
              sw, ".expert_tiling: ep*etp*edp = ", x.ep, "*", x.etp, "*",
              x.edp, " must equal tp*replicas = ", st.tp * t.replicas));
        }
        if (model.moe.num_experts % x.ep != 0) {
          return absl::InvalidArgumentError(
              absl::StrCat(sw, ".expert_tiling.ep: ", x.ep,
                           " does not divide the ", model.moe.num_experts,
                           " experts"));
        }
      }
    }
    if (next_layer != model.num_layers) {
      return absl::InvalidArgumentError(
          absl::StrCat(tw, ": stages cover layers [0, ", next_layer,
                       "), the model has ", model.num_layers));
    }
    for (int r = 0; r < t.replicas; ++r) {
      for (int s = 0; s < t.depth(); ++s) {
        const StagePlacement& p = t.at(r, s);
        const std::string pw =
            absl::StrCat(tw, ".placement[replica ", r, ", stage ", s, "]");
        if (p.node < 0 || p.node >= cluster.num_nodes()) {
          return absl::InvalidArgumentError(
              absl::StrCat(pw, ".node: no node ", p.node, " in the cluster"));
        }
        if (static_cast<int>(p.gpus.size()) != t.stages[s].tp) {
          return absl::InvalidArgumentError(
              absl::StrCat(pw, ": ", p.gpus.size(), " GPUs for TP ",
                           t.stages[s].tp));
        }
        for (int g : p.gpus) {
          if (g < 0 || g >= cluster.node(p.node).num_gpus) {
            return absl::InvalidArgumentError(
                absl::StrCat(pw, ": node ", cluster.node(p.node).name,
                             " has no GPU ", g));
          }
          if (!used.insert({p.node, g}).second) {
            return absl::InvalidArgumentError(
                absl::StrCat(pw, ": GPU ", cluster.node(p.node).name, ":", g,
                             " is used twice"));
          }
        }
      }
    }
  }
  return absl::OkStatus();
}

}  // namespace

absl::StatusOr<PlanLayout> PlanLayout::Create(const ModelState& state,
                                              const Plan& plan,
                                              const Cluster& cluster) {
  const ModelSpec& model = state.model();
  if (absl::Status s = CheckStructure(model, plan, cluster); !s.ok()) return s;

  // Tensors by the block they belong to, so a stage lists only its own.
  std::vector<std::vector<int>> by_layer(model.num_layers + 3);
  auto slot = [&](int layer) {
    return layer == kEmbeddingLayer  ? 0
           : layer == kHeadLayer     ? model.num_layers + 1
           : layer == kEveryGpuLayer ? model.num_layers + 2
                                     : layer + 1;
  };
  for (int id = 0; id < state.num_tensors(); ++id) {
    by_layer[slot(state.tensor(id).layer)].push_back(id);
  }

  PlanLayout layout;
  for (int ti = 0; ti < static_cast<int>(plan.templates.size()); ++ti) {
    const Template& t = plan.templates[ti];
    for (int r = 0; r < t.replicas; ++r) {
      for (int s = 0; s < t.depth(); ++s) {
        const Stage& st = t.stages[s];
        const StagePlacement& p = t.at(r, s);
        // The blocks of the stage; the embedding on the first stage, and on
        // the last too when the LM head reuses it (tied embeddings: Megatron
        // keeps a synchronised copy, with its own optimizer state, there);
        // the final norm and head on the last. In tensor-id order.
        const bool last = s == t.depth() - 1;
        std::vector<int> slots;
        if (s == 0 || (last && model.tied_embeddings)) {
          slots.push_back(slot(kEmbeddingLayer));
        }
        for (int l = st.layer_begin; l < st.layer_end; ++l) {
          slots.push_back(slot(l));
        }
        if (last) slots.push_back(slot(kHeadLayer));
        slots.push_back(slot(kEveryGpuLayer));
        for (int k = 0; k < st.tp; ++k) {
          // Position among all GPUs of this stage over the replicas; expert
          // groups are ETP innermost, then EP, then EDP (see plan.h).
          const int g = r * st.tp + k;
          const int ep_rank = (g / st.tiling.etp) % st.tiling.ep;
          const int etp_rank = g % st.tiling.etp;
          std::vector<Holding> holds;
          for (int sl : slots) {
            for (int id : by_layer[sl]) {
              const TensorSpec& ts = state.tensor(id);
              if (ts.expert >= 0) {
                const int per_rank = model.moe.num_experts / st.tiling.ep;
                if (ts.expert / per_rank != ep_rank) continue;
                holds.push_back({id, ts.ShardRange(etp_rank, st.tiling.etp)});
              } else {
                holds.push_back({id, ts.ShardRange(k, st.tp)});
              }
            }
          }
          layout.gpus_.push_back({cluster.node(p.node).name, p.gpus[k]});
          layout.roles_.push_back({ti, r, s, k});
          layout.holdings_.push_back(std::move(holds));
        }
      }
    }
  }
  return layout;
}

int64_t PlanLayout::BytesOn(int gpu) const {
  int64_t n = 0;
  for (const Holding& h : holdings_[gpu]) n += h.range.size();
  return n;
}

int64_t PlanLayout::TotalBytes() const {
  int64_t n = 0;
  for (int g = 0; g < num_gpus(); ++g) n += BytesOn(g);
  return n;
}

}  // namespace arachne::migration
