// The run corrections' files and messages: the calibration file that holds
// a fit's corrections (`arachne calibrate --out`, read by `--calibration
// FILE`), a request's calibration message, and the pricing of measured runs
// over the profiles of a profiles directory. The fit itself is
// planner_service/core/calibration/run_corrections.h.
#ifndef ARACHNE_PLANNER_SERVICE_IO_RUN_CORRECTIONS_IO_H_
#define ARACHNE_PLANNER_SERVICE_IO_RUN_CORRECTIONS_IO_H_

#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "arachne/v1/planner.pb.h"
#include "nlohmann/json.hpp"
#include "planner_service/core/calibration/run_corrections.h"
#include "planner_service/core/model/gpu_catalog.h"

namespace arachne {

// PredictRun and FitCorrections over the GPU catalog and profiles of
// `profiles_dir` ("" = built in): its shipped measured profiles, then
// synthesized ones for whatever the run's GPU types still lack, as a
// PlanningContext loads them.
RunPricingData ProfilesDirPricing(const std::string& profiles_dir);

// The calibration file:
//
// {"format": "arachne-run-calibration-1",
//  "compute_scale": {"A100-80GB": 1.31},
//  "attention_scale": {"H100-80GB": 1.6},     (optional)
//  "tp_comm_scale": {"V100-16GB": 2.1},       (optional)
//  "framework": {"micro_batch_fixed_ms": 1.2, "iteration_fixed_ms": 40,
//                "context_reserve_gib": 2.1, "fragmentation": 0.07},
//  "fitted_on": ["gpt-2.7b pp4 16 nodes"],
//  "cluster_note": "H100-80GB: 64 GPUs on 16 nodes, 200 Gb/s"}
inline constexpr absl::string_view kRunCalibrationFormat =
    "arachne-run-calibration-1";

struct RunCalibrationFile {
  RunCorrections corrections;
  std::vector<std::string> fitted_on;
  std::string cluster_note;  // the clusters the fit saw (free text)
};

// Values to six significant digits (a file a person reads), or exactly
// (`exact`: what a store reads back must reprice to the same figures).
nlohmann::json RunCalibrationToJson(const RunCalibrationFile& file,
                                    bool exact = false);

// The scales of a request's calibration (v1::Calibration: GPU id or alias
// -> factor), ids resolved to the canonical ones; the framework fields are
// not in it (they travel as the training config's framework overrides).
// InvalidArgument naming "<path>.<map>.<GPU>" for an unknown GPU or a
// factor outside the fit's range (compute [1e-3, 1e4], attention and TP
// communication [1e-2, 1e2]) or not finite.
absl::StatusOr<RunCorrections> CorrectionsFromMessage(
    const v1::Calibration& message, const GpuCatalog& catalog,
    absl::string_view path);
// The scales of `corrections` as a request carries them.
v1::Calibration CorrectionsToMessage(const RunCorrections& corrections);
// Strict: unknown fields, a wrong format, a GPU id not in `catalog`
// (aliases are resolved to the canonical id), a non-positive scale or an
// out-of-range framework value are InvalidArgument "<source>: <field>: ...".
absl::StatusOr<RunCalibrationFile> RunCalibrationFromJson(
    const nlohmann::json& json, const GpuCatalog& catalog,
    absl::string_view source);
absl::StatusOr<RunCalibrationFile> LoadRunCalibrationFile(
    const std::string& path, const GpuCatalog& catalog);

}  // namespace arachne

#endif  // ARACHNE_PLANNER_SERVICE_IO_RUN_CORRECTIONS_IO_H_
