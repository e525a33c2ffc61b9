// Keep-or-switch after a membership change (docs/controller.md,
// paper §5.6): the controller switches
//   - always, when the current plan lost a GPU or no longer fits the new
//     cluster (it cannot go on), and
//   - otherwise only when the training time the new plan saves over the
//     horizon beats the downtime a switch costs:
//        gain_s = horizon_s * (new - old) / new   >   downtime_s
//        downtime_s = migration estimate + fixed cost
//     (new, old: predicted iterations/s; gain_s is the seconds the new plan
//     needs less than the old for the iterations the old one does in
//     horizon_s). The fixed cost is what earlier switches took beyond their
//     migration estimate (pause, rebuild, resume), measured, or a configured
//     prior before the first switch.
// So a join whose better plan gains too little over the horizon keeps the
// current plan (the paper's "keep" case), and so does a new plan that is
// not faster at all. Pure functions; every number is recorded.
//
// Both throughputs are the cost model's predictions. Once the controller fitted
// corrections on measured generations (controller/measurement.h,
// planner_service/core/calibration/run_corrections.h) it passes the corrected
// ones too, and the verdict is decided on those: a raw prediction that is off
// by a factor (CPU ranks standing in for GPUs, an untuned framework) would
// otherwise weigh a gain in the wrong units against a measured downtime.
//
// Like with like: both plans are priced with the same corrections, and a
// GPU type of the new plan that never ran (no fitted correction) is priced
// with the correction its measured fleet implies (ImputeUnmeasuredTypes in
// controller/online_corrections.h). That imputation is a guess, so the new
// plan's throughput counts `unmeasured_margin` against the switch (divided
// by 1 + margin) when it uses such a type. A switch the current plan does not
// need must predict a relative gain above `min_switch_gain`: the cost
// model's error, corrected, is several percent, so a smaller predicted gain
// is as likely a loss. And a switch back to a plan the job left less than a
// horizon ago must gain more than the measurement's noise too
// (hysteresis): otherwise two plans of nearly equal speed would trade
// places on every replan.
#ifndef ARACHNE_CONTROLLER_DECISION_H_
#define ARACHNE_CONTROLLER_DECISION_H_

#include <string>
#include <vector>

namespace arachne::controller {

enum class Verdict {
  kSwitch,
  kKeep,
  // The current plan cannot go on and no switch is possible (no new plan,
  // or no live holder for some byte of its state): training stops.
  kCannotSwitch,
};
const char* VerdictName(Verdict v);

struct DecisionInput {
  std::string trigger;  // what asked for the replan, for the record
  // The current plan carried to the new cluster.
  bool current_feasible = true;
  std::string current_reason;  // when not feasible
  bool current_lost_gpu = false;  // a GPU it uses left ungracefully
  double old_throughput = 0;      // iterations/s raw, 0 when not feasible
  // The new plan.
  bool new_plan_found = true;
  std::string new_plan_reason;  // when not found
  bool new_plan_same = false;   // the planner returned the current plan
  double new_throughput = 0;    // iterations/s raw
  // The same two with the corrections in force, and the corrections in one
  // line; only when `corrected` (else the raw ones decide).
  bool corrected = false;
  double old_throughput_corrected = 0;
  double new_throughput_corrected = 0;
  std::string corrections;
  // Migration from the current plan to the new one.
  bool migration_available = true;
  std::string migration_reason;
  double migration_estimate_s = 0;
  double fixed_cost_s = 0;
  double horizon_s = 3600;
  // GPU types the new plan adds (the current plan does not run them)
  // priced with an imputed correction (no measured speed:
  // UnmeasuredTypesAgainstSwitch), and what that uncertainty counts against
  // the switch: the new throughput is divided by 1 + unmeasured_margin
  // (>= 0).
  std::vector<std::string> new_unmeasured_types;
  double unmeasured_margin = 0.1;
  // A switch the current plan does not need: its relative gain must exceed
  // min_switch_gain. The new plan is the plan of generation
  // `switch_back_generation` (> 0), which the job left `switch_back_age_s`
  // ago, within the horizon: max(measurement_noise, min_switch_gain).
  int64_t switch_back_generation = 0;
  double switch_back_age_s = 0;
  // Relative noise of the measured iteration time (median absolute
  // deviation / median of the current generation's window); 0 = unknown.
  double measurement_noise = 0;
  double min_switch_gain = 0.05;
};

struct Decision {
  Verdict verdict = Verdict::kKeep;
  std::string reason;
  std::string trigger;
  // What the verdict used: the corrected throughputs when corrections were
  // in force, else the raw ones (then equal to the *_raw fields).
  double old_throughput = 0;
  double new_throughput = 0;
  double old_throughput_raw = 0;
  double new_throughput_raw = 0;
  std::string corrections;  // "" = none: the raw predictions decided
  double migration_estimate_s = 0;
  double fixed_cost_s = 0;
  double downtime_estimate_s = 0;
  double horizon_s = 0;
  double gain_s = 0;
  // The new throughput the gain was computed with: new_throughput, divided
  // by 1 + margin when it uses unmeasured types (else equal).
  double new_throughput_counted = 0;
  std::vector<std::string> unmeasured_types;
  // The relative gain (counted new / old - 1) and the least one a switch
  // needed (min_switch_gain, or for a switch back the noise if larger);
  // both 0 where the rule did not get that far.
  double relative_gain = 0;
  double gain_threshold = 0;
  int64_t switch_back_generation = 0;
  // How long it took: the planner call, and the whole decision from the
  // replan's start to the verdict (planner call included).
  double planning_s = 0;
  double decision_s = 0;
};

Decision Decide(const DecisionInput& in);

// The fixed cost of a switch beyond its migration estimate, learned from
// the switches measured so far: their mean of (downtime - estimate),
// floored at 0; `prior_s` until one was measured.
class SwitchCostModel {
 public:
  explicit SwitchCostModel(double prior_s) : prior_s_(prior_s) {}
  void Record(double measured_downtime_s, double migration_estimate_s);
  double FixedCostSeconds() const;
  int measured() const { return static_cast<int>(samples_.size()); }

 private:
  double prior_s_;
  std::vector<double> samples_;
};

}  // namespace arachne::controller

#endif  // ARACHNE_CONTROLLER_DECISION_H_
