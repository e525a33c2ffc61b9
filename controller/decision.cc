#include "controller/decision.h"

#include <algorithm>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"

namespace arachne::controller {

const char* VerdictName(Verdict v) {
  switch (v) {
    case Verdict::kSwitch:
      return "switch";
    case Verdict::kKeep:
      return "keep";
    case Verdict::kCannotSwitch:
      return "cannot_switch";
  }
  return "?";
}

namespace {

// What the throughputs of a reason are: corrected ones name the raw ones
// beside them, so a verdict the corrections turned is visible in its reason.
std::string Basis(const Decision& d) {
  if (d.corrections.empty()) return "";
  return absl::StrFormat(" corrected; raw %.3f -> %.3f it/s",
                         d.old_throughput_raw, d.new_throughput_raw);
}

}  // namespace

Decision Decide(const DecisionInput& in) {
  Decision d;
  d.trigger = in.trigger;
  d.old_throughput_raw = in.old_throughput;
  d.new_throughput_raw = in.new_throughput;
  d.old_throughput = in.corrected ? in.old_throughput_corrected : in.old_throughput;
  d.new_throughput = in.corrected ? in.new_throughput_corrected : in.new_throughput;
  if (in.corrected) d.corrections = in.corrections;
  d.migration_estimate_s = in.migration_estimate_s;
  d.fixed_cost_s = in.fixed_cost_s;
  d.downtime_estimate_s = in.migration_estimate_s + in.fixed_cost_s;
  d.horizon_s = in.horizon_s;
  if (d.new_throughput > 0) {
    d.gain_s = in.horizon_s * (d.new_throughput - d.old_throughput) /
               d.new_throughput;
  }
  const bool must = in.current_lost_gpu || !in.current_feasible;
  if (must) {
    const std::string why =
        in.current_lost_gpu
            ? "the current plan lost a GPU"
            : absl::StrCat("the current plan no longer fits: ",
                           in.current_reason);
    if (!in.new_plan_found) {
      d.verdict = Verdict::kCannotSwitch;
      d.reason = absl::StrCat(why, "; and no new plan: ", in.new_plan_reason);
    } else if (!in.migration_available) {
      d.verdict = Verdict::kCannotSwitch;
      d.reason =
          absl::StrCat(why, "; and no migration to the new plan: ",
                       in.migration_reason);
    } else {
      d.verdict = Verdict::kSwitch;
      d.reason = absl::StrCat(why, ": switching whatever it costs");
    }
    return d;
  }
  if (!in.new_plan_found) {
    d.verdict = Verdict::kKeep;
    d.reason = absl::StrCat("no new plan (", in.new_plan_reason,
                            "); the current one still fits");
    return d;
  }
  if (in.new_plan_same) {
    d.verdict = Verdict::kKeep;
    d.reason = "the new plan is the current plan";
    return d;
  }
  if (!in.migration_available) {
    d.verdict = Verdict::kKeep;
    d.reason = absl::StrCat("no migration to the new plan (",
                            in.migration_reason,
                            "); the current one still fits");
    return d;
  }
  if (d.gain_s > d.downtime_estimate_s) {
    d.verdict = Verdict::kSwitch;
    d.reason = absl::StrFormat(
        "gain %.3f s over the %.0f s horizon (%.3f -> %.3f it/s%s) beats the "
        "estimated downtime %.3f s",
        d.gain_s, d.horizon_s, d.old_throughput, d.new_throughput, Basis(d),
        d.downtime_estimate_s);
  } else {
    d.verdict = Verdict::kKeep;
    d.reason = absl::StrFormat(
        "gain %.3f s over the %.0f s horizon (%.3f -> %.3f it/s%s) does not "
        "beat the estimated downtime %.3f s",
        d.gain_s, d.horizon_s, d.old_throughput, d.new_throughput, Basis(d),
        d.downtime_estimate_s);
  }
  return d;
}

void SwitchCostModel::Record(double measured_downtime_s,
                             double migration_estimate_s) {
  samples_.push_back(std::max(0.0, measured_downtime_s - migration_estimate_s));
}

double SwitchCostModel::FixedCostSeconds() const {
  if (samples_.empty()) return prior_s_;
  double sum = 0;
  for (double s : samples_) sum += s;
  return sum / samples_.size();
}

}  // namespace arachne::controller
