#include "planner_service/core/planners/search_tracker.h"

#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "planner_service/core/cost/plan_validation.h"

namespace arachne {

const Clock& DefaultClock() {
  static const RealClock* clock = new RealClock();
  return *clock;
}

absl::string_view PlannerObjectiveName(PlannerObjective objective) {
  switch (objective) {
    case PlannerObjective::kThroughput:
      return "throughput";
    case PlannerObjective::kUsdPerToken:
      return "usd_per_token";
  }
  return "unknown";
}

absl::StatusOr<PlannerObjective> ParsePlannerObjective(absl::string_view name) {
  for (PlannerObjective o :
       {PlannerObjective::kThroughput, PlannerObjective::kUsdPerToken}) {
    if (name == PlannerObjectiveName(o)) return o;
  }
  return absl::InvalidArgumentError(
      absl::StrCat("objective: unknown value \"", name,
                   "\"; expected throughput or usd_per_token"));
}

double PlanUsdPerHour(const GpuCatalog& catalog, const Plan& plan) {
  double usd = 0;
  for (const Template& t : plan.templates)
    for (const Stage& st : t.stages)
      usd += catalog.type(st.gpu_type).usd_per_hour * st.tp * t.replicas;
  return usd;
}

double UsdPerToken(double usd_per_hour, double tokens_per_s) {
  if (!(tokens_per_s > 0)) return kInfeasible;
  return usd_per_hour / (tokens_per_s * 3600.0);
}

absl::Status CheckObjective(const CostModel& cm, PlannerObjective objective) {
  if (objective != PlannerObjective::kUsdPerToken) return absl::OkStatus();
  std::vector<std::string> unpriced;
  for (int type : cm.cluster().types_present()) {
    const GpuType& g = cm.catalog().type(type);
    if (!(g.usd_per_hour > 0)) unpriced.push_back(g.id);
  }
  if (unpriced.empty()) return absl::OkStatus();
  return absl::FailedPreconditionError(absl::StrCat(
      "objective usd_per_token: GPU type", unpriced.size() > 1 ? "s " : " ",
      absl::StrJoin(unpriced, ", "),
      " of the cluster ", unpriced.size() > 1 ? "have" : "has",
      " no price (usd_per_hour 0 or missing in the GPU catalog); give ",
      unpriced.size() > 1 ? "them" : "it",
      " a usd_per_hour or plan with objective throughput"));
}

SearchTracker::SearchTracker(const CostModel& cm, const PlannerOptions& options)
    : cm_(cm),
      options_(options),
      clock_(options.clock ? *options.clock : DefaultClock()),
      start_(clock_.Now()),
      deadline_(start_ + options.budget),
      tokens_per_iteration_(static_cast<double>(cm.training().global_batch) *
                            cm.training().seq_len),
      objective_status_(CheckObjective(cm, options.objective)) {
  // An objective that cannot rank plans makes any search pointless: stop
  // before the first candidate and let Finish say why.
  if (!objective_status_.ok()) stopped_ = true;
}

bool SearchTracker::OutOfBudget() {
  if (stopped_) return true;
  if (options_.max_evaluations > 0 &&
      evaluations_ >= options_.max_evaluations) {
    stopped_ = true;
    stop_reason_ = StopReason::kEvaluations;
  } else if (options_.cancelled != nullptr &&
             options_.cancelled->load(std::memory_order_relaxed)) {
    stopped_ = true;
    cancelled_ = true;
  } else if (clock_.Now() >= deadline_) {
    stopped_ = true;
    stop_reason_ = StopReason::kBudget;
  }
  return stopped_;
}

double SearchTracker::PriceAndOffer(Plan& plan, Infeasibility* why) {
  ++evaluations_;
  Infeasibility reason = Infeasibility::kOk;
  const double time = cm_.BalanceAndPrice(plan, &reason);
  if (why) *why = reason;
  Offer(plan, time);
  return time;
}

double SearchTracker::Score(const Plan& plan, double iteration_time_s) const {
  if (!(iteration_time_s < kInfeasible)) return kInfeasible;
  switch (options_.objective) {
    case PlannerObjective::kThroughput:
      return iteration_time_s;
    case PlannerObjective::kUsdPerToken:
      return UsdPerToken(PlanUsdPerHour(cm_.catalog(), plan),
                         tokens_per_iteration_ / iteration_time_s);
  }
  return kInfeasible;
}

bool SearchTracker::Offer(const Plan& plan, double iteration_time_s) {
  if (!objective_status_.ok()) return false;
  if (!(iteration_time_s < kInfeasible)) return false;
  const double score = Score(plan, iteration_time_s);
  // Lower score wins; an equal score (always the case for two plans of the
  // same time under throughput) goes to the faster plan, so usd_per_token
  // breaks ties by throughput.
  if (!(score < best_score_ ||
        (score == best_score_ && iteration_time_s < best_time_)))
    return false;
  best_score_ = score;
  best_time_ = iteration_time_s;
  best_ = plan;
  // An unpriced GPU (throughput objective only) would understate the
  // price, so the curve then says 0 (unknown) rather than a wrong figure.
  bool priced = true;
  for (const Template& t : plan.templates)
    for (const Stage& st : t.stages)
      priced = priced && cm_.catalog().type(st.gpu_type).usd_per_hour > 0;
  progress_.push_back(ProgressPoint{
      evaluations_, elapsed_s(), 1.0 / iteration_time_s,
      priced ? UsdPerToken(PlanUsdPerHour(cm_.catalog(), plan),
                           tokens_per_iteration_ / iteration_time_s)
             : 0.0});
  return true;
}

double SearchTracker::elapsed_s() const {
  return absl::ToDoubleSeconds(clock_.Now() - start_);
}

absl::StatusOr<PlanResult> SearchTracker::Finish(const std::string& name,
                                                 bool exhaustive) const {
  if (!objective_status_.ok()) {
    return absl::Status(objective_status_.code(),
                        absl::StrCat(name, ": ", objective_status_.message()));
  }
  if (!found() && cancelled_) {
    return absl::CancelledError(
        absl::StrCat(name, ": cancelled after ", evaluations_,
                     " plan evaluations, before any plan was found"));
  }
  // Stopped by a limit: unless not even one layer fits anywhere, that a
  // plan exists is still open, and "no plan fits" (with, often, one layer
  // shown to fit) would be wrong.
  const bool stopped_by_limit =
      !found() && stop_reason_ != StopReason::kNone && SomeLayerFits(cm_);
  if (stopped_by_limit && stop_reason_ == StopReason::kEvaluations) {
    return absl::ResourceExhaustedError(absl::StrCat(
        name,
        ": the search was stopped before any plan was found, by the "
        "evaluation limit (max_evaluations ",
        options_.max_evaluations, ", reached after ", evaluations_,
        " plan evaluations); raise it or give 0 for no limit"));
  }
  if (stopped_by_limit && stop_reason_ == StopReason::kBudget) {
    return absl::DeadlineExceededError(absl::StrCat(
        name,
        ": the search was stopped before any plan was found, by its "
        "time budget (",
        absl::FormatDuration(options_.budget), ", after ", evaluations_,
        " plan evaluations); give it a larger budget"));
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
