#include "planner_service/core/planners/metis_planner.h"

#include <algorithm>
#include <functional>

#include "absl/strings/str_cat.h"
#include "planner_service/core/planners/layer_split.h"
#include "planner_service/core/planners/search_tracker.h"
#include "planner_service/core/planners/template_builder.h"

namespace arachne {
namespace {

class MetisSearch {
 public:
  MetisSearch(const CostModel& cm, SearchTracker& tracker, int max_depth)
      : cm_(cm), tracker_(tracker), max_depth_(max_depth) {}

  void Run() {
    const Cluster& cluster = cm_.cluster();
    const std::vector<int>& types = cluster.types_present();
    for (int mbs : MicroBatchSizes(cm_)) {
      for (int replicas = 1; replicas <= cluster.total_gpus(); replicas *= 2) {
        if (static_cast<int64_t>(replicas) * mbs > cm_.training().global_batch)
          break;
        for (int depth = 1; depth <= max_depth_; ++depth) {
          // Stage counts per type (device groups of `replicas` GPUs at TP 1).
          std::vector<int> count(types.size(), 0);
          std::function<void(size_t, int)> counts = [&](size_t i, int left) {
            if (tracker_.OutOfBudget()) return;
            if (i + 1 == types.size()) {
              if (static_cast<int64_t>(left) * replicas >
                  cluster.GpusOfType(types[i]))
                return;
              count[i] = left;
              Mappings(types, count, replicas, mbs);
              return;
            }
            for (int c = 0; c <= left; ++c) {
              if (static_cast<int64_t>(c) * replicas >
                  cluster.GpusOfType(types[i]))
                break;
              count[i] = c;
              counts(i + 1, left - c);
            }
          };
          counts(0, depth);
          if (tracker_.OutOfBudget()) return;
        }
      }
    }
  }

 private:
  // Every order of the used types' runs of stages: the stage-to-GPU
  // mappings of one set of device groups.
  void Mappings(const std::vector<int>& types, const std::vector<int>& count,
                int replicas, int mbs) {
    std::vector<int> used;
    for (size_t i = 0; i < types.size(); ++i)
      if (count[i] > 0) used.push_back(static_cast<int>(i));
    for (const std::vector<int>& order : Permutations(used)) {
      if (tracker_.OutOfBudget()) return;
      std::vector<StageChoice> structure;
      for (int i : order)
        for (int c = 0; c < count[i]; ++c) structure.push_back({types[i], 1});
      Try(structure, replicas, mbs);
    }
  }

  // Prices one mapping, growing TP (in powers of two) only on the stages
  // that do not fit: DP before TP.
  void Try(std::vector<StageChoice> structure, int replicas, int mbs) {
    const ModelSpec& model = cm_.model();
    const Cluster& cluster = cm_.cluster();
    for (int attempt = 0; attempt <= kMaxTpLog2; ++attempt) {
      if (tracker_.OutOfBudget()) return;
      for (const StageChoice& c : structure)
        if (!cm_.Supports(c.gpu_type, c.tp, mbs)) return;
      tracker_.CountTemplate();
      Template t = MakeTemplate(structure, mbs);
      t.replicas = replicas;
      const StageCosts costs = StageCostsOf(cm_, t);
      // One-shot balance by speed, blind to memory.
      const std::vector<int> split =
          BalancedSplit(model.num_layers, costs.per_layer_s, costs.fixed_s,
                        std::vector<int>(t.depth(), model.num_layers));
      if (split.empty()) return;
      ApplySplit(t, split);
      NodePool pool(cluster);
      if (!PlaceReplicas(t, replicas, pool)) {
        tracker_.NoteFailure(absl::StrCat(replicas, " replicas of depth ",
                                          t.depth(), ": no placement"));
        return;
      }
      ShardExpertsByTp(t, model);
      Plan plan;
      plan.templates.push_back(std::move(t));
      Infeasibility why = Infeasibility::kOk;
      tracker_.PriceAndOffer(plan, &why);
      if (why != Infeasibility::kOutOfMemory) return;
      // Out of memory: double TP on the stages that overflow.
      bool grew = false;
      std::vector<int> used(cm_.catalog().size(), 0);
      for (const StageChoice& c : structure) used[c.gpu_type] += c.tp * replicas;
      for (int s = 0; s < plan.templates[0].depth(); ++s) {
        StageChoice& c = structure[s];
        if (cm_.StageMemoryOf(plan, 0, s).total_gib() <=
            cm_.UsableMemoryGib(c.gpu_type))
          continue;
        if (c.tp * 2 > std::min(cm_.params().max_tp,
                                cluster.MaxNodeSizeOfType(c.gpu_type)) ||
            used[c.gpu_type] + c.tp * replicas >
                cluster.GpusOfType(c.gpu_type))
          continue;
        used[c.gpu_type] += c.tp * replicas;
        c.tp *= 2;
        grew = true;
      }
      if (!grew) {
        tracker_.NoteFailure(absl::StrCat(replicas, " replicas of depth ",
                                          structure.size(),
                                          ": out of memory"));
        return;
      }
    }
  }

  const CostModel& cm_;
  SearchTracker& tracker_;
  const int max_depth_;
};

}  // namespace

absl::StatusOr<PlanResult> MetisPlanner::Run(const CostModel& cm,
                                             const PlannerOptions& options) {
  SearchTracker tracker(cm, options);
  MetisSearch search(cm, tracker,
                     std::min(options.max_depth, cm.model().num_layers));
  search.Run();
  return tracker.Finish(name(), /*exhaustive=*/true);
}

}  // namespace arachne
