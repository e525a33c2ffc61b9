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
// Both throughputs are the cost model's predictions. Once the controller
// fitted corrections on measured generations (controller/measurement.h,
// planner_service/io/run_calibration.h) it passes the corrected ones too,
// and the verdict is decided on those: a raw prediction that is off by a
// factor (CPU ranks standing in for GPUs, an untuned framework) would
// otherwise weigh a gain in the wrong units against a measured downtime.
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
