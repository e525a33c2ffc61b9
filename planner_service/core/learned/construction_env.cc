#include "planner_service/core/learned/construction_env.h"

#include <algorithm>
#include <cmath>
#include <numeric>

#include "absl/random/distributions.h"
#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "glog/logging.h"

namespace arachne {
namespace {

namespace tf = env_type_feature;
namespace gf = env_global_feature;
namespace sf = env_summary_feature;
namespace df = env_depth_feature;
namespace vf = env_device_feature;

// log2(GPUs) / kLogScaleBits is 1 at 4096 GPUs, the service's bound on a
// request's scale order (larger clusters give values above 1, still finite).
constexpr double kLogScaleBits = 12;
// Memory ratios above this say "does not fit" equally loudly; clipping keeps
// the features bounded for the network.
constexpr double kMemoryRatioClip = 4;
// Bytes per parameter of mixed-precision Adam without the distributed
// optimizer (weights 2 + gradients 2 + fp32 state 12): the layer-memory
// features are the memory a layer needs at most.
constexpr double kBytesPerParam = 16;
constexpr double kNicScaleGbps = 400;

int NodeBucket(int free_gpus) {
  if (free_gpus >= 8) return 3;
  if (free_gpus >= 4) return 2;
  if (free_gpus >= 2) return 1;
  return 0;
}

}  // namespace

ConstructionEnv::ConstructionEnv(const CostModel& cost_model,
                                 const ConstructionEnvConfig& config)
    : cm_(&cost_model),
      fill_(cost_model),
      config_(config),
      empty_(std::make_shared<const FilledPlan>(
          FilledPlan{{}, NodePool(cost_model.cluster()), kInfeasible})),
      current_(empty_),
      scratch_(empty_->pool) {}

absl::StatusOr<ConstructionEnv> ConstructionEnv::Create(
    const CostModel& cost_model, const ConstructionEnvConfig& config) {
  if (config.max_depth < 1 || config.max_depth > kEnvMaxDepth) {
    return absl::InvalidArgumentError(
        absl::StrCat("construction env: max_depth must be in [1, ",
                     kEnvMaxDepth, "], got ", config.max_depth));
  }
  if (config.fill_cache_entries < 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("construction env: fill_cache_entries must be >= 0, got ",
                     config.fill_cache_entries));
  }
  if (config.max_templates < 1) {
    return absl::InvalidArgumentError(
        absl::StrCat("construction env: max_templates must be >= 1, got ",
                     config.max_templates));
  }
  if (!(config.infeasible_penalty >= 0)) {
    return absl::InvalidArgumentError(
        absl::StrCat("construction env: infeasible_penalty must be >= 0, got ",
                     config.infeasible_penalty));
  }
  const int types =
      static_cast<int>(cost_model.cluster().types_present().size());
  if (types > kEnvDeviceSlots) {
    return absl::InvalidArgumentError(absl::StrCat(
        "construction env: cluster has ", types,
        " GPU types; the device head has slots for at most ",
        kEnvDeviceSlots));
  }
  ConstructionEnv env(cost_model, config);
  if (absl::Status s = env.Init(); !s.ok()) return s;
  env.Reset();
  return env;
}

absl::Status ConstructionEnv::Init() {
  const Cluster& cluster = cm_->cluster();
  const GpuCatalog& catalog = cm_->catalog();
  const ModelSpec& model = cm_->model();
  const int layers = model.num_layers;
  const int n_moe = model.MoeLayersIn(0, layers);
  const int n_dense = layers - n_moe;
  total_gpus_ = cluster.total_gpus();
  depth_limit_ = std::min(config_.max_depth, layers);

  // Slot order: fastest first, so a slot means "the k-th fastest type" in
  // every composition, whatever the catalog order.
  std::vector<int> types = cluster.types_present();
  std::sort(types.begin(), types.end(), [&](int a, int b) {
    const GpuType& x = catalog.type(a);
    const GpuType& y = catalog.type(b);
    if (x.peak_bf16_tflops != y.peak_bf16_tflops)
      return x.peak_bf16_tflops > y.peak_bf16_tflops;
    if (x.memory_gib != y.memory_gib) return x.memory_gib > y.memory_gib;
    return a < b;
  });
  slot_type_.fill(-1);
  state_slot_.fill(-1);
  double max_tflops = 0, max_memory = 0;
  for (int t : types) {
    max_tflops = std::max(max_tflops, catalog.type(t).peak_bf16_tflops);
    max_memory = std::max(max_memory, catalog.type(t).memory_gib);
  }
  const int max_tp = std::min(cm_->params().max_tp, 1 << (kEnvTpSlots - 1));

  // Time of one average block on a TP group at micro-batch 1 (compute + TP
  // communication; a MoE block's experts at the cheapest ETP <= TP), and
  // its bytes per GPU (experts spread over the group's GPUs).
  auto block_time = [&](int type, int tp) -> double {
    double total = 0;
    if (n_dense > 0) {
      const LayerCost& c = cm_->Layer(LayerKind::kDense, type, tp, 1);
      if (!c.present) return kInfeasible;
      total += n_dense * (c.compute_s + c.tp_comm_s);
    }
    if (n_moe > 0) {
      const LayerCost& a = cm_->Layer(LayerKind::kMoeAttention, type, tp, 1);
      if (!a.present) return kInfeasible;
      double experts = kInfeasible;
      for (int etp = 1; etp <= tp; etp *= 2) {
        const LayerCost& e = cm_->Layer(LayerKind::kMoeExperts, type, etp, 1);
        if (!e.present) continue;
        experts = std::min(experts, (e.compute_s + e.tp_comm_s) * etp / tp);
      }
      if (!std::isfinite(experts)) return kInfeasible;
      total += n_moe * (a.compute_s + a.tp_comm_s + experts);
    }
    return total / layers;
  };
  auto block_bytes = [&](int type, int tp) -> double {
    double total = 0;
    if (n_dense > 0) {
      const LayerCost& c = cm_->Layer(LayerKind::kDense, type, tp, 1);
      total += n_dense * (c.params * kBytesPerParam + c.activation_bytes);
    }
    if (n_moe > 0) {
      const LayerCost& a = cm_->Layer(LayerKind::kMoeAttention, type, tp, 1);
      const LayerCost& e = cm_->Layer(LayerKind::kMoeExperts, type, 1, 1);
      total += n_moe * (a.params * kBytesPerParam + a.activation_bytes +
                        e.params * kBytesPerParam / tp);
    }
    return total / layers;
  };

  std::array<std::array<double, kEnvTpSlots>, kEnvDeviceSlots> times{};
  double best_gpu_time = kInfeasible;  // min over types and TP of TP * time
  bool any_choice = false;
  for (int s = 0; s < static_cast<int>(types.size()); ++s) {
    const int t = types[s];
    slot_type_[s] = t;
    slot_gpus_[s] = cluster.GpusOfType(t);
    const int max_node = cluster.MaxNodeSizeOfType(t);
    for (int k = 0; k < kEnvTpSlots; ++k) {
      const int tp = 1 << k;
      times[s][k] = kInfeasible;
      // Exactly ExactPlanner::StageOptions' rule, within the TP head.
      if (tp > max_tp || tp > max_node || !cm_->Supports(t, tp, 1)) continue;
      tp_allowed_[s][k] = 1;
      if (min_tp_[s] == 0) min_tp_[s] = tp;
      any_choice = true;
      times[s][k] = block_time(t, tp);
      layer_bytes_[s][k] = block_bytes(t, tp);
      if (std::isfinite(times[s][k]))
        best_gpu_time = std::min(best_gpu_time, tp * times[s][k]);
    }
    usable_bytes_[s] = cm_->UsableMemoryGib(t) * double{1 << 30};
  }
  for (int i = 0; i < cluster.num_nodes(); ++i) {
    const int s = SlotOfType(cluster.node(i).gpu_type);
    if (s >= 0) slot_nodes_[s].push_back(i);
  }
  if (!any_choice) {
    return absl::FailedPreconditionError(absl::StrCat(
        "construction env: no GPU type of the cluster has a profile of model ",
        model.name, " at micro-batch 1 for any TP degree"));
  }

  for (int s = 0; s < kEnvDeviceSlots; ++s) {
    std::array<float, kEnvTypeFeatures>& f = static_[s];
    const int t = slot_type_[s];
    if (t < 0) continue;
    f[tf::kPresent] = 1;
    f[tf::kShare] = static_cast<float>(slot_gpus_[s]) / total_gpus_;
    f[tf::kPeakTflops] = catalog.type(t).peak_bf16_tflops / max_tflops;
    f[tf::kMemory] = catalog.type(t).memory_gib / max_memory;
    for (int k = 0; k < kEnvTpSlots; ++k) {
      if (!tp_allowed_[s][k] || !std::isfinite(times[s][k])) continue;
      const double relative = best_gpu_time / times[s][k];
      f[tf::kRelativeSpeed + k] = static_cast<float>(relative);
      f[tf::kEffectiveSpeed + k] = static_cast<float>(relative / (1 << k));
      f[tf::kLayerMemory + k] = static_cast<float>(
          std::min(layer_bytes_[s][k] / usable_bytes_[s], kMemoryRatioClip));
    }
  }

  GroupTypeSlots(static_cast<int>(types.size()));

  // Reference throughput: GPU-seconds one sequence needs through all blocks
  // on type t at its best (TP, micro-batch), attention and experts each at
  // their own best; the cluster's rate is the sum of the per-GPU rates.
  double sequences_per_s = 0;
  for (int s = 0; s < kEnvDeviceSlots; ++s) {
    const int t = slot_type_[s];
    if (t < 0) continue;
    double dense = kInfeasible, attention = kInfeasible, experts = kInfeasible;
    for (int tp = 1; tp <= max_tp; tp *= 2) {
      for (int mbs = 1; mbs <= cm_->params().max_micro_batch_size; mbs *= 2) {
        const LayerCost& d = cm_->Layer(LayerKind::kDense, t, tp, mbs);
        if (d.present) dense = std::min(dense, tp * d.compute_s / mbs);
        const LayerCost& a = cm_->Layer(LayerKind::kMoeAttention, t, tp, mbs);
        if (a.present) attention = std::min(attention, tp * a.compute_s / mbs);
        const LayerCost& e = cm_->Layer(LayerKind::kMoeExperts, t, tp, mbs);
        if (e.present) experts = std::min(experts, tp * e.compute_s / mbs);
      }
    }
    const double seconds = (n_dense > 0 ? n_dense * dense : 0) +
                           (n_moe > 0 ? n_moe * (attention + experts) : 0);
    if (std::isfinite(seconds) && seconds > 0)
      sequences_per_s += slot_gpus_[s] / seconds;
  }
  reference_throughput_ =
      sequences_per_s > 0 ? sequences_per_s / cm_->training().global_batch : 1;

  // Composition summary.
  summary_[sf::kLogScale] =
      static_cast<float>(std::log2(total_gpus_) / kLogScaleBits);
  double max_share = 0, min_share = 1, entropy = 0;
  for (int s = 0; s < kEnvTypeSlots; ++s) {
    if (state_slot_gpus_[s] == 0) continue;
    const double share =
        static_cast<double>(state_slot_gpus_[s]) / total_gpus_;
    summary_[sf::kTypeShare + s] = static_cast<float>(share);
    max_share = std::max(max_share, share);
    min_share = std::min(min_share, share);
    entropy -= share * std::log(share);
  }
  summary_[sf::kTypeCount] =
      static_cast<float>(std::min<int>(types.size(), kEnvTypeSlots)) /
      kEnvTypeSlots;
  summary_[sf::kShareSpread] = static_cast<float>(max_share - min_share);
  summary_[sf::kShareEntropy] =
      static_cast<float>(entropy / std::log(double{kEnvTypeSlots}));
  double nic = 0;
  for (const Node& n : cluster.nodes()) {
    summary_[sf::kNodeSizeMix + NodeBucket(n.num_gpus)] +=
        static_cast<float>(n.num_gpus) / total_gpus_;
    nic += n.nic_gbps;
  }
  summary_[sf::kNicGbps] =
      static_cast<float>(nic / cluster.num_nodes() / kNicScaleGbps);

  // Model summary.
  namespace mf = env_model_feature;
  auto log_scaled = [](double x, double bits) {
    return static_cast<float>(std::log2(1 + std::max(x, 0.0)) / bits);
  };
  model_summary_[mf::kLogLayers] =
      static_cast<float>(std::log2(std::max(layers, 1)) / 8);
  model_summary_[mf::kLogHidden] =
      static_cast<float>(std::log2(std::max(model.hidden, 1)) / 14);
  model_summary_[mf::kFfnRatio] = static_cast<float>(
      static_cast<double>(model.ffn) / std::max(model.hidden, 1) / 8);
  model_summary_[mf::kKvHeadShare] = static_cast<float>(
      static_cast<double>(model.num_kv_heads) / std::max(model.num_heads, 1));
  if (model.is_moe()) {
    model_summary_[mf::kMoe] = 1;
    model_summary_[mf::kLogExperts] = log_scaled(model.moe.num_experts, 9);
    model_summary_[mf::kActiveExperts] = static_cast<float>(
        static_cast<double>(model.moe.top_k) / model.moe.num_experts);
  }
  const double total_params = static_cast<double>(model.TotalParams());
  const double edge_params =
      static_cast<double>(model.EmbeddingParams() + model.LmHeadParams());
  if (total_params > 0) {
    model_summary_[mf::kEmbeddingShare] =
        static_cast<float>(edge_params / total_params);
  }
  // GPUs the layers need, on the placement that needs fewest.
  double model_gpus = kInfeasible;
  for (int s = 0; s < kEnvDeviceSlots; ++s) {
    for (int k = 0; k < kEnvTpSlots; ++k) {
      if (!tp_allowed_[s][k] || !(usable_bytes_[s] > 0)) continue;
      model_gpus = std::min(
          model_gpus, layers * layer_bytes_[s][k] * (1 << k) / usable_bytes_[s]);
    }
  }
  if (std::isfinite(model_gpus)) {
    model_summary_[mf::kModelGpus] = log_scaled(model_gpus, 10);
    model_summary_[mf::kMemoryPressure] =
        static_cast<float>(std::min(model_gpus / total_gpus_, 1.0));
  }
  const double nic_bytes_per_s = nic / cluster.num_nodes() * 1e9 / 8;
  if (std::isfinite(best_gpu_time) && best_gpu_time > 0 &&
      nic_bytes_per_s > 0) {
    // bf16 gradients, ring all-reduce (2x the bytes); best_gpu_time is the
    // GPU-seconds of one sequence through one layer at its best TP.
    const double layer_params = (total_params - edge_params) / layers;
    const double allreduce_s = 2 * layer_params * 2 / nic_bytes_per_s;
    const double compute_per_gpu_s =
        best_gpu_time * cm_->training().global_batch / total_gpus_;
    model_summary_[mf::kGradientCommRatio] =
        log_scaled(allreduce_s / compute_per_gpu_s, 8);
    const double activation_s =
        static_cast<double>(cm_->training().seq_len) * model.hidden * 2 /
        nic_bytes_per_s;
    model_summary_[mf::kActivationCommRatio] =
        log_scaled(activation_s / best_gpu_time, 8);
  }
  model_summary_[mf::kBatchPerGpu] = log_scaled(
      static_cast<double>(cm_->training().global_batch) / total_gpus_, 10);
  structure_.reserve(kEnvMaxDepth);
  structure_slots_.reserve(kEnvMaxDepth);
  return absl::OkStatus();
}

void ConstructionEnv::GroupTypeSlots(int types) {
  // At most kEnvTypeSlots types: one type per type slot, its own features.
  // More: consecutive runs of device slots (the rule in construction_env.h).
  for (int s = 0; s < types; ++s) {
    state_slot_[s] = types <= kEnvTypeSlots ? s : s * kEnvTypeSlots / types;
  }
  for (int g = 0; g < kEnvTypeSlots; ++g) {
    std::array<float, kEnvTypeFeatures>& f = state_static_[g];
    std::array<double, kEnvTypeFeatures> sum{};
    std::array<double, kEnvTypeFeatures> weight{};
    int gpus = 0;
    for (int s = 0; s < types; ++s) {
      if (state_slot_[s] != g) continue;
      gpus += slot_gpus_[s];
      for (int n : slot_nodes_[s]) state_slot_nodes_[g].push_back(n);
      for (int i = 0; i < kEnvTypeFeatures; ++i) {
        // A TP degree the type cannot run contributes nothing (its
        // features are 0 there, as for a type slot on its own).
        const bool per_tp = i >= tf::kRelativeSpeed && i < tf::kNodesOfSize;
        const int k = per_tp ? (i - tf::kRelativeSpeed) % kEnvTpSlots : 0;
        if (per_tp && !tp_allowed_[s][k]) continue;
        sum[i] += static_cast<double>(slot_gpus_[s]) * static_[s][i];
        weight[i] += slot_gpus_[s];
      }
    }
    state_slot_gpus_[g] = gpus;
    if (gpus == 0) continue;
    // A type alone in its slot gets its own features back exactly (a float
    // times a GPU count is exact in double, and so is the division).
    for (int i = 0; i < kEnvTypeFeatures; ++i)
      f[i] = weight[i] > 0 ? static_cast<float>(sum[i] / weight[i]) : 0;
    f[tf::kPresent] = 1;
    f[tf::kShare] = static_cast<float>(gpus) / total_gpus_;
  }
}

int ConstructionEnv::SlotOfType(int gpu_type) const {
  for (int s = 0; s < kEnvDeviceSlots; ++s) {
    if (slot_type_[s] == gpu_type && gpu_type >= 0) return s;
  }
  return -1;
}

void ConstructionEnv::Reset() {
  current_ = empty_;
  end_ = EpisodeEnd::kRunning;
  episode_return_ = 0;
  history_.clear();
  StartTemplate();
}

int ConstructionEnv::StageCapacity() const {
  // A stage at the type's smallest TP m takes m of a node's free GPUs, so a
  // node with f free holds floor(f / m) of them; TP degrees are powers of
  // two, so a stage at TP k (a multiple of m) lowers this count by exactly
  // k / m whichever node it lands on. The count is therefore exact for any
  // placement, which makes the masks' look-ahead exact.
  int capacity = 0;
  for (int s = 0; s < kEnvDeviceSlots; ++s) {
    if (min_tp_[s] == 0) continue;
    for (int n : slot_nodes_[s])
      capacity += scratch_.FreeOnNode(n) / min_tp_[s];
  }
  return capacity;
}

void ConstructionEnv::ClearMasks() {
  depth_mask_.fill(0);
  device_mask_.fill(0);
  tp_mask_.fill(0);
}

void ConstructionEnv::StartTemplate() {
  state_valid_ = false;
  scratch_ = current_->pool;  // copy-assignment reuses scratch_'s storage
  structure_.clear();
  structure_slots_.clear();
  depth_ = 0;
  pending_slot_ = -1;
  previous_node_ = -1;
  capacity_ = StageCapacity();
  ClearMasks();
  if (templates_placed() >= config_.max_templates) {
    EndEpisode(EpisodeEnd::kMaxTemplates);
    return;
  }
  const int deepest = std::min(depth_limit_, capacity_);
  if (deepest < 1) {
    EndEpisode(EpisodeEnd::kNoStageLeft);
    return;
  }
  head_ = EnvHead::kDepth;
  // An empty plan is no plan: STOP only once a template stands.
  depth_mask_[0] = templates_placed() > 0 ? 1 : 0;
  for (int d = 1; d <= deepest; ++d) depth_mask_[d] = 1;
}

void ConstructionEnv::UpdateDeviceMask() {
  device_mask_.fill(0);
  for (int s = 0; s < kEnvDeviceSlots; ++s) {
    if (min_tp_[s] == 0) continue;
    device_mask_[s] =
        scratch_.LargestFreeOfType(slot_type_[s]) >= min_tp_[s] ? 1 : 0;
  }
}

void ConstructionEnv::UpdateTpMask() {
  tp_mask_.fill(0);
  const int s = pending_slot_;
  const int largest = scratch_.LargestFreeOfType(slot_type_[s]);
  const int later_stages = depth_ - static_cast<int>(structure_.size()) - 1;
  for (int k = 0; k < kEnvTpSlots; ++k) {
    const int tp = 1 << k;
    if (!tp_allowed_[s][k] || tp > largest) continue;
    if (capacity_ - tp / min_tp_[s] < later_stages) continue;
    tp_mask_[k] = 1;
  }
}

void ConstructionEnv::EndEpisode(EpisodeEnd why) {
  ClearMasks();
  head_ = EnvHead::kDone;
  end_ = why;
  state_valid_ = false;
}

absl::Span<const uint8_t> ConstructionEnv::LegalMask() const {
  switch (head_) {
    case EnvHead::kDepth:
      return absl::MakeConstSpan(depth_mask_);
    case EnvHead::kDevice:
      return absl::MakeConstSpan(device_mask_);
    case EnvHead::kTp:
      return absl::MakeConstSpan(tp_mask_);
    case EnvHead::kDone:
      break;
  }
  return {};
}

StepOutcome ConstructionEnv::Step(int action) {
  CHECK(head_ != EnvHead::kDone) << "Step on a finished episode";
  const absl::Span<const uint8_t> mask = LegalMask();
  CHECK(action >= 0 && action < static_cast<int>(mask.size()) && mask[action])
      << "illegal action " << action << " for head " << static_cast<int>(head_);
  state_valid_ = false;
  StepOutcome out;
  switch (head_) {
    case EnvHead::kDepth:
      if (action == 0) {
        EndEpisode(EpisodeEnd::kStop);
        out.done = true;
        return out;
      }
      depth_ = action;
      depth_mask_.fill(0);
      head_ = EnvHead::kDevice;
      UpdateDeviceMask();
      return out;
    case EnvHead::kDevice:
      pending_slot_ = action;
      device_mask_.fill(0);
      head_ = EnvHead::kTp;
      UpdateTpMask();
      return out;
    case EnvHead::kTp: {
      const int tp = 1 << action;
      const int type = slot_type_[pending_slot_];
      const int node =
          scratch_.PlaceStage(type, tp, previous_node_, &placement_scratch_);
      CHECK_GE(node, 0) << "the TP mask admitted a stage no node holds";
      previous_node_ = node;
      capacity_ -= tp / min_tp_[pending_slot_];
      structure_.push_back(StageChoice{type, tp});
      structure_slots_.push_back(pending_slot_);
      pending_slot_ = -1;
      tp_mask_.fill(0);
      if (static_cast<int>(structure_.size()) < depth_) {
        head_ = EnvHead::kDevice;
        UpdateDeviceMask();
        return out;
      }
      return CompleteTemplate();
    }
    case EnvHead::kDone:
      break;
  }
  LOG(FATAL) << "unreachable";
}

StepOutcome ConstructionEnv::CompleteTemplate() {
  StepOutcome out;
  out.template_completed = true;
  const double before = throughput_iters_per_s();
  ++fills_;
  key_scratch_ = history_;
  for (size_t i = 0; i < structure_.size(); ++i) {
    key_scratch_.push_back(static_cast<char>(structure_slots_[i] * kEnvTpSlots +
                                             Log2Exact(structure_[i].tp) + 1));
  }
  key_scratch_.push_back('\0');
  std::shared_ptr<const FilledPlan> filled;
  if (auto it = fill_cache_.find(key_scratch_); it != fill_cache_.end()) {
    filled = it->second;
    ++fill_cache_hits_;
  } else {
    absl::StatusOr<FillResult> r =
        fill_.Extend(current_->plan, current_->pool, structure_, &evaluations_);
    // The masks rule out every other failure (see DepthMask()).
    CHECK(r.ok() || r.status().code() == absl::StatusCode::kFailedPrecondition)
        << r.status();
    if (r.ok()) {
      filled = std::make_shared<const FilledPlan>(FilledPlan{
          std::move(r->plan), std::move(r->pool), r->iteration_time_s});
    }
    if (config_.fill_cache_entries > 0) {
      if (static_cast<int>(fill_cache_.size()) >= config_.fill_cache_entries)
        fill_cache_.clear();
      fill_cache_.emplace(key_scratch_, filled);
    }
  }
  const bool ok = filled != nullptr;
  if (!ok) {
    if (templates_placed() == 0) {
      out.reward = -config_.infeasible_penalty;
      EndEpisode(EpisodeEnd::kInfeasibleFirstTemplate);
    } else {
      EndEpisode(EpisodeEnd::kInfeasibleLaterTemplate);
    }
    episode_return_ += out.reward;
    out.done = true;
    return out;
  }
  current_ = std::move(filled);
  history_ = key_scratch_;
  out.reward = (throughput_iters_per_s() - before) / reference_throughput_;
  episode_return_ += out.reward;
  StartTemplate();
  out.done = done();
  return out;
}

double ConstructionEnv::throughput_iters_per_s() const {
  const double t = current_->iteration_time_s;
  return std::isfinite(t) ? 1.0 / t : 0.0;
}

double ConstructionEnv::normalized_throughput() const {
  return throughput_iters_per_s() / reference_throughput_;
}

int ConstructionEnv::FeasibleDepthCount() const {
  int n = 0;
  for (int d = 1; d < kEnvDepthActions; ++d) n += depth_mask_[d];
  return n;
}

int ConstructionEnv::FeasibleDepth(int k) const {
  CHECK_GE(k, 0);
  for (int d = 1; d < kEnvDepthActions; ++d) {
    if (depth_mask_[d] && k-- == 0) return d;
  }
  LOG(FATAL) << "FeasibleDepth: index past FeasibleDepthCount()";
}

int ConstructionEnv::UniformFeasibleDepth(absl::BitGenRef rng) const {
  CHECK(head_ == EnvHead::kDepth) << "UniformFeasibleDepth off the depth head";
  const int count = FeasibleDepthCount();
  CHECK_GT(count, 0) << "the depth head acts with no legal depth";
  return FeasibleDepth(absl::Uniform<int>(rng, 0, count));
}

int ConstructionEnv::UniformLegalAction(absl::BitGenRef rng) const {
  const absl::Span<const uint8_t> mask = LegalMask();
  CHECK(!mask.empty()) << "UniformLegalAction on a finished episode";
  const int legal = std::accumulate(mask.begin(), mask.end(), 0);
  CHECK_GT(legal, 0) << "the acting head has no legal action";
  int k = absl::Uniform<int>(rng, 0, legal);
  for (int a = 0; a < static_cast<int>(mask.size()); ++a) {
    if (mask[a] && k-- == 0) return a;
  }
  LOG(FATAL) << "unreachable";
}

double ConstructionEnv::RunUniformEpisode(absl::BitGenRef rng) {
  double total = 0;
  while (!done()) total += Step(UniformLegalAction(rng)).reward;
  return total;
}

int ConstructionEnv::LargestAllowedTp(int slot, int free_block) const {
  int best = 0;
  for (int k = 0; k < kEnvTpSlots; ++k) {
    if (tp_allowed_[slot][k] && (1 << k) <= free_block) best = 1 << k;
  }
  return best;
}

double ConstructionEnv::LayerMemoryRatio(int slot, int tp, int layers) const {
  const int k = Log2Exact(tp);
  return std::min(layers * layer_bytes_[slot][k] / usable_bytes_[slot],
                  kMemoryRatioClip);
}

void ConstructionEnv::ComputeState() const {
  const int layers = cm_->model().num_layers;
  const int free_total = scratch_.TotalFree();
  const double log_total = std::log2(1.0 + total_gpus_);
  state_.fill(0);
  depth_rows_.fill(0);
  device_rows_.fill(0);
  // Largest free block on one node, per device slot.
  std::array<int, kEnvDeviceSlots> largest{};
  std::array<int, kEnvTypeSlots> state_free{};
  for (int s = 0; s < kEnvDeviceSlots; ++s) {
    if (slot_type_[s] < 0) continue;
    for (int n : slot_nodes_[s])
      largest[s] = std::max(largest[s], scratch_.FreeOnNode(n));
    state_free[state_slot_[s]] += scratch_.FreeOfType(slot_type_[s]);
  }
  for (int g = 0; g < kEnvTypeSlots; ++g) {
    if (state_slot_gpus_[g] == 0) continue;
    float* f = &state_[g * kEnvTypeFeatures];
    std::copy(state_static_[g].begin(), state_static_[g].end(), f);
    f[tf::kRemainingGpus] =
        static_cast<float>(state_free[g]) / state_slot_gpus_[g];
    int nodes_with_free = 0;
    const float per_node = 1.0f / state_slot_nodes_[g].size();
    for (int n : state_slot_nodes_[g]) {
      const int f_n = scratch_.FreeOnNode(n);
      if (f_n == 0) continue;
      ++nodes_with_free;
      f[tf::kNodesOfSize + NodeBucket(f_n)] += per_node;
    }
    f[tf::kRemainingNodes] = nodes_with_free * per_node;
  }

  float* g = &state_[kEnvGlobalOffset];
  g[gf::kLogScale] = summary_[sf::kLogScale];
  g[gf::kRemainingGpus] = static_cast<float>(free_total) / total_gpus_;
  g[gf::kTemplateProgress] =
      static_cast<float>(templates_placed()) / config_.max_templates;
  if (head_ == EnvHead::kDepth) g[gf::kHeadDepth] = 1;
  if (head_ == EnvHead::kDevice) g[gf::kHeadDevice] = 1;
  if (head_ == EnvHead::kTp) g[gf::kHeadTp] = 1;
  const int stage = static_cast<int>(structure_.size());
  g[gf::kDepth] = static_cast<float>(depth_) / kEnvMaxDepth;
  g[gf::kStage] = static_cast<float>(stage) / kEnvMaxDepth;
  g[gf::kStagesLeft] = static_cast<float>(depth_ - stage) / kEnvMaxDepth;
  if (stage > 0) {
    g[gf::kPreviousType + state_slot_[structure_slots_.back()]] = 1;
    g[gf::kPreviousTp] = Log2Exact(structure_.back().tp) / 3.0f;
  }
  if (pending_slot_ >= 0)
    g[gf::kPendingType + state_slot_[pending_slot_]] = 1;
  g[gf::kThroughput] = static_cast<float>(normalized_throughput());
  g[gf::kStageCapacity] = static_cast<float>(capacity_) / total_gpus_;
  for (int d = 1; d <= kEnvMaxDepth; ++d) {
    state_[kEnvDepthCountOffset + d - 1] =
        static_cast<float>(std::log2(1.0 + free_total / d) / log_total);
  }
  std::copy(summary_.begin(), summary_.end(), &state_[kEnvSummaryOffset]);
  std::copy(model_summary_.begin(), model_summary_.end(),
            &state_[kEnvModelSummaryOffset]);

  // Depth candidates.
  for (int a = 0; a < kEnvDepthActions; ++a) {
    float* r = &depth_rows_[a * kEnvDepthFeatures];
    r[df::kLegal] = depth_mask_[a];
    if (a == 0) {
      r[df::kIsStop] = 1;
      r[df::kThroughput] = g[gf::kThroughput];
      continue;
    }
    const int per_stage = (layers + a - 1) / a;
    r[df::kDepth] = static_cast<float>(a) / kEnvMaxDepth;
    r[df::kReplicaBound] =
        static_cast<float>(std::log2(1.0 + free_total / a) / log_total);
    r[df::kLayersPerStage] = static_cast<float>(per_stage) / layers;
    double ratio = kMemoryRatioClip;
    for (int s = 0; s < kEnvDeviceSlots; ++s) {
      if (slot_type_[s] < 0) continue;
      const int tp = LargestAllowedTp(s, largest[s]);
      if (tp > 0) ratio = std::min(ratio, LayerMemoryRatio(s, tp, per_stage));
    }
    r[df::kMemoryRatio] = static_cast<float>(ratio);
  }

  // Device candidates for the stage about to be chosen.
  const int d = std::max(depth_, 1);
  const int per_stage = (layers + d - 1) / d;
  for (int s = 0; s < kEnvDeviceSlots; ++s) {
    if (slot_type_[s] < 0) continue;
    const int free = scratch_.FreeOfType(slot_type_[s]);
    float* r = &device_rows_[s * kEnvDeviceFeatures];
    r[vf::kPresent] = 1;
    r[vf::kLegal] = device_mask_[s];
    r[vf::kRemainingGpus] = static_cast<float>(free) / slot_gpus_[s];
    r[vf::kLargestBlock] = static_cast<float>(largest[s]) / 8;
    r[vf::kSameAsPrevious] =
        !structure_slots_.empty() && structure_slots_.back() == s ? 1 : 0;
    int on_type = 0;
    for (int x : structure_slots_) on_type += x == s;
    r[vf::kStagesOfType] = static_cast<float>(on_type) / d;
    float speed = 0;
    for (int k = 0; k < kEnvTpSlots; ++k) {
      if (tp_allowed_[s][k] && (1 << k) <= largest[s])
        speed = std::max(speed, static_[s][tf::kEffectiveSpeed + k]);
    }
    r[vf::kBestEffectiveSpeed] = speed;
    const int tp = LargestAllowedTp(s, largest[s]);
    r[vf::kMemoryRatio] = static_cast<float>(
        tp > 0 ? LayerMemoryRatio(s, tp, per_stage) : kMemoryRatioClip);
    r[vf::kFreeShare] =
        free_total > 0 ? static_cast<float>(free) / free_total : 0;
  }

  // TP candidates for the pending type (its own features, not its group's).
  tp_rows_.fill(0);
  if (pending_slot_ >= 0) {
    const std::array<float, kEnvTypeFeatures>& type = static_[pending_slot_];
    namespace pf = env_tp_feature;
    for (int k = 0; k < kEnvTpSlots; ++k) {
      float* r = &tp_rows_[k * kEnvTpFeatures];
      r[pf::kRelativeSpeed] = type[tf::kRelativeSpeed + k];
      r[pf::kEffectiveSpeed] = type[tf::kEffectiveSpeed + k];
      r[pf::kLayerMemory] = type[tf::kLayerMemory + k];
      r[pf::kDegree + k] = 1;
    }
  }
  state_valid_ = true;
}

absl::Span<const float> ConstructionEnv::State() const {
  if (!state_valid_) ComputeState();
  return absl::MakeConstSpan(state_);
}

absl::Span<const float> ConstructionEnv::DepthCandidates() const {
  if (!state_valid_) ComputeState();
  return absl::MakeConstSpan(depth_rows_);
}

absl::Span<const float> ConstructionEnv::DeviceCandidates() const {
  if (!state_valid_) ComputeState();
  return absl::MakeConstSpan(device_rows_);
}

absl::Span<const float> ConstructionEnv::TpCandidates() const {
  CHECK(head_ == EnvHead::kTp) << "TpCandidates off the TP head";
  if (!state_valid_) ComputeState();
  return absl::MakeConstSpan(tp_rows_);
}

}  // namespace arachne
