// Calibration of the profile synthesizer against published per-layer
// measurements (profiles/reference/cephalo/layer-latency.csv): parsing,
// per-GPU least-squares fit of CalibrationParams, error report, and the
// rule that gives GPU types without measurements their parameters from
// their published matmul throughput (checked leave-one-GPU-out).
// docs/calibration.md describes the method and shows the shipped result.
#ifndef ARACHNE_PLANNER_SERVICE_CORE_CALIBRATION_SYNTHESIZER_FIT_H_
#define ARACHNE_PLANNER_SERVICE_CORE_CALIBRATION_SYNTHESIZER_FIT_H_

#include <cstdint>
#include <map>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "absl/types/span.h"
#include "planner_service/core/model/gpu_catalog.h"
#include "planner_service/core/cost/profile_synthesizer.h"

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

// The OLD (mapping) rule for GPU types without measurements: the shipped
// default (profiles/calibration.json's `mapping`, see
// CalibrationReport::MappingRuleForm), the leave-one-GPU-out baseline and
// the fallback of a calibration.json that carries no unmeasured_rule: copy
// the efficiencies of a measured type (fractions of each type's own
// peak/bandwidth, so nothing is scaled). Explicit ids first; other catalog
// types by rule (see MapUnmeasuredGpu).
const std::map<std::string, std::string>& DefaultGpuMapping();
// The measured id `gpu` takes parameters from under the old rule: the
// explicit table, else product-name rules (V100/T4/Titan V -> V100-16GB;
// P100/P40/P4 -> P100; HBM >= 1500 GB/s data-centre parts -> A100-80GB; the
// rest (workstation and inference cards) -> A6000).
std::string MapUnmeasuredGpu(const GpuType& gpu);

// Published figures of one GPU type that no layer measurement gives:
// measured dense matmul throughput and the board power limit. 0 = unknown.
struct GpuThroughput {
  // Sustained dense 16-bit matmul (bf16 where the part has it, else fp16:
  // the precision training runs in), TFLOPS.
  double matmul_tflops = 0;
  double matmul_fp32_tflops = 0;  // plain FP32 (no TF32) matmul, TFLOPS
  double tdp_w = 0;               // board power limit, W
  std::string source;             // where the figures come from
};
// The figures read for catalog ids (sources in synthesizer_fit.cc and
// docs/calibration.md). Ids absent here have none.
const std::map<std::string, GpuThroughput>& PublishedGpuThroughput();
// PublishedGpuThroughput() entry of gpu.id, or all zero.
GpuThroughput ThroughputOf(const GpuType& gpu);
// Parts at or under this board power form the low-power class whose
// matmul fraction is used for a low-power part without a measurement.
inline constexpr double kLowPowerTdpW = 75;

// One fitted type the rule for unmeasured types is derived from.
struct CalibrationDonor {
  GpuType gpu;
  CalibrationParams params;
  GpuThroughput throughput;
  bool fp32_fitted = false;  // had FP32 rows (fp32_gemm_eff_max was fitted)
  bool attn_fitted = false;  // had fused-attention rows (attn_eff_rel fitted)
};

// The derived rule for a GPU type without layer measurements, the shipped
// default (profiles/calibration.json; docs/calibration.md). The GEMM
// efficiency follows the type's own published matmul throughput:
//   gemm_eff_max = gemm_eff_per_matmul * matmul_tflops / peak_bf16_tflops
// (gemm_eff_per_matmul = how much of a square-matmul benchmark the measured
// layers' GEMMs reach, median over the fitted types), so a power-limited
// part whose clock drops under dense GEMMs (T4, L4) gets the lower
// efficiency its benchmark shows. Without a measurement the matmul fraction
// is the median of the catalog parts that have one, in the part's power
// class (tdp_w <= kLowPowerTdpW or not). FP32 likewise. The small-GEMM
// half-point is carried as a time (gemm_half_us at the part's effective
// throughput); the remaining efficiencies are medians of the fitted types.
// Calibrate then fits all constants but fp32_eff_per_matmul jointly to the
// fitted types' rows (docs/calibration.md, "GPUs without measurements").
struct UnmeasuredGpuRule {
  double gemm_eff_per_matmul = 0;
  double fp32_eff_per_matmul = 0;
  double matmul_fraction = 0;            // fallback, parts above the class
  double matmul_fraction_low_power = 0;  // fallback, tdp_w <= kLowPowerTdpW
  double fp32_matmul_fraction = 0;       // fallback
  double gemm_half_us = 0;
  double attn_eff_rel = 0;
  double mem_eff = 0;
  double bwd_eff_rel = 0;
  double layer_overhead_us = 0;
  std::vector<std::string> donors;  // fitted ids it was derived from

  friend bool operator==(const UnmeasuredGpuRule&,
                         const UnmeasuredGpuRule&) = default;
};
// The numeric fields by name (calibration.json unmeasured_rule).
const std::vector<std::pair<const char*, double UnmeasuredGpuRule::*>>&
UnmeasuredGpuRuleFields();

// Derives the rule (the medians) from fitted types; `reference` are the types whose
// published matmul fractions give the fallback fractions (the catalog).
// FailedPrecondition when no donor is given or none has a published 16-bit
// matmul figure; InvalidArgument naming the type and field for a negative
// figure or one above 1.5x the datasheet peak.
absl::StatusOr<UnmeasuredGpuRule> DeriveUnmeasuredGpuRule(
    absl::Span<const CalibrationDonor> donors,
    absl::Span<const GpuType> reference);
// Parameters of `gpu` under the rule; the fields the fit leaves alone come
// from `base`.
CalibrationParams ApplyUnmeasuredGpuRule(const UnmeasuredGpuRule& rule,
                                         const GpuType& gpu,
                                         const GpuThroughput& throughput,
                                         const CalibrationParams& base);

// Per-GPU-id calibration, as shipped in profiles/calibration.json.
struct CalibrationSet {
  CalibrationParams defaults;
  // Fitted, derived and mapped ids, already resolved to parameters.
  std::map<std::string, CalibrationParams> by_gpu;
  // Explicit overrides: unfitted id -> fitted id it copies (wins over the
  // derived parameters).
  std::map<std::string, std::string> mapping;
  // Ids fitted from measurements.
  std::vector<std::string> fitted;
  // Ids whose parameters the unmeasured-GPU rule derived.
  std::vector<std::string> derived;
  // The rule, for types outside the file (absent in old files).
  std::optional<UnmeasuredGpuRule> rule;

  // Parameters for a catalog id: by_gpu, else defaults.
  const CalibrationParams& For(absl::string_view gpu_id) const;
  // As above; a type absent from by_gpu gets the rule applied to it (old
  // files without a rule: MapUnmeasuredGpu).
  CalibrationParams For(const GpuType& gpu) const;
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

// Leave-one-GPU-out: one fitted type's rows predicted from the others.
// Errors are |pred/meas - 1| of fwd+bwd over its rows, percent.
struct LogoResult {
  std::string gpu_id;
  int rows = 0;
  std::string old_source;  // fitted id the old rule copies, or "defaults"
  double old_median = 0, old_mean = 0;
  double new_median = 0, new_mean = 0;
  // Best single copy in hindsight (the donor with the lowest mean): the
  // best any copy-a-neighbour rule could do.
  std::string best_source;
  double best_median = 0, best_mean = 0;
  CalibrationParams new_params;
};

// A catalog type without measurements and what the rule gives it.
struct DerivedGpu {
  std::string gpu_id;
  CalibrationParams params;
  GpuThroughput throughput;
  double matmul_fraction = 0;  // the one used (measured or class fallback)
  std::string basis;           // "measured", "fallback" or "fallback, low-power"
  std::string old_source;      // what the old rule copied
};

struct CalibrationReport {
  std::vector<GpuFit> gpus;  // sorted by id
  ErrorStats overall, overall_fp16_llama, overall_heldout;
  CalibrationParams defaults;
  std::map<std::string, std::string> mapping;  // explicit overrides
  std::vector<DerivedGpu> derived;             // every other catalog id
  std::optional<UnmeasuredGpuRule> rule;       // from all fitted types
  std::vector<LogoResult> logo;                // per fitted type, by id
  LogoResult logo_all;                         // pooled over their rows
  std::vector<std::string> notes;              // skipped rows etc.
  // The old mapping rule, kept beside the derived one: every unfitted
  // catalog id -> the fitted id it copies (MapUnmeasuredGpu, overrides
  // first), and that form's notes (skipped rows, targets without
  // measurements). MappingRuleForm() builds the report from them.
  std::map<std::string, std::string> old_mapping;
  std::vector<std::string> old_notes;

  // The parameters this report gives planning: fitted + derived + mapped.
  CalibrationSet ToSet() const;
  // The same fit with the OLD mapping rule for unmeasured types: no rule,
  // no derived types, no leave-one-GPU-out; mapping = old_mapping. Kept for
  // comparison as profiles/reference/calibration-mapping.json; the shipped
  // default profiles/calibration.json is this report as is (the derived
  // rule), which the shipped learned policies were trained on.
  CalibrationReport MappingRuleForm() const;
};

// Fits CalibrationParams per catalog GPU id by Nelder-Mead on the mean
// squared relative error of fwd and bwd, deterministically (fixed start,
// fixed restarts). Series whose FNV-1a hash of SeriesKey() is 0 mod 5 are
// held out for the held-out error (params fitted on the other series); the
// shipped params are then fitted on all rows. Rows whose GPU is not in
// `catalog` are skipped (noted). FailedPrecondition when nothing remains.
// Every other catalog type gets the unmeasured-GPU rule derived from all
// fitted types, unless `overrides` (unfitted id -> fitted id) names it;
// an override naming an unknown or unfitted id is InvalidArgument. With
// two or more fitted types the leave-one-GPU-out check is run.
absl::StatusOr<CalibrationReport> Calibrate(
    absl::Span<const MeasuredLayer> rows, const GpuCatalog& catalog,
    const std::map<std::string, std::string>& overrides = {});

// Predicted fwd/bwd of one measured row with `p` against `gpu` (the model
// of the Cephalo layer: unfused Hugging Face kernels, eager attention for
// gpt/bert/mistral). Exposed for tests.
LayerTime PredictMeasuredLayer(const MeasuredLayer& row, const GpuType& gpu,
                               const CalibrationParams& p);

// True when the series is held out (FNV-1a 64 of SeriesKey() % 5 == 0).
bool IsHeldOutSeries(absl::string_view series_key);

// One layer on one unmeasured GPU type under each rule, for the doc: the
// same synthesized fwd+bwd with the old mapping's parameters and with the
// derived ones.
struct UnmeasuredGpuExample {
  std::string gpu_id;
  std::string mapping_source;  // fitted id the old mapping copies
  double mapping_ms = 0;       // fwd+bwd under the old mapping rule
  double derived_ms = 0;       // fwd+bwd under the derived rule (default)
};
// What the examples price, e.g. "llama3-8b dense layer, tp 1, mbs 1, seq 4096".
struct UnmeasuredGpuExamples {
  std::string what;
  std::vector<UnmeasuredGpuExample> rows;
};

// docs/calibration.md: method, per-GPU error table, parameters, the shipped
// default (old mapping) and the opt-in derived rule with its
// leave-one-GPU-out check, the reproduction command, and `examples` when
// given. `report` is the derived form (Calibrate's result).
std::string RenderCalibrationMarkdown(
    const CalibrationReport& report,
    const UnmeasuredGpuExamples& examples = {});

}  // namespace arachne

#endif  // ARACHNE_PLANNER_SERVICE_CORE_CALIBRATION_SYNTHESIZER_FIT_H_
