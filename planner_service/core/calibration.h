// Calibration of the profile synthesizer against published per-layer
// measurements (profiles/reference/cephalo/layer-latency.csv): parsing,
// per-GPU least-squares fit of CalibrationParams, error report, and the
// mapping of GPU types without measurements to a measured one.
// docs/calibration.md describes the method and shows the shipped result.
#ifndef ARACHNE_PLANNER_SERVICE_CORE_CALIBRATION_H_
#define ARACHNE_PLANNER_SERVICE_CORE_CALIBRATION_H_

#include <cstdint>
#include <map>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "absl/types/span.h"
#include "planner_service/core/gpu_catalog.h"
#include "planner_service/core/profile_synthesizer.h"

namespace arachne {

// One row of the Cephalo CSV: one transformer layer on one GPU.
struct MeasuredLayer {
  int line = 0;         // 1-based line in the CSV
  std::string model;    // e.g. "deepspeedllama_7b"
  std::string family;   // gpt | llama | mistral | bert
  int hidden = 0, heads = 0, kv_heads = 0, ffn = 0;
  bool swiglu = false;  // mlp_type swiglu_3mat (else gelu_2mat)
  int seq = 0;
  bool fp32 = false;    // dtype float32 (else float16)
  std::string gpu;      // Cephalo key, e.g. "a100x40"
  int batch = 0;
  double fwd_ms = 0, bwd_ms = 0;
  std::string note;     // source_note

  // "model|gpu|seq|dtype": the measured series the row belongs to.
  std::string SeriesKey() const;
};

// Parses the CSV (header as in the shipped file; columns located by name,
// extra columns ignored; quoted fields allowed). Errors are InvalidArgument
// "line L, column C (name): ..." naming the bad value.
absl::StatusOr<std::vector<MeasuredLayer>> ParseMeasuredLayerCsv(
    absl::string_view csv_text);

// Catalog id of a Cephalo GPU key (a100x40 -> A100-40GB, a100x80 ->
// A100-80GB, a6000 -> A6000, v100x16 / v100-pciex16 -> V100-16GB, p100 ->
// P100); NotFound for other keys.
absl::StatusOr<std::string> CephaloGpuToCatalogId(absl::string_view key);

// Named mapping of GPU types without measurements to the measured type whose
// efficiencies they take (efficiencies are fractions of each type's own
// peak/bandwidth, so nothing is scaled). Explicit ids first; other catalog
// types by rule (see MapUnmeasuredGpu).
const std::map<std::string, std::string>& DefaultGpuMapping();
// The measured id `gpu` takes parameters from: the explicit table, else
// product-name rules (V100/T4/Titan V -> V100-16GB; P100/P40/P4 -> P100;
// HBM >= 1500 GB/s data-centre parts -> A100-80GB; the rest (workstation
// and inference cards) -> A6000).
std::string MapUnmeasuredGpu(const GpuType& gpu);

// Per-GPU-id calibration, as shipped in profiles/calibration.json.
struct CalibrationSet {
  CalibrationParams defaults;
  // Fitted ids and mapped ids, already resolved to parameters.
  std::map<std::string, CalibrationParams> by_gpu;
  // Unfitted id -> fitted id it takes parameters from.
  std::map<std::string, std::string> mapping;
  // Ids fitted from measurements.
  std::vector<std::string> fitted;

  // Parameters for a catalog id: by_gpu, else defaults.
  const CalibrationParams& For(absl::string_view gpu_id) const;
  // As above, but a type absent from by_gpu is mapped by MapUnmeasuredGpu.
  const CalibrationParams& For(const GpuType& gpu) const;
};

struct ErrorStats {
  int rows = 0;
  double mape_fwd = 0;    // mean |pred/meas - 1| of fwd, percent
  double mape_bwd = 0;
  double mape_total = 0;  // of fwd + bwd
  double max_ape = 0;     // largest |error| of fwd, bwd or total, percent
};

struct GpuFit {
  std::string gpu_id;                    // catalog id
  std::vector<std::string> source_gpus;  // Cephalo keys
  CalibrationParams params;              // fit on all rows (shipped)
  double peak_bf16_tflops = 0, peak_fp32_tflops = 0, hbm_gbps = 0;
  ErrorStats all;         // all rows, shipped params
  ErrorStats fp16;        // float16 rows
  ErrorStats fp16_llama;  // float16 llama rows
  ErrorStats fp32;        // float32 rows
  ErrorStats heldout;     // held-out series, params fit on the rest
  ErrorStats train;       // training series, params fit on them
  int series = 0, heldout_series = 0;
};

struct CalibrationReport {
  std::vector<GpuFit> gpus;  // sorted by id
  ErrorStats overall, overall_fp16_llama, overall_heldout;
  CalibrationParams defaults;
  std::map<std::string, std::string> mapping;  // every other catalog id
  std::vector<std::string> notes;              // skipped rows etc.

  // The shipped form: fitted + mapped parameters.
  CalibrationSet ToSet() const;
};

// Fits CalibrationParams per catalog GPU id by Nelder-Mead on the mean
// squared relative error of fwd and bwd, deterministically (fixed start,
// fixed restarts). Series whose FNV-1a hash of SeriesKey() is 0 mod 5 are
// held out for the held-out error (params fitted on the other series); the
// shipped params are then fitted on all rows. Rows whose GPU is not in
// `catalog` are skipped (noted). FailedPrecondition when nothing remains.
absl::StatusOr<CalibrationReport> Calibrate(absl::Span<const MeasuredLayer> rows,
                                            const GpuCatalog& catalog);

// Predicted fwd/bwd of one measured row with `p` against `gpu` (the model
// of the Cephalo layer: unfused Hugging Face kernels, eager attention for
// gpt/bert/mistral). Exposed for tests.
LayerTime PredictMeasuredLayer(const MeasuredLayer& row, const GpuType& gpu,
                               const CalibrationParams& p);

// True when the series is held out (FNV-1a 64 of SeriesKey() % 5 == 0).
bool IsHeldOutSeries(absl::string_view series_key);

// docs/calibration.md: method, per-GPU error table, mapping, parameters and
// the reproduction command.
std::string RenderCalibrationMarkdown(const CalibrationReport& report);

}  // namespace arachne

#endif  // ARACHNE_PLANNER_SERVICE_CORE_CALIBRATION_H_
