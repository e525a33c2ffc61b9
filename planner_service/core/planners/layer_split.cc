#include "planner_service/core/planners/layer_split.h"

#include <algorithm>
#include <cmath>
#include <cstdint>

namespace arachne {

StageCosts StageCostsOf(const CostModel& cm, const Template& t) {
  const ModelSpec& model = cm.model();
  const int d = t.depth();
  const int mbs = t.micro_batch_size;
  StageCosts costs;
  std::vector<double>& tau = costs.per_layer_s;
  std::vector<double>& fixed = costs.fixed_s;
  tau.assign(d, 0);
  fixed.assign(d, 0);
  for (int s = 0; s < d; ++s) {
    const Stage& st = t.stages[s];
    double per_layer;
    if (model.is_moe()) {
      const LayerCost& a = cm.Layer(LayerKind::kMoeAttention, st.gpu_type, st.tp, mbs);
      const LayerCost& e = cm.Layer(LayerKind::kMoeExperts, st.gpu_type, st.tiling.etp, mbs);
      per_layer = a.compute_s + a.tp_comm_s +
                  (e.compute_s + e.tp_comm_s) * st.tiling.etp / st.tp;
    } else {
      const LayerCost& c = cm.Layer(LayerKind::kDense, st.gpu_type, st.tp, mbs);
      per_layer = c.compute_s + c.tp_comm_s;
    }
    tau[s] = std::max(per_layer, 1e-12);
    if (s == 0) {
      const LayerCost& c = cm.Layer(LayerKind::kEmbedding, st.gpu_type, st.tp, mbs);
      fixed[s] += c.compute_s + c.tp_comm_s;
    }
    if (s == d - 1) {
      const LayerCost& c = cm.Layer(LayerKind::kLmHead, st.gpu_type, st.tp, mbs);
      fixed[s] += c.compute_s + c.tp_comm_s;
    }
  }
  return costs;
}

std::vector<int> LayerCaps(const CostModel& cm, const Plan& plan, int t) {
  const int layers = cm.model().num_layers;
  const int d = plan.templates[t].depth();
  std::vector<int> caps(d);
  // The memory of a stage reads its own template's stages, replicas and
  // micro-batch size and only the replica counts of the others (the
  // data-parallel degree of sharded optimizer state), never a placement:
  // copying just those keeps the probe cheap on plans of hundreds of
  // replicas (their placements are most of a plan's size).
  Plan probe;
  probe.templates.resize(plan.templates.size());
  for (size_t x = 0; x < plan.templates.size(); ++x)
    probe.templates[x].replicas = plan.templates[x].replicas;
  Template& pt = probe.templates[t];
  pt.stages = plan.templates[t].stages;
  pt.micro_batch_size = plan.templates[t].micro_batch_size;
  pt.total_micro_batches = pt.replicas * std::max(d, 1) * 4;
  for (int s = 0; s < d; ++s) {
    auto mem_with = [&](int n) {
      pt.stages[s].layer_begin = layers - n;
      pt.stages[s].layer_end = layers;
      return cm.StageMemoryOf(probe, t, s).total_gib();
    };
    const double m1 = mem_with(1), m2 = mem_with(2);
    const double slope = std::max(m2 - m1, 1e-9);
    const double room = cm.UsableMemoryGib(pt.stages[s].gpu_type) - (m1 - slope);
    caps[s] = static_cast<int>(std::clamp(std::floor(room / slope), 0.0,
                                          static_cast<double>(layers)));
  }
  return caps;
}

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

std::vector<int> EvenSplit(int layers, int depth) {
  std::vector<int> even(depth, layers / depth);
  for (int s = 0; s < layers % depth; ++s) ++even[s];
  return even;
}

std::vector<int> GreedySplit(int layers, const std::vector<double>& per_layer,
                             const std::vector<double>& fixed,
                             const std::vector<int>& cap) {
  const int d = static_cast<int>(per_layer.size());
  if (d == 0 || d > layers) return {};
  std::vector<int> n(d, 1);
  for (int s = 0; s < d; ++s)
    if (cap[s] < 1) return {};
  for (int placed = d; placed < layers; ++placed) {
    int pick = -1;
    double pick_time = 0;
    for (int s = 0; s < d; ++s) {
      if (n[s] >= cap[s]) continue;
      const double time = (n[s] + 1) * per_layer[s] + fixed[s];
      if (pick < 0 || time < pick_time) {
        pick = s;
        pick_time = time;
      }
    }
    if (pick < 0) return {};
    ++n[pick];
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

}  // namespace arachne
