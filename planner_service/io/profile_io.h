// Profile files (profiles/measured/*.csv) and the shipped calibration
// (profiles/calibration.json).
//
// Profile CSV: header
//   model,layer_kind,gpu,tp,mbs,seq,fwd_ms,bwd_ms,tp_comm_ms,activation_bytes,param_count,source
// one ProfileEntry per row (semantics in profile_store.h and
// docs/calibration.md). Blank lines and lines starting with '#' are skipped.
#ifndef ARACHNE_PLANNER_SERVICE_IO_PROFILE_IO_H_
#define ARACHNE_PLANNER_SERVICE_IO_PROFILE_IO_H_

#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "absl/types/span.h"
#include "planner_service/core/calibration/synthesizer_fit.h"
#include "planner_service/core/model/gpu_catalog.h"
#include "planner_service/core/cost/profile_store.h"

namespace arachne {

inline constexpr absl::string_view kProfileCsvHeader =
    "model,layer_kind,gpu,tp,mbs,seq,fwd_ms,bwd_ms,tp_comm_ms,"
    "activation_bytes,param_count,source";

// Parses a profile CSV. Errors are InvalidArgument
// "<source>: line L, column C (name): <what>, got \"value\"". GPU ids are
// kept as written (LoadProfileFiles resolves them against the catalog).
absl::StatusOr<std::vector<ProfileEntry>> ParseProfileCsv(
    absl::string_view text, absl::string_view source = "profile csv");

// Header + one row per entry, in the given order; doubles round-trip.
std::string SerializeProfileCsv(absl::Span<const ProfileEntry> entries);

// Loads every measured/*.csv of `profiles_dir` (embedded copies when empty,
// via ListDataFiles / ReadDataFile) into `store` with canonical GPU ids.
// Unknown GPU ids and duplicate keys (within or across files) are
// InvalidArgument naming the file and line.
absl::Status LoadProfileFiles(const std::string& profiles_dir,
                              const GpuCatalog& catalog, ProfileStore* store);

// calibration.json <-> CalibrationSet. Parsing applies the file's mapping
// (every mapped id resolves to its target's parameters); ids neither fitted
// nor mapped get the defaults through CalibrationSet::For.
absl::StatusOr<CalibrationSet> ParseCalibrationJson(
    absl::string_view text, absl::string_view source = "calibration.json");
absl::StatusOr<CalibrationSet> LoadCalibration(
    const std::string& profiles_dir = "");
// A report as calibration.json: defaults, fitted params + fit metadata and
// errors per GPU, mapping, overall errors; with a rule also unmeasured_rule,
// derived and leave_one_gpu_out (written only when the report has a rule or
// derived types or a leave-one-GPU-out result, so report.MappingRuleForm()
// renders the shipped default file exactly as before the derived rule).
std::string CalibrationReportToJson(const CalibrationReport& report);

// The model, GPUs and shape of the doc's old-vs-derived per-layer examples.
inline constexpr absl::string_view kUnmeasuredExampleModel = "llama3-8b";
inline constexpr int kUnmeasuredExampleMbs = 1;
inline constexpr int kUnmeasuredExampleSeq = 4096;
const std::vector<std::string>& UnmeasuredExampleGpus();
// Synthesized fwd+bwd of one dense kUnmeasuredExampleModel layer (tp 1) on
// each of UnmeasuredExampleGpus() under report.MappingRuleForm().ToSet()
// and under report.ToSet(): what `arachne profile show` prints on the two
// profile sets. The model comes from the catalog of `profiles_dir`.
absl::StatusOr<UnmeasuredGpuExamples> ComputeUnmeasuredGpuExamples(
    const CalibrationReport& report, const GpuCatalog& catalog,
    const std::string& profiles_dir = "");

// `arachne profile calibrate`: reads the Cephalo CSV at `csv_path`,
// calibrates against `catalog` and, for each non-empty path, writes the
// shipped default JSON (profiles/calibration.json: the derived rule, the
// report as is), the markdown report (docs/calibration.md, with
// ComputeUnmeasuredGpuExamples) and the old mapping rule's JSON for
// comparison (profiles/reference/calibration-mapping.json,
// report.MappingRuleForm()). Returns the report.
absl::StatusOr<CalibrationReport> CalibrateFiles(
    const std::string& csv_path, const GpuCatalog& catalog,
    const std::string& json_out, const std::string& markdown_out,
    const std::string& mapping_json_out = "");

}  // namespace arachne

#endif  // ARACHNE_PLANNER_SERVICE_IO_PROFILE_IO_H_
