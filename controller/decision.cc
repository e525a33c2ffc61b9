#include "controller/decision.h"

#include <algorithm>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"

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
  d.unmeasured_types = in.new_unmeasured_types;
  d.new_throughput_counted =
      in.new_unmeasured_types.empty()
          ? d.new_throughput
          : d.new_throughput / (1 + std::max(0.0, in.unmeasured_margin));
  if (d.new_throughput_counted > 0) {
    d.gain_s = in.horizon_s * (d.new_throughput_counted - d.old_throughput) /
               d.new_throughput_counted;
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
  const std::string unmeasured =
      in.new_unmeasured_types.empty()
          ? ""
          : absl::StrFormat(
                "; %s without a measured speed: counted as %.3f it/s (%.0f%% margin)",
                absl::StrJoin(in.new_unmeasured_types, ", "),
                d.new_throughput_counted, 100 * in.unmeasured_margin);
  const std::string rates =
      absl::StrFormat("%.3f -> %.3f it/s%s%s", d.old_throughput,
                      d.new_throughput, Basis(d), unmeasured);
  const bool switch_back = in.switch_back_generation > 0;
  if (d.old_throughput > 0) {
    d.relative_gain = d.new_throughput_counted / d.old_throughput - 1;
    d.gain_threshold =
        switch_back ? std::max(in.measurement_noise, in.min_switch_gain)
                    : in.min_switch_gain;
    if (switch_back) d.switch_back_generation = in.switch_back_generation;
  }
  if (d.old_throughput > 0 && !(d.relative_gain > d.gain_threshold)) {
    d.verdict = Verdict::kKeep;
    d.reason =
        switch_back
            ? absl::StrFormat(
                  "the new plan is generation %d's, left %.0f s ago: "
                  "switching back within the %.0f s horizon needs a gain "
                  "above %.1f%% (the measurement's noise or the least gain), "
                  "and it is %.1f%% (%s)",
                  in.switch_back_generation, in.switch_back_age_s,
                  d.horizon_s, 100 * d.gain_threshold, 100 * d.relative_gain,
                  rates)
            : absl::StrFormat(
                  "a predicted gain of %.1f%% (%s) is not above the least "
                  "gain a switch needs, %.1f%%",
                  100 * d.relative_gain, rates, 100 * d.gain_threshold);
    return d;
  }
  if (d.gain_s > d.downtime_estimate_s) {
    d.verdict = Verdict::kSwitch;
    d.reason = absl::StrFormat(
        "gain %.3f s over the %.0f s horizon (%s) beats the estimated "
        "downtime %.3f s",
        d.gain_s, d.horizon_s, rates, d.downtime_estimate_s);
  } else {
    d.verdict = Verdict::kKeep;
    d.reason = absl::StrFormat(
        "gain %.3f s over the %.0f s horizon (%s) does not beat the "
        "estimated downtime %.3f s",
        d.gain_s, d.horizon_s, rates, d.downtime_estimate_s);
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
