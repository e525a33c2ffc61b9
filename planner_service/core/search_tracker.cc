#include "planner_service/core/search_tracker.h"

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "planner_service/core/plan_validation.h"
#include "planner_service/core/planners.h"

namespace arachne {

const Clock& DefaultClock() {
  static const RealClock* clock = new RealClock();
  return *clock;
}

SearchTracker::SearchTracker(const CostModel& cm, const PlannerOptions& options)
    : cm_(cm),
      options_(options),
      clock_(options.clock ? *options.clock : DefaultClock()),
      start_(clock_.Now()),
      deadline_(start_ + options.budget) {}

bool SearchTracker::OutOfBudget() {
  if (stopped_) return true;
  if (options_.max_evaluations > 0 &&
      evaluations_ >= options_.max_evaluations) {
    stopped_ = true;
  } else if (options_.cancelled != nullptr &&
             options_.cancelled->load(std::memory_order_relaxed)) {
    stopped_ = true;
    cancelled_ = true;
  } else if (clock_.Now() >= deadline_) {
    stopped_ = true;
  }
  return stopped_;
}

double SearchTracker::PriceAndOffer(Plan& plan, Infeasibility* why) {
  ++evaluations_;
  Infeasibility reason = cm_.BalanceMicroBatches(plan);
  double time = kInfeasible;
  if (reason == Infeasibility::kOk) time = cm_.IterationTime(plan, &reason);
  if (why) *why = reason;
  Offer(plan, time);
  return time;
}

bool SearchTracker::Offer(const Plan& plan, double iteration_time_s) {
  if (!(iteration_time_s < best_time_)) return false;
  best_time_ = iteration_time_s;
  best_ = plan;
  progress_.push_back(ProgressPoint{evaluations_, elapsed_s(),
                                    1.0 / iteration_time_s});
  return true;
}

double SearchTracker::elapsed_s() const {
  return absl::ToDoubleSeconds(clock_.Now() - start_);
}

absl::StatusOr<PlanResult> SearchTracker::Finish(const std::string& name,
                                                 bool exhaustive) const {
  if (!found() && cancelled_) {
    return absl::CancelledError(
        absl::StrCat(name, ": cancelled after ", evaluations_,
                     " plan evaluations, before any plan was found"));
  }
  if (!found()) {
    const std::string why = ExplainNoFit(cm_);
    return absl::FailedPreconditionError(absl::StrCat(
        name, ": no plan fits ", cm_.model().name, " on this cluster",
        last_failure_.empty()
            ? ""
            : absl::StrCat(" (last candidate tried: ", last_failure_, ")"),
        why.empty() ? "" : absl::StrCat("; ", why)));
  }
  PlanResult result;
  result.planner = name;
  result.plan = best_;
  if (absl::Status s = ValidatePlan(result.plan, cm_); !s.ok()) {
    return absl::InternalError(absl::StrCat(
        name, " planner built an invalid plan: ", s.message()));
  }
  absl::StatusOr<Prediction> p = cm_.Predict(result.plan);
  if (!p.ok()) return p.status();
  result.prediction = *std::move(p);
  result.stats.evaluations = evaluations_;
  result.stats.templates_tried = templates_tried_;
  result.stats.exhaustive = exhaustive && !stopped_;
  result.stats.wall_s = elapsed_s();
  result.stats.progress = progress_;
  result.stats.cancelled = cancelled_;
  return result;
}

}  // namespace arachne
