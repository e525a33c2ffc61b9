// What every search-based planner keeps while it searches: the budget (wall
// clock and evaluation count), the counters, the incumbent plan and its
// progress curve, and the final validation and pricing of the result.
#ifndef ARACHNE_PLANNER_SERVICE_CORE_PLANNERS_SEARCH_TRACKER_H_
#define ARACHNE_PLANNER_SERVICE_CORE_PLANNERS_SEARCH_TRACKER_H_

#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "planner_service/core/cost/cost_model.h"
#include "planner_service/core/planners/planner.h"

namespace arachne {

// Dollars per hour of the GPUs `plan` uses (the cost model's
// Prediction::usd_per_hour without pricing the plan): idle GPUs are free.
double PlanUsdPerHour(const GpuCatalog& catalog, const Plan& plan);

// Dollars per token of a plan that costs `usd_per_hour` and trains
// `tokens_per_s`; infinite when it trains nothing.
double UsdPerToken(double usd_per_hour, double tokens_per_s);

// OK when `objective` can rank plans on `cost_model`'s cluster. Under
// usd_per_token every GPU type present in the cluster needs a price: any plan
// may use any of them, and a type priced 0 (the catalog's default when
// usd_per_hour is missing) would rank as free GPUs instead of failing.
// FailedPrecondition naming the unpriced types otherwise.
absl::Status CheckObjective(const CostModel& cost_model,
                            PlannerObjective objective);

class SearchTracker {
 public:
  // `cost_model` must outlive the tracker; the budget starts now. When
  // options.objective cannot rank plans here (CheckObjective), the tracker
  // is out of budget from the start and Finish returns that error.
  SearchTracker(const CostModel& cost_model, const PlannerOptions& options);

  // True once the wall-clock budget or the evaluation limit is spent (or the
  // objective is unusable); stays true afterwards so nested loops unwind.
  bool OutOfBudget();
  bool stopped() const { return stopped_; }
  // True when the search stopped because options.cancelled was set.
  bool cancelled() const { return cancelled_; }

  // The evaluation counter, for code (auto-fill) that prices plans itself.
  int64_t* evaluation_counter() { return &evaluations_; }
  int64_t evaluations() const { return evaluations_; }
  void CountTemplate() { ++templates_tried_; }

  // Balances the micro-batches of `plan` and prices it (one evaluation);
  // keeps it when it beats the incumbent. Returns the iteration time, or
  // kInfeasible with the reason in *why (when non-null).
  double PriceAndOffer(Plan& plan, Infeasibility* why = nullptr);
  // Keeps `plan` (balanced, priced by the caller at `iteration_time_s`) when
  // it beats the incumbent under the objective; returns whether it did.
  bool Offer(const Plan& plan, double iteration_time_s);

  PlannerObjective objective() const { return options_.objective; }
  // The objective's value of `plan` priced at `iteration_time_s`, lower is
  // better: the iteration time (throughput) or $ per token (usd_per_token).
  // kInfeasible for an infeasible time.
  double Score(const Plan& plan, double iteration_time_s) const;
  // Score of the incumbent (kInfeasible before one is found).
  double best_score() const { return best_score_; }
  // How many times the incumbent improved (the progress curve's length).
  int64_t improvements() const {
    return static_cast<int64_t>(progress_.size());
  }

  // Remembers why the latest candidate failed, for the no-plan message.
  void NoteFailure(std::string why) { last_failure_ = std::move(why); }

  bool found() const { return best_time_ < kInfeasible; }
  const Plan& best() const { return best_; }
  double best_time() const { return best_time_; }
  double elapsed_s() const;

  // The result of planner `name`: the incumbent validated (Internal when a
  // planner built an invalid plan: a bug) and predicted, with statistics.
  // Without a plan: ResourceExhausted when the evaluation limit stopped the
  // search, DeadlineExceeded when the budget did, Cancelled on
  // options.cancelled (each says the search was stopped before any plan was
  // found: more budget may find one); FailedPrecondition saying why when the
  // search ended without a plan (nothing fits) or the objective cannot be
  // used on this cluster.
  absl::StatusOr<PlanResult> Finish(const std::string& name,
                                    bool exhaustive) const;

 private:
  const CostModel& cm_;
  PlannerOptions options_;
  const Clock& clock_;
  absl::Time start_, deadline_;
  Plan best_;
  double best_time_ = kInfeasible;
  double best_score_ = kInfeasible;
  // Tokens of one iteration (global batch x sequence), for $ per token.
  double tokens_per_iteration_ = 0;
  absl::Status objective_status_;
  int64_t evaluations_ = 0, templates_tried_ = 0;
  bool stopped_ = false, cancelled_ = false;
  // What stopped the search (OutOfBudget), for Finish's message.
  enum class StopReason { kNone, kEvaluations, kBudget };
  StopReason stop_reason_ = StopReason::kNone;
  std::string last_failure_;
  std::vector<ProgressPoint> progress_;
};

}  // namespace arachne

#endif  // ARACHNE_PLANNER_SERVICE_CORE_PLANNERS_SEARCH_TRACKER_H_
