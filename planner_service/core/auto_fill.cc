#include "planner_service/core/auto_fill.h"

#include <algorithm>
#include <cmath>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"

namespace arachne {
namespace {

// Splits `layers` over stages with per-layer times `tau` and fixed extra
// times `fixed` so every stage takes about the same time, each stage holding
// between 1 and cap[s] layers. Empty when the caps cannot hold the model.
std::vector<int> BalancedSplit(int layers, const std::vector<double>& tau,
                               const std::vector<double>& fixed,
                               const std::vector<int>& cap) {
  const int d = static_cast<int>(tau.size());
  int64_t cap_sum = 0;
  for (int c : cap) cap_sum += c;
  if (cap_sum < layers || d > layers) return {};
  for (int c : cap)
    if (c < 1) return {};
  // Water-filling: stages whose share falls outside [1, cap] are pinned and
  // the rest re-balanced.
  std::vector<double> share(d, 0);
  std::vector<int> pinned(d, 0);  // 0 free, 1 at floor 1, 2 at cap
  for (int iter = 0; iter <= d; ++iter) {
    double free_layers = layers, inv = 0, fixed_over_tau = 0;
    for (int s = 0; s < d; ++s) {
      if (pinned[s] == 1) free_layers -= 1;
      if (pinned[s] == 2) free_layers -= cap[s];
      if (pinned[s] == 0) {
        inv += 1.0 / tau[s];
        fixed_over_tau += fixed[s] / tau[s];
      }
    }
    if (inv == 0) break;
    const double x = (free_layers + fixed_over_tau) / inv;
    bool changed = false;
    for (int s = 0; s < d; ++s) {
      if (pinned[s] != 0) continue;
      share[s] = (x - fixed[s]) / tau[s];
      if (share[s] < 1) { pinned[s] = 1; changed = true; }
      else if (share[s] > cap[s]) { pinned[s] = 2; changed = true; }
    }
    if (!changed) break;
  }
  std::vector<int> n(d);
  int assigned = 0;
  for (int s = 0; s < d; ++s) {
    if (pinned[s] == 1) share[s] = 1;
    if (pinned[s] == 2) share[s] = cap[s];
    n[s] = std::clamp(static_cast<int>(std::floor(share[s])), 1, cap[s]);
    assigned += n[s];
  }
  // Largest remainders first, within caps; then take back if over.
  std::vector<int> order(d);
  for (int s = 0; s < d; ++s) order[s] = s;
  std::sort(order.begin(), order.end(), [&](int a, int b) {
    return share[a] - n[a] > share[b] - n[b];
  });
  for (int pass = 0; assigned < layers && pass < layers; ++pass) {
    bool any = false;
    for (int s : order) {
      if (assigned == layers) break;
      if (n[s] < cap[s]) { ++n[s]; ++assigned; any = true; }
    }
    if (!any) return {};
  }
  while (assigned > layers) {
    int worst = -1;
    for (int s = 0; s < d; ++s)
      if (n[s] > 1 && (worst < 0 || n[s] * tau[s] + fixed[s] >
                                        n[worst] * tau[worst] + fixed[worst]))
        worst = s;
    if (worst < 0) return {};
    --n[worst];
    --assigned;
  }
  return n;
}

void ApplySplit(Template& t, const std::vector<int>& split) {
  int begin = 0;
  for (int s = 0; s < t.depth(); ++s) {
    t.stages[s].layer_begin = begin;
    begin += split[s];
    t.stages[s].layer_end = begin;
  }
}

}  // namespace

std::vector<std::vector<int>> AutoFill::CandidateSplits(
    const Plan& plan, int template_index) const {
  const Template& t = plan.templates[template_index];
  const ModelSpec& model = cm_.model();
  const int layers = model.num_layers;
  const int d = t.depth();
  const int mbs = t.micro_batch_size;
  std::vector<double> tau(d), fixed(d);
  for (int s = 0; s < d; ++s) {
    const Stage& st = t.stages[s];
    double per_layer;
    if (model.is_moe()) {
      const LayerCost& a = cm_.Layer(LayerKind::kMoeAttention, st.gpu_type, st.tp, mbs);
      const LayerCost& e = cm_.Layer(LayerKind::kMoeExperts, st.gpu_type, st.tiling.etp, mbs);
      per_layer = a.compute_s + a.tp_comm_s +
                  (e.compute_s + e.tp_comm_s) * st.tiling.etp / st.tp;
    } else {
      const LayerCost& c = cm_.Layer(LayerKind::kDense, st.gpu_type, st.tp, mbs);
      per_layer = c.compute_s + c.tp_comm_s;
    }
    tau[s] = std::max(per_layer, 1e-12);
    if (s == 0) {
      const LayerCost& c = cm_.Layer(LayerKind::kEmbedding, st.gpu_type, st.tp, mbs);
      fixed[s] += c.compute_s + c.tp_comm_s;
    }
    if (s == d - 1) {
      const LayerCost& c = cm_.Layer(LayerKind::kLmHead, st.gpu_type, st.tp, mbs);
      fixed[s] += c.compute_s + c.tp_comm_s;
    }
  }
  // Memory caps: stage memory is linear in its layer count (for layers of
  // one kind), so two probes give the most layers that fit. Probe with the
  // deepest in-flight count (no balancing yet) and MoE layers where the
  // model has them: both are the larger case.
  std::vector<int> caps(d);
  Plan probe = plan;
  Template& pt = probe.templates[template_index];
  pt.total_micro_batches = pt.replicas * std::max(d, 1) * 4;
  for (int s = 0; s < d; ++s) {
    auto mem_with = [&](int n) {
      pt.stages[s].layer_begin = layers - n;
      pt.stages[s].layer_end = layers;
      return cm_.StageMemoryOf(probe, template_index, s).total_gib();
    };
    const double m1 = mem_with(1), m2 = mem_with(2);
    const double slope = std::max(m2 - m1, 1e-9);
    const double room = cm_.UsableMemoryGib(t.stages[s].gpu_type) - (m1 - slope);
    caps[s] = static_cast<int>(std::clamp(std::floor(room / slope), 0.0,
                                          static_cast<double>(layers)));
  }
  std::vector<std::vector<int>> out;
  auto add = [&](std::vector<int> split) {
    if (split.empty()) return;
    if (std::find(out.begin(), out.end(), split) == out.end())
      out.push_back(std::move(split));
  };
  add(BalancedSplit(layers, tau, fixed, std::vector<int>(d, layers)));
  add(BalancedSplit(layers, tau, fixed, caps));
  std::vector<int> even(d, layers / d);
  for (int s = 0; s < layers % d; ++s) ++even[s];
  add(even);
  return out;
}

double AutoFill::Price(Plan& plan, int64_t* evaluations) const {
  if (evaluations) ++*evaluations;
  if (cm_.BalanceMicroBatches(plan) != Infeasibility::kOk) return kInfeasible;
  return cm_.IterationTime(plan);
}

double AutoFill::ChooseExpertTilings(Plan& plan, int template_index,
                                     int64_t* evaluations) const {
  Template& t = plan.templates[template_index];
  const ModelSpec& model = cm_.model();
  std::vector<std::vector<ExpertTiling>> options(t.depth());
  for (int s = 0; s < t.depth(); ++s) {
    Stage& st = t.stages[s];
    if (model.MoeLayersIn(st.layer_begin, st.layer_end) == 0) {
      st.tiling = ExpertTiling{};
      continue;
    }
    const int w = st.tp * t.replicas;
    const int max_node = cm_.cluster().MaxNodeSizeOfType(st.gpu_type);
    double best_time = kInfeasible;
    ExpertTiling best{1, 1, w};
    for (int etp = 1; etp <= max_node && w % etp == 0; etp *= 2) {
      if (!cm_.HasProfile(LayerKind::kMoeExperts, st.gpu_type, etp,
                          t.micro_batch_size))
        continue;
      if (!GroupsStayInNode(t, s, etp)) continue;
      for (int ep = 1; ep <= w / etp; ++ep) {
        if ((w / etp) % ep != 0 || model.moe.num_experts % ep != 0) continue;
        st.tiling = ExpertTiling{ep, etp, w / (etp * ep)};
        if (cm_.StageMemoryOf(plan, template_index, s).total_gib() >
            cm_.UsableMemoryGib(st.gpu_type))
          continue;
        options[s].push_back(st.tiling);
        const double time = cm_.StageTime(plan, template_index, s);
        if (time < best_time) {
          best_time = time;
          best = st.tiling;
        }
      }
    }
    st.tiling = best;
  }
  double best = Price(plan, evaluations);
  // Re-select each stage against the whole iteration (gradient sync and
  // memory differ between tilings with the same stage time).
  for (int s = 0; s < t.depth(); ++s) {
    if (options[s].size() <= 1) continue;
    ExpertTiling keep = plan.templates[template_index].stages[s].tiling;
    for (const ExpertTiling& x : options[s]) {
      if (x == keep) continue;
      plan.templates[template_index].stages[s].tiling = x;
      const double time = Price(plan, evaluations);
      if (time < best) {
        best = time;
        keep = x;
      }
    }
    plan.templates[template_index].stages[s].tiling = keep;
  }
  if (std::isfinite(best)) Price(plan, nullptr);  // restore the balance
  return best;
}

absl::StatusOr<FillResult> AutoFill::Extend(
    const Plan& so_far, const NodePool& pool,
    absl::Span<const StageChoice> structure, int64_t* evaluations) const {
  const ModelSpec& model = cm_.model();
  auto describe = [&] {
    std::vector<std::string> parts;
    for (const StageChoice& c : structure)
      parts.push_back(absl::StrCat(cm_.catalog().type(c.gpu_type).id, "/tp",
                                   c.tp));
    return absl::StrCat("[", absl::StrJoin(parts, ", "), "]");
  };
  if (structure.empty() ||
      static_cast<int>(structure.size()) > model.num_layers) {
    return absl::InvalidArgumentError(
        absl::StrCat("template ", describe(), ": depth must be in [1, ",
                     model.num_layers, "]"));
  }
  FillResult result{so_far, pool, kInfeasible};
  Template t;
  for (const StageChoice& c : structure) {
    Stage st;
    st.gpu_type = c.gpu_type;
    st.tp = c.tp;
    t.stages.push_back(st);
  }
  NodePool placed = pool;
  int replicas = 0;
  while (placed.PlaceReplica(t.stages, &t.placement)) ++replicas;
  if (replicas == 0) {
    return absl::FailedPreconditionError(absl::StrCat(
        "template ", describe(), ": the free nodes hold no replica"));
  }
  t.replicas = replicas;
  Plan plan = so_far;
  plan.templates.push_back(std::move(t));
  const int idx = static_cast<int>(plan.templates.size()) - 1;
  for (Stage& st : plan.templates[idx].stages) {
    st.tiling = ExpertTiling{1, 1, st.tp * replicas};
  }

  bool any_profiled = false, any_fits = false;
  for (int mbs = 1; mbs <= cm_.params().max_micro_batch_size; mbs *= 2) {
    if (static_cast<int64_t>(mbs) * replicas > cm_.training().global_batch)
      break;
    bool supported = true;
    for (const Stage& st : plan.templates[idx].stages)
      supported = supported && cm_.Supports(st.gpu_type, st.tp, mbs);
    if (!supported) continue;
    any_profiled = true;
    plan.templates[idx].micro_batch_size = mbs;
    bool fits_at_mbs = false;
    for (const std::vector<int>& split : CandidateSplits(plan, idx)) {
      ApplySplit(plan.templates[idx], split);
      if (!model.is_moe()) {
        for (Stage& st : plan.templates[idx].stages) st.tiling = ExpertTiling{};
      }
      const double time = model.is_moe() ? ChooseExpertTilings(plan, idx, evaluations)
                                         : Price(plan, evaluations);
      if (!std::isfinite(time)) {
        Infeasibility why = Infeasibility::kOk;
        if (cm_.BalanceMicroBatches(plan) == Infeasibility::kOk)
          cm_.IterationTime(plan, &why);
        if (why != Infeasibility::kOutOfMemory) fits_at_mbs = true;
        continue;
      }
      fits_at_mbs = true;
      if (time < result.iteration_time_s) {
        result.iteration_time_s = time;
        result.plan = plan;
      }
    }
    any_fits = any_fits || fits_at_mbs;
    // Activations grow with the micro-batch: if nothing fit, nothing larger will.
    if (!fits_at_mbs) break;
  }
  if (!std::isfinite(result.iteration_time_s)) {
    if (!any_profiled) {
      return absl::FailedPreconditionError(absl::StrCat(
          "template ", describe(), ": no profiled micro-batch size"));
    }
    return absl::FailedPreconditionError(absl::StrCat(
        "template ", describe(), " with ", replicas, " replicas: ",
        any_fits ? "the global batch cannot be split into its micro-batches"
                 : "no layer split fits in memory"));
  }
  result.pool = pool;
  const Template& chosen = result.plan.templates[idx];
  Plan only;
  only.templates.push_back(chosen);
  if (absl::Status s = result.pool.Take(only); !s.ok()) return s;
  return result;
}

}  // namespace arachne
