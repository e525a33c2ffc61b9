#include "planner_service/io/run_corrections_io.h"

#include <cmath>
#include <cstdlib>
#include <map>
#include <string>
#include <utility>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "glog/logging.h"
#include "planner_service/core/model/framework.h"
#include "planner_service/io/data_files.h"
#include "planner_service/io/gpu_catalog_io.h"
#include "planner_service/io/json_yaml.h"
#include "planner_service/io/planning_context.h"

namespace arachne {
namespace {

using Json = nlohmann::json;
using ScaleMap = std::map<std::string, double>;
using MessageScales = google::protobuf::Map<std::string, double>;

// Where a per-GPU-type scale lives in the request message.
struct MessageScale {
  const MessageScales& (v1::Calibration::*get)() const;
  MessageScales* (v1::Calibration::*mutable_get)();
};

MessageScale MessageScaleOf(const CorrectionScaleKind& k) {
  if (k.name == kFitComputeScale) {
    return {&v1::Calibration::compute_scale,
            &v1::Calibration::mutable_compute_scale};
  }
  if (k.name == kFitAttentionScale) {
    return {&v1::Calibration::attention_scale,
            &v1::Calibration::mutable_attention_scale};
  }
  CHECK_EQ(k.name, kFitTpCommScale) << "a scale the message lacks";
  return {&v1::Calibration::tp_comm_scale,
          &v1::Calibration::mutable_tp_comm_scale};
}

// Six significant digits: far inside what the runs determine, and a file
// (and the framework summary of `arachne plan`) a person can read.
double SixDigits(double v) {
  return std::strtod(absl::StrFormat("%.6g", v).c_str(), nullptr);
}
}  // namespace

nlohmann::json RunCalibrationToJson(const RunCalibrationFile& file,
                                    bool exact) {
  auto Rounded = [exact](double v) { return exact ? v : SixDigits(v); };
  Json j;
  j["format"] = std::string(kRunCalibrationFormat);
  // compute_scale always; the scales fitted only when named, when fitted.
  for (const CorrectionScaleKind& k : CorrectionScaleKinds()) {
    const ScaleMap& scales = file.corrections.*(k.corrections);
    if (k.only_when_named && scales.empty()) continue;
    Json out = Json::object();
    for (const auto& [gpu, s] : scales) out[gpu] = Rounded(s);
    j[std::string(k.name)] = out;
  }
  Json fw = Json::object();
  const RunCorrections& c = file.corrections;
  if (c.micro_batch_fixed_s) {
    fw[kFitMicroBatchFixed] = Rounded(*c.micro_batch_fixed_s * 1e3);
  }
  if (c.iteration_fixed_s) {
    fw[kFitIterationFixed] = Rounded(*c.iteration_fixed_s * 1e3);
  }
  if (c.context_reserve_gib) {
    fw[kFitContextReserve] = Rounded(*c.context_reserve_gib);
  }
  if (c.fragmentation) fw[kFitFragmentation] = Rounded(*c.fragmentation);
  j["framework"] = fw;
  j["fitted_on"] = file.fitted_on;
  j["cluster_note"] = file.cluster_note;
  return j;
}

absl::StatusOr<RunCorrections> CorrectionsFromMessage(
    const v1::Calibration& message, const GpuCatalog& catalog,
    absl::string_view path) {
  RunCorrections c;
  for (const CorrectionScaleKind& k : CorrectionScaleKinds()) {
    const auto& in = (message.*(MessageScaleOf(k).get))();
    // Sorted, so the first bad entry named is the same on every call.
    const ScaleMap sorted(in.begin(), in.end());
    for (const auto& [gpu, v] : sorted) {
      const std::string field = absl::StrCat(path, ".", k.name, ".", gpu);
      absl::StatusOr<int> type = catalog.IndexOf(gpu);
      if (!type.ok()) {
        return absl::InvalidArgumentError(
            absl::StrCat(field, ": ", type.status().message()));
      }
      if (!std::isfinite(v) || v < k.lo || v > k.hi) {
        return absl::InvalidArgumentError(absl::StrFormat(
            "%s: must be a factor in [%g, %g], got %g", field, k.lo, k.hi, v));
      }
      const std::string& id = catalog.type(*type).id;
      if (!(c.*(k.corrections)).emplace(id, v).second) {
        return absl::InvalidArgumentError(
            absl::StrCat(field, ": names GPU type ", id, " twice"));
      }
    }
  }
  return c;
}

v1::Calibration CorrectionsToMessage(const RunCorrections& c) {
  v1::Calibration m;
  for (const CorrectionScaleKind& k : CorrectionScaleKinds()) {
    for (const auto& [gpu, v] : c.*(k.corrections)) {
      (*(m.*(MessageScaleOf(k).mutable_get))())[gpu] = v;
    }
  }
  return m;
}

absl::StatusOr<RunCalibrationFile> RunCalibrationFromJson(
    const nlohmann::json& json, const GpuCatalog& catalog,
    absl::string_view source) {
  ARACHNE_IO_ASSIGN_OR_RETURN(ObjectReader top,
                              ObjectReader::Create(json, source, ""));
  ARACHNE_IO_RETURN_IF_ERROR(top.AllowOnly(
      {"format", "compute_scale", "attention_scale", "tp_comm_scale",
       "framework", "fitted_on", "cluster_note"}));
  ARACHNE_IO_ASSIGN_OR_RETURN(const std::string format, top.String("format"));
  if (format != kRunCalibrationFormat) {
    return top.Error(
        "format", absl::StrCat("must be \"", kRunCalibrationFormat, "\", got ",
                               QuoteForMessage(format)));
  }
  RunCalibrationFile file;
  // The scales: GPU id (or alias) -> factor > 0, each type once.
  for (const CorrectionScaleKind& k : CorrectionScaleKinds()) {
    if (!top.Has(k.name)) continue;
    ScaleMap* out = &(file.corrections.*(k.corrections));
    ARACHNE_IO_ASSIGN_OR_RETURN(ObjectReader s, top.Object(k.name));
    for (const auto& [key, value] : s.value().items()) {
      absl::StatusOr<int> type = catalog.IndexOf(key);
      if (!type.ok()) {
        return s.Error(key, AbbreviateQuoted(type.status().message(), key));
      }
      ARACHNE_IO_ASSIGN_OR_RETURN(const double v, s.Number(key, 0, true));
      const std::string& id = catalog.type(*type).id;
      if (!out->emplace(id, v).second) {
        return s.Error(key, absl::StrCat("names GPU type ", id, " twice"));
      }
    }
  }
  if (top.Has("framework")) {
    ARACHNE_IO_ASSIGN_OR_RETURN(ObjectReader f, top.Object("framework"));
    ARACHNE_IO_RETURN_IF_ERROR(
        f.AllowOnly({kFitMicroBatchFixed, kFitIterationFixed,
                     kFitContextReserve, kFitFragmentation}));
    for (absl::string_view name : {kFitMicroBatchFixed, kFitIterationFixed,
                                   kFitContextReserve, kFitFragmentation}) {
      if (!f.Has(name)) continue;
      ARACHNE_IO_ASSIGN_OR_RETURN(const double v, f.Number(name, 0, false));
      // The framework field's own range check, so the file and a
      // `framework:` override refuse the same values.
      FrameworkConfig scratch;
      if (absl::Status st =
              SetFrameworkField(scratch, name, absl::StrFormat("%.17g", v));
          !st.ok()) {
        return f.Error(name, st.message());
      }
      RunCorrections& c = file.corrections;
      if (name == kFitMicroBatchFixed) c.micro_batch_fixed_s = v * 1e-3;
      if (name == kFitIterationFixed) c.iteration_fixed_s = v * 1e-3;
      if (name == kFitContextReserve) c.context_reserve_gib = v;
      if (name == kFitFragmentation) c.fragmentation = v;
    }
  }
  ARACHNE_IO_ASSIGN_OR_RETURN(file.fitted_on, top.StringListOr("fitted_on"));
  ARACHNE_IO_ASSIGN_OR_RETURN(file.cluster_note,
                              top.StringOr("cluster_note", ""));
  return file;
}

absl::StatusOr<RunCalibrationFile> LoadRunCalibrationFile(
    const std::string& path, const GpuCatalog& catalog) {
  ARACHNE_IO_ASSIGN_OR_RETURN(std::string text, ReadFileToString(path));
  ARACHNE_IO_ASSIGN_OR_RETURN(Json json, ParseJsonOrYaml(text, path));
  return RunCalibrationFromJson(json, catalog, path);
}

RunPricingData ProfilesDirPricing(const std::string& profiles_dir) {
  RunPricingData pricing;
  pricing.catalog = [profiles_dir] { return LoadGpuCatalog(profiles_dir); };
  pricing.profiles = [profiles_dir](const GpuCatalog& catalog,
                                    const ModelSpec& model,
                                    const TrainingConfig& training,
                                    const Cluster& cluster,
                                    const CostParams& params) {
    return LoadPlanningProfiles(catalog, model, training, cluster,
                                profiles_dir, params);
  };
  return pricing;
}

}  // namespace arachne
