// `arachne calibrate --runs FILE`: fits the cost model's corrections to
// measured runs (core/calibration/run_corrections.h), prints measured
// against predicted before and after for every run (fitted-on and
// held-out), the fitted factors and what was left out, and writes the
// calibration file that `--calibration FILE` applies (io/run_corrections_io.h,
// docs/measured-runs.md).
#ifndef ARACHNE_PLANNER_SERVICE_CLI_CALIBRATE_COMMAND_H_
#define ARACHNE_PLANNER_SERVICE_CLI_CALIBRATE_COMMAND_H_

#include <ostream>
#include <string>
#include <vector>

#include "CLI/CLI.hpp"
#include "planner_service/io/run_corrections_io.h"

namespace arachne {

struct CalibrateFlags {
  std::string runs_file;
  std::vector<std::string> fit_on;      // labels; empty: every run
  std::vector<std::string> parameters;  // --fit; empty: automatic
  std::string out_file;                 // "": print only
  std::string profiles_dir;
};

// Registers `calibrate` on `app` with its flags bound to `flags`.
CLI::App* AddCalibrateCommand(CLI::App& app, CalibrateFlags* flags);

// Runs it: kExitOk, or kExitBadInput with "error: <message>" on `err` for a
// bad file or a refused fit (FailedPrecondition naming the parameter).
int RunCalibrateCommand(const CalibrateFlags& flags, std::ostream& out,
                        std::ostream& err);

// The per-run table and the parameter lines, as RunCalibrateCommand prints
// them.
std::string RenderFitReport(const FitResult& result);

// Relative error of `predicted` against `measured`, "+4.1%".
std::string RelativeError(double predicted, double measured);

// "--calibration FILE" as plan, evaluate and bench apply it: the file's
// corrections, read against the catalog of `profiles_dir`. Errors name the
// flag and the file's field.
absl::StatusOr<RunCorrections> LoadCalibrationFlag(
    const std::string& path, const std::string& profiles_dir);

}  // namespace arachne

#endif  // ARACHNE_PLANNER_SERVICE_CLI_CALIBRATE_COMMAND_H_
