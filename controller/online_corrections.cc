#include "controller/online_corrections.h"

#include <algorithm>
#include <cmath>
#include <map>
#include <set>
#include <utility>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "nlohmann/json.hpp"
#include "planner_service/io/cluster_io.h"
#include "planner_service/io/plan_io.h"
#include "planner_service/io/run_corrections_io.h"

namespace arachne::controller {

OnlineCorrections::OnlineCorrections(GpuCatalog catalog, ModelSpec model,
                                     TrainingConfig training,
                                     std::string profiles_dir,
                                     int min_iterations)
    : catalog_(std::move(catalog)),
      model_(std::move(model)),
      training_(std::move(training)),
      profiles_dir_(std::move(profiles_dir)),
      min_iterations_(std::max(1, min_iterations)) {}

absl::StatusOr<RunPrediction> OnlineCorrections::Predict(
    const Cluster& cluster, const Plan& plan,
    const RunCorrections& corrections) const {
  MeasuredRun run;
  run.label = "prediction";
  run.source = "arachne-controller";
  run.model = model_;
  run.training = training_;
  run.cluster = cluster;
  run.plan = plan;
  // Pricing only: no measurement is read, but a run carries one.
  run.measured_iteration_s = 1;
  return PredictRun(run, corrections, ProfilesDirPricing(profiles_dir_));
}

namespace {

struct Parsed {
  Cluster cluster;
  Plan plan;
};

absl::StatusOr<Parsed> ParseRecord(const GenerationRecord& r,
                                   const GpuCatalog& catalog) {
  const std::string what = absl::StrCat("generation ", r.generation);
  absl::StatusOr<Cluster> cluster =
      ParseCluster(r.cluster_json, absl::StrCat(what, " cluster"), catalog);
  if (!cluster.ok()) return cluster.status();
  const nlohmann::json json = nlohmann::json::parse(r.plan_json, nullptr, false);
  if (json.is_discarded()) {
    return absl::DataLossError(absl::StrCat(what, ": the plan is not JSON"));
  }
  absl::StatusOr<Plan> plan =
      PlanFromJson(json, *cluster, catalog, absl::StrCat(what, " plan"));
  if (!plan.ok()) return plan.status();
  return Parsed{*std::move(cluster), *std::move(plan)};
}

}  // namespace

absl::StatusOr<RunPrediction> OnlineCorrections::Predict(
    const GenerationRecord& record, const RunCorrections& corrections) const {
  absl::StatusOr<Parsed> p = ParseRecord(record, catalog_);
  if (!p.ok()) return p.status();
  return Predict(p->cluster, p->plan, corrections);
}

absl::StatusOr<std::vector<MeasuredRun>> OnlineCorrections::Runs(
    const std::vector<GenerationRecord>& records,
    std::vector<int64_t>* generations) const {
  std::vector<MeasuredRun> runs;
  generations->clear();
  for (const GenerationRecord& r : records) {
    if (r.iterations_measured < min_iterations_ || !(r.measured_iteration_s > 0)) {
      continue;
    }
    absl::StatusOr<Parsed> p = ParseRecord(r, catalog_);
    if (!p.ok()) return p.status();
    MeasuredRun run;
    run.label = absl::StrCat("generation ", r.generation);
    run.source = absl::StrFormat(
        "arachne-controller: median of the last %d of %d iterations after %d "
        "warm-up",
        static_cast<int>(r.samples.size()), r.iterations_measured, r.warmup);
    run.model = model_;
    run.training = training_;
    run.cluster = std::move(p->cluster);
    run.plan = std::move(p->plan);
    run.measured_iteration_s = r.measured_iteration_s;
    if (const double peak = r.MeasuredPeakGib(); peak > 0) {
      run.measured_peak_gib = peak;
    }
    runs.push_back(std::move(run));
    generations->push_back(r.generation);
  }
  return runs;
}

CorrectionsFit OnlineCorrections::Fit(
    const std::vector<GenerationRecord>& records) const {
  CorrectionsFit out;
  absl::StatusOr<std::vector<MeasuredRun>> runs = Runs(records, &out.generations);
  if (!runs.ok()) {
    out.status = runs.status();
    out.note = absl::StrCat("refused: ", runs.status().message());
    return out;
  }
  if (runs->empty()) {
    out.status = absl::FailedPreconditionError(absl::StrCat(
        "no generation measured ", min_iterations_,
        " iterations after its warm-up yet"));
    out.note = absl::StrCat("refused: ", out.status.message());
    return out;
  }
  FitOptions options;
  options.pricing = ProfilesDirPricing(profiles_dir_);
  absl::StatusOr<FitResult> fit = FitCorrections(*runs, options);
  std::string memory_note;
  if (!fit.ok() && absl::IsFailedPrecondition(fit.status())) {
    // The agents' peak RSS is a process's (CPU ranks share it): when it is
    // what the fit cannot explain, the iteration times still determine the
    // time corrections.
    bool any_peak = false;
    for (MeasuredRun& r : *runs) {
      any_peak |= r.measured_peak_gib.has_value();
      r.measured_peak_gib.reset();
    }
    if (any_peak) {
      memory_note = absl::StrCat("; memory left out (", fit.status().message(), ")");
      fit = FitCorrections(*runs, options);
    }
  }
  if (!fit.ok()) {
    out.status = fit.status();
    out.note = absl::StrCat("refused on ", out.generations.size(),
                            out.generations.size() == 1 ? " generation" : " generations",
                            ": ", fit.status().message());
    return out;
  }
  out.corrections = fit->corrections;
  // How far the corrected predictions still are from what was measured:
  // a fit held at its bounds, or plans the corrections cannot tell apart,
  // leave an error the note names.
  double worst = 0;
  for (const RunFitReport& r : fit->runs) {
    out.after.push_back(r.after);
    if (r.fitted_on && r.measured_iteration_s > 0) {
      worst = std::max(worst, std::abs(r.after.iteration_s /
                                           r.measured_iteration_s - 1));
    }
  }
  std::vector<std::string> left_out;
  for (const FittedParameter& p : fit->parameters) {
    if (!p.fitted && !p.reason.empty()) {
      left_out.push_back(absl::StrCat(p.name, " left out: ", p.reason));
    }
  }
  out.note = absl::StrCat(
      "fitted on ", out.generations.size(),
      out.generations.size() == 1 ? " generation" : " generations", " (",
      absl::StrJoin(out.generations, ", "), "); time rms log error ",
      absl::StrFormat("%.3f -> %.3f, corrected iteration times within "
                      "%.1f%% of the measured",
                      fit->time_rms_log_error_before,
                      fit->time_rms_log_error_after, 100 * worst),
      memory_note, left_out.empty() ? "" : "; ", absl::StrJoin(left_out, "; "));
  // The fit's own warnings (a value at its bound, a scale far from 1, ...):
  // an operator reads them before trusting the corrections.
  out.warnings = fit->warnings;
  if (!fit->warnings.empty()) {
    absl::StrAppend(&out.note, "; warning: ", absl::StrJoin(fit->warnings, "; warning: "));
  }
  return out;
}

std::string OnlineCorrections::ToJson(
    const RunCorrections& corrections,
    const std::vector<int64_t>& generations) const {
  RunCalibrationFile file;
  file.corrections = corrections;
  for (int64_t g : generations) {
    file.fitted_on.push_back(absl::StrCat("generation ", g));
  }
  file.cluster_note = "arachne-controller: the job's measured generations";
  return RunCalibrationToJson(file, /*exact=*/true).dump();
}

absl::StatusOr<RunCorrections> OnlineCorrections::FromJson(
    const std::string& json, std::vector<int64_t>* generations) const {
  const nlohmann::json j = nlohmann::json::parse(json, nullptr, false);
  if (j.is_discarded()) {
    return absl::DataLossError("stored corrections: not JSON");
  }
  absl::StatusOr<RunCalibrationFile> file =
      RunCalibrationFromJson(j, catalog_, "stored corrections");
  if (!file.ok()) return file.status();
  generations->clear();
  for (const std::string& label : file->fitted_on) {
    int64_t g = 0;
    if (label.rfind("generation ", 0) == 0 &&
        absl::SimpleAtoi(label.substr(11), &g)) {
      generations->push_back(g);
    }
  }
  return file->corrections;
}

std::vector<std::string> ImputeUnmeasuredTypes(
    const std::vector<std::string>& types, RunCorrections* corrections) {
  // Unmeasured means without a compute scale: the others are fitted only
  // when asked for.
  std::set<std::string> unmeasured;
  if (!corrections->compute_scale.empty()) {
    for (const std::string& type : types)
      if (!corrections->compute_scale.contains(type)) unmeasured.insert(type);
  }
  for (std::map<std::string, double>* scales :
       {&corrections->compute_scale, &corrections->attention_scale,
        &corrections->tp_comm_scale}) {
    if (scales->empty()) continue;
    double log_sum = 0;
    for (const auto& [gpu, scale] : *scales) log_sum += std::log(scale);
    const double fleet = std::exp(log_sum / scales->size());
    for (const std::string& type : types) scales->emplace(type, fleet);
  }
  return std::vector<std::string>(unmeasured.begin(), unmeasured.end());
}

std::vector<std::string> UnmeasuredTypesAgainstSwitch(
    const std::vector<std::string>& imputed,
    const std::set<std::string>& new_types,
    const std::set<std::string>& current_types) {
  std::vector<std::string> out;
  for (const std::string& type : imputed) {
    if (new_types.count(type) > 0 && current_types.count(type) == 0) {
      out.push_back(type);
    }
  }
  return out;
}

std::string DescribeCorrections(const RunCorrections& c) {
  std::vector<std::string> parts;
  for (const auto& [gpu, scale] : c.compute_scale) {
    parts.push_back(absl::StrFormat("compute_scale %s %.3f", gpu, scale));
  }
  for (const auto& [gpu, scale] : c.attention_scale) {
    parts.push_back(absl::StrFormat("attention_scale %s %.3f", gpu, scale));
  }
  for (const auto& [gpu, scale] : c.tp_comm_scale) {
    parts.push_back(absl::StrFormat("tp_comm_scale %s %.3f", gpu, scale));
  }
  if (c.micro_batch_fixed_s) {
    parts.push_back(absl::StrFormat("micro_batch_fixed %.3f ms",
                                    *c.micro_batch_fixed_s * 1e3));
  }
  if (c.iteration_fixed_s) {
    parts.push_back(
        absl::StrFormat("iteration_fixed %.3f ms", *c.iteration_fixed_s * 1e3));
  }
  if (c.context_reserve_gib) {
    parts.push_back(
        absl::StrFormat("context_reserve %.3f GiB", *c.context_reserve_gib));
  }
  if (c.fragmentation) {
    parts.push_back(absl::StrFormat("fragmentation %.3f", *c.fragmentation));
  }
  return absl::StrJoin(parts, ", ");
}

}  // namespace arachne::controller
