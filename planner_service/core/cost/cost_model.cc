#include "planner_service/core/cost/cost_model.h"

#include <algorithm>
#include <bit>
#include <cmath>

#include "absl/container/inlined_vector.h"
#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "glog/logging.h"

namespace arachne {
namespace {

constexpr double kGiB = 1024.0 * 1024.0 * 1024.0;

// What a collective of `comm_s` that compute covers adds: the compute it
// overlaps stretches to its length (OverlappedTime).
double HiddenCommCost(double comm_s, double slowdown) {
  return comm_s * slowdown / (1 + slowdown);
}

}  // namespace

double OverlappedTime(double compute_s, double comm_s, double slowdown) {
  if (comm_s <= 0) return compute_s;
  if (comm_s >= compute_s * (1 + slowdown)) return comm_s;
  return compute_s + HiddenCommCost(comm_s, slowdown);
}
// Per-template work the balance and the pricing share: placement facts
// (linear in the placement) and each template's slowest stage and sum of
// stages per micro-batch. Inline for up to 16 templates (every planner but
// HexiScale, whose one-replica pipelines can number in the hundreds).
// The facts are read through `facts`: the local arrays (default-initialised,
// so only the entries of each template's depth are ever written) or a
// PricingScratch's, never copied.
struct CostModel::PlanWork {
  const PlacementFacts* facts = nullptr;
  std::array<PlacementFacts, 16> inline_facts;
  std::vector<PlacementFacts> heap_facts;
  absl::InlinedVector<double, 16> max_t, sum_t;
  // Every stage's time per micro-batch, template after template (what the
  // overlapped gradient reduction hides behind).
  absl::InlinedVector<double, kMaxPricedDepth> stage_t;
};

namespace {
// Copies of each expert shard over the whole plan: the stage's EDP in each
// of its template's replicas, spread over every replica (at least 1).
double ExpertCopies(const Stage& st, int template_replicas, int total_replicas) {
  return std::max(1.0, static_cast<double>(st.tiling.edp) * total_replicas /
                           template_replicas);
}
}  // namespace

int Log2Exact(int v) {
  if (v <= 0 || (v & (v - 1)) != 0) return -1;
  return std::countr_zero(static_cast<unsigned>(v));
}

absl::StatusOr<CostModel> CostModel::Create(const GpuCatalog& catalog,
                                            const ModelSpec& model,
                                            const TrainingConfig& training,
                                            const Cluster& cluster,
                                            const ProfileStore& profiles,
                                            CostParams params) {
  if (absl::Status s = model.Validate(); !s.ok()) return s;
  if (absl::Status s = training.Validate(); !s.ok()) return s;
  CostModel cm;
  cm.catalog_ = &catalog;
  cm.cluster_ = &cluster;
  cm.model_ = model;
  cm.training_ = training;
  cm.params_ = params;
  cm.has_dense_layers_ = !model.is_moe() || model.moe.dense_first_layers > 0;
  cm.sharding_ = training.EffectiveSharding();
  cm.iteration_flops_ = model.ModelTrainFlopsPerToken(training.seq_len) *
                        static_cast<double>(training.seq_len) *
                        training.global_batch;
  for (int i = 0; i < cluster.num_nodes(); ++i) {
    cm.nic_gbps_.push_back(cluster.NicGBps(i));
    cm.nic_share_.push_back(cluster.NicGBps(i) * params.nic_efficiency /
                            cluster.node(i).num_gpus);
  }
  cm.cells_.resize(static_cast<size_t>(catalog.size()) * (kMaxTpLog2 + 1) *
                   (kMaxMbsLog2 + 1));
  const std::string& profile_model =
      model.profile_name.empty() ? model.name : model.profile_name;
  const double bytes16 = 2.0;
  const FrameworkConfig& fw = training.framework;
  for (int type : cluster.types_present()) {
    const GpuType& gpu = catalog.type(type);
    // Measured-run corrections of this type (arachne calibrate); 1 when
    // not listed.
    auto scale_of = [&gpu](const std::map<std::string, double>& scales) {
      const auto it = scales.find(gpu.id);
      return it == scales.end() ? 1.0 : it->second;
    };
    const double compute_scale = scale_of(params.compute_scale);
    const double tp_comm_scale = scale_of(params.tp_comm_scale);
    const double attention_extra = scale_of(params.attention_scale) - 1.0;
    for (int tl = 0; tl <= kMaxTpLog2; ++tl) {
      // The profiles price TP collectives at the catalog's intra-node
      // bandwidth (a switch); nodes with a declared topology move them at
      // their slowest TP group's links instead (Cluster::SlowestTpGroupGbps).
      const double topology_scale =
          gpu.intra_node_gbps /
          cluster.SlowestTpGroupGbps(type, 1 << tl, gpu.intra_node_gbps);
      for (int ml = 0; ml <= kMaxMbsLog2; ++ml) {
        auto& cell = cm.cells_[cm.CellIndex(type, tl, ml)];
        for (int k = 0; k < kNumLayerKinds; ++k) {
          const LayerKind kind = static_cast<LayerKind>(k);
          ProfileKey key{profile_model, kind, gpu.id, 1 << tl, 1 << ml,
                         training.seq_len};
          const ProfileEntry* e = profiles.Find(key);
          if (e == nullptr) continue;
          LayerCost& c = cell[k];
          c.present = true;
          c.fwd_s = (e->fwd_ms + attention_extra * e->attention_fwd_ms) *
                    1e-3 * compute_scale;
          const double bwd_s =
              (e->bwd_ms + attention_extra * e->attention_bwd_ms) * 1e-3 *
              compute_scale;
          // The exposed share of the TP collectives, plus the compute the
          // hidden share slows while it overlaps it.
          const double exposed = fw.tp_comm_exposed_fraction;
          c.tp_comm_s = e->tp_comm_ms * 1e-3 *
                        (exposed + HiddenCommCost(1 - exposed,
                                                  params.overlap_compute_slowdown)) *
                        tp_comm_scale * topology_scale;
          c.params = static_cast<double>(e->param_count);
          const double act = static_cast<double>(e->activation_bytes);
          const bool block = kind == LayerKind::kDense ||
                             kind == LayerKind::kMoeAttention ||
                             kind == LayerKind::kMoeExperts;
          c.compute_s = c.fwd_s + bwd_s;
          c.activation_bytes = act;
          c.full_activation_bytes = act;
          if (block && training.recompute == Recompute::kSelective) {
            c.compute_s += params.selective_recompute_fwd_fraction * c.fwd_s;
            c.activation_bytes = act * params.selective_activation_fraction;
          } else if (block && training.recompute == Recompute::kFull) {
            // Keep only the block input, 2·s·b·h (Korthikanti et al. 2022,
            // Table 2): every TP rank holds all of it unless sequence
            // parallelism shards it; the forward runs again before the
            // backward.
            const int input_shards = fw.sequence_parallel ? 1 << tl : 1;
            c.compute_s += c.fwd_s;
            c.activation_bytes =
                kind == LayerKind::kMoeExperts
                    ? 0
                    : bytes16 * (1 << ml) * training.seq_len * model.hidden /
                          input_shards;
          }
        }
      }
    }
  }
  return cm;
}

int CostModel::CellIndex(int gpu_type, int tp_log2, int mbs_log2) const {
  return (gpu_type * (kMaxTpLog2 + 1) + tp_log2) * (kMaxMbsLog2 + 1) +
         mbs_log2;
}

const CostModel::LayerRow& CostModel::Row(int gpu_type, int tp,
                                          int mbs) const {
  const int tl = Log2Exact(tp), ml = Log2Exact(mbs);
  if (gpu_type < 0 || gpu_type >= catalog_->size() || tl < 0 ||
      tl > kMaxTpLog2 || ml < 0 || ml > kMaxMbsLog2) {
    return absent_row_;
  }
  return cells_[CellIndex(gpu_type, tl, ml)];
}

const LayerCost& CostModel::Layer(LayerKind kind, int gpu_type, int tp,
                                  int mbs) const {
  return Row(gpu_type, tp, mbs)[static_cast<int>(kind)];
}

[[gnu::always_inline]] inline CostModel::StageCells CostModel::CellsOf(const Template& t, int s) const {
  const Stage& st = t.stages[s];
  StageCells c;
  c.layers = &Row(st.gpu_type, st.tp, t.micro_batch_size);
  c.n_moe = model_.MoeLayersIn(st.layer_begin, st.layer_end);
  c.n_dense = st.num_layers() - c.n_moe;
  c.experts = c.n_moe > 0 ? &Row(st.gpu_type, st.tiling.etp, t.micro_batch_size)
                          : &absent_row_;
  return c;
}

bool CostModel::Supports(int gpu_type, int tp, int mbs) const {
  if (has_dense_layers_ && !HasProfile(LayerKind::kDense, gpu_type, tp, mbs))
    return false;
  if (model_.is_moe() &&
      !HasProfile(LayerKind::kMoeAttention, gpu_type, tp, mbs))
    return false;
  return HasProfile(LayerKind::kEmbedding, gpu_type, tp, mbs) &&
         HasProfile(LayerKind::kLmHead, gpu_type, tp, mbs);
}

double CostModel::UsableMemoryGib(int gpu_type) const {
  return catalog_->type(gpu_type).memory_gib * params_.usable_memory_fraction;
}

CostModel::PlacementFacts CostModel::FactsOf(const Template& t) const {
  PlacementFacts f;
  FillFacts(t, f);
  return f;
}

void CostModel::FillFacts(const Template& t, PlacementFacts& f) const {
  const GpuCatalog& catalog = *catalog_;
  const double* nic_share = nic_share_.data();
  const double* nic_gbps = nic_gbps_.data();
  const double p2p_nic_eff = params_.nic_efficiency;
  const bool full_tensor_sends = !training_.framework.pipeline_scatter_gather &&
                                 !training_.framework.sequence_parallel;
  const int d = t.depth();
  const int replicas = t.replicas;
  const StagePlacement* at = t.placement.data();  // at[r * d + s]
  // Members of each stage's data-parallel rings per node: one TP rank of
  // every replica of stage s on a node belongs to the same ring. A count
  // is the current stage's when its mark is, so none is ever cleared.
  struct RingCount {
    uint64_t mark = 0;
    int members = 0;
  };
  thread_local std::vector<RingCount> rings;
  thread_local uint64_t mark = 0;
  if (rings.size() < nic_share_.size()) rings.resize(nic_share_.size());
  // Stage-major, so every fact of a stage comes from one pass over its
  // replicas, and a second for its rings only when a node holds two of
  // them (pricing is linear in the placement; on a 512-GPU plan this is a
  // quarter of what pricing costs).
  const int first_node = replicas > 0 && d > 0 ? at[0].node : -1;
  bool one_node = first_node >= 0;
  f.min_ring_share = kInfeasible;
  for (int s = 0; s < d; ++s) {
    const Stage& st = t.stages[s];
    const bool has_next = s + 1 < d;
    const int tp_next = has_next ? t.stages[s + 1].tp : 0;
    const double intra_gbps =
        has_next ? catalog.type(st.gpu_type).intra_node_gbps : 0;
    // Without the scatter/gather of the boundary activation (and without
    // sequence parallelism, which shards it anyway) every TP rank sends
    // the whole tensor through the same NIC: the group moves t copies.
    const int copies = full_tensor_sends ? std::max(st.tp, tp_next) : 1;
    const int stage_node = replicas > 0 ? at[s].node : -1;
    double min_share = kInfeasible, boundary = kInfeasible;
    bool single_node = true, shared_node = false;
    ++mark;
    for (int r = 0; r < replicas; ++r) {
      const int node = at[r * d + s].node;
      min_share = std::min(min_share, nic_share[node]);
      single_node = single_node && node == stage_node;
      RingCount& ring = rings[node];
      ring.members = (ring.mark == mark ? ring.members : 0) + 1;
      ring.mark = mark;
      shared_node = shared_node || ring.members > 1;
      if (!has_next) continue;
      const int next = at[r * d + s + 1].node;
      double bw;
      if (next == node) {
        bw = intra_gbps;
      } else {
        // The TP group's share of each node's NIC: every GPU of a node
        // sends at the same time in the steady state.
        bw = std::min(std::min(nic_share[node] * st.tp,
                               nic_share[next] * tp_next),
                      std::min(nic_gbps[node], nic_gbps[next]) * p2p_nic_eff);
        if (full_tensor_sends) bw /= copies;
      }
      boundary = std::min(boundary, bw);
    }
    // A ring with k members on a node gets k GPUs' shares of its NIC
    // (with one member per node, each node's share).
    double ring_share = min_share;
    if (shared_node) {
      ring_share = kInfeasible;
      for (int r = 0; r < replicas; ++r) {
        const int node = at[r * d + s].node;
        ring_share = std::min(ring_share, nic_share[node] * rings[node].members);
      }
    }
    f.stage_min_share[s] = min_share;
    f.boundary_gbps[s] = boundary;
    f.stage_single_node[s] = single_node;
    f.stage_ring_share[s] = ring_share;
    f.min_ring_share = std::min(f.min_ring_share, ring_share);
    one_node = one_node && single_node && stage_node == first_node;
  }
  f.only_node = one_node ? first_node : -1;
}

const CostModel::PlacementFacts* CostModel::ScratchFacts(
    const Plan& plan, PricingScratch& scratch) const {
  const int n = static_cast<int>(plan.templates.size());
  if (static_cast<int>(scratch.facts_.size()) != n) {
    // Another plan: the stage times kept for the last one go with its facts.
    scratch.facts_.resize(n);
    scratch.timed_.clear();
    for (int j = 0; j < n; ++j) FillFacts(plan.templates[j], scratch.facts_[j]);
  }
  return scratch.facts_.data();
}

namespace {
// Whether `a` and `b` are priced the same apart from their placement.
bool SameStage(const Stage& a, const Stage& b) {
  return a.gpu_type == b.gpu_type && a.tp == b.tp &&
         a.layer_begin == b.layer_begin && a.layer_end == b.layer_end &&
         a.tiling == b.tiling;
}
}  // namespace

Infeasibility CostModel::PrepareWork(const Plan& plan, bool stage_times,
                                     PlanWork& work,
                                     PricingScratch* scratch) const {
  const int n = static_cast<int>(plan.templates.size());
  if (scratch != nullptr) {
    work.facts = ScratchFacts(plan, *scratch);
  } else {
    PlacementFacts* out = work.inline_facts.data();
    if (n > static_cast<int>(work.inline_facts.size())) {
      work.heap_facts.resize(n);
      out = work.heap_facts.data();
    }
    for (int j = 0; j < n; ++j) FillFacts(plan.templates[j], out[j]);
    work.facts = out;
  }
  if (!stage_times) return Infeasibility::kOk;
  work.max_t.assign(n, 0.0);
  work.sum_t.assign(n, 0.0);
  work.stage_t.clear();
  // A stage's time reads, besides its template and its facts, the plan's
  // template count and replicas (parameter gathers under FSDP).
  int total_replicas = 0;
  if (scratch != nullptr) {
    for (const Template& t : plan.templates) total_replicas += t.replicas;
    scratch->timed_.resize(n);
  }
  for (int j = 0; j < n; ++j) {
    const Template& t = plan.templates[j];
    PricingScratch::TimedTemplate* kept =
        scratch != nullptr ? &scratch->timed_[j] : nullptr;
    if (kept != nullptr && kept->valid &&
        kept->micro_batch_size == t.micro_batch_size &&
        kept->replicas == t.replicas &&
        kept->total_replicas == total_replicas && kept->templates == n &&
        kept->stages.size() == t.stages.size()) {
      // Under the same key a stage's time reads only the stage: the
      // stages that changed are priced again, the rest reused. Summed in
      // stage order, as afresh.
      bool changed = false;
      double max_t = 0, sum_t = 0;  // locals: the vectors' stores alias
      for (int s = 0; s < t.depth(); ++s) {
        double ts = kept->stage_t[s];
        if (!SameStage(t.stages[s], kept->stages[s])) {
          ts = StageTimeTerms(plan, j, s, work.facts[j], CellsOf(t, s)).total();
          if (!std::isfinite(ts)) {
            kept->valid = false;
            return Infeasibility::kMissingProfile;
          }
          kept->stages[s] = t.stages[s];
          kept->stage_t[s] = ts;
          kept->ForgetStage(s);
          changed = true;
        }
        max_t = std::max(max_t, ts);
        sum_t += ts;
      }
      work.stage_t.insert(work.stage_t.end(), kept->stage_t.begin(),
                          kept->stage_t.end());
      work.max_t[j] = max_t;
      work.sum_t[j] = sum_t;
      if (changed) {
        kept->priced = false;
        kept->fits_deep = 0;
      }
      continue;
    }
    if (kept != nullptr) kept->valid = false;
    const size_t first = work.stage_t.size();
    for (int s = 0; s < t.depth(); ++s) {
      const double ts =
          StageTimeTerms(plan, j, s, work.facts[j], CellsOf(t, s)).total();
      if (!std::isfinite(ts)) return Infeasibility::kMissingProfile;
      work.stage_t.push_back(ts);
      work.max_t[j] = std::max(work.max_t[j], ts);
      work.sum_t[j] += ts;
    }
    if (kept != nullptr) {
      kept->valid = true;
      kept->priced = false;
      kept->micro_batch_size = t.micro_batch_size;
      kept->replicas = t.replicas;
      kept->total_replicas = total_replicas;
      kept->templates = n;
      kept->stages.assign(t.stages.begin(), t.stages.end());
      kept->stage_t.assign(work.stage_t.begin() + first, work.stage_t.end());
      kept->fits_deep = 0;
      kept->synced.assign(t.depth(), 0);
      kept->stage_sync.assign(t.depth(), 0.0);
      kept->stage_opt.assign(t.depth(), 0.0);
      kept->mem_in_flight.assign(t.depth(), -1);
      kept->mem_fits.assign(t.depth(), 0);
    }
  }
  return Infeasibility::kOk;
}

// Inlined into the pricing loops, where the terms stay in registers.
[[gnu::always_inline]] inline CostModel::StageTerms CostModel::StageTimeTerms(
    const Plan& plan, int t, int s, const PlacementFacts& f,
    const StageCells& cells) const {
  const Template& tmpl = plan.templates[t];
  StageTerms terms;
  const Stage& st = tmpl.stages[s];
  const int mbs = tmpl.micro_batch_size;
  const double h = model_.hidden;
  const int n_moe = cells.n_moe;
  const int n_dense = cells.n_dense;
  const LayerRow& row = *cells.layers;
  auto inf = [] {
    StageTerms x;
    x.compute_s = kInfeasible;
    return x;
  };
  if (n_dense > 0) {
    const LayerCost& c = row[static_cast<int>(LayerKind::kDense)];
    if (!c.present) return inf();
    terms.compute_s += n_dense * c.compute_s;
    terms.tp_comm_s += n_dense * c.tp_comm_s;
  }
  if (n_moe > 0) {
    const LayerCost& a = row[static_cast<int>(LayerKind::kMoeAttention)];
    const LayerCost& e = (*cells.experts)[static_cast<int>(LayerKind::kMoeExperts)];
    if (!a.present || !e.present) return inf();
    const double scale = static_cast<double>(st.tiling.etp) / st.tp;
    terms.compute_s += n_moe * (a.compute_s + e.compute_s * scale);
    terms.tp_comm_s += n_moe * (a.tp_comm_s + e.tp_comm_s * scale);
    if (st.tiling.ep > 1) {
      // Dispatch + combine, forward and backward: 4 * k * h * 2 bytes per
      // token of this GPU (sequence-parallel share), (ep-1)/ep leaves it.
      const double tokens = static_cast<double>(mbs) * training_.seq_len / st.tp;
      const double bytes = 4.0 * model_.moe.top_k * h * 2.0 * tokens *
                           (st.tiling.ep - 1) / st.tiling.ep;
      const bool intra = GroupsStayInNode(tmpl, s, st.tiling.etp * st.tiling.ep);
      const double bw = intra ? catalog_->type(st.gpu_type).intra_node_gbps
                              : f.stage_min_share[s];
      const double latency = 4.0 * (st.tiling.ep - 1) *
                             (intra ? params_.intra_node_step_latency_s
                                    : params_.network_step_latency_s);
      terms.all_to_all_s = n_moe * (bytes / (bw * 1e9) + latency);
    }
  }
  if (s == 0) {
    const LayerCost& c = row[static_cast<int>(LayerKind::kEmbedding)];
    if (!c.present) return inf();
    terms.compute_s += c.compute_s;
    terms.tp_comm_s += c.tp_comm_s;
  }
  if (s == tmpl.depth() - 1) {
    const LayerCost& c = row[static_cast<int>(LayerKind::kLmHead)];
    if (!c.present) return inf();
    terms.compute_s += c.compute_s;
    terms.tp_comm_s += c.tp_comm_s;
  }
  if (s + 1 < tmpl.depth()) {
    // Output activations forward and their gradient backward.
    const double bytes = 2.0 * mbs * training_.seq_len * h;
    terms.p2p_s = 2.0 * (bytes / (f.boundary_gbps[s] * 1e9) + params_.p2p_latency_s);
  }
  const FrameworkConfig& fw = training_.framework;
  terms.fixed_s = fw.micro_batch_fixed_s;
  if (sharding_ == StateSharding::kParameters) {
    int n = 0;
    for (const Template& x : plan.templates) n += x.replicas;
    if (n > 1) {
      // Every micro-batch all-gathers the stage's 16-bit weights for its
      // forward and again for its backward; prefetch hides what the
      // compute covers.
      const StageParams sp = ParamsOf(tmpl, s, cells);
      const bool intra = f.stage_single_node[s] && plan.templates.size() == 1;
      const double bw = intra ? catalog_->type(st.gpu_type).intra_node_gbps
                              : f.stage_ring_share[s];
      const double step = intra ? params_.intra_node_step_latency_s
                                : params_.network_step_latency_s;
      const double bytes = (sp.non_expert + sp.expert) * 2.0;
      const double gather = 2.0 * (params_.collective_base_latency_s +
                                   (n - 1) * step +
                                   (n - 1.0) / n * bytes / (bw * 1e9));
      terms.dp_gather_s =
          OverlappedTime(terms.compute_s, gather,
                         params_.overlap_compute_slowdown) -
          terms.compute_s;
    }
  }
  return terms;
}

double CostModel::StageTime(const Plan& plan, int t, int s) const {
  return StageTimeTerms(plan, t, s, FactsOf(plan.templates[t]),
                        CellsOf(plan.templates[t], s))
      .total();
}

double CostModel::StageTime(const Plan& plan, int t, int s,
                            PricingScratch& scratch) const {
  return StageTimeTerms(plan, t, s, ScratchFacts(plan, scratch)[t],
                        CellsOf(plan.templates[t], s))
      .total();
}

[[gnu::always_inline]] inline CostModel::StageParams CostModel::ParamsOf(const Template& t, int s,
                                          const StageCells& cells) const {
  const Stage& st = t.stages[s];
  const LayerRow& row = *cells.layers;
  StageParams p;
  if (cells.n_dense > 0)
    p.non_expert += cells.n_dense * row[static_cast<int>(LayerKind::kDense)].params;
  if (cells.n_moe > 0) {
    p.non_expert += cells.n_moe * row[static_cast<int>(LayerKind::kMoeAttention)].params;
    p.expert += cells.n_moe * (*cells.experts)[static_cast<int>(LayerKind::kMoeExperts)].params / st.tiling.ep;
  }
  if (s == 0) p.non_expert += row[static_cast<int>(LayerKind::kEmbedding)].params;
  if (s == t.depth() - 1) p.non_expert += row[static_cast<int>(LayerKind::kLmHead)].params;
  return p;
}

StageMemory CostModel::StageMemoryOf(const Plan& plan, int t, int s) const {
  const StageCells cells = CellsOf(plan.templates[t], s);
  return MemoryWithParams(plan, t, s, ParamsOf(plan.templates[t], s, cells),
                          cells);
}

[[gnu::always_inline]] inline StageMemory CostModel::MemoryWithParams(const Plan& plan, int t, int s,
                                        const StageParams& params,
                                        const StageCells& cells) const {
  const Template& tmpl = plan.templates[t];
  const Stage& st = tmpl.stages[s];
  int total_replicas = 0;
  for (const Template& x : plan.templates) total_replicas += x.replicas;
  const int n_moe = cells.n_moe;
  const int n_dense = cells.n_dense;
  const LayerRow& row = *cells.layers;
  const double p_ne = params.non_expert, p_e = params.expert;
  // `block_full`: the largest block's activations without recomputation.
  double act = 0, block_full = 0, extra_act = 0;
  if (n_dense > 0) {
    const LayerCost& c = row[static_cast<int>(LayerKind::kDense)];
    act += n_dense * c.activation_bytes;
    block_full = c.full_activation_bytes;
  }
  if (n_moe > 0) {
    const LayerCost& a = row[static_cast<int>(LayerKind::kMoeAttention)];
    const LayerCost& e = (*cells.experts)[static_cast<int>(LayerKind::kMoeExperts)];
    const double scale = static_cast<double>(st.tiling.etp) / st.tp;
    act += n_moe * (a.activation_bytes + e.activation_bytes * scale);
    block_full = std::max(block_full, a.full_activation_bytes +
                                          e.full_activation_bytes * scale);
  }
  // Under full recomputation one block's activations are live while it is
  // recomputed: the entry's own, so the attention kernel (an s x s score
  // tensor when materialized) and what a TP group without sequence
  // parallelism replicates count.
  const double working =
      training_.recompute == Recompute::kFull ? block_full : 0;
  if (s == 0) {
    extra_act +=
        row[static_cast<int>(LayerKind::kEmbedding)].activation_bytes;
  }
  if (s == tmpl.depth() - 1) {
    // Logits of the one micro-batch in the loss.
    extra_act +=
        row[static_cast<int>(LayerKind::kLmHead)].activation_bytes;
  }
  const FrameworkConfig& fw = training_.framework;
  const StateSharding sharding = sharding_;
  // Each part of the state is held whole, or 1/d of it when the framework
  // shards it over the data-parallel group (d = every replica for the
  // non-expert parameters, the EDP copies for the experts; a stage without
  // experts skips their division).
  const double shard =
      p_ne / total_replicas +
      (p_e > 0 ? p_e / ExpertCopies(st, tmpl.replicas, total_replicas) : 0.0);
  auto held = [&](double bytes_per_param, StateSharding from) {
    if (sharding >= from) return bytes_per_param * shard;
    return bytes_per_param * (p_ne + p_e);
  };
  double state_bytes =
      held(fw.weight_bytes_per_param, StateSharding::kParameters) +
      held(fw.grad_bytes_per_param, StateSharding::kGradients) +
      held(fw.optimizer_bytes_per_param + fw.optimizer_grad_bytes_per_param,
           StateSharding::kOptimizer);
  if (sharding == StateSharding::kParameters && st.num_layers() > 0) {
    // The gathered 16-bit weights of the layer running and the one
    // prefetched (FSDP's forward/backward prefetch).
    const double per_layer = (p_ne + p_e) / st.num_layers();
    state_bytes += 2.0 * std::min(2, st.num_layers()) * per_layer;
  }
  const int in_flight = std::min(tmpl.depth() - s, tmpl.max_micro_batches());
  StageMemory m;
  m.weights_gib = state_bytes / kGiB;
  m.activations_gib = (in_flight * act + working + extra_act) / kGiB;
  m.reserve_gib = fw.context_reserve_gib + fw.comm_buffer_gib +
                  fw.fragmentation * (m.weights_gib + m.activations_gib);
  return m;
}

void CostModel::PriceStageTilings(Plan& plan, int t, int s,
                                  absl::Span<const ExpertTiling> tilings,
                                  double memory_limit_gib,
                                  PricingScratch* scratch,
                                  absl::Span<double> memory_gib,
                                  absl::Span<double> time_s) const {
  CHECK_EQ(memory_gib.size(), tilings.size());
  CHECK_EQ(time_s.size(), tilings.size());
  Template& tmpl = plan.templates[t];
  Stage& st = tmpl.stages[s];
  const ExpertTiling keep = st.tiling;
  PlacementFacts own;
  const PlacementFacts* facts = &own;
  if (scratch != nullptr) {
    facts = &ScratchFacts(plan, *scratch)[t];
  } else {
    FillFacts(tmpl, own);
  }
  StageCells cells = CellsOf(tmpl, s);
  int cells_etp = keep.etp;
  for (size_t i = 0; i < tilings.size(); ++i) {
    st.tiling = tilings[i];
    if (cells.n_moe > 0 && st.tiling.etp != cells_etp) {
      cells.experts = &Row(st.gpu_type, st.tiling.etp, tmpl.micro_batch_size);
      cells_etp = st.tiling.etp;
    }
    memory_gib[i] =
        MemoryWithParams(plan, t, s, ParamsOf(tmpl, s, cells), cells)
            .total_gib();
    time_s[i] = memory_gib[i] > memory_limit_gib
                    ? kInfeasible
                    : StageTimeTerms(plan, t, s, *facts, cells).total();
  }
  st.tiling = keep;
}

Infeasibility CostModel::BalanceMicroBatches(Plan& plan,
                                             PricingScratch* scratch) const {
  const int n = static_cast<int>(plan.templates.size());
  const int64_t batch = training_.global_batch;
  if (n == 0) return Infeasibility::kBadStructure;
  if (n == 1) {
    Template& t = plan.templates[0];
    if (batch % t.micro_batch_size != 0) return Infeasibility::kBadBatch;
    t.total_micro_batches = static_cast<int>(batch / t.micro_batch_size);
    return t.total_micro_batches >= t.replicas ? Infeasibility::kOk
                                               : Infeasibility::kBadBatch;
  }
  PlanWork work;
  if (Infeasibility w = PrepareWork(plan, /*stage_times=*/true, work, scratch);
      w != Infeasibility::kOk)
    return w;
  return BalanceWith(plan, work);
}

Infeasibility CostModel::BalanceWith(Plan& plan, const PlanWork& work) const {
  const int n = static_cast<int>(plan.templates.size());
  const int64_t batch = training_.global_batch;
  // Per template: steady-state time per micro-batch (max stage) and the
  // fill/drain (sum of stages), so a replica with m micro-batches takes
  // (m - 1) * max + sum.
  const auto& max_t = work.max_t;
  const auto& sum_t = work.sum_t;
  // Smallest time X at which the replicas, each running as many whole
  // micro-batches as fit in X, cover the batch.
  // Samples per step of each template, read into plain arrays: the
  // bisection below evaluates this tens of times per balance.
  absl::InlinedVector<int64_t, 16> per_step(n);
  for (int j = 0; j < n; ++j) {
    per_step[j] = static_cast<int64_t>(plan.templates[j].replicas) *
                  plan.templates[j].micro_batch_size;
  }
  const double* sums = sum_t.data();
  const double* maxs = max_t.data();
  const int64_t* per = per_step.data();
  auto capacity = [&](double x, absl::InlinedVector<int64_t, 64>& m) {
    int64_t samples = 0;
    int64_t* mj = m.data();
    for (int j = 0; j < n; ++j) {
      mj[j] = x < sums[j] ? 1 : 1 + static_cast<int64_t>((x - sums[j]) / maxs[j]);
      samples += mj[j] * per[j];
    }
    return samples;
  };
  absl::InlinedVector<int64_t, 64> m(n, 0);
  // Micro-batches of every template's busiest replica together.
  auto steps = [&] {
    int64_t k = 0;
    for (int j = 0; j < n; ++j) k += m[j];
    return k;
  };
  double lo = 0, hi = 0;
  for (int j = 0; j < n; ++j) {
    const Template& t = plan.templates[j];
    hi = std::max(hi, sum_t[j] + max_t[j] * (batch / (t.replicas * t.micro_batch_size) + 1));
  }
  if (capacity(lo, m) >= batch) {
    hi = lo;
  } else {
    // Bisection, done once (lo, hi] holds a single step of one template:
    // then hi has the micro-batches of the smallest time, whatever its
    // exact value. Ties (steps of several templates at the same time) end
    // on the width instead.
    int64_t steps_lo = steps();
    capacity(hi, m);
    int64_t steps_hi = steps();
    for (int it = 0;
         it < 60 && steps_hi - steps_lo > 1 && hi - lo > 1e-9 * hi; ++it) {
      const double mid = 0.5 * (lo + hi);
      if (capacity(mid, m) >= batch) {
        hi = mid;
        steps_hi = steps();
      } else {
        lo = mid;
        steps_lo = steps();
      }
    }
  }
  int64_t samples = capacity(hi, m);
  absl::InlinedVector<int64_t, 64> total(n, 0);
  for (int j = 0; j < n; ++j) total[j] = m[j] * plan.templates[j].replicas;
  // Give back the excess, whole micro-batches from the largest sizes first,
  // taking from the templates whose busiest replica finishes last.
  int64_t excess = samples - batch;
  while (excess > 0) {
    int best = -1;
    double best_time = -1;
    for (int j = 0; j < n; ++j) {
      const Template& t = plan.templates[j];
      if (t.micro_batch_size > excess || total[j] <= t.replicas) continue;
      const int64_t mm = (total[j] + t.replicas - 1) / t.replicas;
      const double time = sum_t[j] + (mm - 1) * max_t[j];
      if (best < 0 || t.micro_batch_size > plan.templates[best].micro_batch_size ||
          (t.micro_batch_size == plan.templates[best].micro_batch_size &&
           time > best_time)) {
        best = j;
        best_time = time;
      }
    }
    if (best < 0) return Infeasibility::kBadBatch;
    --total[best];
    excess -= plan.templates[best].micro_batch_size;
  }
  for (int j = 0; j < n; ++j) {
    if (total[j] < plan.templates[j].replicas) return Infeasibility::kBadBatch;
    plan.templates[j].total_micro_batches = static_cast<int>(total[j]);
  }
  return Infeasibility::kOk;
}

// The structural checks of Evaluate, before any per-template work.
Infeasibility CostModel::CheckStructure(const Plan& plan) const {
  if (plan.templates.empty()) return Infeasibility::kBadStructure;
  for (const Template& t : plan.templates) {
    if (t.depth() == 0 || t.depth() > kMaxPricedDepth || t.replicas <= 0)
      return Infeasibility::kBadStructure;
  }
  return Infeasibility::kOk;
}

double CostModel::Evaluate(const Plan& plan, Infeasibility* why,
                           Prediction* detail) const {
  if (Infeasibility w = CheckStructure(plan); w != Infeasibility::kOk) {
    if (why) *why = w;
    return kInfeasible;
  }
  PlanWork work;
  PrepareWork(plan, /*stage_times=*/false, work);
  return EvaluateWith(plan, work, why, detail);
}

double CostModel::BalanceAndPrice(Plan& plan, Infeasibility* why,
                                  PricingScratch* scratch) const {
  auto fail = [&](Infeasibility w) {
    if (why) *why = w;
    return kInfeasible;
  };
  if (Infeasibility w = CheckStructure(plan); w != Infeasibility::kOk)
    return fail(w);
  PlanWork work;
  if (plan.templates.size() == 1) {
    // One template needs no stage times to balance, and pricing checks
    // memory before a missing profile: as BalanceMicroBatches then
    // IterationTime.
    if (Infeasibility w = BalanceMicroBatches(plan); w != Infeasibility::kOk)
      return fail(w);
    // With a scratch, the stage times are priced first so that what it
    // keeps of the template is reused (every stage has a profile then;
    // otherwise the untimed order decides which reason is reported).
    if (scratch == nullptr ||
        PrepareWork(plan, /*stage_times=*/true, work, scratch) !=
            Infeasibility::kOk) {
      work.max_t.clear();
      work.sum_t.clear();
      work.stage_t.clear();
      PrepareWork(plan, /*stage_times=*/false, work, scratch);
    }
  } else {
    if (Infeasibility w =
            PrepareWork(plan, /*stage_times=*/true, work, scratch);
        w != Infeasibility::kOk)
      return fail(w);
    if (Infeasibility w = BalanceWith(plan, work); w != Infeasibility::kOk)
      return fail(w);
  }
  return EvaluateWith(plan, work, why, nullptr, scratch);
}

CostModel::SyncContext CostModel::SyncContextOf(
    const Plan& plan, const PlacementFacts* facts) const {
  SyncContext c;
  for (const Template& t : plan.templates) c.total_replicas += t.replicas;
  c.templates = static_cast<int>(plan.templates.size());
  // Nodes the whole plan touches: a plan inside one node syncs over NVLink.
  const int first_node = plan.templates[0].placement[0].node;
  for (size_t j = 0; j < plan.templates.size(); ++j) {
    c.plan_min_ring_share =
        std::min(c.plan_min_ring_share, facts[j].min_ring_share);
    if (facts[j].only_node != first_node) c.plan_single_node = false;
  }
  const FrameworkConfig& fw = training_.framework;
  c.replicas_moved = 2.0 * (c.total_replicas - 1.0) / c.total_replicas;
  // Sharded gradients are reduce-scattered (half an all-reduce's traffic);
  // whole ones all-reduced.
  c.reduce_share = sharding_ >= StateSharding::kGradients ? 0.5 : 1.0;
  // Adam step, memory-bound, over the shard each GPU updates; fp16 also
  // reads the gradients once for the loss scaler's inf/NaN check.
  c.opt_sharded = sharding_ >= StateSharding::kOptimizer;
  c.step_bytes = fw.optimizer_step_bytes_per_param;
  if (training_.precision == Precision::kFp16)
    c.step_bytes += fw.grad_bytes_per_param;
  return c;
}

[[gnu::always_inline]] inline CostModel::SyncAndStep
CostModel::StageSyncAndStep(const Template& t, int s, const StageParams& sp,
                            double stage_s, const PlacementFacts& f,
                            SyncContext c) const {
  const Stage& st = t.stages[s];
  const FrameworkConfig& fw = training_.framework;
  // Gradient synchronisation of this stage's layers over every replica
  // of every template (ring all-reduce), experts over their EDP copies.
  const double p_ne = sp.non_expert, p_e = sp.expert;
  const bool intra = c.plan_single_node ||
                     (c.templates == 1 && f.stage_single_node[s]);
  const double bw =
      intra ? catalog_->type(st.gpu_type).intra_node_gbps
            : (c.templates == 1
                   ? f.stage_ring_share[s]
                   : std::min(f.stage_ring_share[s], c.plan_min_ring_share));
  const double step_latency = intra ? params_.intra_node_step_latency_s
                                    : params_.network_step_latency_s;
  // A ring all-reduce over n members moves 2 (n - 1) / n of the bytes
  // (`moved`, given: the replicas' is the same for every stage).
  auto ring = [&](double bytes, double n, double moved) {
    if (n <= 1 || bytes <= 0) return 0.0;
    return params_.collective_base_latency_s +
           2.0 * (n - 1) * step_latency + moved * bytes / (bw * 1e9);
  };
  // Experts, only on stages that hold some.
  const double edp_all =
      p_e > 0 ? ExpertCopies(st, t.replicas, c.total_replicas) : 1.0;
  const double g_experts =
      p_e > 0 ? ring(p_e * fw.grad_reduce_bytes_per_param, edp_all,
                     2.0 * (edp_all - 1) / edp_all)
              : 0.0;
  double g = c.reduce_share *
             (ring(p_ne * fw.grad_reduce_bytes_per_param, c.total_replicas,
                   c.replicas_moved) +
              g_experts);
  if (fw.overlap_grad_reduce) {
    // Buckets reduce while the last micro-batch's backward runs: about
    // two thirds of the stage's time per micro-batch, slowed while the
    // reduction overlaps it.
    const double backward = (2.0 / 3.0) * stage_s;
    g = OverlappedTime(backward, g, params_.overlap_compute_slowdown) -
        backward;
  }
  const double dist_ne = c.opt_sharded ? c.total_replicas : 1;
  const double dist_e = c.opt_sharded ? edp_all : 1;
  SyncAndStep out;
  out.sync_s = g;
  out.step_s = (p_ne / dist_ne + (p_e > 0 ? p_e / dist_e : 0.0)) *
               c.step_bytes / (catalog_->type(st.gpu_type).hbm_gbps * 1e9);
  return out;
}

CostModel::StageWeight CostModel::StageWeightOf(
    const Plan& plan, int t, int s, PricingScratch& scratch) const {
  const PlacementFacts* facts = ScratchFacts(plan, scratch);
  const Template& tmpl = plan.templates[t];
  const StageCells cells = CellsOf(tmpl, s);
  StageWeight w;
  w.time_s = StageTimeTerms(plan, t, s, facts[t], cells).total();
  const SyncAndStep ss =
      StageSyncAndStep(tmpl, s, ParamsOf(tmpl, s, cells), w.time_s, facts[t],
                       SyncContextOf(plan, facts));
  w.sync_s = ss.sync_s;
  w.step_s = ss.step_s;
  return w;
}

double CostModel::EvaluateWith(const Plan& plan, const PlanWork& work,
                               Infeasibility* why, Prediction* detail,
                               PricingScratch* scratch) const {
  auto fail = [&](Infeasibility w) {
    if (why) *why = w;
    return kInfeasible;
  };
  int total_replicas = 0;
  int64_t samples = 0;
  for (const Template& t : plan.templates) {
    total_replicas += t.replicas;
    samples += static_cast<int64_t>(t.total_micro_batches) * t.micro_batch_size;
  }
  if (samples != training_.global_batch) return fail(Infeasibility::kBadBatch);

  const PlacementFacts* facts = work.facts;
  const SyncContext sync_context = SyncContextOf(plan, facts);
  // Stage times already priced for the balance are not priced again.
  const bool timed = !work.max_t.empty();

  if (detail) {
    detail->stage_memory.assign(plan.templates.size(), {});
    detail->max_memory_gib = 0;
  }
  double worst_pipeline = 0, worst_sync = 0, worst_opt = 0;
  int critical = 0;
  size_t stage_index = 0;  // into work.stage_t
  // The scratch's templates PrepareWork keyed for this plan (timed: more
  // than one template). Under the scratch's contract the placement facts,
  // hence plan_single_node and plan_min_ring_share, are the same for every
  // plan it prices; with the key (stages, micro-batch size, replicas, the
  // plan's template and replica counts) and the stage times, so are each
  // stage's gradient sync and optimizer step. Only the memory reads the
  // balance (micro-batches in flight: min(d - s, the busiest replica's),
  // the same for every balance with at least d).
  PricingScratch::TimedTemplate* kept_all =
      scratch != nullptr && timed && detail == nullptr &&
              scratch->timed_.size() == plan.templates.size()
          ? scratch->timed_.data()
          : nullptr;
  for (size_t j = 0; j < plan.templates.size(); ++j) {
    const Template& t = plan.templates[j];
    const int d = t.depth();
    PricingScratch::TimedTemplate* kept =
        kept_all != nullptr && kept_all[j].valid ? &kept_all[j] : nullptr;
    const bool deep = t.max_micro_batches() >= d;
    // Whether stage s of a kept template fits with the micro-batches this
    // balance puts in flight, checked once per count.
    auto kept_stage_fits = [&](int s) {
      const int in_flight = std::min(d - s, t.max_micro_batches());
      if (kept->mem_in_flight[s] != in_flight) {
        const StageCells cells = CellsOf(t, s);
        const StageMemory mem = MemoryWithParams(
            plan, static_cast<int>(j), s, ParamsOf(t, s, cells), cells);
        kept->mem_in_flight[s] = in_flight;
        kept->mem_fits[s] =
            mem.total_gib() <= UsableMemoryGib(t.stages[s].gpu_type);
      }
      return kept->mem_fits[s] != 0;
    };
    if (kept != nullptr && kept->priced) {
      if (!deep || kept->fits_deep == 0) {
        for (int s = 0; s < d; ++s) {
          if (kept_stage_fits(s)) continue;
          if (deep) kept->fits_deep = -1;
          return fail(Infeasibility::kOutOfMemory);
        }
        if (deep) kept->fits_deep = 1;
      } else if (kept->fits_deep < 0) {
        return fail(Infeasibility::kOutOfMemory);
      }
      stage_index += d;
      worst_sync = std::max(worst_sync, kept->worst_sync);
      worst_opt = std::max(worst_opt, kept->worst_opt);
      const double m = t.max_micro_batches();
      const double pipeline = (m - 1) * work.max_t[j] + work.sum_t[j];
      if (pipeline > worst_pipeline) {
        worst_pipeline = pipeline;
        critical = static_cast<int>(j);
      }
      continue;
    }
    // This template's worst sync and optimizer step (their maxima over
    // stages, as over the plan's: max is exact in any order), and whether
    // it ran out of memory, when it is kept: then every stage is priced,
    // for the scratch, before the plan fails.
    double tmpl_sync = 0, tmpl_opt = 0;
    bool oom = false;
    double max_t = 0, sum_t = 0;
    for (int s = 0; s < d; ++s) {
      const Stage& st = t.stages[s];
      if (kept != nullptr && kept->synced[s]) {
        // Priced under this key before (timed: kept needs the balance's
        // stage times): only its memory may read this balance.
        const bool fits = kept_stage_fits(s);
        oom = oom || !fits;
        ++stage_index;
        tmpl_sync = std::max(tmpl_sync, kept->stage_sync[s]);
        tmpl_opt = std::max(tmpl_opt, kept->stage_opt[s]);
        continue;
      }
      // Memory first: an OOM plan is never priced.
      const StageCells cells = CellsOf(t, s);
      const StageParams sp = ParamsOf(t, s, cells);
      StageMemory mem =
          MemoryWithParams(plan, static_cast<int>(j), s, sp, cells);
      if (detail) {
        detail->stage_memory[j].push_back(mem);
        detail->max_memory_gib = std::max(detail->max_memory_gib, mem.total_gib());
      }
      const bool fits = mem.total_gib() <= UsableMemoryGib(st.gpu_type);
      if (kept != nullptr) {
        kept->mem_in_flight[s] = std::min(d - s, t.max_micro_batches());
        kept->mem_fits[s] = fits;
      }
      if (!fits) {
        if (kept == nullptr) return fail(Infeasibility::kOutOfMemory);
        oom = true;
      }
      // This stage's time per micro-batch: priced for the balance, or now.
      double stage_s;
      if (timed) {
        stage_s = work.stage_t[stage_index++];
      } else {
        stage_s =
            StageTimeTerms(plan, static_cast<int>(j), s, facts[j], cells)
                .total();
        if (!std::isfinite(stage_s)) return fail(Infeasibility::kMissingProfile);
        max_t = std::max(max_t, stage_s);
        sum_t += stage_s;
      }

      const SyncAndStep ss =
          StageSyncAndStep(t, s, sp, stage_s, facts[j], sync_context);
      const double g = ss.sync_s, opt = ss.step_s;
      tmpl_sync = std::max(tmpl_sync, g);
      tmpl_opt = std::max(tmpl_opt, opt);
      if (kept != nullptr) {
        kept->synced[s] = 1;
        kept->stage_sync[s] = g;
        kept->stage_opt[s] = opt;
      }
    }
    if (kept != nullptr) {
      kept->priced = true;
      kept->worst_sync = tmpl_sync;
      kept->worst_opt = tmpl_opt;
      kept->fits_deep = deep ? (oom ? -1 : 1) : 0;
    }
    if (oom) return fail(Infeasibility::kOutOfMemory);
    worst_sync = std::max(worst_sync, tmpl_sync);
    worst_opt = std::max(worst_opt, tmpl_opt);
    if (timed) {
      max_t = work.max_t[j];
      sum_t = work.sum_t[j];
    }
    const double m = t.max_micro_batches();
    const double pipeline = (m - 1) * max_t + sum_t;
    if (pipeline > worst_pipeline) {
      worst_pipeline = pipeline;
      critical = static_cast<int>(j);
    }
  }
  const double iteration = worst_pipeline + worst_sync + worst_opt +
                           training_.framework.iteration_fixed_s;
  if (why) *why = Infeasibility::kOk;
  if (detail) {
    detail->iteration_time_s = iteration;
    detail->throughput_iters_per_s = 1.0 / iteration;
    detail->tokens_per_s = static_cast<double>(training_.global_batch) *
                           training_.seq_len / iteration;
    double peak = 0, usd = 0;
    for (const Template& t : plan.templates) {
      for (const Stage& st : t.stages) {
        const GpuType& g = catalog_->type(st.gpu_type);
        peak += g.peak_bf16_tflops * 1e12 * st.tp * t.replicas;
        usd += g.usd_per_hour * st.tp * t.replicas;
      }
    }
    detail->mfu = iteration_flops_ / (iteration * peak);
    detail->usd_per_hour = usd;
    // Breakdown of the critical template: its bottleneck stage runs m times,
    // the other stages' times are the fill and drain bubble.
    const Template& t = plan.templates[critical];
    int bottleneck = 0;
    double max_t = 0, sum_t = 0;
    std::vector<StageTerms> terms;
    for (int s = 0; s < t.depth(); ++s) {
      terms.push_back(StageTimeTerms(plan, critical, s, facts[critical],
                                     CellsOf(t, s)));
      sum_t += terms.back().total();
      if (terms.back().total() > max_t) {
        max_t = terms.back().total();
        bottleneck = s;
      }
    }
    const double m = t.max_micro_batches();
    TimeBreakdown& b = detail->breakdown;
    // Host-side fixed costs count as compute, exposed FSDP gathers as
    // data-parallel traffic, so the parts still add up to the iteration.
    b.compute_s = m * (terms[bottleneck].compute_s + terms[bottleneck].fixed_s);
    b.tp_comm_s = m * terms[bottleneck].tp_comm_s;
    b.p2p_s = m * terms[bottleneck].p2p_s;
    b.all_to_all_s = m * terms[bottleneck].all_to_all_s;
    b.bubble_s = worst_pipeline - m * max_t;
    b.dp_sync_s = worst_sync + m * terms[bottleneck].dp_gather_s;
    b.optimizer_s = worst_opt + training_.framework.iteration_fixed_s;
  }
  return iteration;
}

double CostModel::IterationTime(const Plan& plan, Infeasibility* why) const {
  return Evaluate(plan, why, nullptr);
}

absl::StatusOr<Prediction> CostModel::Predict(const Plan& plan) const {
  Prediction p;
  Infeasibility why = Infeasibility::kOk;
  const double t = Evaluate(plan, &why, &p);
  if (std::isfinite(t)) return p;
  switch (why) {
    case Infeasibility::kOutOfMemory:
      for (size_t j = 0; j < p.stage_memory.size(); ++j) {
        for (size_t s = 0; s < p.stage_memory[j].size(); ++s) {
          const int type = plan.templates[j].stages[s].gpu_type;
          if (p.stage_memory[j][s].total_gib() > UsableMemoryGib(type)) {
            const StageMemory& m = p.stage_memory[j][s];
            return absl::FailedPreconditionError(absl::StrCat(
                "templates[", j, "].stages[", s, "] (", catalog_->type(type).id,
                ", tp=", plan.templates[j].stages[s].tp, ", layers ",
                plan.templates[j].stages[s].layer_begin, "-",
                plan.templates[j].stages[s].layer_end, "): needs ",
                absl::StrFormat("%.1f", m.total_gib()), " GiB per GPU (state ",
                absl::StrFormat("%.1f", m.weights_gib), ", activations ",
                absl::StrFormat("%.1f", m.activations_gib), ", reserve ",
                absl::StrFormat("%.1f", m.reserve_gib), ") but ",
                absl::StrFormat("%.1f", UsableMemoryGib(type)),
                " GiB are usable"));
          }
        }
      }
      return absl::FailedPreconditionError("plan does not fit in memory");
    case Infeasibility::kMissingProfile:
      return absl::FailedPreconditionError(
          "a stage uses a (GPU type, TP, micro-batch) with no profile entry");
    case Infeasibility::kBadBatch:
      return absl::InvalidArgumentError(absl::StrCat(
          "micro-batches do not add up to the global batch of ",
          training_.global_batch, " sequences"));
    default:
      return absl::InvalidArgumentError("plan structure is invalid");
  }
}

}  // namespace arachne
