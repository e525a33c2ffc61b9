#include "planner_service/core/planners/espresso_planner.h"

#include <algorithm>
#include <cmath>

#include "absl/strings/str_cat.h"
#include "planner_service/core/planners/layer_split.h"
#include "planner_service/core/planners/search_tracker.h"
#include "planner_service/core/planners/template_builder.h"

namespace arachne {
namespace {

class EspressoSearch {
 public:
  EspressoSearch(const CostModel& cm, SearchTracker& tracker, int max_depth)
      : cm_(cm), tracker_(tracker), max_depth_(max_depth) {}

  void Run() {
    for (int depth = 1; depth <= max_depth_; ++depth) {
      for (int mbs : MicroBatchSizes(cm_)) {
        if (tracker_.OutOfBudget()) return;
        if (!Prepare(mbs)) continue;
        depth_ = depth;
        mbs_ = mbs;
        structure_.clear();
        std::fill(count_.begin(), count_.end(), 0);
        Branch();
      }
    }
  }

 private:
  // Types usable at TP 1 and this micro-batch size, fastest first, with the
  // least time one layer can take on each (the bound's speed).
  bool Prepare(int mbs) {
    types_.clear();
    count_.assign(cm_.catalog().size(), 0);
    speed_.assign(cm_.catalog().size(), 0);
    for (int type : cm_.cluster().types_present()) {
      if (!cm_.Supports(type, 1, mbs)) continue;
      double least = kInfeasible;
      for (LayerKind kind : {LayerKind::kDense, LayerKind::kMoeAttention}) {
        const LayerCost& c = cm_.Layer(kind, type, 1, mbs);
        if (!c.present) continue;
        double t = c.compute_s + c.tp_comm_s;
        if (kind == LayerKind::kMoeAttention) {
          const LayerCost& e = cm_.Layer(LayerKind::kMoeExperts, type, 1, mbs);
          t += e.compute_s + e.tp_comm_s;
        }
        least = std::min(least, t);
      }
      if (!(least > 0) || !std::isfinite(least)) continue;
      speed_[type] = 1.0 / least;
      types_.push_back(type);
    }
    std::sort(types_.begin(), types_.end(),
              [&](int a, int b) { return speed_[a] > speed_[b]; });
    return !types_.empty();
  }

  // Most replicas the stages chosen so far allow (more stages never allow
  // more replicas).
  int ReplicaBound() const {
    const Cluster& cluster = cm_.cluster();
    int bound = cluster.total_gpus() / depth_;
    for (int type : types_)
      if (count_[type] > 0)
        bound = std::min(bound, cluster.GpusOfType(type) / count_[type]);
    return bound;
  }

  // Lower bound on the iteration time of any completion: the busiest
  // replica's micro-batches, each taking at least the perfectly balanced
  // per-stage time, with undecided stages on the fastest type.
  double TimeBound(int replicas) const {
    double speed = (depth_ - structure_.size()) * speed_[types_.front()];
    for (const StageChoice& c : structure_) speed += speed_[c.gpu_type];
    const int64_t micro = cm_.training().global_batch / mbs_;
    const int64_t per_replica = (micro + replicas - 1) / replicas;
    return per_replica * cm_.model().num_layers / speed;
  }

  // Lower bound on the $ per token of any completion, for the usd_per_token
  // objective (a bound on time alone would prune cheaper, slower plans). A
  // completion with r replicas costs r x (one replica's GPUs) per hour and
  // its iteration takes at least TimeBound(r) = ceil(micro / r) x L / speed,
  // so its cost per iteration is at least micro x L / speed x the price of
  // one replica, whatever r is; undecided stages count at the cheapest type
  // (and, in `speed`, at the fastest).
  double UsdPerTokenBound() const {
    const GpuCatalog& catalog = cm_.catalog();
    double cheapest = kInfeasible;
    for (int type : types_)
      cheapest = std::min(cheapest, catalog.type(type).usd_per_hour);
    double price = (depth_ - structure_.size()) * cheapest;
    for (const StageChoice& c : structure_)
      price += catalog.type(c.gpu_type).usd_per_hour;
    double speed = (depth_ - structure_.size()) * speed_[types_.front()];
    for (const StageChoice& c : structure_) speed += speed_[c.gpu_type];
    const double micro =
        static_cast<double>(cm_.training().global_batch / mbs_);
    const double tokens = static_cast<double>(cm_.training().global_batch) *
                          cm_.training().seq_len;
    return micro * cm_.model().num_layers / speed * price / 3600.0 / tokens;
  }

  void Branch() {
    if (tracker_.OutOfBudget()) return;
    const int replicas = ReplicaBound();
    if (replicas < 1) return;
    // Prune on the objective's bound. Under usd_per_token an equal score can
    // still win on throughput, so only a strictly worse bound prunes.
    if (tracker_.objective() == PlannerObjective::kUsdPerToken
            ? UsdPerTokenBound() > tracker_.best_score()
            : TimeBound(replicas) >= tracker_.best_time())
      return;
    if (static_cast<int>(structure_.size()) == depth_) {
      Leaf(replicas);
      return;
    }
    for (int type : types_) {
      structure_.push_back({type, 1});
      ++count_[type];
      Branch();
      --count_[type];
      structure_.pop_back();
    }
  }

  void Leaf(int replicas) {
    tracker_.CountTemplate();
    Template t = MakeTemplate(structure_, mbs_);
    t.replicas = replicas;
    Plan plan;
    plan.templates.push_back(t);
    const StageCosts costs = StageCostsOf(cm_, t);
    const std::vector<int> split =
        GreedySplit(cm_.model().num_layers, costs.per_layer_s, costs.fixed_s,
                    LayerCaps(cm_, plan, 0));
    if (split.empty()) {
      tracker_.NoteFailure(absl::StrCat("depth ", depth_, ", micro-batch ",
                                        mbs_, ": the layers fit in no split"));
      return;
    }
    ApplySplit(t, split);
    NodePool pool(cm_.cluster());
    if (!PlaceReplicas(t, replicas, pool)) return;
    ShardExpertsByTp(t, cm_.model());
    plan.templates[0] = std::move(t);
    tracker_.PriceAndOffer(plan);
  }

  const CostModel& cm_;
  SearchTracker& tracker_;
  const int max_depth_;
  int depth_ = 1, mbs_ = 1;
  std::vector<int> types_;
  std::vector<int> count_;
  std::vector<double> speed_;
  std::vector<StageChoice> structure_;
};

}  // namespace

absl::StatusOr<PlanResult> EspressoPlanner::Run(const CostModel& cm,
                                                const PlannerOptions& options) {
  SearchTracker tracker(cm, options);
  EspressoSearch search(cm, tracker,
                        std::min(options.max_depth, cm.model().num_layers));
  search.Run();
  return tracker.Finish(name(), /*exhaustive=*/true);
}

}  // namespace arachne
