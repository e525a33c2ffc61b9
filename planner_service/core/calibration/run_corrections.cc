#include "planner_service/core/calibration/run_corrections.h"

#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <limits>
#include <memory>
#include <set>
#include <utility>

#include "absl/container/flat_hash_map.h"
#include "absl/container/flat_hash_set.h"
#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "glog/logging.h"
#include "planner_service/core/cost/cost_model.h"
#include "planner_service/core/cost/plan_validation.h"
#include "planner_service/core/text/quote.h"

namespace arachne {
namespace {

// A measured run ran, so its plan fitted in memory whatever the model says:
// it is priced with the memory check out of the way (and `fits` reports
// the model's verdict against the real usable memory).
constexpr double kNoMemoryLimit = 1e9;

// Bounds of the fit, inside the framework fields' ranges (framework.cc) so
// a fitted value can always be written back and read as a field.
// The compute scale spans what a profile can be off by, up to a CPU
// running a GPU type's profile (the reference engine's agents measure
// ~500x the A6000 figures): the report warns beyond a factor of 2.
constexpr double kMinComputeScale = 1e-3;
constexpr double kMaxComputeScale = 1e4;
// The attention kernel's and the TP collectives' corrections: what
// separates one kind of work's efficiency from the rest on the same GPU.
constexpr double kMinKernelScale = 1e-2;
constexpr double kMaxKernelScale = 1e2;

using ScaleMap = std::map<std::string, double>;

// CorrectionScaleKinds().
using ScaleKind = CorrectionScaleKind;
const ScaleKind kScaleKinds[] = {
    {kFitComputeScale, "compute scale", &RunCorrections::compute_scale,
     &CostParams::compute_scale, kMinComputeScale, kMaxComputeScale, false,
     " (its stages are never on the critical path)", "",
     "the runs' framework, precision and plan"},
    // Only when named: runs of one sequence length cannot tell it from the
    // compute scale, and the automatic fit stays the few robust factors.
    {kFitAttentionScale, "attention scale", &RunCorrections::attention_scale,
     &CostParams::attention_scale, kMinKernelScale, kMaxKernelScale, true,
     " (its layers have no flash-attention time to scale: measured profiles, "
     "or materialized attention, which compute_scale covers)",
     "the fitted runs spend the same share of their time in attention (fit it "
     "on runs of different sequence lengths)",
     "the runs' attention kernel (flash, flash2 or materialized) and "
     "sequence lengths"},
    // Likewise the TP collectives: runs of one TP degree cannot tell them
    // from the compute.
    {kFitTpCommScale, "TP-communication scale", &RunCorrections::tp_comm_scale,
     &CostParams::tp_comm_scale, kMinKernelScale, kMaxKernelScale, true,
     " (its stages run at TP 1: no TP communication)",
     "the fitted runs spend the same share of their time in TP communication "
     "(fit it on runs of different TP degrees)",
     "the nodes' GPU interconnect (NVLink, NVSwitch, PCIe) and the runs' TP "
     "overlap"},
};

// Prices one run repeatedly under different corrections: the profiles
// (shipped, then synthesized; none of the fitted corrections changes them)
// are loaded once, and only the cost model is rebuilt per evaluation.
class RunPricer {
 public:
  static absl::StatusOr<std::unique_ptr<RunPricer>> Create(
      const MeasuredRun& run, const RunPricingData& pricing,
      const CostParams& base) {
    CHECK(pricing.catalog && pricing.profiles)
        << "RunPricingData needs both loaders";
    absl::StatusOr<GpuCatalog> catalog = pricing.catalog();
    if (!catalog.ok()) return catalog.status();
    CostParams relaxed = base;
    relaxed.usable_memory_fraction = kNoMemoryLimit;
    std::unique_ptr<RunPricer> p(new RunPricer());
    p->run_ = &run;
    p->base_ = base;
    p->catalog_ = *std::move(catalog);
    // As PlanningContext::Create: the inputs checked, the profiles loaded
    // and the cost model built over them.
    if (absl::Status s = run.training.Validate(); !s.ok()) {
      return Labelled(run, s);
    }
    if (absl::Status s = run.model.Validate(); !s.ok()) {
      return Labelled(run, s);
    }
    absl::StatusOr<ProfileStore> profiles = pricing.profiles(
        p->catalog_, run.model, run.training, run.cluster, relaxed);
    if (!profiles.ok()) return Labelled(run, profiles.status());
    p->profiles_ = *std::move(profiles);
    absl::StatusOr<CostModel> cm =
        CostModel::Create(p->catalog_, run.model, run.training, run.cluster,
                          p->profiles_, relaxed);
    if (!cm.ok()) return Labelled(run, cm.status());
    p->cost_model_ = std::make_unique<CostModel>(*std::move(cm));
    p->plan_ = run.plan;
    int64_t batch = 0;
    for (const Template& t : p->plan_.templates) {
      batch += int64_t{t.total_micro_batches} * t.micro_batch_size;
    }
    // A plan file states its micro-batches; only a plan that does not add
    // up to the batch is balanced the way the planners balance theirs.
    if (batch != run.training.global_batch) {
      p->cost_model_->BalanceMicroBatches(p->plan_);
    }
    if (absl::Status s = ValidatePlan(p->plan_, *p->cost_model_); !s.ok()) {
      return Labelled(run, s);
    }
    return p;
  }

  absl::StatusOr<RunPrediction> Price(const RunCorrections& c) const {
    TrainingConfig training = run_->training;
    CostParams params = base_;
    ApplyCorrections(c, &training, &params);
    params.usable_memory_fraction = kNoMemoryLimit;
    absl::StatusOr<CostModel> cm =
        CostModel::Create(catalog_, run_->model, training, run_->cluster,
                          profiles_, params);
    if (!cm.ok()) return Labelled(*run_, cm.status());
    absl::StatusOr<Prediction> p = cm->Predict(plan_);
    if (!p.ok()) return Labelled(*run_, p.status());
    RunPrediction out;
    out.iteration_s = p->iteration_time_s;
    out.micro_batches_per_replica =
        plan_.templates.empty() ? 0 : plan_.templates[0].max_micro_batches();
    out.peak_gib = -1;
    for (size_t t = 0; t < p->stage_memory.size(); ++t) {
      for (size_t s = 0; s < p->stage_memory[t].size(); ++s) {
        const StageMemory& m = p->stage_memory[t][s];
        const int type = plan_.templates[t].stages[s].gpu_type;
        const double usable = catalog_.type(type).memory_gib *
                              base_.usable_memory_fraction;
        if (m.total_gib() > usable) out.fits = false;
        if (m.total_gib() > out.peak_gib) {
          out.peak_gib = m.total_gib();
          out.tensors_gib = m.weights_gib + m.activations_gib;
        }
      }
    }
    CHECK_GE(out.peak_gib, 0) << "a validated plan has stages";
    return out;
  }

  const Plan& plan() const { return plan_; }
  const GpuCatalog& catalog() const { return catalog_; }
  const std::string& label() const { return run_->label; }

 private:
  RunPricer() = default;
  static absl::Status Labelled(const MeasuredRun& run, const absl::Status& s) {
    return absl::Status(
        s.code(),
        absl::StrCat("run ", QuoteForMessage(run.label), ": ", s.message()));
  }

  const MeasuredRun* run_ = nullptr;
  CostParams base_;
  GpuCatalog catalog_;
  ProfileStore profiles_;
  // Over catalog_, profiles_ and the run, with the memory check relaxed:
  // balances and validates the plan.
  std::unique_ptr<CostModel> cost_model_;
  Plan plan_;
};

// --- The fitted parameters ---------------------------------------------------

enum class ParamKind {
  kScale,  // one of kScaleKinds, for one GPU type
  kMicroBatchFixed,
  kIterationFixed,
  kContextReserve,
  kFragmentation
};

// One parameter of the fit, in the coordinate the fit moves: log of the
// factor for a compute scale (a scale is relative), the value itself (ms,
// GiB, fraction) for the framework fields, which may be 0.
struct Param {
  ParamKind kind;
  const ScaleKind* scale = nullptr;  // kScale only
  std::string gpu;                   // kScale only
  double lo = 0, hi = 0;
  // For the identifiability check of a field that may be 0: d log T / d
  // log p is taken at this value (or the start value when larger), where
  // the column is not identically 0.
  double reference = 0;

  std::string Name() const {
    switch (kind) {
      case ParamKind::kScale:
        return absl::StrCat(scale->name, "[", gpu, "]");
      case ParamKind::kMicroBatchFixed:
        return std::string(kFitMicroBatchFixed);
      case ParamKind::kIterationFixed:
        return std::string(kFitIterationFixed);
      case ParamKind::kContextReserve:
        return std::string(kFitContextReserve);
      case ParamKind::kFragmentation:
        return std::string(kFitFragmentation);
    }
    return "";
  }
  // How a message names it: "the A100-80GB compute scale".
  std::string Prose() const {
    return kind == ParamKind::kScale
               ? absl::StrCat("the ", gpu, " ", scale->prose)
               : Name();
  }
  bool is_log() const { return kind == ParamKind::kScale; }
  // The value written out (factor, ms, GiB, fraction).
  double Display(double x) const { return is_log() ? std::exp(x) : x; }
};

Param ScaleParam(const ScaleKind& k, const std::string& gpu) {
  return {ParamKind::kScale, &k, gpu, std::log(k.lo), std::log(k.hi), 0};
}
Param MicroBatchFixedParam() {
  return {ParamKind::kMicroBatchFixed, nullptr, "", 0, 1e4, 1.0};
}
Param IterationFixedParam() {
  return {ParamKind::kIterationFixed, nullptr, "", 0, 1e6, 10.0};
}
Param ContextReserveParam() {
  return {ParamKind::kContextReserve, nullptr, "", 0, 64, 1.0};
}
Param FragmentationParam() {
  return {ParamKind::kFragmentation, nullptr, "", 0, 1, 0.05};
}

RunCorrections CorrectionsOf(const std::vector<Param>& params,
                             const std::vector<double>& x,
                             RunCorrections c = {}) {
  CHECK_EQ(params.size(), x.size());
  for (size_t j = 0; j < params.size(); ++j) {
    const Param& p = params[j];
    switch (p.kind) {
      case ParamKind::kScale:
        (c.*(p.scale->corrections))[p.gpu] = std::exp(x[j]);
        break;
      case ParamKind::kMicroBatchFixed:
        c.micro_batch_fixed_s = x[j] * 1e-3;
        break;
      case ParamKind::kIterationFixed:
        c.iteration_fixed_s = x[j] * 1e-3;
        break;
      case ParamKind::kContextReserve:
        c.context_reserve_gib = x[j];
        break;
      case ParamKind::kFragmentation:
        c.fragmentation = x[j];
        break;
    }
  }
  return c;
}

// What the fit compares: log(predicted / measured) of time or of memory.
struct Objective {
  std::vector<const RunPricer*> pricers;
  std::vector<double> measured;
  bool memory = false;
  RunCorrections fixed;  // corrections held constant (the other fit's)

  absl::StatusOr<std::vector<double>> Residuals(
      const std::vector<Param>& params, const std::vector<double>& x) const {
    const RunCorrections c = CorrectionsOf(params, x, fixed);
    std::vector<double> r(pricers.size());
    for (size_t i = 0; i < pricers.size(); ++i) {
      absl::StatusOr<RunPrediction> p = pricers[i]->Price(c);
      if (!p.ok()) return p.status();
      const double v = memory ? p->peak_gib : p->iteration_s;
      r[i] = std::log(v / measured[i]);
    }
    return r;
  }
};

double SumSquares(const std::vector<double>& r) {
  double s = 0;
  for (double v : r) s += v * v;
  return s;
}

// Solves the small dense system a * x = b by Gaussian elimination with
// partial pivoting; false when singular.
bool Solve(std::vector<std::vector<double>> a, std::vector<double> b,
           std::vector<double>* x) {
  const int n = static_cast<int>(b.size());
  for (int c = 0; c < n; ++c) {
    int piv = c;
    for (int r = c + 1; r < n; ++r) {
      if (std::abs(a[r][c]) > std::abs(a[piv][c])) piv = r;
    }
    if (std::abs(a[piv][c]) < 1e-300) return false;
    std::swap(a[piv], a[c]);
    std::swap(b[piv], b[c]);
    for (int r = c + 1; r < n; ++r) {
      const double f = a[r][c] / a[c][c];
      for (int k = c; k < n; ++k) a[r][k] -= f * a[c][k];
      b[r] -= f * b[c];
    }
  }
  x->assign(n, 0);
  for (int r = n - 1; r >= 0; --r) {
    double s = b[r];
    for (int k = r + 1; k < n; ++k) s -= a[r][k] * (*x)[k];
    (*x)[r] = s / a[r][r];
  }
  return true;
}

// Forward-difference Jacobian of the residuals in the fit's coordinates,
// stepping inward from an upper bound.
absl::StatusOr<std::vector<std::vector<double>>> Jacobian(
    const Objective& f, const std::vector<Param>& params,
    const std::vector<double>& x, const std::vector<double>& r0) {
  std::vector<std::vector<double>> j(r0.size(),
                                     std::vector<double>(params.size()));
  for (size_t k = 0; k < params.size(); ++k) {
    double h = 1e-6 * std::max(1.0, std::abs(x[k]));
    if (x[k] + h > params[k].hi) h = -h;
    std::vector<double> xh = x;
    xh[k] += h;
    absl::StatusOr<std::vector<double>> r = f.Residuals(params, xh);
    if (!r.ok()) return r.status();
    for (size_t i = 0; i < r0.size(); ++i) j[i][k] = ((*r)[i] - r0[i]) / h;
  }
  return j;
}

// Levenberg-Marquardt on the squared log error, each coordinate kept in
// its bounds. The objective is piecewise smooth (a stage becomes the
// slowest), which the damping copes with; deterministic.
// It stops when a step gains less than `rel_gain` of the cost: the fits
// that are the answer run to the rounding of the pricing (1e-18), the
// cross-validation's fits, which only rank two sets of parameters, stop
// far earlier.
absl::StatusOr<std::vector<double>> Minimise(const Objective& f,
                                             const std::vector<Param>& params,
                                             std::vector<double> x,
                                             double rel_gain = 1e-18) {
  const size_t n = params.size();
  absl::StatusOr<std::vector<double>> r = f.Residuals(params, x);
  if (!r.ok()) return r.status();
  double cost = SumSquares(*r);
  double lambda = 1e-3;
  for (int iter = 0; iter < 200 && cost > 1e-24; ++iter) {
    absl::StatusOr<std::vector<std::vector<double>>> j =
        Jacobian(f, params, x, *r);
    if (!j.ok()) return j.status();
    std::vector<std::vector<double>> jtj(n, std::vector<double>(n, 0));
    std::vector<double> jtr(n, 0);
    for (size_t i = 0; i < r->size(); ++i) {
      for (size_t a = 0; a < n; ++a) {
        jtr[a] += (*j)[i][a] * (*r)[i];
        for (size_t b = 0; b < n; ++b) jtj[a][b] += (*j)[i][a] * (*j)[i][b];
      }
    }
    bool improved = false;
    double step_norm = 0;
    while (lambda < 1e12) {
      std::vector<std::vector<double>> a = jtj;
      std::vector<double> b(n);
      for (size_t k = 0; k < n; ++k) {
        a[k][k] += lambda * std::max(jtj[k][k], 1e-12);
        b[k] = -jtr[k];
      }
      std::vector<double> delta;
      if (!Solve(a, b, &delta)) {
        lambda *= 10;
        continue;
      }
      std::vector<double> xn = x;
      step_norm = 0;
      for (size_t k = 0; k < n; ++k) {
        xn[k] = std::clamp(x[k] + delta[k], params[k].lo, params[k].hi);
        step_norm = std::max(
            step_norm, std::abs(xn[k] - x[k]) / std::max(1.0, std::abs(x[k])));
      }
      absl::StatusOr<std::vector<double>> rn = f.Residuals(params, xn);
      if (!rn.ok()) return rn.status();
      const double cn = SumSquares(*rn);
      if (cn < cost) {
        x = std::move(xn);
        r = std::move(rn);
        const double gain = cost - cn;
        cost = cn;
        lambda = std::max(lambda / 10, 1e-12);
        improved = true;
        if (gain < rel_gain * std::max(cost, 1e-30) || step_norm < 1e-12) {
          return x;
        }
        break;
      }
      lambda *= 10;
      if (step_norm < 1e-14) break;
    }
    if (!improved) break;
  }
  return x;
}

// --- Identifiability ---------------------------------------------------------

// The columns of d log(prediction) / d log(parameter) at `x`, a fixed cost
// held at least at its reference value (at 0 its column would vanish).
absl::StatusOr<std::vector<std::vector<double>>> LogColumns(
    const Objective& f, const std::vector<Param>& params,
    std::vector<double> x) {
  for (size_t k = 0; k < params.size(); ++k) {
    if (!params[k].is_log()) x[k] = std::max(x[k], params[k].reference);
  }
  absl::StatusOr<std::vector<double>> r0 = f.Residuals(params, x);
  if (!r0.ok()) return r0.status();
  std::vector<std::vector<double>> cols(params.size(),
                                        std::vector<double>(r0->size()));
  for (size_t k = 0; k < params.size(); ++k) {
    // A relative step of 1e-3 in the parameter: large enough to be above
    // the rounding of the pricing, small enough to stay on one piece.
    const double h = params[k].is_log() ? 1e-3 : 1e-3 * x[k];
    std::vector<double> xh = x;
    xh[k] += h;
    absl::StatusOr<std::vector<double>> r = f.Residuals(params, xh);
    if (!r.ok()) return r.status();
    const double per_log = params[k].is_log() ? 1.0 : x[k];
    for (size_t i = 0; i < r0->size(); ++i) {
      cols[k][i] = ((*r)[i] - (*r0)[i]) / h * per_log;
    }
  }
  return cols;
}

double Dot(const std::vector<double>& a, const std::vector<double>& b) {
  double s = 0;
  for (size_t i = 0; i < a.size(); ++i) s += a[i] * b[i];
  return s;
}

struct Confusion {
  int param = -1;     // the parameter that is not determined
  int partner = -1;   // the one it is most confused with (-1: none)
  double sine = 0;    // its distance from the others' span
  bool zero = false;  // the predictions do not depend on it at all
};

// The last parameter (in order) whose normalised column lies within
// kIdentifiabilityTolerance of the span of the other columns; none when
// every one is determined.
std::optional<Confusion> FindUndetermined(
    const std::vector<std::vector<double>>& cols) {
  const int n = static_cast<int>(cols.size());
  std::vector<std::vector<double>> unit(n);
  std::vector<bool> zero(n, false);
  for (int k = 0; k < n; ++k) {
    const double norm = std::sqrt(Dot(cols[k], cols[k]));
    zero[k] = norm < 1e-9;
    unit[k] = cols[k];
    for (double& v : unit[k]) v = zero[k] ? 0 : v / norm;
  }
  for (int k = n - 1; k >= 0; --k) {
    if (zero[k]) return Confusion{k, -1, 0, true};
    // Residual of column k after projection on the others: Gram-Schmidt
    // over the others builds an orthonormal basis of their span.
    std::vector<std::vector<double>> basis;
    for (int o = 0; o < n; ++o) {
      if (o == k || zero[o]) continue;
      std::vector<double> v = unit[o];
      for (const auto& b : basis) {
        const double d = Dot(v, b);
        for (size_t i = 0; i < v.size(); ++i) v[i] -= d * b[i];
      }
      const double norm = std::sqrt(Dot(v, v));
      if (norm < 1e-9) continue;
      for (double& e : v) e /= norm;
      basis.push_back(std::move(v));
    }
    std::vector<double> res = unit[k];
    for (const auto& b : basis) {
      const double d = Dot(res, b);
      for (size_t i = 0; i < res.size(); ++i) res[i] -= d * b[i];
    }
    const double sine = std::sqrt(Dot(res, res));
    if (sine < kIdentifiabilityTolerance) {
      int partner = -1;
      double best = -1;
      for (int o = 0; o < n; ++o) {
        if (o == k || zero[o]) continue;
        const double c = std::abs(Dot(unit[k], unit[o]));
        if (c > best) best = c, partner = o;
      }
      return Confusion{k, partner, sine, false};
    }
  }
  return std::nullopt;
}

// Why parameter `c.param` is not determined, for the refusal or the note.
std::string ConfusionReason(const Confusion& c, const std::vector<Param>& p,
                            bool memory) {
  const Param& q = p[c.param];
  if (c.zero) {
    return absl::StrCat("no fitted run's predicted ",
                        memory ? "peak memory" : "time", " depends on it",
                        q.kind == ParamKind::kScale ? q.scale->independent
                                                    : "");
  }
  std::string partner =
      c.partner >= 0 ? p[c.partner].Prose() : std::string("the others");
  std::string what;
  if (q.kind == ParamKind::kMicroBatchFixed) {
    what =
        "the runs' micro-batch counts per replica grow in proportion to "
        "their compute";
  } else if (q.kind == ParamKind::kScale && !q.scale->confused.empty()) {
    what = std::string(q.scale->confused);
  } else if (q.kind == ParamKind::kFragmentation) {
    what = "the fitted runs' predicted tensors are (nearly) the same size";
  } else {
    what = absl::StrCat(
        "the fitted runs' predicted ", memory ? "peak memory" : "times",
        " change with it in the same proportion as with ", partner);
  }
  return absl::StrFormat(
      "%s, so it cannot be told apart from %s (sine of the angle between "
      "their Jacobian columns %.3g < %.3g)",
      what, partner, c.sine, kIdentifiabilityTolerance);
}

// GPU types the stages of `runs` use, in catalog order.
std::vector<std::string> TypesUsed(const std::vector<const RunPricer*>& runs) {
  std::set<int> types;
  for (const RunPricer* r : runs) {
    for (const Template& t : r->plan().templates) {
      for (const Stage& s : t.stages) types.insert(s.gpu_type);
    }
  }
  std::vector<std::string> ids;
  if (runs.empty()) return ids;
  for (int t : types) ids.push_back(runs[0]->catalog().type(t).id);
  return ids;
}

absl::Status Refuse(const std::string& param, const std::string& why) {
  return absl::FailedPreconditionError(absl::StrCat(param, ": ", why));
}

// "2 fitted runs with a measured peak for 2 parameters (a, b)": the start
// of both messages about too few runs.
std::string RunsForParameters(int runs, const std::vector<Param>& params,
                              bool memory) {
  return absl::StrCat(
      runs, " fitted run", runs == 1 ? "" : "s",
      memory ? " with a measured peak" : "", " for ", params.size(),
      " parameters (",
      absl::StrJoin(params, ", ",
                    [](std::string* out, const Param& p) {
                      out->append(p.Name());
                    }),
      ")");
}

// Whether an optional parameter must also pass OptionalParameterDoubt: all
// but a scale (the automatic fit's compute scales: one run sets one) and
// the memory's first term, the additive reserve, which one run with a
// peak sets as one run sets a compute scale.
bool NeedsSupport(const Param& q) {
  return q.kind != ParamKind::kContextReserve && q.kind != ParamKind::kScale;
}

// Past this many fitted runs the cross-validation of an optional parameter
// holds out one of this many folds at a time (run i in fold i % folds)
// rather than one run: its cost stays at 2 x folds fits however many
// generations the controller has measured.
constexpr int kMaxFolds = 10;

// Where the cross-validation's fits stop (Minimise): the errors it
// compares differ in the third or fourth digit.
constexpr double kCrossValidationGain = 1e-8;

int FoldsOf(const Objective& f) {
  return std::min(static_cast<int>(f.pricers.size()), kMaxFolds);
}

// `f` without the runs of fold `k` of `folds`.
Objective WithoutFold(const Objective& f, int folds, int k) {
  Objective sub = f;
  sub.pricers.clear();
  sub.measured.clear();
  for (size_t i = 0; i < f.pricers.size(); ++i) {
    if (static_cast<int>(i % folds) == k) continue;
    sub.pricers.push_back(f.pricers[i]);
    sub.measured.push_back(f.measured[i]);
  }
  return sub;
}

struct CrossValidation {
  double rms = 0;  // of log(predicted / measured), each run predicted by
                   // the fit without its fold
  // Runs (indices in f) without which the last parameter is not
  // determined, empty when it always is; and why.
  std::vector<int> undetermined_without;
  std::string why;
};

// Predicts each run of `f` from `params` fitted on the runs outside its
// fold (leave-one-out up to kMaxFolds runs), each fit started from the fit
// on every run. Stops at the first fold without which the last of `params`
// is not determined (when `check_last`; checked at `x0`, as FitGroup
// checks the whole set).
absl::StatusOr<CrossValidation> CrossValidationError(
    const Objective& f, const std::vector<Param>& params,
    const std::vector<double>& x0, bool check_last, bool memory) {
  CrossValidation out;
  // With no parameters there is nothing to fit: the start is the fit.
  auto fit = [&](const Objective& o, const std::vector<double>& from)
      -> absl::StatusOr<std::vector<double>> {
    if (params.empty()) return from;
    return Minimise(o, params, from, kCrossValidationGain);
  };
  absl::StatusOr<std::vector<double>> x_all = fit(f, x0);
  if (!x_all.ok()) return x_all.status();
  const int folds = FoldsOf(f);
  double sum = 0;
  for (int k = 0; k < folds; ++k) {
    const Objective sub = WithoutFold(f, folds, k);
    if (check_last) {
      absl::StatusOr<std::vector<std::vector<double>>> cols =
          LogColumns(sub, params, x0);
      if (!cols.ok()) return cols.status();
      std::optional<Confusion> c = FindUndetermined(*cols);
      if (c && c->param == static_cast<int>(params.size()) - 1) {
        for (size_t i = k; i < f.pricers.size(); i += folds) {
          out.undetermined_without.push_back(static_cast<int>(i));
        }
        out.why = ConfusionReason(*c, params, memory);
        return out;
      }
    }
    absl::StatusOr<std::vector<double>> x = fit(sub, *x_all);
    if (!x.ok()) return x.status();
    absl::StatusOr<std::vector<double>> r = f.Residuals(params, *x);
    if (!r.ok()) return r.status();
    for (size_t i = k; i < f.pricers.size(); i += folds) sum += (*r)[i] * (*r)[i];
  }
  out.rms = std::sqrt(sum / static_cast<double>(f.pricers.size()));
  return out;
}

// What the check of an optional parameter found: why the runs determine it
// but it should still be left out, or "" to keep it, and then the
// cross-validated errors that kept it (for the report).
struct OptionalVerdict {
  std::string doubt;
  std::string evidence;
};

// Why an optional parameter the runs determine should still be left out,
// or "" to keep it: fitted on no more runs than parameters it passes
// through every run, so nothing checks it; and it must predict each fitted
// run from the others better than the fit without it does (leave-one-out
// cross-validation). Two runs and a compute scale fit a fixed cost per
// micro-batch exactly, whatever the error they share.
absl::StatusOr<OptionalVerdict> OptionalParameterDoubt(
    const Objective& f, const std::vector<Param>& without,
    const std::vector<double>& x_without, const std::vector<Param>& with,
    const std::vector<double>& x_with, bool memory) {
  const int runs = static_cast<int>(f.pricers.size());
  if (static_cast<int>(with.size()) >= runs) {
    return OptionalVerdict{
        absl::StrCat(RunsForParameters(runs, with, memory),
                     ": the fit would pass through every run with none left "
                     "to check it; fit on one run more, or name it in --fit"),
        ""};
  }
  const std::string method =
      FoldsOf(f) == runs ? "leave-one-out"
                         : absl::StrCat(FoldsOf(f), "-fold cross-validation");
  absl::StatusOr<CrossValidation> a =
      CrossValidationError(f, with, x_with, /*check_last=*/true, memory);
  if (!a.ok()) return a.status();
  if (!a->undetermined_without.empty()) {
    return OptionalVerdict{
        absl::StrCat(
            "without fitted run",
            a->undetermined_without.size() == 1 ? " " : "s ",
            absl::StrJoin(a->undetermined_without, ", ",
                          [&](std::string* out, int i) {
                            out->append(QuoteForMessage(f.pricers[i]->label()));
                          }),
            " the others do not determine it (", a->why, "), so ",
            a->undetermined_without.size() == 1 ? "one run alone sets it"
                                                : "those runs alone set it"),
        ""};
  }
  absl::StatusOr<CrossValidation> b =
      CrossValidationError(f, without, x_without, /*check_last=*/false, memory);
  if (!b.ok()) return b.status();
  const char* what = memory ? "peak memory" : "time";
  if (a->rms >= b->rms) {
    return OptionalVerdict{absl::StrFormat(
        "predicting each fitted run from the others (%s), it "
        "raises the rms log error of %s from %.4f to %.4f: the runs do not "
        "support it",
        method, what, b->rms, a->rms), ""};
  }
  return OptionalVerdict{
      "", absl::StrFormat("%s rms log error of %s %.4f -> %.4f", method,
                          what, b->rms, a->rms)};
}

// Fits `candidates` (required ones first, then optional ones in order) to
// objective `f`. A required parameter the runs do not determine refuses
// the fit; an optional one is left out, noted in `report`, as is one
// that NeedsSupport and that the runs determine but do not support
// (OptionalParameterDoubt); what kept such a one goes in `evidence`, by
// name.
absl::StatusOr<std::vector<double>> FitGroup(
    const Objective& f, std::vector<Param> candidates,
    const std::vector<bool>& required, const std::vector<double>& start, bool memory, std::vector<Param>* fitted,
    std::vector<FittedParameter>* report,
    std::map<std::string, std::string>* evidence) {
  const int runs = static_cast<int>(f.pricers.size());
  std::vector<double> x0;
  for (size_t k = 0; k < candidates.size(); ++k) {
    const Param& q = candidates[k];
    std::vector<Param> trial = *fitted;
    trial.push_back(q);
    std::vector<double> xt = x0;
    xt.push_back(start[k]);
    std::string why;
    if (static_cast<int>(trial.size()) > runs) {
      why = absl::StrCat(RunsForParameters(runs, trial, memory),
                         "; a fit needs at least one run per parameter");
    } else {
      absl::StatusOr<std::vector<std::vector<double>>> cols =
          LogColumns(f, trial, xt);
      if (!cols.ok()) return cols.status();
      if (std::optional<Confusion> c = FindUndetermined(*cols)) {
        // Blame the newcomer when it is the one confused, else the
        // parameter the check found.
        why = ConfusionReason(*c, trial, memory);
        if (c->param != static_cast<int>(trial.size()) - 1) {
          if (required[k]) return Refuse(trial[c->param].Name(), why);
          why = absl::StrCat("adding it leaves ", trial[c->param].Name(),
                             " undetermined: ", why);
        }
      }
    }
    if (why.empty() && !required[k] && NeedsSupport(q)) {
      absl::StatusOr<OptionalVerdict> v =
          OptionalParameterDoubt(f, *fitted, x0, trial, xt, memory);
      if (!v.ok()) return v.status();
      why = std::move(v->doubt);
      if (why.empty()) (*evidence)[q.Name()] = std::move(v->evidence);
    }
    if (!why.empty()) {
      if (required[k]) return Refuse(q.Name(), why);
      report->push_back({q.Name(), false, 0, why, ""});
      continue;
    }
    *fitted = std::move(trial);
    x0 = std::move(xt);
  }
  if (fitted->empty()) return x0;
  return Minimise(f, *fitted, x0);
}

// A fixed cost beyond this share of a run's predicted time is taken for a
// compute error absorbed (host overhead of real frameworks is a few per
// cent of an iteration).
constexpr double kMaxFixedShare = 0.5;

// The largest share of a run's predicted time the fixed costs of `c` make
// up over the runs of `f`, and the index (in f.pricers) of that run.
absl::StatusOr<std::pair<double, int>> FixedShare(const Objective& f,
                                                  const RunCorrections& c) {
  RunCorrections none = c;
  if (none.micro_batch_fixed_s) none.micro_batch_fixed_s = 0;
  if (none.iteration_fixed_s) none.iteration_fixed_s = 0;
  std::pair<double, int> worst = {0, 0};
  for (size_t i = 0; i < f.pricers.size(); ++i) {
    absl::StatusOr<RunPrediction> with = f.pricers[i]->Price(c);
    if (!with.ok()) return with.status();
    absl::StatusOr<RunPrediction> without = f.pricers[i]->Price(none);
    if (!without.ok()) return without.status();
    const double share =
        (with->iteration_s - without->iteration_s) / with->iteration_s;
    if (share > worst.first) worst = {share, static_cast<int>(i)};
  }
  return worst;
}

double RmsLog(const std::vector<RunFitReport>& runs, bool after) {
  double s = 0;
  int n = 0;
  for (const RunFitReport& r : runs) {
    if (!r.fitted_on) continue;
    const double p = after ? r.after.iteration_s : r.before.iteration_s;
    const double e = std::log(p / r.measured_iteration_s);
    s += e * e;
    ++n;
  }
  return n == 0 ? 0 : std::sqrt(s / n);
}

}  // namespace

absl::Span<const CorrectionScaleKind> CorrectionScaleKinds() {
  return kScaleKinds;
}

void ApplyCorrections(const RunCorrections& c, TrainingConfig* training,
                      CostParams* params) {
  CHECK(training != nullptr && params != nullptr);
  for (const ScaleKind& k : kScaleKinds) {
    for (const auto& [gpu, scale] : c.*(k.corrections)) {
      (params->*(k.params))[gpu] = scale;
    }
  }
  FrameworkConfig& fw = training->framework;
  if (c.micro_batch_fixed_s) fw.micro_batch_fixed_s = *c.micro_batch_fixed_s;
  if (c.iteration_fixed_s) fw.iteration_fixed_s = *c.iteration_fixed_s;
  if (c.context_reserve_gib) fw.context_reserve_gib = *c.context_reserve_gib;
  if (c.fragmentation) fw.fragmentation = *c.fragmentation;
}

absl::StatusOr<RunPrediction> PredictRun(const MeasuredRun& run,
                                         const RunCorrections& corrections,
                                         const RunPricingData& pricing,
                                         const CostParams& base) {
  absl::StatusOr<std::unique_ptr<RunPricer>> pricer =
      RunPricer::Create(run, pricing, base);
  if (!pricer.ok()) return pricer.status();
  return (*pricer)->Price(corrections);
}

absl::StatusOr<FitResult> FitCorrections(const std::vector<MeasuredRun>& runs,
                                         const FitOptions& options) {
  if (runs.empty()) {
    return absl::InvalidArgumentError("runs: no measured run to fit");
  }
  absl::flat_hash_map<std::string, int> by_label;
  for (int i = 0; i < static_cast<int>(runs.size()); ++i) {
    if (!by_label.emplace(runs[i].label, i).second) {
      return absl::InvalidArgumentError(
          absl::StrCat("runs[", i, "].label: duplicate label ",
                       QuoteForMessage(runs[i].label)));
    }
    if (!(runs[i].measured_iteration_s > 0) ||
        !std::isfinite(runs[i].measured_iteration_s)) {
      return absl::InvalidArgumentError(
          absl::StrCat("run ", QuoteForMessage(runs[i].label),
                       ": measured iteration_s must be > 0, got ",
                       runs[i].measured_iteration_s));
    }
  }
  std::vector<bool> on(runs.size(), options.fit_on.empty());
  for (const std::string& label : options.fit_on) {
    auto it = by_label.find(label);
    if (it == by_label.end()) {
      std::vector<std::string> labels;
      for (const MeasuredRun& r : runs) labels.push_back(r.label);
      return absl::InvalidArgumentError(
          absl::StrCat("fit_on: unknown run label ", QuoteForMessage(label),
                       " (runs: ", absl::StrJoin(labels, ", "), ")"));
    }
    on[it->second] = true;
  }
  // Which parameters were asked for (empty: automatic).
  const bool automatic = options.parameters.empty();
  absl::flat_hash_set<std::string> asked;
  for (const std::string& p : options.parameters) {
    if (p != kFitComputeScale && p != kFitAttentionScale &&
        p != kFitTpCommScale &&
        p != kFitMicroBatchFixed &&
        p != kFitIterationFixed && p != kFitContextReserve &&
        p != kFitFragmentation) {
      return absl::InvalidArgumentError(absl::StrCat(
          "parameters: unknown parameter ", QuoteForMessage(p),
          " (known: compute_scale, attention_scale, tp_comm_scale, "
          "micro_batch_fixed_ms, iteration_fixed_ms, context_reserve_gib, "
          "fragmentation)"));
    }
    asked.insert(p);
  }

  std::vector<std::unique_ptr<RunPricer>> pricers;
  for (const MeasuredRun& run : runs) {
    absl::StatusOr<std::unique_ptr<RunPricer>> p =
        RunPricer::Create(run, options.pricing, options.base);
    if (!p.ok()) return p.status();
    pricers.push_back(*std::move(p));
  }
  FitResult result;
  std::vector<int> time_runs;  // index in `runs` of each time.pricers entry
  Objective time;
  Objective memory;
  memory.memory = true;
  for (size_t i = 0; i < runs.size(); ++i) {
    if (!on[i]) continue;
    result.fitted_on.push_back(runs[i].label);
    time_runs.push_back(static_cast<int>(i));
    time.pricers.push_back(pricers[i].get());
    time.measured.push_back(runs[i].measured_iteration_s);
    if (runs[i].measured_peak_gib) {
      memory.pricers.push_back(pricers[i].get());
      memory.measured.push_back(*runs[i].measured_peak_gib);
    }
  }

  // Start values: compute scale 1, a framework field at the mean of the
  // fitted runs' own values.
  auto mean_of = [&](auto field) {
    double s = 0;
    int n = 0;
    for (size_t i = 0; i < runs.size(); ++i) {
      if (on[i]) s += field(runs[i].training.framework), ++n;
    }
    return n == 0 ? 0.0 : s / n;
  };

  // --- Time ---
  std::vector<FittedParameter> notes;  // parameters left out, and why
  // Optional parameters kept, and the cross-validated errors that kept
  // them.
  std::map<std::string, std::string> evidence;
  std::vector<Param> cand;
  std::vector<bool> req;
  std::vector<double> start;
  for (const ScaleKind& k : kScaleKinds) {
    if (!asked.contains(k.name) && (k.only_when_named || !automatic)) continue;
    for (const std::string& gpu : TypesUsed(time.pricers)) {
      cand.push_back(ScaleParam(k, gpu));
      // Named, a scale the runs do not determine refuses the fit. The
      // automatic fit leaves it out and keeps the others: a GPU type whose
      // stages were never on the critical path (a mixed plan's faster
      // template) says nothing of its speed, but the runs still say how
      // far the other types are from their profiles (the controller fits
      // on every generation it measured, and refusing them all kept its
      // first generation's corrections for the rest of the job).
      req.push_back(asked.contains(k.name));
      start.push_back(0);
    }
  }
  if (automatic || asked.contains(kFitMicroBatchFixed)) {
    // With one micro-batch count per replica across the runs, every run
    // adds the same number of fixed costs, which then is separable from
    // the compute only through the profiles' micro-batch-size scaling — the
    // very thing the compute scale corrects. So it needs varied counts.
    std::set<int> counts;
    for (const RunPricer* p : time.pricers) {
      absl::StatusOr<RunPrediction> r = p->Price({});
      if (!r.ok()) return r.status();
      counts.insert(r->micro_batches_per_replica);
    }
    const bool req_it = asked.contains(kFitMicroBatchFixed);
    if (counts.size() == 1) {
      const std::vector<std::string> types = TypesUsed(time.pricers);
      std::string why = absl::StrCat(
          time.pricers.size() == 1 ? "the only fitted run has "
                                   : "every fitted run has ",
          *counts.begin(),
          *counts.begin() == 1 ? " micro-batch" : " micro-batches",
          " per replica, so it cannot be told apart from ",
          types.size() == 1 ? absl::StrCat("the ", types[0], " compute scale")
                            : std::string("the compute scales"));
      if (req_it) return Refuse(std::string(kFitMicroBatchFixed), why);
      notes.push_back({std::string(kFitMicroBatchFixed), false, 0, why, ""});
    } else {
      cand.push_back(MicroBatchFixedParam());
      req.push_back(req_it);
      start.push_back(1e3 * mean_of([](const FrameworkConfig& f) {
                        return f.micro_batch_fixed_s;
                      }));
    }
  }
  // The fixed cost per iteration only when named: it absorbs whatever error
  // grows less than linearly with the compute, so fitted by default it
  // would hide model error on runs of different sizes.
  if (asked.contains(kFitIterationFixed)) {
    cand.push_back(IterationFixedParam());
    req.push_back(true);
    start.push_back(1e3 * mean_of([](const FrameworkConfig& f) {
                      return f.iteration_fixed_s;
                    }));
  }
  std::vector<Param> time_params;
  absl::StatusOr<std::vector<double>> xt =
      FitGroup(time, cand, req, start, false, &time_params, &notes,
               &evidence);
  if (!xt.ok()) return xt.status();
  RunCorrections corrections = CorrectionsOf(time_params, *xt);
  // A fixed cost the automatic fit chose that makes up most of a run's
  // time is a compute error absorbed, not host overhead: leave it out and
  // fit again without it (named in `parameters`, it is kept, with a
  // warning below).
  for (size_t k = 0; k < time_params.size(); ++k) {
    if (time_params[k].kind != ParamKind::kMicroBatchFixed ||
        asked.contains(kFitMicroBatchFixed)) {
      continue;
    }
    absl::StatusOr<std::pair<double, int>> share =
        FixedShare(time, corrections);
    if (!share.ok()) return share.status();
    if (share->first <= kMaxFixedShare) break;
    notes.push_back(
        {time_params[k].Name(), false, 0,
         absl::StrFormat(
             "fitted (%.4g ms), it made up %.0f%% of run %s's predicted "
             "time: a compute error absorbed, not host overhead (name it in "
             "--fit to keep it)",
             (*xt)[k], 100 * share->first,
             QuoteForMessage(runs[time_runs[share->second]].label)),
         ""});
    std::vector<Param> kept;
    std::vector<double> x0;
    for (size_t j = 0; j < time_params.size(); ++j) {
      if (j == k) continue;
      kept.push_back(time_params[j]);
      x0.push_back(0);  // the start of the first fit
    }
    time_params = kept;
    xt = Minimise(time, time_params, x0);
    if (!xt.ok()) return xt.status();
    corrections = CorrectionsOf(time_params, *xt);
    break;
  }

  // --- Memory ---
  cand.clear(), req.clear(), start.clear();
  const bool mem_auto = automatic;
  if (mem_auto || asked.contains(kFitContextReserve)) {
    cand.push_back(ContextReserveParam());
    req.push_back(asked.contains(kFitContextReserve));
    start.push_back(mean_of(
        [](const FrameworkConfig& f) { return f.context_reserve_gib; }));
  }
  if (mem_auto || asked.contains(kFitFragmentation)) {
    cand.push_back(FragmentationParam());
    req.push_back(asked.contains(kFitFragmentation));
    start.push_back(
        mean_of([](const FrameworkConfig& f) { return f.fragmentation; }));
  }
  std::vector<Param> mem_params;
  if (!cand.empty() && memory.pricers.empty()) {
    const std::string why = "no fitted run has a measured peak_memory_gib";
    for (size_t k = 0; k < cand.size(); ++k) {
      if (req[k]) return Refuse(cand[k].Name(), why);
      notes.push_back({cand[k].Name(), false, 0, why, ""});
    }
  } else if (!cand.empty()) {
    memory.fixed = corrections;
    absl::StatusOr<std::vector<double>> xm =
        FitGroup(memory, cand, req, start, true, &mem_params,
                 &notes, &evidence);
    if (!xm.ok()) return xm.status();
    corrections = CorrectionsOf(mem_params, *xm, corrections);
    for (size_t k = 0; k < mem_params.size(); ++k) {
      result.parameters.push_back({mem_params[k].Name(), true,
                                   mem_params[k].Display((*xm)[k]), "",
                                   evidence[mem_params[k].Name()]});
    }
  }
  // Fitted time parameters first, then memory, then the notes.
  std::vector<FittedParameter> ordered;
  for (size_t k = 0; k < time_params.size(); ++k) {
    ordered.push_back({time_params[k].Name(), true,
                       time_params[k].Display((*xt)[k]), "",
                       evidence[time_params[k].Name()]});
  }
  for (FittedParameter& p : result.parameters) ordered.push_back(std::move(p));
  for (FittedParameter& p : notes) ordered.push_back(std::move(p));
  result.parameters = std::move(ordered);
  result.corrections = corrections;

  for (size_t i = 0; i < runs.size(); ++i) {
    RunFitReport r;
    r.label = runs[i].label;
    r.fitted_on = on[i];
    r.measured_iteration_s = runs[i].measured_iteration_s;
    r.measured_peak_gib = runs[i].measured_peak_gib;
    absl::StatusOr<RunPrediction> before = pricers[i]->Price({});
    if (!before.ok()) return before.status();
    absl::StatusOr<RunPrediction> after = pricers[i]->Price(corrections);
    if (!after.ok()) return after.status();
    r.before = *before;
    r.after = *after;
    result.runs.push_back(std::move(r));
  }
  result.time_rms_log_error_before = RmsLog(result.runs, false);
  result.time_rms_log_error_after = RmsLog(result.runs, true);

  // --- Warnings ---
  auto at_bound = [](const Param& q, double x) -> std::optional<double> {
    const double tol = 1e-9 * std::max(1.0, std::abs(x));
    if (std::abs(x - q.lo) <= tol) return q.lo;
    if (std::abs(x - q.hi) <= tol) return q.hi;
    return std::nullopt;
  };
  auto check_bounds = [&](const std::vector<Param>& ps,
                          const std::vector<double>& xs) {
    for (size_t k = 0; k < ps.size(); ++k) {
      if (std::optional<double> b = at_bound(ps[k], xs[k])) {
        result.warnings.push_back(absl::StrFormat(
            "%s = %.6g is at the %s bound of its range (the unconstrained "
            "best fit lies beyond it): the fit may be absorbing an error of "
            "another kind",
            ps[k].Name(), ps[k].Display(xs[k]),
            *b == ps[k].lo ? "lower" : "upper"));
      }
    }
  };
  check_bounds(time_params, *xt);
  if (!mem_params.empty()) {
    std::vector<double> xm;
    for (const Param& q : mem_params) {
      xm.push_back(q.kind == ParamKind::kContextReserve
                       ? *corrections.context_reserve_gib
                       : *corrections.fragmentation);
    }
    check_bounds(mem_params, xm);
  }
  // A scale more than a factor 2 from the profiles, and what to check first.
  for (const ScaleKind& k : kScaleKinds) {
    for (const auto& [gpu, scale] : corrections.*(k.corrections)) {
      if (scale < 0.5 || scale > 2.0) {
        result.warnings.push_back(absl::StrFormat(
            "%s[%s] = %.4g is more than a factor 2 from the profiles: check "
            "%s before trusting it",
            k.name, gpu, scale, k.check));
      }
    }
  }
  if (corrections.micro_batch_fixed_s || corrections.iteration_fixed_s) {
    absl::StatusOr<std::pair<double, int>> share =
        FixedShare(time, corrections);
    if (!share.ok()) return share.status();
    if (share->first > kMaxFixedShare) {
      result.warnings.push_back(absl::StrFormat(
          "the fitted fixed costs are %.0f%% of run %s's predicted time: "
          "they are absorbing a compute error, not host overhead",
          100 * share->first,
          QuoteForMessage(runs[time_runs[share->second]].label)));
    }
  }
  if (result.time_rms_log_error_after > 0.1) {
    result.warnings.push_back(absl::StrFormat(
        "the fitted runs still differ from the predictions by %.3f (rms log "
        "error, about %.0f%%): the corrections cannot explain them; look at "
        "the runs with the largest error after",
        result.time_rms_log_error_after,
        100 * (std::exp(result.time_rms_log_error_after) - 1)));
  }
  return result;
}

std::string DescribeRunClusters(const std::vector<const MeasuredRun*>& runs,
                                const GpuCatalog& catalog) {
  std::vector<std::string> lines;
  std::set<std::string> seen;
  for (const MeasuredRun* run : runs) {
    std::map<std::string, std::pair<int, int>> by_type;  // gpus, nodes
    std::set<double> nics;
    for (const Node& n : run->cluster.nodes()) {
      auto& [g, k] = by_type[catalog.type(n.gpu_type).id];
      g += n.num_gpus;
      ++k;
      nics.insert(n.nic_gbps);
    }
    std::vector<std::string> parts;
    for (const auto& [id, gk] : by_type) {
      parts.push_back(absl::StrCat(id, ": ", gk.first, " GPUs on ", gk.second,
                                   " node", gk.second == 1 ? "" : "s"));
    }
    std::vector<std::string> nic_text;
    for (double v : nics) nic_text.push_back(absl::StrCat(v));
    std::string line = absl::StrCat(absl::StrJoin(parts, ", "), ", ",
                                    absl::StrJoin(nic_text, "/"), " Gb/s");
    if (seen.insert(line).second) lines.push_back(line);
  }
  return absl::StrJoin(lines, "; ");
}

}  // namespace arachne
