#include "planner_service/core/planners/amp_planner.h"

#include <algorithm>
#include <set>

#include "absl/strings/str_cat.h"
#include "planner_service/core/planners/layer_split.h"
#include "planner_service/core/planners/search_tracker.h"
#include "planner_service/core/planners/template_builder.h"

namespace arachne {
namespace {

// Cost of one layer of `model` on `type` at (tp, mbs), experts sharded by TP.
double LayerCostOn(const CostModel& cm, int layer, int type, int tp, int mbs) {
  if (!cm.model().IsMoeLayer(layer)) {
    const LayerCost& c = cm.Layer(LayerKind::kDense, type, tp, mbs);
    return c.compute_s + c.tp_comm_s;
  }
  const LayerCost& a = cm.Layer(LayerKind::kMoeAttention, type, tp, mbs);
  const LayerCost& e = cm.Layer(LayerKind::kMoeExperts, type, tp, mbs);
  return a.compute_s + a.tp_comm_s + e.compute_s + e.tp_comm_s;
}

}  // namespace

std::vector<int> AmpPlanner::PartitionLayers(
    const std::vector<double>& layer_cost, double first_extra,
    double last_extra, int depth) {
  const int L = static_cast<int>(layer_cost.size());
  if (depth < 1 || depth > L) return {};
  std::vector<double> prefix(L + 1, 0);
  for (int i = 0; i < L; ++i) prefix[i + 1] = prefix[i] + layer_cost[i];
  // best[k][i]: least possible slowest stage when stages 0..k-1 hold layers
  // [0, i); cut[k][i]: where stage k-1 starts in that optimum.
  const double inf = kInfeasible;
  std::vector<std::vector<double>> best(depth + 1,
                                        std::vector<double>(L + 1, inf));
  std::vector<std::vector<int>> cut(depth + 1, std::vector<int>(L + 1, -1));
  best[0][0] = 0;
  for (int k = 1; k <= depth; ++k) {
    for (int i = k; i <= L - (depth - k); ++i) {
      for (int j = k - 1; j < i; ++j) {
        if (best[k - 1][j] == inf) continue;
        double stage = prefix[i] - prefix[j];
        if (k == 1) stage += first_extra;
        if (k == depth) stage += last_extra;
        const double worst = std::max(best[k - 1][j], stage);
        if (worst < best[k][i]) {
          best[k][i] = worst;
          cut[k][i] = j;
        }
      }
    }
  }
  std::vector<int> split(depth);
  int end = L;
  for (int k = depth; k >= 1; --k) {
    const int begin = cut[k][end];
    split[k - 1] = end - begin;
    end = begin;
  }
  return split;
}

absl::StatusOr<PlanResult> AmpPlanner::Run(const CostModel& cm,
                                           const PlannerOptions& options) {
  SearchTracker tracker(cm, options);
  const Cluster& cluster = cm.cluster();
  const ModelSpec& model = cm.model();
  const int n = cluster.total_gpus();
  const int L = model.num_layers;
  const int max_depth = std::min(options.max_depth, L);
  const bool uniform = UniformNodeSizes(cluster);
  const int max_tp =
      uniform ? std::min(cm.params().max_tp, cluster.node(0).num_gpus) : 1;
  const std::vector<int>& types = cluster.types_present();
  const std::vector<std::vector<int>> orders = Permutations(types);

  for (int mbs : MicroBatchSizes(cm)) {
    for (int tp = 1; tp <= max_tp; tp *= 2) {
      // AMP's cost model is blind to which type a layer lands on: average
      // each layer's cost over the types that can run it.
      std::vector<int> able;
      for (int type : types)
        if (cm.Supports(type, tp, mbs)) able.push_back(type);
      if (able.empty()) continue;
      std::vector<double> layer_cost(L, 0);
      double first = 0, last = 0;
      for (int type : able) {
        for (int i = 0; i < L; ++i)
          layer_cost[i] += LayerCostOn(cm, i, type, tp, mbs) / able.size();
        const LayerCost& e = cm.Layer(LayerKind::kEmbedding, type, tp, mbs);
        const LayerCost& h = cm.Layer(LayerKind::kLmHead, type, tp, mbs);
        first += (e.compute_s + e.tp_comm_s) / able.size();
        last += (h.compute_s + h.tp_comm_s) / able.size();
      }
      for (int dp = 1; dp * tp <= n; ++dp) {
        if (static_cast<int64_t>(dp) * mbs > cm.training().global_batch)
          break;
        // Stage s takes the s-th block of tp x dp GPUs in device order. A
        // stage has one GPU type here, so a block may not span two types:
        // the GPUs of a type that do not fill a whole block stay idle.
        const int block = dp * tp;
        int pp = 0;
        for (int type : types) pp += cluster.GpusOfType(type) / block;
        if (pp < 1 || pp > max_depth) continue;
        const std::vector<int> split =
            PartitionLayers(layer_cost, first, last, pp);
        std::set<std::vector<int>> seen;
        for (const std::vector<int>& order : orders) {
          if (tracker.OutOfBudget()) return tracker.Finish(name(), false);
          std::vector<int> stage_type;
          for (int type : order)
            for (int b = 0; b < cluster.GpusOfType(type) / block; ++b)
              stage_type.push_back(type);
          if (!seen.insert(stage_type).second) continue;
          std::vector<StageChoice> structure;
          for (int type : stage_type) structure.push_back({type, tp});
          Template t = MakeTemplate(structure, mbs);
          ApplySplit(t, split);
          NodePool pool(cluster);
          tracker.CountTemplate();
          if (!PlaceReplicas(t, dp, pool)) {
            tracker.NoteFailure(absl::StrCat("tp ", tp, " x dp ", dp,
                                             ": the nodes hold no placement"));
            continue;
          }
          ShardExpertsByTp(t, model);
          Plan plan;
          plan.templates.push_back(std::move(t));
          tracker.PriceAndOffer(plan);
        }
      }
    }
  }
  return tracker.Finish(name(), /*exhaustive=*/true);
}

}  // namespace arachne
