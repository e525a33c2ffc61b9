#include "planner_service/core/planners/exact_planner.h"

#include <algorithm>
#include <cmath>
#include <functional>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "planner_service/core/planners/search_tracker.h"

namespace arachne {

namespace {

// Search state shared by the phases: the best plan so far, the budget and
// counters.
class Search {
 public:
  Search(const CostModel& cm, const PlannerOptions& options)
      : cm_(cm),
        fill_(cm),
        options_(options),
        tracker_(cm, options),
        choices_(ExactPlanner::StageOptions(cm)),
        max_depth_(std::min(options.max_depth, cm.model().num_layers)) {}

  void Run() {
    const Plan empty;
    const NodePool pool(cm_.cluster());
    // Phase 1: uniform templates; phase 2: one contiguous run per GPU type;
    // each followed by greedily adding templates on the GPUs left. These
    // hold the plans practitioners build by hand, so the best of them is a
    // strong incumbent before the exhaustive phase.
    const auto try_first = [&](const std::vector<StageChoice>& s) {
      TryTemplate(empty, pool, s, 0, /*recurse=*/false);
    };
    ForEachUniform(pool, try_first);
    ExtendBestGreedily(/*with_runs=*/false);
    ForEachTypeRuns(pool, try_first);
    ExtendBestGreedily(/*with_runs=*/true);
    // Phase 3: every structure, every sequence of templates (in canonical
    // order: templates of a plan are a set).
    exhaustive_ = true;
    Enumerate(empty, pool, 0, {});
  }

  bool found() const { return tracker_.found(); }
  bool exhaustive() const { return exhaustive_; }
  const SearchTracker& tracker() const { return tracker_; }

 private:
  bool OutOfBudget() { return tracker_.OutOfBudget(); }

  // Fills `structure` on top of `so_far`; records an improvement and, when
  // `recurse`, continues with further templates on the GPUs left. Auto-fill
  // packs as many replicas as fit, which is what the fastest plan wants;
  // under usd_per_token a plan on fewer GPUs can cost less per token (the
  // idle GPUs are not billed; fewer replicas mean less bubble and gradient
  // sync per token), so the template is also filled with every power of two
  // replicas below the packed count.
  void TryTemplate(const Plan& so_far, const NodePool& pool,
                   const std::vector<StageChoice>& structure, int level,
                   bool recurse) {
    if (tracker_.objective() != PlannerObjective::kUsdPerToken) {
      FillAndRecurse(so_far, pool, structure, level, recurse,
                     /*max_replicas=*/0);
      return;
    }
    // The caps come from the pool rather than from the packed fill: that
    // fill can fail (the batch does not split into that many replicas)
    // where fewer fit.
    for (int cap : AutoFill::ReplicaCaps(pool, structure))
      FillAndRecurse(so_far, pool, structure, level, recurse, cap);
  }

  // One fill of TryTemplate with at most `max_replicas` replicas (0: as
  // many as fit).
  void FillAndRecurse(const Plan& so_far, const NodePool& pool,
                     const std::vector<StageChoice>& structure, int level,
                     bool recurse, int max_replicas) {
    if (OutOfBudget()) return;
    tracker_.CountTemplate();
    absl::StatusOr<FillResult> r =
        fill_.Extend(so_far, pool, structure, tracker_.evaluation_counter(),
                     max_replicas);
    if (!r.ok()) {
      tracker_.NoteFailure(std::string(r.status().message()));
      return;
    }
    tracker_.Offer(r->plan, r->iteration_time_s);
    if (recurse && level + 1 < options_.max_templates &&
        r->pool.TotalFree() > 0) {
      Enumerate(r->plan, r->pool, level + 1, structure);
    }
  }

  // Every structure of depth 1..Dmax whose stages the free GPUs can hold,
  // not ordered before `min_structure` (canonical template order).
  void Enumerate(const Plan& so_far, const NodePool& pool, int level,
                 const std::vector<StageChoice>& min_structure) {
    std::vector<StageChoice> structure;
    std::vector<int> used(cm_.catalog().size(), 0);
    for (int d = 1; d <= max_depth_ && !OutOfBudget(); ++d) {
      if (!min_structure.empty() && d < static_cast<int>(min_structure.size()))
        continue;
      structure.clear();
      std::fill(used.begin(), used.end(), 0);
      Dfs(so_far, pool, level, d, min_structure, structure, used);
    }
  }

  void Dfs(const Plan& so_far, const NodePool& pool, int level, int depth,
           const std::vector<StageChoice>& min_structure,
           std::vector<StageChoice>& structure, std::vector<int>& used) {
    if (OutOfBudget()) return;
    if (static_cast<int>(structure.size()) == depth) {
      if (!min_structure.empty() &&
          static_cast<int>(min_structure.size()) == depth &&
          KeyLess(structure, min_structure))
        return;
      TryTemplate(so_far, pool, structure, level, /*recurse=*/true);
      return;
    }
    for (const StageChoice& c : choices_) {
      if (used[c.gpu_type] + c.tp > pool.FreeOfType(c.gpu_type)) continue;
      if (c.tp > pool.LargestFreeOfType(c.gpu_type)) continue;
      used[c.gpu_type] += c.tp;
      structure.push_back(c);
      Dfs(so_far, pool, level, depth, min_structure, structure, used);
      structure.pop_back();
      used[c.gpu_type] -= c.tp;
    }
  }

  bool KeyLess(const std::vector<StageChoice>& a,
               const std::vector<StageChoice>& b) const {
    auto index = [&](const StageChoice& c) {
      return static_cast<int>(std::find(choices_.begin(), choices_.end(), c) -
                              choices_.begin());
    };
    for (size_t i = 0; i < std::min(a.size(), b.size()); ++i) {
      if (index(a[i]) != index(b[i])) return index(a[i]) < index(b[i]);
    }
    return a.size() < b.size();
  }

  using StructureFn = std::function<void(const std::vector<StageChoice>&)>;

  // Uniform structures (one type and TP degree on every stage), depth
  // 1..Dmax, that the free GPUs can hold.
  void ForEachUniform(const NodePool& pool, const StructureFn& fn) {
    for (int d = 1; d <= max_depth_; ++d) {
      for (const StageChoice& c : choices_) {
        if (OutOfBudget()) return;
        if (c.tp * d > pool.FreeOfType(c.gpu_type)) continue;
        fn(std::vector<StageChoice>(d, c));
      }
    }
  }

  // Structures made of one contiguous run of stages per GPU type (>= 2
  // types, one TP degree per run), depth up to Dmax.
  void ForEachTypeRuns(const NodePool& pool, const StructureFn& fn) {
    std::vector<int> types = cm_.cluster().types_present();
    if (types.size() < 2) return;
    // Ordered subsets of >= 2 types, a TP per type, stage counts per run.
    std::vector<StageChoice> runs;
    std::function<void(std::vector<bool>&)> pick_types =
        [&](std::vector<bool>& taken) {
          if (runs.size() >= 2) Counts(pool, runs, fn);
          for (size_t i = 0; i < types.size(); ++i) {
            if (taken[i] || OutOfBudget()) continue;
            taken[i] = true;
            for (const StageChoice& c : choices_) {
              if (c.gpu_type != types[i]) continue;
              runs.push_back(c);
              pick_types(taken);
              runs.pop_back();
            }
            taken[i] = false;
          }
        };
    std::vector<bool> taken(types.size(), false);
    pick_types(taken);
  }

  void Counts(const NodePool& pool, const std::vector<StageChoice>& runs,
              const StructureFn& fn) {
    const int k = static_cast<int>(runs.size());
    std::vector<int> count(k, 1);
    for (int d = k; d <= max_depth_; ++d) {
      // Exactly d stages: the last run takes what is left.
      std::function<void(int, int)> exact = [&](int i, int left) {
        if (OutOfBudget()) return;
        if (i == k - 1) {
          if (left < 1 ||
              runs[i].tp * left > pool.FreeOfType(runs[i].gpu_type))
            return;
          count[i] = left;
          std::vector<StageChoice> s;
          for (int j = 0; j < k; ++j)
            for (int c = 0; c < count[j]; ++c) s.push_back(runs[j]);
          fn(s);
          return;
        }
        for (int c = 1; c <= left - (k - i - 1); ++c) {
          if (runs[i].tp * c > pool.FreeOfType(runs[i].gpu_type)) break;
          count[i] = c;
          exact(i + 1, left - c);
        }
      };
      exact(0, d);
    }
  }

  // Adds templates to the incumbent while that helps, trying the uniform
  // (and, `with_runs`, the per-type-run) structures on the GPUs it leaves
  // free.
  void ExtendBestGreedily(bool with_runs) {
    for (int level = 1; level < options_.max_templates && found(); ++level) {
      NodePool pool(cm_.cluster());
      if (!pool.Take(tracker_.best()).ok() || pool.TotalFree() == 0) return;
      const Plan base = tracker_.best();
      // Improvement under the objective, not just a faster plan.
      const int64_t before = tracker_.improvements();
      const auto try_next = [&](const std::vector<StageChoice>& s) {
        TryTemplate(base, pool, s, level, /*recurse=*/false);
      };
      ForEachUniform(pool, try_next);
      if (with_runs) ForEachTypeRuns(pool, try_next);
      if (tracker_.improvements() == before) return;
    }
  }

  const CostModel& cm_;
  AutoFill fill_;
  PlannerOptions options_;
  SearchTracker tracker_;
  std::vector<StageChoice> choices_;
  int max_depth_;
  bool exhaustive_ = false;
};

}  // namespace

std::vector<StageChoice> ExactPlanner::StageOptions(const CostModel& cm) {
  std::vector<StageChoice> out;
  for (int type : cm.cluster().types_present()) {
    const int max_tp =
        std::min(cm.params().max_tp, cm.cluster().MaxNodeSizeOfType(type));
    for (int tp = 1; tp <= max_tp; tp *= 2) {
      if (cm.Supports(type, tp, 1)) out.push_back({type, tp});
    }
  }
  return out;
}

absl::StatusOr<PlanResult> ExactPlanner::Run(const CostModel& cm,
                                             const PlannerOptions& options) {
  Search search(cm, options);
  search.Run();
  return search.tracker().Finish(name(), search.exhaustive());
}

}  // namespace arachne
