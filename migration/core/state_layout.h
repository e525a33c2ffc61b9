// The training state of a model and where a plan puts it (paper §5.6,
// docs/migration.md).
//
// ModelState lists every tensor of the model: for every parameter (per
// transformer block, embedding, final norm, LM head; routed experts one by
// one) four tensors, its bf16 weight, fp32 master weight, Adam m and Adam v.
// PlanLayout says which byte range of which tensor every GPU of a plan holds:
// TP splits a parameter along its split dimension, EP spreads the routed
// experts of a stage over its expert-parallel ranks (ETP slices an expert
// like TP), and DP / EDP replicas hold copies. With tied embeddings the last
// stage of a pipeline also holds the embedding (Megatron's synchronised copy
// that the LM head uses).
//
// Canonical byte order: a tensor is stored with its TP split dimension
// outermost. Column-parallel weights ([out, in], split on out) are stored as
// they are; row-parallel weights ([out, in], split on in) are stored
// transposed. Every shard is therefore one contiguous byte range, and the
// shards of two TP degrees intersect in one range. An engine converts to its
// own memory layout when it loads or saves a shard.
//
// The layout assumes a replicated (not distributed) optimizer: every DP
// replica holds the whole optimizer state of its shard.
#ifndef ARACHNE_MIGRATION_CORE_STATE_LAYOUT_H_
#define ARACHNE_MIGRATION_CORE_STATE_LAYOUT_H_

#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "planner_service/core/model/cluster.h"
#include "planner_service/core/model/model.h"
#include "planner_service/core/model/plan.h"

namespace arachne::migration {

// kScalars is the replicated scalar group of a training run (step count,
// data cursor, RNG position, ...): int64 values every GPU of a plan holds.
enum class StateKind { kWeight, kMasterWeight, kAdamM, kAdamV, kScalars };
inline constexpr int kNumStateKinds = 5;
absl::string_view StateKindName(StateKind k);  // "weight", "master", ...
// The kind a StateKindName names; InvalidArgument naming `field` otherwise.
absl::StatusOr<StateKind> StateKindFromName(absl::string_view name,
                                            absl::string_view field);
// 2 for the bf16/fp16 weight, 4 for the fp32 master weight and moments, 8
// for the int64 scalars.
int BytesPerElement(StateKind k);

// How tensor parallelism cuts a parameter.
enum class TpSplit {
  kReplicated,  // every TP rank holds all of it (norms, router, some biases)
  kColumn,      // split on dim 0 (output features, vocabulary rows)
  kRow,         // split on dim 1 (input features); stored transposed
};
absl::string_view TpSplitName(TpSplit s);  // "replicated", "column", "row"
absl::StatusOr<TpSplit> TpSplitFromName(absl::string_view name,
                                        absl::string_view field);

// Half-open byte interval [begin, end) of a tensor in canonical order.
struct ByteRange {
  int64_t begin = 0;
  int64_t end = 0;
  int64_t size() const { return end - begin; }
  bool empty() const { return end <= begin; }
  friend bool operator==(const ByteRange&, const ByteRange&) = default;
};
ByteRange Intersect(const ByteRange& a, const ByteRange& b);

// Where in the model a tensor belongs.
inline constexpr int kEmbeddingLayer = -1;  // lives on every first stage
inline constexpr int kHeadLayer = -2;       // final norm + LM head, last stage
inline constexpr int kEveryGpuLayer = -3;   // every GPU of a plan holds it

struct TensorSpec {
  std::string name;  // e.g. "layers.3.mlp.down.weight:adam_m"
  StateKind kind = StateKind::kWeight;
  int layer = 0;    // transformer block, kEmbeddingLayer or kHeadLayer
  int expert = -1;  // routed expert index; -1 for everything else
  std::vector<int64_t> shape;  // logical PyTorch shape ([out, in] for linears)
  TpSplit split = TpSplit::kReplicated;

  int64_t elements() const;
  int64_t bytes() const { return elements() * BytesPerElement(kind); }
  // The byte range TP (or ETP) rank `rank` of `degree` holds. Rows of the
  // split dimension are divided as [rank*n/degree, (rank+1)*n/degree), so a
  // degree that does not divide n still covers the tensor exactly once.
  ByteRange ShardRange(int rank, int degree) const;
};

struct ModelStateOptions {
  // Number of int64 scalars in the replicated group "train_state:scalars"
  // (0: no such group). A training engine keeps what it needs to continue
  // bit-exactly besides the tensors there: step, data cursor, RNG state.
  int training_scalars = 0;
};
inline constexpr absl::string_view kTrainStateTensor = "train_state:scalars";

// Every tensor of a model's training state, in a fixed order (the tensor id
// is the index). Depends on the model only, not on a plan.
class ModelState {
 public:
  // InvalidArgument (from ModelSpec::Validate) for an inconsistent model.
  static absl::StatusOr<ModelState> Create(
      const ModelSpec& model, const ModelStateOptions& options = {});
  // The state an engine describes (the engine protocol's Describe): its own
  // tensors for `model`, in its order. InvalidArgument naming
  // "tensors[i].<field>" for a tensor no plan could place: an empty or
  // repeated name (at most kMaxTensorName characters), a layer outside
  // [kEveryGpuLayer, model.num_layers), an expert outside
  // [-1, model.moe.num_experts) or set outside a block, a shape that is
  // empty, has a dimension < 1 or more than 2^40 elements, a row split of a
  // tensor that is not 2-D, scalars that are not replicated on every GPU;
  // or no tensors, or more than kMaxTensors.
  static absl::StatusOr<ModelState> FromTensors(const ModelSpec& model,
                                                std::vector<TensorSpec> tensors);
  static constexpr int kMaxTensors = 10'000'000;
  static constexpr int kMaxTensorName = 512;
  ModelState() = default;

  const ModelSpec& model() const { return model_; }
  const std::vector<TensorSpec>& tensors() const { return tensors_; }
  const TensorSpec& tensor(int id) const { return tensors_[id]; }
  int num_tensors() const { return static_cast<int>(tensors_.size()); }
  // Sum of the elements of the kWeight tensors; equals model.TotalParams().
  int64_t TotalParams() const;
  int64_t TotalBytes() const;

 private:
  ModelSpec model_;
  std::vector<TensorSpec> tensors_;
};

// A physical GPU: the node's name in its cluster file and the GPU's local
// index on that node. Names, not cluster indices, identify a GPU across two
// plans, because a join or leave renumbers the nodes.
struct GpuId {
  std::string node;
  int index = 0;
  friend bool operator==(const GpuId&, const GpuId&) = default;
  friend bool operator<(const GpuId& a, const GpuId& b) {
    return a.node != b.node ? a.node < b.node : a.index < b.index;
  }
  template <typename H>
  friend H AbslHashValue(H h, const GpuId& g) {
    return H::combine(std::move(h), g.node, g.index);
  }
};
std::string GpuIdName(const GpuId& g);  // "node:index"

// One byte range of one tensor.
struct Holding {
  int tensor = 0;
  ByteRange range;
  friend bool operator==(const Holding&, const Holding&) = default;
};

// Which pipeline replica and stage of a plan a GPU serves.
struct GpuRole {
  int template_index = 0;
  int replica = 0;
  int stage = 0;
  int tp_rank = 0;
};

// The byte ranges every GPU of a plan holds.
class PlanLayout {
 public:
  // Checks the plan's structure (depth, placement size, TP group size, node
  // and GPU indices, no GPU used twice, every pipeline covering
  // [0, num_layers) in order, expert tiling ep*etp*edp = tp*replicas with ep
  // dividing the experts) and fails with InvalidArgument naming the template,
  // stage or replica otherwise. Memory and cost are not checked.
  static absl::StatusOr<PlanLayout> Create(const ModelState& state,
                                           const Plan& plan,
                                           const Cluster& cluster);
  PlanLayout() = default;

  // GPUs the plan uses in placement order: template, replica, stage, TP rank.
  const std::vector<GpuId>& gpus() const { return gpus_; }
  int num_gpus() const { return static_cast<int>(gpus_.size()); }
  const GpuRole& role(int gpu) const { return roles_[gpu]; }
  // Holdings of GPU `gpu` (an index into gpus()), sorted by tensor, each
  // tensor at most once (a GPU holds one contiguous range of a tensor).
  const std::vector<Holding>& holdings(int gpu) const { return holdings_[gpu]; }
  int64_t BytesOn(int gpu) const;
  int64_t TotalBytes() const;

 private:
  std::vector<GpuId> gpus_;
  std::vector<GpuRole> roles_;
  std::vector<std::vector<Holding>> holdings_;
};

}  // namespace arachne::migration

#endif  // ARACHNE_MIGRATION_CORE_STATE_LAYOUT_H_
