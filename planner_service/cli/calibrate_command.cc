#include "planner_service/cli/calibrate_command.h"

#include <algorithm>
#include <cmath>
#include <fstream>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "planner_service/cli/cli.h"
#include "planner_service/core/planning_options.h"
#include "planner_service/io/gpu_catalog_io.h"
#include "planner_service/io/measured_runs_io.h"

namespace arachne {
namespace {

int Fail(std::ostream& err, const absl::Status& s) {
  return FailCommand(err, s);
}

std::string Cell(const std::string& s, size_t width) {
  return s + std::string(width > s.size() ? width - s.size() : 0, ' ');
}

// Root mean square of log(after or before / measured) over the runs of one
// side (fitted on or held out); -1 when there are none.
double Rms(const FitResult& r, bool fitted_on, bool after, bool memory) {
  double s = 0;
  int n = 0;
  for (const RunFitReport& run : r.runs) {
    if (run.fitted_on != fitted_on) continue;
    if (memory && !run.measured_peak_gib) continue;
    const RunPrediction& p = after ? run.after : run.before;
    const double e = memory
                         ? std::log(p.peak_gib / *run.measured_peak_gib)
                         : std::log(p.iteration_s / run.measured_iteration_s);
    s += e * e;
    ++n;
  }
  return n == 0 ? -1 : std::sqrt(s / n);
}

}  // namespace

std::string RelativeError(double predicted, double measured) {
  return absl::StrFormat("%+.1f%%", 100.0 * (predicted / measured - 1.0));
}

CLI::App* AddCalibrateCommand(CLI::App& app, CalibrateFlags* f) {
  CLI::App* cmd = app.add_subcommand(
      "calibrate",
      "fit the cost model to measured runs (docs/measured-runs.md)");
  cmd->add_option("--runs", f->runs_file, "measured-runs file (YAML or JSON)")
      ->required();
  cmd->add_option("--fit-on", f->fit_on,
                  "labels of the runs to fit on, comma-separated (default: "
                  "all); the others are held out")
      ->delimiter(',');
  cmd->add_option("--fit", f->parameters,
                  "what to fit, comma-separated: compute_scale, "
                  "attention_scale, tp_comm_scale, micro_batch_fixed_ms, "
                  "iteration_fixed_ms, context_reserve_gib, fragmentation "
                  "(default: what the runs determine; attention_scale, "
                  "tp_comm_scale and iteration_fixed_ms only when named); "
                  "a named one the runs do not determine is an error")
      ->delimiter(',');
  cmd->add_option("--out", f->out_file,
                  "write the calibration file (JSON) here, for "
                  "--calibration");
  cmd->add_option("--profiles-dir", f->profiles_dir,
                  "directory overriding the built-in profiles/ data");
  return cmd;
}

std::string RenderFitReport(const FitResult& r) {
  size_t label_w = 3;
  for (const RunFitReport& run : r.runs) {
    label_w = std::max(label_w, run.label.size());
  }
  std::string s;
  const std::vector<std::string> head = {
      "measured s", "before s",   "after s",   "err before", "err after",
      "meas GiB",   "before GiB", "after GiB", "err before", "err after"};
  s += Cell("run", label_w + 2) + Cell("set", 10);
  for (const std::string& h : head) s += Cell(h, 12);
  while (!s.empty() && s.back() == ' ') s.pop_back();
  s += "\n";
  for (const RunFitReport& run : r.runs) {
    std::vector<std::string> cells = {
        absl::StrFormat("%.3f", run.measured_iteration_s),
        absl::StrFormat("%.3f", run.before.iteration_s),
        absl::StrFormat("%.3f", run.after.iteration_s),
        RelativeError(run.before.iteration_s, run.measured_iteration_s),
        RelativeError(run.after.iteration_s, run.measured_iteration_s),
        run.measured_peak_gib ? absl::StrFormat("%.1f", *run.measured_peak_gib)
                              : "-",
        absl::StrFormat("%.1f", run.before.peak_gib),
        absl::StrFormat("%.1f", run.after.peak_gib),
        run.measured_peak_gib
            ? RelativeError(run.before.peak_gib, *run.measured_peak_gib)
            : "-",
        run.measured_peak_gib
            ? RelativeError(run.after.peak_gib, *run.measured_peak_gib)
            : "-"};
    s += Cell(run.label, label_w + 2) +
         Cell(run.fitted_on ? "fitted" : "held-out", 10);
    for (const std::string& c : cells) s += Cell(c, 12);
    // Trailing blanks of the last cell are noise in a terminal and a diff.
    while (!s.empty() && s.back() == ' ') s.pop_back();
    if (!run.after.fits) s += "  (predicted not to fit)";
    s += "\n";
  }
  s += "\n";
  for (bool fitted : {true, false}) {
    const double tb = Rms(r, fitted, false, false);
    if (tb < 0) continue;
    s += absl::StrFormat("%s runs: rms log error of time %.4f -> %.4f",
                         fitted ? "fitted" : "held-out", tb,
                         Rms(r, fitted, true, false));
    const double mb = Rms(r, fitted, false, true);
    if (mb >= 0) {
      s += absl::StrFormat(", of peak memory %.4f -> %.4f", mb,
                           Rms(r, fitted, true, true));
    }
    s += "\n";
  }
  s += "fitted:\n";
  bool any = false;
  for (const FittedParameter& p : r.parameters) {
    if (!p.fitted) continue;
    any = true;
    s += absl::StrFormat("  %s = %.6g", p.name, p.value);
    if (!p.evidence.empty()) s += absl::StrCat(" (kept: ", p.evidence, ")");
    s += "\n";
  }
  if (!any) s += "  (nothing)\n";
  for (const FittedParameter& p : r.parameters) {
    if (p.fitted) continue;
    s += absl::StrFormat("not fitted: %s: %s\n", p.name, p.reason);
  }
  for (const std::string& w : r.warnings) s += "warning: " + w + "\n";
  return s;
}

absl::StatusOr<RunCorrections> LoadCalibrationFlag(
    const std::string& path, const std::string& profiles_dir) {
  absl::StatusOr<GpuCatalog> catalog = LoadGpuCatalog(profiles_dir);
  if (!catalog.ok()) return catalog.status();
  absl::StatusOr<RunCalibrationFile> file =
      LoadRunCalibrationFile(path, *catalog);
  if (!file.ok()) {
    return absl::Status(
        file.status().code(),
        absl::StrCat("--calibration: ", file.status().message()));
  }
  return file->corrections;
}

int RunCalibrateCommand(const CalibrateFlags& f, std::ostream& out,
                        std::ostream& err) {
  if (absl::Status s = CheckProfilesDir(f.profiles_dir, "--profiles-dir");
      !s.ok()) {
    return Fail(err, s);
  }
  absl::StatusOr<GpuCatalog> catalog = LoadGpuCatalog(f.profiles_dir);
  if (!catalog.ok()) return Fail(err, catalog.status());
  absl::StatusOr<MeasuredRunsFile> runs =
      LoadMeasuredRunsFile(f.runs_file, *catalog, f.profiles_dir);
  if (!runs.ok()) return Fail(err, runs.status());
  FitOptions options;
  options.fit_on = f.fit_on;
  options.parameters = f.parameters;
  options.pricing = ProfilesDirPricing(f.profiles_dir);
  absl::StatusOr<FitResult> result = FitCorrections(runs->runs, options);
  if (!result.ok()) {
    absl::Status s = result.status();
    // The flags' names, where the library speaks of its options.
    std::string msg(s.message());
    if (absl::StartsWith(msg, "fit_on: ")) msg = "--fit-on: " + msg.substr(8);
    if (absl::StartsWith(msg, "parameters: ")) msg = "--fit: " + msg.substr(12);
    return Fail(err, absl::Status(s.code(), msg));
  }
  const int fitted = static_cast<int>(result->fitted_on.size());
  out << absl::StrFormat(
      "calibrate: %d runs from %s (%d fitted on, %d held "
      "out)\n\n",
      runs->runs.size(), f.runs_file, fitted, runs->runs.size() - fitted);
  out << RenderFitReport(*result);
  if (!f.out_file.empty()) {
    RunCalibrationFile file;
    file.corrections = result->corrections;
    file.fitted_on = result->fitted_on;
    std::vector<const MeasuredRun*> on;
    for (const MeasuredRun& r : runs->runs) {
      if (std::find(file.fitted_on.begin(), file.fitted_on.end(), r.label) !=
          file.fitted_on.end()) {
        on.push_back(&r);
      }
    }
    file.cluster_note = DescribeRunClusters(on, *catalog);
    std::ofstream o(f.out_file);
    o << RunCalibrationToJson(file).dump(2) << "\n";
    if (!o) {
      return Fail(err, absl::PermissionDeniedError(
                           absl::StrCat("--out: cannot write ", f.out_file)));
    }
    out << "wrote " << f.out_file << " (apply with --calibration " << f.out_file
        << ")\n";
  }
  return kExitOk;
}

}  // namespace arachne
