// Run corrections: the cost model corrected to measured training runs. A
// run is a model, training config, cluster and plan with the iteration time
// (and optionally the peak memory per GPU) it was measured at. The fit finds
// the corrections that make the cost model's predictions of the runs match:
//
//   * compute_scale[GPU type]: multiplier on that type's profiled layer
//     compute time (CostParams::compute_scale), one per type the runs use;
//   * attention_scale[GPU type], only when asked for: multiplier on the
//     fused attention kernel's share of the synthesized layer times
//     (CostParams::attention_scale), for runs whose sequence lengths vary;
//   * tp_comm_scale[GPU type], only when asked for: multiplier on the TP
//     collectives' time (CostParams::tp_comm_scale), for runs of different
//     TP degrees;
//   * micro_batch_fixed_ms / iteration_fixed_ms: the framework's host-side
//     fixed costs (FrameworkConfig::micro_batch_fixed_s / iteration_fixed_s);
//   * context_reserve_gib / fragmentation: the framework's memory outside
//     the tensors (an additive GiB per GPU and a fraction of the tensors).
//
// The fit minimises the squared log error (time and memory separately: no
// time correction changes memory and no memory correction changes time) and
// fits only what the runs determine; see FitCorrections and
// docs/measured-runs.md. Everything here is deterministic.
//
// Applying corrections: ApplyCorrections on the TrainingConfig and
// CostParams a PlanningContext is built from (`arachne plan / evaluate /
// bench --calibration FILE`).
//
// The algorithm only: the calibration file that holds a fit's corrections,
// the request message's scales and the pricing over a profiles directory
// (ProfilesDirPricing) are in planner_service/io/run_corrections_io.h; the
// controller's online fit is controller/online_corrections.h.
#ifndef ARACHNE_PLANNER_SERVICE_CORE_CALIBRATION_RUN_CORRECTIONS_H_
#define ARACHNE_PLANNER_SERVICE_CORE_CALIBRATION_RUN_CORRECTIONS_H_

#include <functional>
#include <map>
#include <optional>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "absl/types/span.h"
#include "planner_service/core/cost/cost_params.h"
#include "planner_service/core/cost/profile_store.h"
#include "planner_service/core/model/cluster.h"
#include "planner_service/core/model/gpu_catalog.h"
#include "planner_service/core/model/model.h"
#include "planner_service/core/model/plan.h"

namespace arachne {

// One measured run, resolved: what a runs file row (measured_runs_io.h)
// becomes, or what the live loop builds from a running job. `cluster` and
// `plan` index the GPU catalog of the profiles_dir the run is priced with.
struct MeasuredRun {
  std::string label;   // unique among the runs of one fit
  std::string source;  // where the measurement comes from (free text)
  ModelSpec model;
  TrainingConfig training;
  Cluster cluster;
  // Structurally valid for `cluster`; micro-batches need not be balanced
  // (PredictRun balances them as the cost model does).
  Plan plan;
  double measured_iteration_s = 0;          // > 0
  std::optional<double> measured_peak_gib;  // max over GPUs, > 0
};

// What a fit sets. An absent optional keeps the run's own framework value.
struct RunCorrections {
  // Canonical GPU id -> multiplier on its layer compute time (> 0).
  std::map<std::string, double> compute_scale;
  // Canonical GPU id -> multiplier on its flash-attention kernel time (> 0).
  std::map<std::string, double> attention_scale;
  // Canonical GPU id -> multiplier on its TP-collective time (> 0).
  std::map<std::string, double> tp_comm_scale;
  // Framework fields, in seconds / GiB as FrameworkConfig holds them.
  std::optional<double> micro_batch_fixed_s;
  std::optional<double> iteration_fixed_s;
  std::optional<double> context_reserve_gib;
  std::optional<double> fragmentation;

  bool empty() const {
    return compute_scale.empty() && attention_scale.empty() &&
           tp_comm_scale.empty() &&
           !micro_batch_fixed_s &&
           !iteration_fixed_s && !context_reserve_gib && !fragmentation;
  }
  friend bool operator==(const RunCorrections&,
                         const RunCorrections&) = default;
};

// Sets the corrections on a config about to be priced: compute_scale
// entries replace params->compute_scale's for the same GPU (others stay),
// present framework fields replace training->framework's.
void ApplyCorrections(const RunCorrections& corrections,
                      TrainingConfig* training, CostParams* params);

// What a run is priced over beyond the run itself, as loaders: the GPU
// catalog its cluster and plan index, and the profiles of its model on its
// cluster's GPU types (shipped measured profiles, then synthesized ones;
// none of the fitted corrections changes them). Each run loads them once.
// io/run_corrections_io.h has the one over a profiles directory
// (ProfilesDirPricing); both loaders must be set.
struct RunPricingData {
  std::function<absl::StatusOr<GpuCatalog>()> catalog;
  // The profiles for `model` and `training` on `cluster` (indexing
  // `catalog`), priced with `params`.
  std::function<absl::StatusOr<ProfileStore>(
      const GpuCatalog& catalog, const ModelSpec& model,
      const TrainingConfig& training, const Cluster& cluster,
      const CostParams& params)>
      profiles;
};

struct RunPrediction {
  double iteration_s = 0;
  // Max over the plan's stages of the predicted peak per GPU (GiB).
  double peak_gib = 0;
  // Of that stage: the tensors (weights + activations), and the rest
  // (context reserve, buffers, fragmentation).
  double tensors_gib = 0;
  // Whether the peak is within the usable memory of the stage's GPU (a
  // measured run ran, so it is priced either way; a run predicted not to
  // fit is worth a look).
  bool fits = true;
  // Micro-batches of the busiest replica of the first template (the count
  // the fixed cost per micro-batch multiplies).
  int micro_batches_per_replica = 0;
};

// Prices `run` with `corrections` applied over `base` (the catalog and
// profiles of `pricing`). The run's plan is balanced and validated
// (ValidatePlan) except for its memory: a measured run is priced even where
// the model predicts it does not fit. Errors: the catalog loader's as they
// are; the training config's, the model's, the profile loader's and the
// plan's InvalidArgument / FailedPrecondition (a missing profile), prefixed
// with the run's label.
absl::StatusOr<RunPrediction> PredictRun(const MeasuredRun& run,
                                         const RunCorrections& corrections,
                                         const RunPricingData& pricing,
                                         const CostParams& base = {});

// Names of the fitted parameters, as the calibration file and --fit write
// them. A compute scale is "compute_scale[<GPU id>]"; the framework fields
// take their FrameworkFieldNames names.
inline constexpr absl::string_view kFitComputeScale = "compute_scale";
inline constexpr absl::string_view kFitAttentionScale = "attention_scale";
inline constexpr absl::string_view kFitTpCommScale = "tp_comm_scale";
inline constexpr absl::string_view kFitMicroBatchFixed = "micro_batch_fixed_ms";
inline constexpr absl::string_view kFitIterationFixed = "iteration_fixed_ms";
inline constexpr absl::string_view kFitContextReserve = "context_reserve_gib";
inline constexpr absl::string_view kFitFragmentation = "fragmentation";

// A per-GPU-type scale of RunCorrections (compute, attention, TP
// communication): its kFit* name, where it lives in the corrections and the
// cost parameters, the range of a fitted or given factor, and what the
// fit's report says of it.
struct CorrectionScaleKind {
  absl::string_view name;   // kFit*: the file's and --fit's name
  absl::string_view prose;  // "compute scale": "the A100-80GB compute scale"
  std::map<std::string, double> RunCorrections::*corrections;
  std::map<std::string, double> CostParams::*params;
  double lo, hi;
  // Fitted only when named (else also by the automatic fit).
  bool only_when_named;
  // Why no run depends on it, after "no fitted run's predicted time depends
  // on it".
  absl::string_view independent;
  // Why it is confused with the others ("" = the generic reason).
  absl::string_view confused;
  // What to check when it is more than a factor 2 from 1.
  absl::string_view check;
};
// The scales, in the calibration file's order: compute_scale,
// attention_scale, tp_comm_scale.
absl::Span<const CorrectionScaleKind> CorrectionScaleKinds();

struct FitOptions {
  // Labels of the runs to fit on; empty: every run. The others are
  // predicted with the result (held out). An unknown label is
  // InvalidArgument.
  std::vector<std::string> fit_on;
  // What to fit, by the kFit* names ("compute_scale": one per GPU type the
  // fitted runs' stages use); empty: automatic — every compute scale, the
  // fixed cost per micro-batch where the runs determine and support it,
  // and the memory terms the runs with a measured peak determine
  // (context_reserve_gib from one, + fragmentation where supported); a
  // term the runs do not determine is left out with the reason
  // (FitResult::parameters), as is a second term of either kind (fixed
  // cost, fragmentation) fitted on no more runs than parameters or that
  // raises the leave-one-out error (each fitted run predicted from the fit
  // on the others), and a fixed cost per micro-batch that, fitted, makes
  // up more than half of a run's predicted time (a compute error
  // absorbed). The fixed cost
  // per iteration is fitted only when named: it absorbs any error that
  // grows less than linearly with the compute. So is the attention scale
  // ("attention_scale": one per GPU type, after the compute scales): it
  // needs runs whose attention share differs (sequence lengths); and the
  // TP-communication scale ("tp_comm_scale"), which needs runs of
  // different TP degrees. Named
  // explicitly, a parameter the runs do not determine is
  // FailedPrecondition instead.
  std::vector<std::string> parameters;
  RunPricingData pricing;  // the catalog and profiles (required)
  CostParams base;         // priced over these (compute_scale is replaced)
};

struct FittedParameter {
  std::string name;  // "compute_scale[A100-80GB]", "micro_batch_fixed_ms"
  bool fitted = false;
  double value = 0;    // in the unit of the name (ms, GiB, factor)
  std::string reason;  // why it was left out (automatic mode), else empty
  // Fitted in automatic mode as an optional parameter: the leave-one-out
  // errors without and with it ("leave-one-out rms log error of time
  // 0.0248 -> 0.0001"); else empty.
  std::string evidence;
};

struct RunFitReport {
  std::string label;
  bool fitted_on = false;  // false: held out
  double measured_iteration_s = 0;
  std::optional<double> measured_peak_gib;
  RunPrediction before;  // no corrections
  RunPrediction after;   // with the fitted corrections
};

struct FitResult {
  RunCorrections corrections;
  std::vector<FittedParameter> parameters;  // fitted and left out, in order
  std::vector<RunFitReport> runs;           // in input order
  std::vector<std::string> fitted_on;       // labels, in input order
  // Root mean square of log(predicted / measured) over the fitted runs.
  double time_rms_log_error_before = 0;
  double time_rms_log_error_after = 0;
  // What a person should check before using the result: a fitted value at
  // the bound of its range, a compute scale more than a factor 2 from 1,
  // fixed costs that make up most of a run's predicted time, or a fit that
  // leaves a large error — each a sign that the corrections absorb an error
  // of another kind (a wrong framework, plan or profile).
  std::vector<std::string> warnings;
};

// Fits the corrections to the runs of options.fit_on. Refuses with
// FailedPrecondition, naming the parameter and why, when:
//   * fewer runs (with a measured peak, for memory) than parameters;
//   * a parameter cannot be told apart from the others: the column of the
//     finite-difference Jacobian of log predicted time (memory) wrt the log
//     parameter (at a reference value for a fixed cost that is 0) lies
//     within kIdentifiabilityTolerance of the span of the other columns —
//     e.g. two GPU types that only ever run together in the same
//     proportion, or a fixed cost per micro-batch when every run has the
//     same micro-batch count per replica (then the fixed cost scales with
//     the compute exactly as a compute scale does).
// InvalidArgument for duplicate labels, unknown fit_on labels or parameter
// names; a run that cannot be priced is its PredictRun error.
absl::StatusOr<FitResult> FitCorrections(const std::vector<MeasuredRun>& runs,
                                         const FitOptions& options);

// Smallest distance (sine of the angle) between a parameter's normalised
// Jacobian column and the span of the others for it to count as determined.
inline constexpr double kIdentifiabilityTolerance = 0.05;

// The clusters of `runs` in one line per distinct composition, for the
// calibration file's cluster_note (io/run_corrections_io.h).
std::string DescribeRunClusters(const std::vector<const MeasuredRun*>& runs,
                                const GpuCatalog& catalog);

}  // namespace arachne

#endif  // ARACHNE_PLANNER_SERVICE_CORE_CALIBRATION_RUN_CORRECTIONS_H_
