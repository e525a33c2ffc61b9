#include "planner_service/core/planners/sailor_planner.h"

#include <algorithm>

#include "absl/strings/str_cat.h"
#include "planner_service/core/planners/layer_split.h"
#include "planner_service/core/planners/search_tracker.h"
#include "planner_service/core/planners/template_builder.h"

namespace arachne {
namespace {

// A one-replica template of `depth` stages on `gpu_type` at `tp`, layers
// split evenly, experts sharded by TP, as a probe for memory and time.
Plan ProbePlan(const CostModel& cm, int gpu_type, int tp, int depth, int mbs) {
  Template t = MakeTemplate(std::vector<StageChoice>(depth, {gpu_type, tp}), mbs);
  ApplySplit(t, EvenSplit(cm.model().num_layers, depth));
  t.replicas = 1;
  // The deepest in-flight count any balance can give: the memory worst case.
  t.total_micro_batches = depth * 4;
  ShardExpertsByTp(t, cm.model());
  Plan plan;
  plan.templates.push_back(std::move(t));
  return plan;
}

}  // namespace

int SailorPlanner::TpDegree(const CostModel& cm, int gpu_type, int stage,
                            int depth, int mbs, int max_tp) {
  auto fits = [&](int tp) {
    if (!cm.Supports(gpu_type, tp, mbs)) return false;
    const Plan p = ProbePlan(cm, gpu_type, tp, depth, mbs);
    return cm.StageMemoryOf(p, 0, stage).total_gib() <=
           cm.UsableMemoryGib(gpu_type);
  };
  auto time = [&](int tp) {
    const Plan p = ProbePlan(cm, gpu_type, tp, depth, mbs);
    const StageCosts c = StageCostsOf(cm, p.templates[0]);
    return p.templates[0].stages[stage].num_layers() * c.per_layer_s[stage] +
           c.fixed_s[stage];
  };
  int fit = 0;
  for (int tp = 1; tp <= max_tp; tp *= 2) {
    if (fits(tp)) {
      fit = tp;
      break;
    }
  }
  if (fit == 0) return 0;
  int speed = 1;
  while (speed * 2 <= max_tp && cm.Supports(gpu_type, speed * 2, mbs) &&
         time(speed) / time(speed * 2) >= kTpSpeedupThreshold) {
    speed *= 2;
  }
  const int tp = std::max(fit, speed);
  return fits(tp) ? tp : fit;
}

absl::StatusOr<PlanResult> SailorPlanner::Run(const CostModel& cm,
                                              const PlannerOptions& options) {
  SearchTracker tracker(cm, options);
  const Cluster& cluster = cm.cluster();
  const ModelSpec& model = cm.model();
  const int L = model.num_layers;
  const int max_depth = std::min(options.max_depth, L);
  const bool uniform = UniformNodeSizes(cluster);

  for (int depth = 1; depth <= max_depth; ++depth) {
    const std::vector<int> split = EvenSplit(L, depth);
    for (int mbs : MicroBatchSizes(cm)) {
      if (tracker.OutOfBudget()) return tracker.Finish(name(), false);
      // Per type: its per-stage TP degrees and how many replicas it holds.
      std::vector<int> types;
      std::vector<std::vector<StageChoice>> pipeline(cm.catalog().size());
      std::vector<int> max_replicas(cm.catalog().size(), 0);
      const NodePool full(cluster);
      for (int type : cluster.types_present()) {
        const int max_tp =
            uniform ? std::min(cm.params().max_tp, cluster.MaxNodeSizeOfType(type))
                    : 1;
        std::vector<StageChoice> stages;
        for (int s = 0; s < depth; ++s) {
          const int tp = TpDegree(cm, type, s, depth, mbs, max_tp);
          if (tp == 0) break;
          stages.push_back({type, tp});
        }
        if (static_cast<int>(stages.size()) != depth) continue;
        const int n = CountReplicas(MakeTemplate(stages, mbs).stages, full);
        if (n == 0) continue;
        types.push_back(type);
        pipeline[type] = std::move(stages);
        max_replicas[type] = n;
      }
      if (types.empty()) {
        tracker.NoteFailure(absl::StrCat("depth ", depth, ", micro-batch ", mbs,
                                         ": no GPU type fits a stage"));
        continue;
      }
      // Every combination of replica counts per type, most GPUs first.
      std::vector<int> count(types.size());
      for (size_t i = 0; i < types.size(); ++i) count[i] = max_replicas[types[i]];
      while (true) {
        if (tracker.OutOfBudget()) return tracker.Finish(name(), false);
        Plan plan;
        NodePool pool(cluster);
        bool placed = true;
        for (size_t i = 0; i < types.size() && placed; ++i) {
          if (count[i] == 0) continue;
          Template t = MakeTemplate(pipeline[types[i]], mbs);
          ApplySplit(t, split);
          placed = PlaceReplicas(t, count[i], pool);
          ShardExpertsByTp(t, model);
          plan.templates.push_back(std::move(t));
        }
        // Leftover GPUs of several types: mixed-type replicas, each stage on
        // the type with the most stage slots left.
        if (placed && pool.TotalFree() > 0) {
          std::vector<StageChoice> mixed;
          std::vector<int> used(cm.catalog().size(), 0);
          for (int s = 0; s < depth; ++s) {
            int pick = -1;
            double slots = 0;
            for (int type : types) {
              const int tp = pipeline[type][s].tp;
              const double left =
                  static_cast<double>(pool.FreeOfType(type) - used[type]) / tp;
              if (left >= 1 && left > slots) {
                pick = type;
                slots = left;
              }
            }
            if (pick < 0) break;
            mixed.push_back(pipeline[pick][s]);
            used[pick] += pipeline[pick][s].tp;
          }
          if (static_cast<int>(mixed.size()) == depth) {
            Template t = MakeTemplate(mixed, mbs);
            ApplySplit(t, split);
            const int n = CountReplicas(t.stages, pool);
            if (n > 0 && PlaceReplicas(t, n, pool)) {
              ShardExpertsByTp(t, model);
              plan.templates.push_back(std::move(t));
            }
          }
        }
        if (placed && !plan.templates.empty()) {
          tracker.CountTemplate();
          tracker.PriceAndOffer(plan);
        }
        // Next combination (odometer, counting down).
        size_t i = 0;
        while (i < count.size() && count[i] == 0) {
          count[i] = max_replicas[types[i]];
          ++i;
        }
        if (i == count.size()) break;
        --count[i];
      }
    }
  }
  return tracker.Finish(name(), /*exhaustive=*/true);
}

}  // namespace arachne
