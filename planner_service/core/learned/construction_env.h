// The construction environment of the learned planner (paper §5.1-§5.4): an
// episode builds a plan as a sequence of structural templates. Each template
// is one depth decision (STOP or 1..Dmax), then per stage a device decision
// (a GPU-type slot) and a TP decision (1, 2, 4, 8); when its last stage is
// chosen, auto-fill (auto_fill.h) completes it on the GPUs left and the step
// is rewarded with the throughput delta of the filled plan.
//
// This is the planner core's half of the learned policy: no LibTorch. The
// policy (planner_service/policy) reads State() and the candidate features,
// samples an action under LegalMask() and calls Step(). Everything here is
// arithmetic on fixed-size arrays plus one AutoFill::Extend per template,
// so one core runs thousands of episodes per second (bench/
// construction_env_bench.cc); there is no randomness inside (helpers that
// draw take the caller's generator).
//
// The state layout, masks, reward and their normalisation are documented in
// docs/learned-policy.md, section "Construction environment"; the index
// constants below are the contract the policy code relies on.
#ifndef ARACHNE_PLANNER_SERVICE_CORE_LEARNED_CONSTRUCTION_ENV_H_
#define ARACHNE_PLANNER_SERVICE_CORE_LEARNED_CONSTRUCTION_ENV_H_

#include <array>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "absl/random/bit_gen_ref.h"
#include "absl/status/statusor.h"
#include "absl/types/span.h"
#include "planner_service/core/planners/auto_fill.h"
#include "planner_service/core/cost/cost_model.h"
#include "planner_service/core/model/node_pool.h"
#include "planner_service/core/model/plan.h"

namespace arachne {

// Device slots: the device head's actions, one per GPU type present,
// ordered by peak bf16 TFLOPS (fastest first), then memory (largest first),
// then catalog index; slots past the cluster's types are empty (masked, all
// features 0). A cluster with more types is rejected by
// ConstructionEnv::Create (the default planner then plans with a search
// that takes any number, planners.h).
inline constexpr int kEnvDeviceSlots = 16;
// Type slots of the state (the backbone's view of the cluster's types).
// With at most 4 types present, type slot s is device slot s. With more,
// the T types are grouped, in device-slot order, into 4 runs of consecutive
// slots: device slot s is in group floor(4s / T) (T = 5: sizes 2, 1, 1, 1;
// T = 8: 2, 2, 2, 2), and a type slot's features summarise its group: shares and
// counts summed, speeds and memory averaged weighted by GPUs. No type is
// lost: the device head still scores every type by its own row, and a
// stage is always placed on one concrete type. The shipped policies were
// trained on the 4-slot state, so the grouped view keeps their input
// meaning ("the k-th fastest quarter of the cluster's types").
inline constexpr int kEnvTypeSlots = 4;
// TP degrees of the TP head: 1, 2, 4, 8 (action k is TP 2^k).
inline constexpr int kEnvTpSlots = 4;
// Node-size buckets of the "remaining nodes of size k" features: a node
// with f free GPUs counts in bucket k = 1, 2, 4, 8 when k <= f < 2k (8: f >=
// 8).
inline constexpr int kEnvNodeBuckets = 4;
// Largest pipeline depth (Dmax) the state and depth head have room for.
inline constexpr int kEnvMaxDepth = 16;
// Depth head actions: 0 is STOP, d in 1..kEnvMaxDepth is depth d.
inline constexpr int kEnvDepthActions = kEnvMaxDepth + 1;

// Features of one type slot, at offset slot * kEnvTypeFeatures of the state.
namespace env_type_feature {
inline constexpr int kPresent = 0;          // 1 when a type holds the slot
inline constexpr int kRemainingGpus = 1;    // free GPUs / GPUs of the type
inline constexpr int kRemainingNodes = 2;   // nodes with a free GPU / nodes
inline constexpr int kShare = 3;            // GPUs of the type / all GPUs
inline constexpr int kPeakTflops = 4;       // peak / fastest type present
inline constexpr int kMemory = 5;           // memory / largest type present
inline constexpr int kRelativeSpeed = 6;    // [6, 10): at TP 1, 2, 4, 8
inline constexpr int kEffectiveSpeed = 10;  // [10, 14): relative / TP
inline constexpr int kLayerMemory = 14;     // [14, 18): at TP 1, 2, 4, 8
inline constexpr int kNodesOfSize = 18;     // [18, 22): buckets 1, 2, 4, 8
inline constexpr int kCount = 22;
}  // namespace env_type_feature
inline constexpr int kEnvTypeFeatures = env_type_feature::kCount;

// Cluster-wide features, at offsets from kEnvGlobalOffset.
namespace env_global_feature {
inline constexpr int kLogScale = 0;          // log2(GPUs) / 12
inline constexpr int kRemainingGpus = 1;     // free GPUs / GPUs
inline constexpr int kTemplateProgress = 2;  // templates placed / Tmax
inline constexpr int kHeadDepth = 3;         // one-hot of the head to act
inline constexpr int kHeadDevice = 4;
inline constexpr int kHeadTp = 5;
inline constexpr int kDepth = 6;           // chosen depth / 16 (0: none)
inline constexpr int kStage = 7;           // stage index / 16
inline constexpr int kStagesLeft = 8;      // (depth - stage) / 16
inline constexpr int kPreviousType = 9;    // [9, 13): one-hot type slot
inline constexpr int kPreviousTp = 13;     // log2(TP) / 3 of it
inline constexpr int kPendingType = 14;    // [14, 18): one-hot (TP head)
inline constexpr int kThroughput = 18;     // plan so far / reference
inline constexpr int kStageCapacity = 19;  // stages placeable / GPUs
inline constexpr int kCount = 20;
}  // namespace env_global_feature
inline constexpr int kEnvGlobalOffset = kEnvTypeSlots * kEnvTypeFeatures;
// GPU count over each candidate depth d = 1..16, at kEnvDepthCountOffset + d-1.
inline constexpr int kEnvDepthCountOffset =
    kEnvGlobalOffset + env_global_feature::kCount;

// Composition summary (the FiLM conditioning input); constant over an
// episode. Also the last kEnvSummarySize entries of the state.
namespace env_summary_feature {
inline constexpr int kLogScale = 0;      // log2(GPUs) / 12
inline constexpr int kTypeShare = 1;     // [1, 5): share of each slot
inline constexpr int kTypeCount = 5;     // types present / 4
inline constexpr int kShareSpread = 6;   // max share - min share
inline constexpr int kShareEntropy = 7;  // entropy of the shares / ln 4
inline constexpr int kNodeSizeMix = 8;   // [8, 12): GPUs in nodes of bucket
inline constexpr int kNicGbps = 12;      // mean NIC Gb/s / 400
inline constexpr int kCount = 13;
}  // namespace env_summary_feature
inline constexpr int kEnvSummarySize = env_summary_feature::kCount;
inline constexpr int kEnvSummaryOffset = kEnvDepthCountOffset + kEnvMaxDepth;

// Model summary (the model-conditioned policy's extra input, issue 17): the
// model's shape and how it weighs against this cluster's memory, network
// and batch; constant over an episode. It follows the composition summary,
// so the state's first kEnvUnconditionedStateSize entries are the layout
// the per-model policies were trained on (they read only that prefix) and
// [kEnvSummaryOffset, kEnvStateSize) is one contiguous conditioning input.
namespace env_model_feature {
inline constexpr int kLogLayers = 0;      // log2(layers) / 8
inline constexpr int kLogHidden = 1;      // log2(hidden) / 14
inline constexpr int kFfnRatio = 2;       // dense FFN width / hidden / 8
inline constexpr int kKvHeadShare = 3;    // KV heads / attention heads
inline constexpr int kMoe = 4;            // 1 for a mixture of experts
inline constexpr int kLogExperts = 5;     // log2(1 + routed experts) / 9
inline constexpr int kActiveExperts = 6;  // top-k / routed experts
inline constexpr int kEmbeddingShare = 7;  // embedding + head / all params
// log2(1 + GPUs whose usable memory the model's layers need at TP 1, on
// the type with the most memory) / 10: the model's size in GPUs.
inline constexpr int kModelGpus = 8;
// Those GPUs / the cluster's GPUs, clipped to 1: how tight memory is.
inline constexpr int kMemoryPressure = 9;
// log2(1 + time to all-reduce one layer's gradients over the mean NIC /
// that layer's share of an iteration's compute per GPU) / 8: how dear data
// parallelism is against pipelining.
inline constexpr int kGradientCommRatio = 10;
// log2(1 + time to send one sequence's activations between stages over the
// mean NIC / one layer's forward and backward of that sequence) / 8: how
// dear a pipeline boundary is.
inline constexpr int kActivationCommRatio = 11;
// log2(1 + global batch / GPUs) / 10: micro-batches per pipeline to fill
// its bubble.
inline constexpr int kBatchPerGpu = 12;
inline constexpr int kCount = 13;
}  // namespace env_model_feature
inline constexpr int kEnvModelSummarySize = env_model_feature::kCount;
inline constexpr int kEnvModelSummaryOffset =
    kEnvSummaryOffset + kEnvSummarySize;
// The state of the per-model policies: everything before the model summary.
inline constexpr int kEnvUnconditionedStateSize = kEnvModelSummaryOffset;
inline constexpr int kEnvStateSize =
    kEnvModelSummaryOffset + kEnvModelSummarySize;

// Features of each depth-head candidate (row a = action a: STOP, 1..16).
namespace env_depth_feature {
inline constexpr int kIsStop = 0;
inline constexpr int kDepth = 1;           // d / 16
inline constexpr int kLegal = 2;           // the mask bit
inline constexpr int kReplicaBound = 3;    // log2(1 + free/d) / log2(1 + GPUs)
inline constexpr int kLayersPerStage = 4;  // ceil(L / d) / L
inline constexpr int kThroughput = 5;      // STOP row: plan so far / reference
inline constexpr int kMemoryRatio = 6;  // min over types of ceil(L/d) layers'
                                        // memory at the largest free TP over
                                        // usable memory, clipped to 4
inline constexpr int kCount = 7;
}  // namespace env_depth_feature
inline constexpr int kEnvDepthFeatures = env_depth_feature::kCount;

// Features of each TP-head candidate (row k = TP 2^k) for the pending
// device slot's type.
namespace env_tp_feature {
inline constexpr int kRelativeSpeed = 0;  // the type's, at this TP
inline constexpr int kEffectiveSpeed = 1;
inline constexpr int kLayerMemory = 2;
inline constexpr int kDegree = 3;  // [3, 7): one-hot of k
inline constexpr int kCount = kDegree + kEnvTpSlots;
}  // namespace env_tp_feature
inline constexpr int kEnvTpFeatures = env_tp_feature::kCount;

// Features of each device-head candidate (row = device slot), for the stage
// about to be chosen.
namespace env_device_feature {
inline constexpr int kPresent = 0;
inline constexpr int kLegal = 1;
inline constexpr int kRemainingGpus = 2;   // free GPUs / GPUs of the type
inline constexpr int kLargestBlock = 3;    // largest free block on a node / 8
inline constexpr int kSameAsPrevious = 4;  // the previous stage has this type
inline constexpr int kStagesOfType = 5;    // stages of this template on it / d
inline constexpr int kBestEffectiveSpeed = 6;  // max over legal TP
inline constexpr int kMemoryRatio = 7;  // ceil(L/d) layers at the largest
                                        // legal TP over usable, clip 4
inline constexpr int kFreeShare = 8;    // free GPUs of type / all free
inline constexpr int kCount = 9;
}  // namespace env_device_feature
inline constexpr int kEnvDeviceFeatures = env_device_feature::kCount;

struct ConstructionEnvConfig {
  // Dmax: deepest template, in [1, kEnvMaxDepth]; capped by the model's
  // layers (a stage holds at least one layer).
  int max_depth = 16;
  // Tmax: most templates in a plan (>= 1).
  int max_templates = 3;
  // δ: reward of a first template that auto-fill cannot complete (>= 0).
  double infeasible_penalty = 1.0;
  // Filled templates remembered, keyed by the episode's structures so far
  // (which determine the plan and free GPUs auto-fill starts from, so a hit
  // returns exactly what auto-fill would). A trained policy repeats its
  // templates across the rollouts of a group; a hit costs a pointer copy
  // instead of a fill (plans are shared, never copied). When full, the cache is
  // emptied and starts over (deterministic, and it follows the policy as
  // training moves on). An entry holds a plan (up to ~35 KB on 512 GPUs). 0
  // disables it.
  int fill_cache_entries = 256;
};

// The head that acts next.
enum class EnvHead { kDepth, kDevice, kTp, kDone };

// Why an episode ended.
enum class EpisodeEnd {
  kRunning,
  kStop,                     // the depth head chose STOP
  kNoStageLeft,              // no depth is legal on the GPUs left
  kMaxTemplates,             // Tmax templates placed
  kInfeasibleFirstTemplate,  // penalty δ, empty plan
  kInfeasibleLaterTemplate,  // no penalty, the plan so far is kept
};

struct StepOutcome {
  // Normalised reward (see ConstructionEnv::reference_throughput): nonzero
  // only on the step that completes a template.
  double reward = 0;
  bool done = false;
  bool template_completed = false;  // auto-fill ran on this step
};

// One environment per composition and thread; several may share one cost
// model. Copyable (a copy continues the episode independently, sharing the
// filled plans both hold), movable, not assignable.
class ConstructionEnv {
 public:
  // Builds the environment for the cost model's cluster and model; the cost
  // model must outlive the environment. Errors: InvalidArgument naming the
  // config field and value (max_depth outside [1, 16], max_templates < 1,
  // infeasible_penalty < 0, fill_cache_entries < 0) or naming the cluster's type count when it
  // exceeds kEnvDeviceSlots; FailedPrecondition when no GPU type of the
  // cluster has a profile for any TP degree (no template can exist). The
  // environment starts reset.
  static absl::StatusOr<ConstructionEnv> Create(
      const CostModel& cost_model, const ConstructionEnvConfig& config = {});

  // Starts a new episode on the whole cluster with an empty plan.
  void Reset();

  EnvHead head() const { return head_; }
  bool done() const { return head_ == EnvHead::kDone; }

  // Legal actions of each head now (1 legal, 0 masked). Guarantee: from any
  // state reached through legal actions, every head that acts next has at
  // least one legal action, and every sequence of legal actions ends with a
  // structure whose first replica NodePool places (the placement auto-fill
  // makes), on (type, TP) pairs that are profiled at micro-batch 1, of
  // depth <= the model's layers. Auto-fill can still reject it for memory
  // (no layer split fits) or an unsplittable global batch; that ends the
  // episode (penalty δ on the first template). Exactly:
  //  - depth d legal iff 1 <= d <= Dmax and d <= the stages the free GPUs
  //    can hold (each type's smallest profiled TP per stage, counted node by
  //    node); STOP legal iff a template has been placed;
  //  - device slot legal iff its type has a node with its smallest profiled TP free
  //    after the stages chosen so far;
  //  - TP k of the pending type legal iff profiled at micro-batch 1, <= the
  //    largest free block on one of its nodes, <= min(8, CostParams::max_tp)
  //    and the stages still to choose still fit after it.
  // A head that is not acting has all zeros.
  const std::array<uint8_t, kEnvDepthActions>& DepthMask() const {
    return depth_mask_;
  }
  const std::array<uint8_t, kEnvDeviceSlots>& DeviceMask() const {
    return device_mask_;
  }
  const std::array<uint8_t, kEnvTpSlots>& TpMask() const { return tp_mask_; }
  // The mask of the acting head (empty when done).
  absl::Span<const uint8_t> LegalMask() const;

  // Applies `action` of the acting head (depth: 0 STOP or d; device: device
  // slot;
  // TP: k for TP 2^k). CHECK-fails on an illegal action or when done.
  StepOutcome Step(int action);

  // The state vector (kEnvStateSize floats, layout above).
  absl::Span<const float> State() const;
  // The composition summary (kEnvSummarySize floats, at kEnvSummaryOffset
  // of the state).
  absl::Span<const float> CompositionSummary() const {
    return absl::MakeConstSpan(summary_);
  }
  // The model summary (kEnvModelSummarySize floats; the state's tail).
  absl::Span<const float> ModelSummary() const {
    return absl::MakeConstSpan(model_summary_);
  }
  // Depth-head candidates: kEnvDepthActions rows of kEnvDepthFeatures.
  absl::Span<const float> DepthCandidates() const;
  // Device-head candidates: kEnvDeviceSlots rows of kEnvDeviceFeatures.
  absl::Span<const float> DeviceCandidates() const;
  // TP-head candidates: kEnvTpSlots rows of kEnvTpFeatures for the pending
  // device slot's type; CHECK-fails unless the TP head acts.
  absl::Span<const float> TpCandidates() const;

  // Legal depths (STOP excluded), for the training's forced feasible depth:
  // FeasibleDepth(k) for k in [0, FeasibleDepthCount()) in increasing order.
  int FeasibleDepthCount() const;
  int FeasibleDepth(int k) const;
  // A legal depth (never STOP) drawn uniformly with `rng`: the forced depth
  // of §5.5. CHECK-fails unless the depth head acts.
  int UniformFeasibleDepth(absl::BitGenRef rng) const;

  // A legal action of the acting head drawn uniformly with `rng`. The
  // uniform-type rollout of §5.5 takes it at the device head; a random
  // policy takes it at every head. CHECK-fails when done.
  int UniformLegalAction(absl::BitGenRef rng) const;
  // Plays the episode to its end with uniform legal actions of every head
  // (the random policy); returns the sum of the rewards from now on.
  double RunUniformEpisode(absl::BitGenRef rng);

  // Catalog index of the type in device slot `slot`, -1 for an empty slot.
  int SlotType(int slot) const { return slot_type_[slot]; }
  // Device slot of catalog type `gpu_type`, -1 when absent.
  int SlotOfType(int gpu_type) const;
  // Type slot of the state that summarises device slot `slot` (-1 for an
  // empty slot); the identity with at most kEnvTypeSlots types.
  int StateSlotOf(int slot) const { return state_slot_[slot]; }
  // Dmax in effect (config capped by the model's layers).
  int depth_limit() const { return depth_limit_; }

  // The plan built so far (filled and balanced; passes ValidatePlan) and its
  // prediction; an empty plan has iteration time kInfeasible and
  // throughput 0.
  const Plan& plan() const { return current_->plan; }
  double iteration_time_s() const { return current_->iteration_time_s; }
  double throughput_iters_per_s() const;
  // Throughput / reference_throughput().
  double normalized_throughput() const;
  // The per-composition reward scale: the compute-bound throughput, with
  // every GPU busy at its best per-GPU rate on the model's blocks (best TP
  // and micro-batch, no bubble, communication, embedding or LM head) and
  // the batch spread in proportion to speed. An upper bound on any plan's
  // throughput for models of one block kind (all dense or all MoE).
  double reference_throughput() const { return reference_throughput_; }

  // The stages of the template being built.
  absl::Span<const StageChoice> structure() const { return structure_; }
  int templates_placed() const {
    return static_cast<int>(current_->plan.templates.size());
  }
  EpisodeEnd episode_end() const { return end_; }
  // Sum of the rewards of this episode.
  double episode_return() const { return episode_return_; }
  // Plans auto-fill priced since Create (all episodes); a fill answered by
  // the cache prices none.
  int64_t evaluations() const { return evaluations_; }
  // Templates completed since Create, and how many the cache answered.
  int64_t fills() const { return fills_; }
  int64_t fill_cache_hits() const { return fill_cache_hits_; }

 private:
  // A plan after a fill and the GPUs it leaves free. Immutable once made,
  // so the episode, the fill cache and copies of the environment share it
  // (a cache hit costs a pointer copy).
  struct FilledPlan {
    Plan plan;
    NodePool pool;
    double iteration_time_s = kInfeasible;
  };

  ConstructionEnv(const CostModel& cost_model,
                  const ConstructionEnvConfig& config);
  // Precomputes the per-slot constants and the summary.
  absl::Status Init();
  // Stages the free GPUs of scratch_ can hold (each at its type's smallest
  // TP), node by node.
  int StageCapacity() const;
  void StartTemplate();  // head -> depth, masks for the next template
  void UpdateDeviceMask();
  void UpdateTpMask();
  void ClearMasks();
  void EndEpisode(EpisodeEnd why);
  StepOutcome CompleteTemplate();
  void ComputeState() const;
  double LayerMemoryRatio(int slot, int tp, int layers) const;
  // Largest legal-by-profile TP of `slot` not above `free_block`; 0 if none.
  int LargestAllowedTp(int slot, int free_block) const;

  const CostModel* cm_;
  AutoFill fill_;
  ConstructionEnvConfig config_;
  int depth_limit_ = 1;
  int total_gpus_ = 0;

  // Per device slot constants.
  std::array<int, kEnvDeviceSlots> slot_type_{};
  std::array<int, kEnvDeviceSlots> state_slot_{};
  std::array<int, kEnvDeviceSlots> min_tp_{};  // 0: nothing profiled
  std::array<std::array<uint8_t, kEnvTpSlots>, kEnvDeviceSlots> tp_allowed_{};
  // The type's own static features (the type-slot layout).
  std::array<std::array<float, kEnvTypeFeatures>, kEnvDeviceSlots> static_{};
  std::array<std::vector<int>, kEnvDeviceSlots> slot_nodes_;
  std::array<int, kEnvDeviceSlots> slot_gpus_{};
  // Bytes of one average block per GPU at TP 2^k, for the memory ratios.
  std::array<std::array<double, kEnvTpSlots>, kEnvDeviceSlots> layer_bytes_{};
  std::array<double, kEnvDeviceSlots> usable_bytes_{};
  // Per type slot of the state: its static features (a device slot's own,
  // or its group's summary), its device slots and their nodes and GPUs.
  std::array<std::array<float, kEnvTypeFeatures>, kEnvTypeSlots>
      state_static_{};
  std::array<std::vector<int>, kEnvTypeSlots> state_slot_nodes_;
  std::array<int, kEnvTypeSlots> state_slot_gpus_{};
  std::array<float, kEnvSummarySize> summary_{};
  std::array<float, kEnvModelSummarySize> model_summary_{};
  double reference_throughput_ = 1;

  // Fills state_slot_ and the state_* arrays from the device slots' (the
  // rule at kEnvTypeSlots).
  void GroupTypeSlots(int types);

  // Episode.
  std::shared_ptr<const FilledPlan> empty_;    // no plan, every GPU free
  std::shared_ptr<const FilledPlan> current_;  // the plan so far
  // current_'s free GPUs minus the first replica of the stages chosen.
  NodePool scratch_;
  EnvHead head_ = EnvHead::kDepth;
  EpisodeEnd end_ = EpisodeEnd::kRunning;
  double episode_return_ = 0;
  int depth_ = 0;
  int capacity_ = 0;  // StageCapacity() of scratch_
  int pending_slot_ = -1;
  int previous_node_ = -1;
  std::vector<StageChoice> structure_;
  std::vector<int> structure_slots_;
  StagePlacement placement_scratch_;
  std::array<uint8_t, kEnvDepthActions> depth_mask_{};
  std::array<uint8_t, kEnvDeviceSlots> device_mask_{};
  std::array<uint8_t, kEnvTpSlots> tp_mask_{};
  int64_t evaluations_ = 0;
  int64_t fills_ = 0;
  int64_t fill_cache_hits_ = 0;

  // The fill cache: key = one byte per stage (device slot * kEnvTpSlots +
  // log2 TP,
  // + 1) with a 0 after each template, over the whole episode; value = the
  // filled plan, nullptr when auto-fill rejected the template.
  std::string history_;  // key of the templates placed in this episode
  std::string key_scratch_;
  absl::flat_hash_map<std::string, std::shared_ptr<const FilledPlan>>
      fill_cache_;

  // Lazily computed views.
  mutable bool state_valid_ = false;
  mutable std::array<float, kEnvStateSize> state_{};
  mutable std::array<float, kEnvDepthActions * kEnvDepthFeatures> depth_rows_{};
  mutable std::array<float, kEnvDeviceSlots * kEnvDeviceFeatures>
      device_rows_{};
  mutable std::array<float, kEnvTpSlots * kEnvTpFeatures> tp_rows_{};
};

}  // namespace arachne

#endif  // ARACHNE_PLANNER_SERVICE_CORE_LEARNED_CONSTRUCTION_ENV_H_
