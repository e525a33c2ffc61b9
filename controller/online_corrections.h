// The controller's online corrections: the measured generations
// (controller/measurement.h, recorded in the state database) become measured
// runs (planner_service/core/calibration/run_corrections.h), the corrections
// are fitted on all of them with FitCorrections, and every prediction the
// controller decides on is priced again with the corrections in force
// (PredictRun). So the keep-or-switch rule compares corrected throughputs,
// and `arachne status` shows measured, raw and corrected side by side
// (docs/controller.md, "Measured iteration times and corrected
// predictions").
#ifndef ARACHNE_CONTROLLER_ONLINE_CORRECTIONS_H_
#define ARACHNE_CONTROLLER_ONLINE_CORRECTIONS_H_

#include <set>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "controller/measurement.h"
#include "planner_service/core/calibration/run_corrections.h"
#include "planner_service/core/model/cluster.h"
#include "planner_service/core/model/gpu_catalog.h"
#include "planner_service/core/model/model.h"
#include "planner_service/core/model/plan.h"

namespace arachne::controller {

// What a fit gave: corrections, or why there are none this time.
struct CorrectionsFit {
  absl::Status status;  // OK: `corrections` were fitted
  RunCorrections corrections;
  std::vector<int64_t> generations;  // fitted on
  // One line: "fitted on 2 generations (1, 2); iteration_fixed_ms left out:
  // ..." or why the fit was refused.
  std::string note;
  // FitResult::warnings: signs that the corrections absorb another error
  // (also at the end of `note`).
  std::vector<std::string> warnings;
  // The fitted generations' predictions with the new corrections, in the
  // order of `generations` (FitResult::runs' `after`).
  std::vector<RunPrediction> after;
};

class OnlineCorrections {
 public:
  // A generation is fitted on once it measured `min_iterations` iterations
  // after its warm-up. `catalog` is the one the records' clusters and plans
  // are read with; `profiles_dir` ("" = built in) the profiles the planner
  // prices with.
  OnlineCorrections(GpuCatalog catalog, ModelSpec model,
                    TrainingConfig training, std::string profiles_dir,
                    int min_iterations);

  int min_iterations() const { return min_iterations_; }

  // `plan` on `cluster` priced with `corrections` (empty: raw).
  absl::StatusOr<RunPrediction> Predict(const Cluster& cluster,
                                        const Plan& plan,
                                        const RunCorrections& corrections) const;
  // The same from a stored generation's cluster and plan JSON.
  absl::StatusOr<RunPrediction> Predict(const GenerationRecord& record,
                                        const RunCorrections& corrections) const;

  // The measured runs of the generations measured enough, labelled
  // "generation N"; the others are left out.
  absl::StatusOr<std::vector<MeasuredRun>> Runs(
      const std::vector<GenerationRecord>& records,
      std::vector<int64_t>* generations) const;

  // FitCorrections on every generation measured enough, their measured peak
  // memory included; when the memory terms make the fit refuse, again on
  // the iteration times alone (the note says so). A refused fit is a non-OK
  // status with the fit's reason.
  CorrectionsFit Fit(const std::vector<GenerationRecord>& records) const;

  // The calibration file's JSON of `corrections` (io/run_corrections_io.h),
  // and back: what the state database keeps.
  std::string ToJson(const RunCorrections& corrections,
                     const std::vector<int64_t>& generations) const;
  // `generations`: those named in its fitted_on ("generation N").
  absl::StatusOr<RunCorrections> FromJson(
      const std::string& json, std::vector<int64_t>* generations) const;

  const GpuCatalog& catalog() const { return catalog_; }

 private:
  GpuCatalog catalog_;
  ModelSpec model_;
  TrainingConfig training_;
  std::string profiles_dir_;
  int min_iterations_;
};

// Fills the corrections of GPU types that never ran: each of `types` (canonical
// ids) without a compute_scale entry gets the geometric mean of the
// entries there (the fleet's correction: what its measured relatives
// imply), and likewise for attention_scale and tp_comm_scale where those
// have entries. Returns the types so filled, sorted; none when `corrections`
// has no per-type entry to go on (then an unmeasured type stays raw, like
// every other).
std::vector<std::string> ImputeUnmeasuredTypes(
    const std::vector<std::string>& types, RunCorrections* corrections);

// Of the `imputed` GPU types (ImputeUnmeasuredTypes), those whose guess
// counts against a switch from a plan on `current_types` to one on
// `new_types` (decision.h, unmeasured margin): the new plan's types the
// current plan does not run. A type both plans run (its stages off the
// measured plans' critical path, so no fit determined its scale) carries
// the same guess in both prices: counting it against the new plan alone
// would not compare like with like. Sorted as `imputed`.
std::vector<std::string> UnmeasuredTypesAgainstSwitch(
    const std::vector<std::string>& imputed,
    const std::set<std::string>& new_types,
    const std::set<std::string>& current_types);

// One line naming every correction: "compute_scale A6000 412.300,
// iteration_fixed 12.0 ms"; "" for none.
std::string DescribeCorrections(const RunCorrections& corrections);

}  // namespace arachne::controller

#endif  // ARACHNE_CONTROLLER_ONLINE_CORRECTIONS_H_
