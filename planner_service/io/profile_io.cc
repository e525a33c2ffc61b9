#include "planner_service/io/profile_io.h"

#include <algorithm>
#include <charconv>
#include <cmath>
#include <fstream>
#include <map>
#include <utility>

#include "absl/status/status.h"
#include "absl/strings/ascii.h"
#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"
#include "absl/strings/strip.h"
#include "nlohmann/json.hpp"
#include "planner_service/core/cost/csv.h"
#include "planner_service/core/cost/profile_synthesizer.h"
#include "planner_service/io/data_files.h"
#include "planner_service/io/model_io.h"

namespace arachne {
namespace {

using json = nlohmann::json;

constexpr const char* kColumns[] = {
    "model", "layer_kind", "gpu",        "tp",        "mbs",
    "seq",   "fwd_ms",     "bwd_ms",     "tp_comm_ms", "activation_bytes",
    "param_count", "source"};
constexpr int kNumColumns = 12;


std::string Num(double v) {
  char buf[64];
  auto r = std::to_chars(buf, buf + sizeof(buf), v);
  return std::string(buf, r.ptr);
}

}  // namespace

absl::StatusOr<std::vector<ProfileEntry>> ParseProfileCsv(
    absl::string_view text, absl::string_view source) {
  std::vector<ProfileEntry> out;
  std::vector<absl::string_view> lines = absl::StrSplit(text, '\n');
  bool header_seen = false;
  for (size_t li = 0; li < lines.size(); ++li) {
    const int line_no = static_cast<int>(li) + 1;
    absl::string_view line =
        absl::StripAsciiWhitespace(absl::StripSuffix(lines[li], "\r"));
    if (line.empty() || absl::StartsWith(line, "#")) continue;
    const std::vector<std::string> f = SplitCsvLine(line);
    if (!header_seen) {
      header_seen = true;
      for (int c = 0; c < kNumColumns; ++c) {
        if (c >= static_cast<int>(f.size()) || f[c] != kColumns[c])
          return absl::InvalidArgumentError(absl::StrCat(
              source, ": line ", line_no, ", column ", c + 1,
              ": header must be \"", kProfileCsvHeader, "\", got \"",
              c < static_cast<int>(f.size()) ? f[c] : "", "\""));
      }
      if (f.size() != kNumColumns)
        return absl::InvalidArgumentError(absl::StrCat(
            source, ": line ", line_no, ", column ", kNumColumns + 1,
            ": unexpected extra header column \"", f[kNumColumns], "\""));
      continue;
    }
    if (f.size() != kNumColumns)
      return absl::InvalidArgumentError(
          absl::StrCat(source, ": line ", line_no, ": expected ", kNumColumns,
                       " columns, got ", f.size()));
    auto err = [&](int c, absl::string_view what) {
      return absl::InvalidArgumentError(
          absl::StrCat(source, ": line ", line_no, ", column ", c + 1, " (",
                       kColumns[c], "): ", what, ", got \"", f[c], "\""));
    };
    ProfileEntry e;
    e.key.model = f[0];
    if (e.key.model.empty()) return err(0, "must not be empty");
    absl::StatusOr<LayerKind> kind = ParseLayerKind(f[1]);
    if (!kind.ok())
      return err(1, "expected dense, moe_attention, moe_experts, embedding or lm_head");
    e.key.kind = *kind;
    e.key.gpu = f[2];
    if (e.key.gpu.empty()) return err(2, "must not be empty");
    int* ints[] = {&e.key.tp, &e.key.mbs, &e.key.seq};
    for (int c = 3; c <= 5; ++c) {
      if (!absl::SimpleAtoi(f[c], ints[c - 3]) || *ints[c - 3] <= 0)
        return err(c, "expected an integer > 0");
    }
    double* dbl[] = {&e.fwd_ms, &e.bwd_ms, &e.tp_comm_ms};
    for (int c = 6; c <= 8; ++c) {
      if (!absl::SimpleAtod(f[c], dbl[c - 6]) || !std::isfinite(*dbl[c - 6]) ||
          *dbl[c - 6] < 0)
        return err(c, "expected a finite number >= 0");
    }
    if (e.fwd_ms <= 0) return err(6, "expected a number > 0");
    if (e.key.tp == 1 && e.tp_comm_ms != 0)
      return err(8, "must be 0 at tp 1");
    int64_t* i64[] = {&e.activation_bytes, &e.param_count};
    for (int c = 9; c <= 10; ++c) {
      if (!absl::SimpleAtoi(f[c], i64[c - 9]) || *i64[c - 9] < 0)
        return err(c, "expected an integer >= 0");
    }
    absl::StatusOr<ProfileSource> src = ParseProfileSource(f[11]);
    if (!src.ok()) return err(11, "expected measured or synthesized");
    e.source = *src;
    out.push_back(std::move(e));
  }
  if (!header_seen)
    return absl::InvalidArgumentError(
        absl::StrCat(source, ": line 1: missing header \"", kProfileCsvHeader,
                     "\""));
  return out;
}

std::string SerializeProfileCsv(absl::Span<const ProfileEntry> entries) {
  std::string s = absl::StrCat(kProfileCsvHeader, "\n");
  for (const ProfileEntry& e : entries) {
    absl::StrAppend(&s, e.key.model, ",", LayerKindName(e.key.kind), ",",
                    e.key.gpu, ",", e.key.tp, ",", e.key.mbs, ",", e.key.seq,
                    ",", Num(e.fwd_ms), ",", Num(e.bwd_ms), ",",
                    Num(e.tp_comm_ms), ",", e.activation_bytes, ",",
                    e.param_count, ",", ProfileSourceName(e.source), "\n");
  }
  return s;
}

absl::Status LoadProfileFiles(const std::string& profiles_dir,
                              const GpuCatalog& catalog, ProfileStore* store) {
  // Key -> "file:line" of its first definition, for duplicate errors.
  std::map<std::string, std::string> seen;
  for (const std::string& rel : ListDataFiles("measured/", profiles_dir)) {
    if (!absl::EndsWith(rel, ".csv")) continue;
    absl::StatusOr<std::string> text = ReadDataFile(rel, profiles_dir);
    if (!text.ok()) return text.status();
    absl::StatusOr<std::vector<ProfileEntry>> entries =
        ParseProfileCsv(*text, rel);
    if (!entries.ok()) return entries.status();
    // Line numbers: data rows in file order (re-derived for messages).
    std::vector<int> row_lines;
    {
      std::vector<absl::string_view> lines = absl::StrSplit(*text, '\n');
      bool header = false;
      for (size_t i = 0; i < lines.size(); ++i) {
        absl::string_view l = absl::StripAsciiWhitespace(lines[i]);
        if (l.empty() || absl::StartsWith(l, "#")) continue;
        if (!header) {
          header = true;
          continue;
        }
        row_lines.push_back(static_cast<int>(i) + 1);
      }
    }
    for (size_t i = 0; i < entries->size(); ++i) {
      ProfileEntry e = (*entries)[i];
      const std::string where = absl::StrCat(rel, ": line ", row_lines[i]);
      absl::StatusOr<int> idx = catalog.IndexOf(e.key.gpu);
      if (!idx.ok())
        return absl::InvalidArgumentError(absl::StrCat(
            where, ", column 3 (gpu): unknown GPU \"", e.key.gpu, "\": ",
            idx.status().message()));
      e.key.gpu = catalog.type(*idx).id;
      const std::string key = absl::StrCat(
          e.key.model, "|", LayerKindName(e.key.kind), "|", e.key.gpu, "|",
          e.key.tp, "|", e.key.mbs, "|", e.key.seq);
      auto [it, inserted] = seen.emplace(key, where);
      if (!inserted || store->Find(e.key) != nullptr)
        return absl::InvalidArgumentError(absl::StrCat(
            where, ": duplicate profile ", key,
            inserted ? " (already in the store)"
                     : absl::StrCat(" (first at ", it->second, ")")));
      if (absl::Status s = store->Add(std::move(e)); !s.ok())
        return absl::InvalidArgumentError(
            absl::StrCat(where, ": ", s.message()));
    }
  }
  return absl::OkStatus();
}

namespace {

struct Field {
  const char* name;
  double CalibrationParams::*member;
};
constexpr Field kParamFields[] = {
    {"gemm_eff_max", &CalibrationParams::gemm_eff_max},
    {"gemm_half_gflop", &CalibrationParams::gemm_half_gflop},
    {"fp32_gemm_eff_max", &CalibrationParams::fp32_gemm_eff_max},
    {"attn_eff_rel", &CalibrationParams::attn_eff_rel},
    {"mem_eff", &CalibrationParams::mem_eff},
    {"bwd_eff_rel", &CalibrationParams::bwd_eff_rel},
    {"layer_overhead_us", &CalibrationParams::layer_overhead_us},
    {"tp_loss_per_degree", &CalibrationParams::tp_loss_per_degree},
    {"bwd_elementwise_ratio", &CalibrationParams::bwd_elementwise_ratio},
    {"grad_accum_bytes_per_param",
     &CalibrationParams::grad_accum_bytes_per_param},
    {"comm_bw_eff", &CalibrationParams::comm_bw_eff},
    {"collective_base_us", &CalibrationParams::collective_base_us},
    {"nvlink_step_us", &CalibrationParams::nvlink_step_us},
    {"pcie_step_us", &CalibrationParams::pcie_step_us},
};

json ParamsToJson(const CalibrationParams& p) {
  json j = json::object();
  for (const Field& f : kParamFields) j[f.name] = p.*(f.member);
  return j;
}

// Fields absent from `j` keep `base`'s values; unknown fields are errors.
absl::StatusOr<CalibrationParams> ParamsFromJson(const json& j,
                                                 const CalibrationParams& base,
                                                 absl::string_view where) {
  if (!j.is_object())
    return absl::InvalidArgumentError(
        absl::StrCat(where, ": must be an object"));
  CalibrationParams p = base;
  for (auto it = j.begin(); it != j.end(); ++it) {
    const Field* field = nullptr;
    for (const Field& f : kParamFields)
      if (it.key() == f.name) field = &f;
    if (field == nullptr)
      return absl::InvalidArgumentError(
          absl::StrCat(where, ".", it.key(), ": unknown parameter"));
    if (!it.value().is_number() || !(it.value().get<double>() >= 0))
      return absl::InvalidArgumentError(
          absl::StrCat(where, ".", it.key(), ": must be a number >= 0, got ",
                       it.value().dump()));
    p.*(field->member) = it.value().get<double>();
  }
  return p;
}

json StatsToJson(const ErrorStats& s) {
  return json{{"rows", s.rows},
              {"mape_fwd_pct", s.mape_fwd},
              {"mape_bwd_pct", s.mape_bwd},
              {"mape_total_pct", s.mape_total},
              {"max_ape_pct", s.max_ape}};
}

}  // namespace

std::string CalibrationReportToJson(const CalibrationReport& r) {
  json j;
  j["format"] = "arachne-calibration-v1";
  j["source"] = "profiles/reference/cephalo/layer-latency.csv";
  j["method"] =
      "per-GPU Nelder-Mead least squares on relative fwd/bwd error; see "
      "docs/calibration.md";
  j["defaults"] = ParamsToJson(r.defaults);
  json fitted = json::object();
  for (const GpuFit& g : r.gpus) {
    json gj;
    gj["params"] = ParamsToJson(g.params);
    gj["cephalo_gpus"] = g.source_gpus;
    gj["fit_specs"] = {{"peak_bf16_tflops", g.peak_bf16_tflops},
                       {"peak_fp32_tflops", g.peak_fp32_tflops},
                       {"hbm_gbps", g.hbm_gbps}};
    gj["series"] = g.series;
    gj["heldout_series"] = g.heldout_series;
    gj["errors"] = {{"all", StatsToJson(g.all)},
                    {"fp16", StatsToJson(g.fp16)},
                    {"fp16_llama", StatsToJson(g.fp16_llama)},
                    {"fp32", StatsToJson(g.fp32)},
                    {"heldout", StatsToJson(g.heldout)},
                    {"train", StatsToJson(g.train)}};
    fitted[g.gpu_id] = gj;
  }
  j["fitted"] = fitted;
  // Unmeasured types: the rule, what it gives each catalog type, and its
  // leave-one-GPU-out check (docs/calibration.md).
  if (r.rule.has_value()) {
    json rule = json::object();
    for (const auto& [name, member] : UnmeasuredGpuRuleFields())
      rule[name] = (*r.rule).*member;
    rule["donors"] = r.rule->donors;
    j["unmeasured_rule"] = rule;
  }
  // The mapping-rule form (the shipped default) has none of the three and
  // is written as before the rule existed.
  const bool derived_form =
      r.rule.has_value() || !r.derived.empty() || !r.logo.empty();
  json derived = json::object();
  for (const DerivedGpu& d : r.derived)
    derived[d.gpu_id] = {{"params", ParamsToJson(d.params)},
                         {"basis", d.basis},
                         {"matmul_fraction", d.matmul_fraction},
                         {"old_rule_copied", d.old_source}};
  if (derived_form) j["derived"] = derived;
  json logo = json::array();
  for (const LogoResult& l : r.logo)
    logo.push_back({{"gpu", l.gpu_id},
                    {"rows", l.rows},
                    {"old_source", l.old_source},
                    {"old_median_pct", l.old_median},
                    {"old_mean_pct", l.old_mean},
                    {"new_median_pct", l.new_median},
                    {"new_mean_pct", l.new_mean},
                    {"best_source", l.best_source},
                    {"best_median_pct", l.best_median},
                    {"best_mean_pct", l.best_mean}});
  if (derived_form) j["leave_one_gpu_out"] = logo;
  json mapping = json::object();
  for (const auto& [id, target] : r.mapping) mapping[id] = target;
  j["mapping"] = mapping;
  j["errors"] = {{"all", StatsToJson(r.overall)},
                 {"fp16_llama", StatsToJson(r.overall_fp16_llama)},
                 {"heldout", StatsToJson(r.overall_heldout)}};
  j["notes"] = r.notes;
  return j.dump(2) + "\n";
}

absl::StatusOr<CalibrationSet> ParseCalibrationJson(absl::string_view text,
                                                    absl::string_view source) {
  json j = json::parse(text.begin(), text.end(), nullptr,
                       /*allow_exceptions=*/false);
  if (j.is_discarded())
    return absl::InvalidArgumentError(
        absl::StrCat(source, ": not valid JSON"));
  if (!j.is_object() || !j.contains("fitted") || !j["fitted"].is_object())
    return absl::InvalidArgumentError(
        absl::StrCat(source, ": fitted: missing or not an object"));
  CalibrationSet set;
  if (j.contains("defaults")) {
    absl::StatusOr<CalibrationParams> d = ParamsFromJson(
        j["defaults"], CalibrationParams{}, absl::StrCat(source, ": defaults"));
    if (!d.ok()) return d.status();
    set.defaults = *d;
  }
  // "fitted" and "derived" map GPU ids to {"params": {...}}: both resolve
  // into by_gpu, and the ids are listed under their origin.
  auto read_params_section = [&](const char* section,
                                 std::vector<std::string>* ids) {
    for (auto it = j[section].begin(); it != j[section].end(); ++it) {
      const std::string where =
          absl::StrCat(source, ": ", section, ".", it.key());
      if (!it.value().is_object() || !it.value().contains("params"))
        return absl::InvalidArgumentError(
            absl::StrCat(where, ".params: missing"));
      absl::StatusOr<CalibrationParams> p = ParamsFromJson(
          it.value()["params"], set.defaults, absl::StrCat(where, ".params"));
      if (!p.ok()) return p.status();
      set.by_gpu[it.key()] = *p;
      ids->push_back(it.key());
    }
    return absl::OkStatus();
  };
  if (absl::Status s = read_params_section("fitted", &set.fitted); !s.ok())
    return s;
  if (j.contains("derived")) {
    if (!j["derived"].is_object())
      return absl::InvalidArgumentError(
          absl::StrCat(source, ": derived: must be an object"));
    if (absl::Status s = read_params_section("derived", &set.derived); !s.ok())
      return s;
  }
  if (j.contains("unmeasured_rule")) {
    const json& rj = j["unmeasured_rule"];
    if (!rj.is_object())
      return absl::InvalidArgumentError(
          absl::StrCat(source, ": unmeasured_rule: must be an object"));
    UnmeasuredGpuRule rule;
    for (const auto& [name, member] : UnmeasuredGpuRuleFields()) {
      if (!rj.contains(name) || !rj[name].is_number())
        return absl::InvalidArgumentError(absl::StrCat(
            source, ": unmeasured_rule.", name, ": must be a number"));
      rule.*member = rj[name].get<double>();
    }
    if (rj.contains("donors") && rj["donors"].is_array())
      for (const json& d : rj["donors"])
        if (d.is_string()) rule.donors.push_back(d.get<std::string>());
    set.rule = rule;
  }
  if (j.contains("mapping")) {
    if (!j["mapping"].is_object())
      return absl::InvalidArgumentError(
          absl::StrCat(source, ": mapping: must be an object"));
    for (auto it = j["mapping"].begin(); it != j["mapping"].end(); ++it) {
      if (!it.value().is_string())
        return absl::InvalidArgumentError(absl::StrCat(
            source, ": mapping.", it.key(), ": must be a GPU id string"));
      const std::string target = it.value().get<std::string>();
      auto t = set.by_gpu.find(target);
      if (t == set.by_gpu.end() ||
          std::find(set.fitted.begin(), set.fitted.end(), target) ==
              set.fitted.end())
        return absl::InvalidArgumentError(
            absl::StrCat(source, ": mapping.", it.key(), ": target \"", target,
                         "\" is not a fitted GPU"));
      set.mapping[it.key()] = target;
      set.by_gpu[it.key()] = t->second;
    }
  }
  return set;
}

absl::StatusOr<CalibrationSet> LoadCalibration(const std::string& profiles_dir) {
  absl::StatusOr<std::string> text =
      ReadDataFile("calibration.json", profiles_dir);
  if (!text.ok()) return text.status();
  return ParseCalibrationJson(*text, "calibration.json");
}

const std::vector<std::string>& UnmeasuredExampleGpus() {
  static const auto* kGpus = new std::vector<std::string>{
      "T4", "L4", "L40S", "H100-80GB", "B200", "MI300X"};
  return *kGpus;
}

absl::StatusOr<UnmeasuredGpuExamples> ComputeUnmeasuredGpuExamples(
    const CalibrationReport& report, const GpuCatalog& catalog,
    const std::string& profiles_dir) {
  absl::StatusOr<ModelSpec> model =
      ResolveModel(kUnmeasuredExampleModel, profiles_dir);
  if (!model.ok()) return model.status();
  const CalibrationReport mapping_form = report.MappingRuleForm();
  const CalibrationSet mapping = mapping_form.ToSet();
  const CalibrationSet derived = report.ToSet();
  UnmeasuredGpuExamples ex;
  ex.what = absl::StrCat(kUnmeasuredExampleModel, " dense layer (tp 1, mbs ",
                         kUnmeasuredExampleMbs, ", seq ",
                         kUnmeasuredExampleSeq, ")");
  for (const std::string& id : UnmeasuredExampleGpus()) {
    absl::StatusOr<int> idx = catalog.IndexOf(id);
    if (!idx.ok()) continue;  // a custom catalog without it
    const GpuType& gpu = catalog.type(*idx);
    auto time = [&](const CalibrationSet& set) -> absl::StatusOr<double> {
      absl::StatusOr<ProfileEntry> e =
          ProfileSynthesizer(set.For(gpu))
              .Synthesize(*model, LayerKind::kDense, gpu, /*tp=*/1,
                          kUnmeasuredExampleMbs, kUnmeasuredExampleSeq);
      if (!e.ok()) return e.status();
      return e->fwd_ms + e->bwd_ms;
    };
    UnmeasuredGpuExample row;
    row.gpu_id = gpu.id;
    auto src = mapping_form.mapping.find(gpu.id);
    row.mapping_source =
        src == mapping_form.mapping.end() ? "defaults" : src->second;
    absl::StatusOr<double> a = time(mapping), b = time(derived);
    if (!a.ok()) return a.status();
    if (!b.ok()) return b.status();
    row.mapping_ms = *a;
    row.derived_ms = *b;
    ex.rows.push_back(std::move(row));
  }
  return ex;
}

absl::StatusOr<CalibrationReport> CalibrateFiles(
    const std::string& csv_path, const GpuCatalog& catalog,
    const std::string& json_out, const std::string& markdown_out,
    const std::string& mapping_json_out) {
  absl::StatusOr<std::string> csv = ReadFileToString(csv_path);
  if (!csv.ok()) return csv.status();
  absl::StatusOr<std::vector<MeasuredLayer>> rows = ParseMeasuredLayerCsv(*csv);
  if (!rows.ok())
    return absl::Status(rows.status().code(),
                        absl::StrCat(csv_path, ": ", rows.status().message()));
  absl::StatusOr<CalibrationReport> report = Calibrate(*rows, catalog);
  if (!report.ok()) return report.status();
  auto write = [](const std::string& path,
                  const std::string& content) -> absl::Status {
    std::ofstream out(path, std::ios::binary | std::ios::trunc);
    out << content;
    out.close();
    if (!out)
      return absl::PermissionDeniedError(absl::StrCat("cannot write ", path));
    return absl::OkStatus();
  };
  if (!json_out.empty()) {
    if (absl::Status s = write(json_out, CalibrationReportToJson(*report));
        !s.ok())
      return s;
  }
  if (!mapping_json_out.empty()) {
    if (absl::Status s = write(mapping_json_out,
                               CalibrationReportToJson(report->MappingRuleForm()));
        !s.ok())
      return s;
  }
  if (!markdown_out.empty()) {
    absl::StatusOr<UnmeasuredGpuExamples> ex =
        ComputeUnmeasuredGpuExamples(*report, catalog);
    if (!ex.ok()) return ex.status();
    if (absl::Status s =
            write(markdown_out, RenderCalibrationMarkdown(*report, *ex));
        !s.ok())
      return s;
  }
  return report;
}

}  // namespace arachne
