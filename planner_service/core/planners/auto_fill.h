// Arithmetic auto-fill (paper §5.3): completes a structural template (GPU
// type and TP degree per stage) into a priced template of a plan: data-
// parallel replicas (as many as the free nodes pack, or up to a cap),
// micro-batch size (every profiled power of two the global batch allows,
// keeping the fastest for the plan so far: its GPUs, hence its price, are
// fixed by then, so the fastest is also the cheapest per token), layer
// split (proportional to profiled stage speed, then a fixed list of
// alternatives when memory fails) and, for MoE stages, the expert tiling
// EP x ETP x EDP (every factorisation priced).
#ifndef ARACHNE_PLANNER_SERVICE_CORE_PLANNERS_AUTO_FILL_H_
#define ARACHNE_PLANNER_SERVICE_CORE_PLANNERS_AUTO_FILL_H_

#include <cstdint>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/types/span.h"
#include "planner_service/core/cost/cost_model.h"
#include "planner_service/core/model/node_pool.h"
#include "planner_service/core/model/plan.h"

namespace arachne {

// One stage of a structural template.
struct StageChoice {
  int gpu_type = -1;
  int tp = 1;
  friend bool operator==(const StageChoice&, const StageChoice&) = default;
};

struct FillResult {
  Plan plan;               // so_far plus the filled template, balanced
  NodePool pool;           // GPUs left free after it
  double iteration_time_s = kInfeasible;
};

// How much slower than the best filled candidate so far a MoE candidate
// (micro-batch size x layer split) may price with each stage's fastest
// expert tiling and still get the whole-iteration re-selection of its
// tilings (a plan priced per alternative tiling that could win). The
// re-selection gains 4% on average where it gains (Qwen3-30B-A3B on 256
// GPUs), so candidates 10% behind rarely win: on 175 random MoE templates
// (auto_fill_test, 2026-12-07) the fill is the same on 171 and prices
// 6,725 plans instead of 17,128; the worst fills 6.1% slower (margin 0.2:
// the same, 7,911 plans; 0.5: 174 the same, at most 0.3% slower, 10,830
// plans). Earlier calibrations measured one template 19.7% slower (175)
// and at most 0.12% (179).
inline constexpr double kTilingReselectMargin = 0.10;

class AutoFill {
 public:
  // `cost_model` must outlive the AutoFill. `tiling_reselect_margin`:
  // kTilingReselectMargin by default; infinity re-selects every candidate.
  // `skip_dominated_tilings`: the stage-by-stage re-selection leaves out
  // the alternatives that lower no term of the iteration (see
  // ReselectExpertTilings); false prices every one (the reference its
  // test compares with).
  explicit AutoFill(const CostModel& cost_model,
                    double tiling_reselect_margin = kTilingReselectMargin,
                    bool skip_dominated_tilings = true);

  // Fills `structure` on the GPUs `pool` leaves free and returns the best
  // plan `so_far` + the new template. FailedPrecondition saying why when no
  // replica fits on the free nodes or every candidate is out of memory;
  // `evaluations` (optional) counts plans priced. `max_replicas` > 0 stops
  // placing replicas at that many (0: as many as fit), leaving the rest of
  // the GPUs free: the fastest plan packs every replica, but a cheaper one
  // per token may not (fewer replicas, fewer GPUs billed, less bubble and
  // gradient sync per token); InvalidArgument when negative.
  absl::StatusOr<FillResult> Extend(const Plan& so_far, const NodePool& pool,
                                    absl::Span<const StageChoice> structure,
                                    int64_t* evaluations = nullptr,
                                    int max_replicas = 0) const;

  // Replicas of `structure` the GPUs `pool` leaves free hold, placed by
  // Extend's rule (what Extend packs without a cap).
  static int PackableReplicas(const NodePool& pool,
                              absl::Span<const StageChoice> structure);

  // Replica caps worth trying for `structure` on `pool` when GPUs left idle
  // are not billed (the usd_per_token objective): 0 (no cap: every replica
  // that fits) first, then every power of two below the packable count,
  // largest first. Just {0} when at most one replica fits.
  static std::vector<int> ReplicaCaps(const NodePool& pool,
                                      absl::Span<const StageChoice> structure);

  // Layer splits tried for a template (exposed for tests): proportional to
  // speed; the same with each stage capped at the layers that fit in its
  // memory; the split minimising the slowest stage within those caps; even.
  // Each split covers all layers, >= 1 per stage. Empty entries are omitted
  // (e.g. when the caps cannot hold the model).
  std::vector<std::vector<int>> CandidateSplits(const Plan& plan,
                                                int template_index) const;

 private:
  // The feasible expert tilings of each stage of a template.
  using TilingOptions = std::vector<std::vector<ExpertTiling>>;
  // The tiling pick's buffers, reused from stage to stage within a fill.
  struct TilingScratch {
    std::vector<ExpertTiling> tilings;
    std::vector<double> memory_gib, time_s;
  };
  // Sets each MoE stage's tiling to its fastest stage time among those
  // that fit (`options` gets them; a dense stage's is its one tiling, and
  // every list is empty when the batch does not balance) and prices the
  // plan.
  double PickExpertTilings(Plan& plan, int template_index,
                           TilingOptions& options, int64_t* evaluations,
                           CostModel::PricingScratch* scratch,
                           TilingScratch& tiling_scratch) const;
  // Re-selects each stage's tiling among `options` against the whole
  // iteration (gradient sync and memory differ between tilings of the
  // same stage time), from the plan priced at `time`: one tiling on every
  // stage that has it, then stage by stage. Returns the time.
  double ReselectExpertTilings(Plan& plan, int template_index,
                               const TilingOptions& options, double time,
                               int64_t* evaluations,
                               CostModel::PricingScratch* scratch) const;
  // Balances the batch and prices the plan (`scratch`: see
  // CostModel::PricingScratch).
  double Price(Plan& plan, int64_t* evaluations,
               CostModel::PricingScratch* scratch) const;

  const CostModel& cm_;
  double tiling_reselect_margin_;
  bool skip_dominated_tilings_;
  // The divisors of the model's routed experts, ascending: the expert-
  // parallel degrees a tiling can have (empty for a dense model).
  std::vector<int> expert_divisors_;
};

}  // namespace arachne

#endif  // ARACHNE_PLANNER_SERVICE_CORE_PLANNERS_AUTO_FILL_H_
