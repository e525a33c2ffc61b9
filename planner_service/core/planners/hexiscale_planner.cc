#include "planner_service/core/planners/hexiscale_planner.h"

#include <algorithm>
#include <functional>
#include <cmath>
#include <map>
#include <tuple>

#include "absl/strings/str_cat.h"
#include "planner_service/core/planners/layer_split.h"
#include "planner_service/core/planners/search_tracker.h"
#include "planner_service/core/planners/template_builder.h"

namespace arachne {
namespace {

double Compute(const Cluster& cluster, const GpuCatalog& catalog, int node) {
  const Node& n = cluster.node(node);
  return n.num_gpus * catalog.type(n.gpu_type).peak_bf16_tflops;
}

double Bandwidth(const Cluster& cluster, int a, int b) {
  return std::min(cluster.NicGBps(a), cluster.NicGBps(b));
}

// The best pipeline HexiScale finds on one group's GPUs: a one-replica
// template (structure, micro-batch size, split and tiling; no placement).
struct GroupPipeline {
  bool found = false;
  Template pipeline;
};

class HexiScaleSearch {
 public:
  HexiScaleSearch(const CostModel& cm, SearchTracker& tracker, int max_depth)
      : cm_(cm), tracker_(tracker), max_depth_(max_depth) {}

  void Run() {
    const Cluster& cluster = cm_.cluster();
    for (int k = 1; k <= cluster.num_nodes(); ++k) {
      if (tracker_.OutOfBudget()) return;
      const std::vector<int> group =
          HexiScalePlanner::PartitionNodes(cluster, cm_.catalog(), k);
      Plan plan;
      for (int g = 0; g < k && !tracker_.OutOfBudget(); ++g) {
        std::vector<int> nodes;
        for (int i = 0; i < cluster.num_nodes(); ++i)
          if (group[i] == g) nodes.push_back(i);
        const GroupPipeline& best = BestPipeline(nodes);
        if (!best.found) continue;  // this group's GPUs stay idle
        Template t = best.pipeline;
        NodePool pool(cluster);
        for (int i = 0; i < cluster.num_nodes(); ++i)
          if (group[i] != g) pool.Withhold(i);
        if (!PlaceReplicas(t, 1, pool)) continue;
        plan.templates.push_back(std::move(t));
      }
      if (plan.templates.empty()) continue;
      tracker_.PriceAndOffer(plan);
    }
  }

 private:
  // Groups with the same nodes (type, size, link) get the same pipeline, so
  // the search runs once per kind of group.
  const GroupPipeline& BestPipeline(const std::vector<int>& nodes) {
    std::vector<std::tuple<int, int, double>> key;
    for (int i : nodes) {
      const Node& n = cm_.cluster().node(i);
      key.emplace_back(n.gpu_type, n.num_gpus, cm_.cluster().NicGBps(i));
    }
    std::sort(key.begin(), key.end());
    auto it = cache_.find(key);
    if (it != cache_.end()) return it->second;
    return cache_[key] = SearchGroup(nodes);
  }

  // TP and PP inside one group: a TP degree per GPU type of the group, each
  // type's GPUs all used as stages of that degree, types in every order,
  // every micro-batch size, layers balanced by speed within memory.
  GroupPipeline SearchGroup(const std::vector<int>& nodes) {
    const Cluster& cluster = cm_.cluster();
    std::vector<int> types;
    for (int i : nodes) {
      const int t = cluster.node(i).gpu_type;
      if (std::find(types.begin(), types.end(), t) == types.end())
        types.push_back(t);
    }
    GroupPipeline best;
    double best_time = kInfeasible;
    std::vector<int> tp(types.size(), 1);
    std::function<void(size_t)> choose_tp = [&](size_t i) {
      if (tracker_.OutOfBudget()) return;
      if (i < types.size()) {
        int largest = 0;
        for (int n : nodes)
          if (cluster.node(n).gpu_type == types[i])
            largest = std::max(largest, cluster.node(n).num_gpus);
        for (int t = 1; t <= std::min(largest, cm_.params().max_tp); t *= 2) {
          tp[i] = t;
          choose_tp(i + 1);
        }
        return;
      }
      // Stages per type: as many TP groups as the group's nodes hold.
      std::vector<int> stages(types.size(), 0);
      int depth = 0;
      for (size_t j = 0; j < types.size(); ++j) {
        for (int n : nodes)
          if (cluster.node(n).gpu_type == types[j])
            stages[j] += cluster.node(n).num_gpus / tp[j];
        depth += stages[j];
      }
      if (depth < 1 || depth > max_depth_) return;
      std::vector<int> order(types.size());
      for (size_t j = 0; j < order.size(); ++j) order[j] = static_cast<int>(j);
      for (const std::vector<int>& perm : Permutations(order)) {
        std::vector<StageChoice> structure;
        for (int j : perm)
          for (int c = 0; c < stages[j]; ++c)
            structure.push_back({types[j], tp[j]});
        for (int mbs : MicroBatchSizes(cm_)) {
          if (tracker_.OutOfBudget()) return;
          bool supported = true;
          for (const StageChoice& c : structure)
            supported = supported && cm_.Supports(c.gpu_type, c.tp, mbs);
          if (!supported) continue;
          Template candidate;
          const double time = PriceAlone(structure, mbs, &candidate);
          if (time < best_time) {
            best_time = time;
            best.found = true;
            best.pipeline = std::move(candidate);
          }
        }
      }
    };
    choose_tp(0);
    return best;
  }

  // Prices `structure` as the only pipeline (the group's share of the batch
  // follows its speed, so its speed alone ranks the candidates) and returns
  // its iteration time, with the template (placement cleared) in *out.
  double PriceAlone(const std::vector<StageChoice>& structure, int mbs,
                    Template* out) {
    tracker_.CountTemplate();
    Template t = MakeTemplate(structure, mbs);
    t.replicas = 1;
    for (Stage& st : t.stages)
      if (cm_.model().is_moe()) st.tiling = ExpertTiling{1, st.tp, 1};
    Plan plan;
    plan.templates.push_back(t);
    const StageCosts costs = StageCostsOf(cm_, t);
    const std::vector<int> split =
        BalancedSplit(cm_.model().num_layers, costs.per_layer_s,
                      costs.fixed_s, LayerCaps(cm_, plan, 0));
    if (split.empty()) return kInfeasible;
    ApplySplit(t, split);
    ShardExpertsByTp(t, cm_.model());
    // Priced on a placement anywhere its types fit: a group's own nodes
    // have the same links, so the time is the same.
    NodePool pool(cm_.cluster());
    if (!PlaceReplicas(t, 1, pool)) return kInfeasible;
    plan.templates[0] = t;
    ++*tracker_.evaluation_counter();
    const double time = cm_.BalanceAndPrice(plan);
    *out = std::move(plan.templates[0]);
    out->placement.clear();
    return time;
  }

  const CostModel& cm_;
  SearchTracker& tracker_;
  const int max_depth_;
  std::map<std::vector<std::tuple<int, int, double>>, GroupPipeline> cache_;
};

}  // namespace

std::vector<int> HexiScalePlanner::PartitionNodes(const Cluster& cluster,
                                                  const GpuCatalog& catalog,
                                                  int k) {
  const int n = cluster.num_nodes();
  std::vector<int> group(n, 0);
  if (k <= 1) return group;
  std::vector<int> order(n);
  for (int i = 0; i < n; ++i) order[i] = i;
  std::stable_sort(order.begin(), order.end(), [&](int a, int b) {
    return Compute(cluster, catalog, a) > Compute(cluster, catalog, b);
  });
  std::vector<double> load(k, 0);
  std::vector<std::vector<int>> members(k);
  for (int i : order) {
    int pick = 0;
    double pick_bw = -1;
    for (int g = 0; g < k; ++g) {
      double bw = 0;
      for (int m : members[g]) bw += Bandwidth(cluster, i, m);
      if (load[g] < load[pick] - 1e-9 ||
          (std::abs(load[g] - load[pick]) <= 1e-9 && bw > pick_bw)) {
        pick = g;
        pick_bw = bw;
      }
    }
    group[i] = pick;
    members[pick].push_back(i);
    load[pick] += Compute(cluster, catalog, i);
  }
  // Refinement: swap a node of the heaviest group with one of the lightest
  // while that narrows the gap between them.
  for (int pass = 0; pass < n; ++pass) {
    const int heavy = static_cast<int>(
        std::max_element(load.begin(), load.end()) - load.begin());
    const int light = static_cast<int>(
        std::min_element(load.begin(), load.end()) - load.begin());
    const double gap = load[heavy] - load[light];
    int best_a = -1, best_b = -1;
    double best_gap = gap;
    for (int a = 0; a < n; ++a) {
      if (group[a] != heavy) continue;
      for (int b = 0; b < n; ++b) {
        if (group[b] != light) continue;
        const double d =
            Compute(cluster, catalog, a) - Compute(cluster, catalog, b);
        const double new_gap = std::abs(gap - 2 * d);
        if (d > 0 && new_gap < best_gap - 1e-9) {
          best_gap = new_gap;
          best_a = a;
          best_b = b;
        }
      }
    }
    if (best_a < 0) break;
    const double d =
        Compute(cluster, catalog, best_a) - Compute(cluster, catalog, best_b);
    group[best_a] = light;
    group[best_b] = heavy;
    load[heavy] -= d;
    load[light] += d;
  }
  return group;
}

absl::StatusOr<PlanResult> HexiScalePlanner::Run(const CostModel& cm,
                                                 const PlannerOptions& options) {
  SearchTracker tracker(cm, options);
  HexiScaleSearch search(cm, tracker,
                         std::min(options.max_depth, cm.model().num_layers));
  search.Run();
  return tracker.Finish(name(), /*exhaustive=*/true);
}

}  // namespace arachne
