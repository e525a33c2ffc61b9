#include "planner_service/core/calibration/synthesizer_fit.h"

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdlib>
#include <set>
#include <string>
#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "absl/strings/strip.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "nlohmann/json.hpp"
#include "planner_service/io/data_files.h"
#include "planner_service/io/gpu_catalog_io.h"
#include "planner_service/io/profile_io.h"

namespace arachne {
namespace {

using ::testing::HasSubstr;

const std::string kSrc = ARACHNE_SOURCE_DIR;
const std::string kCsv = kSrc + "/profiles/reference/cephalo/layer-latency.csv";
const std::string kJson = kSrc + "/profiles/calibration.json";
const std::string kMappingJson =
    kSrc + "/profiles/reference/calibration-mapping.json";
const std::string kDoc = kSrc + "/docs/calibration.md";

std::string ReadRepoFile(const std::string& path) {
  auto s = ReadFileToString(path);
  EXPECT_TRUE(s.ok()) << s.status();
  return s.ok() ? *s : "";
}

std::vector<MeasuredLayer> ShippedRows() {
  auto rows = ParseMeasuredLayerCsv(ReadRepoFile(kCsv));
  EXPECT_TRUE(rows.ok()) << rows.status();
  return rows.ok() ? *rows : std::vector<MeasuredLayer>{};
}

TEST(ParseMeasuredLayerCsv, ReadsShippedFile) {
  std::vector<MeasuredLayer> rows = ShippedRows();
  ASSERT_EQ(rows.size(), 1276u);
  const MeasuredLayer& r = rows[0];
  EXPECT_EQ(r.line, 2);
  EXPECT_EQ(r.model, "deepspeedbert_base");
  EXPECT_EQ(r.family, "bert");
  EXPECT_EQ(r.hidden, 768);
  EXPECT_EQ(r.heads, 12);
  EXPECT_EQ(r.ffn, 3072);
  EXPECT_FALSE(r.swiglu);
  EXPECT_TRUE(r.fp32);
  EXPECT_EQ(r.gpu, "a6000");
  EXPECT_EQ(r.batch, 1);
  EXPECT_DOUBLE_EQ(r.fwd_ms, 0.7018666666666669);
  EXPECT_DOUBLE_EQ(r.bwd_ms, 1.4484000000000004);
  std::set<std::string> series;
  for (const MeasuredLayer& m : rows) series.insert(m.SeriesKey());
  EXPECT_EQ(series.size(), 91u);
}

constexpr char kHeader[] =
    "model,family,hidden,heads,kv_heads,ffn,mlp_type,vocab,seq_len,dtype,gpu,"
    "gpu_standard_name,batch_size,fwd_ms,bwd_ms,source_note\n";

TEST(ParseMeasuredLayerCsv, ErrorsNameLineAndColumn) {
  const std::string good =
      "m,llama,4096,32,32,11008,swiglu_3mat,49152,512,float16,a100x40,A100,1,"
      "1.5,3.0,note\n";
  ASSERT_TRUE(ParseMeasuredLayerCsv(std::string(kHeader) + good).ok());

  auto bad_ms = ParseMeasuredLayerCsv(
      std::string(kHeader) + good +
      "m,llama,4096,32,32,11008,swiglu_3mat,49152,512,float16,a100x40,A100,2,"
      "abc,3.0,note\n");
  ASSERT_FALSE(bad_ms.ok());
  EXPECT_EQ(bad_ms.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(bad_ms.status().message(),
              HasSubstr("line 3, column 14 (fwd_ms)"));
  EXPECT_THAT(bad_ms.status().message(), HasSubstr("\"abc\""));

  auto bad_dtype = ParseMeasuredLayerCsv(
      std::string(kHeader) +
      "m,llama,4096,32,32,11008,swiglu_3mat,49152,512,bf16,a100x40,A100,1,"
      "1.5,3.0,note\n");
  ASSERT_FALSE(bad_dtype.ok());
  EXPECT_THAT(bad_dtype.status().message(),
              HasSubstr("line 2, column 10 (dtype)"));

  auto bad_hidden = ParseMeasuredLayerCsv(
      std::string(kHeader) +
      "m,llama,-4,32,32,11008,swiglu_3mat,49152,512,float16,a100x40,A100,1,"
      "1.5,3.0,note\n");
  ASSERT_FALSE(bad_hidden.ok());
  EXPECT_THAT(bad_hidden.status().message(),
              HasSubstr("line 2, column 3 (hidden)"));

  auto short_row = ParseMeasuredLayerCsv(std::string(kHeader) + "m,llama\n");
  ASSERT_FALSE(short_row.ok());
  EXPECT_THAT(short_row.status().message(), HasSubstr("line 2"));

  auto no_col = ParseMeasuredLayerCsv("model,family\n");
  ASSERT_FALSE(no_col.ok());
  EXPECT_THAT(no_col.status().message(), HasSubstr("hidden"));
}

TEST(Calibration, GpuKeysMapToCatalogIds) {
  EXPECT_EQ(*CephaloGpuToCatalogId("a100x40"), "A100-40GB");
  EXPECT_EQ(*CephaloGpuToCatalogId("a100x80"), "A100-80GB");
  EXPECT_EQ(*CephaloGpuToCatalogId("a6000"), "A6000");
  EXPECT_EQ(*CephaloGpuToCatalogId("v100x16"), "V100-16GB");
  EXPECT_EQ(*CephaloGpuToCatalogId("v100-pciex16"), "V100-16GB");
  EXPECT_EQ(*CephaloGpuToCatalogId("p100"), "P100");
  EXPECT_FALSE(CephaloGpuToCatalogId("rtx3090").ok());
}

TEST(Calibration, UnmeasuredGpuMapping) {
  GpuType t;
  t.id = "H100-80GB";
  EXPECT_EQ(MapUnmeasuredGpu(t), "A100-80GB");
  t.id = "T4";
  EXPECT_EQ(MapUnmeasuredGpu(t), "V100-16GB");
  t.id = "P40";
  EXPECT_EQ(MapUnmeasuredGpu(t), "P100");
  t.id = "L40S";
  EXPECT_EQ(MapUnmeasuredGpu(t), "A6000");
  // Rules for ids not in the table.
  t.id = "X-NEW";
  t.product_name = "Tesla V100-PCIE-32GB";
  EXPECT_EQ(MapUnmeasuredGpu(t), "V100-16GB");
  t.product_name = "Future HBM part";
  t.hbm_gbps = 6000;
  EXPECT_EQ(MapUnmeasuredGpu(t), "A100-80GB");
  t.hbm_gbps = 900;
  t.product_name = "Some workstation card";
  EXPECT_EQ(MapUnmeasuredGpu(t), "A6000");
}

TEST(Calibration, HoldOutIsAboutAFifthOfSeries) {
  std::set<std::string> series, held;
  for (const MeasuredLayer& r : ShippedRows()) {
    series.insert(r.SeriesKey());
    if (IsHeldOutSeries(r.SeriesKey())) held.insert(r.SeriesKey());
  }
  EXPECT_EQ(series.size(), 91u);
  EXPECT_EQ(held.size(), 19u);  // 21 %
}

double Rel(double a, double b) {
  return std::abs(a - b) / std::max(1e-300, std::max(std::abs(a), std::abs(b)));
}

void ExpectStatsEq(const nlohmann::json& j, const ErrorStats& s,
                   const std::string& what) {
  SCOPED_TRACE(what);
  EXPECT_EQ(j["rows"].get<int>(), s.rows);
  EXPECT_NEAR(j["mape_fwd_pct"].get<double>(), s.mape_fwd, 1e-6);
  EXPECT_NEAR(j["mape_bwd_pct"].get<double>(), s.mape_bwd, 1e-6);
  EXPECT_NEAR(j["mape_total_pct"].get<double>(), s.mape_total, 1e-6);
  EXPECT_NEAR(j["max_ape_pct"].get<double>(), s.max_ape, 1e-6);
}

// Recomputes the shipped calibration from the CSV and the shipped GPU
// catalog and checks profiles/calibration.json (the derived rule, byte for
// byte: the shipped policies' fingerprint covers its text),
// profiles/reference/calibration-mapping.json (the old mapping rule) and
// docs/calibration.md against it. With ARACHNE_UPDATE_CALIBRATION=1 it
// rewrites the three instead.
TEST(ShippedCalibration, ReproducesJsonAndDocs) {
  absl::StatusOr<GpuCatalog> catalog = LoadGpuCatalog();
  ASSERT_TRUE(catalog.ok()) << catalog.status();
  const char* update = std::getenv("ARACHNE_UPDATE_CALIBRATION");
  if (update != nullptr && std::string(update) == "1") {
    auto r = CalibrateFiles(kCsv, *catalog, kJson, kDoc, kMappingJson);
    ASSERT_TRUE(r.ok()) << r.status();
    GTEST_SKIP() << "rewrote " << kJson << ", " << kMappingJson << " and "
                 << kDoc;
  }
  const auto t0 = std::chrono::steady_clock::now();
  std::vector<MeasuredLayer> rows = ShippedRows();
  absl::StatusOr<CalibrationReport> report = Calibrate(rows, *catalog);
  const double secs = std::chrono::duration<double>(
                          std::chrono::steady_clock::now() - t0).count();
  ASSERT_TRUE(report.ok()) << report.status();
  EXPECT_LT(secs, 30.0);
  ASSERT_EQ(report->gpus.size(), 5u);
  EXPECT_EQ(report->overall.rows, 1276);

  // The shipped default is the derived rule's rendering, byte for byte
  // (the shipped policies' profile fingerprint covers its text).
  EXPECT_TRUE(ReadRepoFile(kJson) == CalibrationReportToJson(*report))
      << kJson << " differs from the derived-rule rendering; regenerate with "
         "ARACHNE_UPDATE_CALIBRATION=1";
  // The old mapping rule, kept for comparison.
  const std::string mapping_text = ReadRepoFile(kMappingJson);
  EXPECT_TRUE(mapping_text == CalibrationReportToJson(report->MappingRuleForm()))
      << kMappingJson << " differs from the mapping-rule rendering; "
         "regenerate with ARACHNE_UPDATE_CALIBRATION=1";
  absl::StatusOr<CalibrationSet> fallback = ParseCalibrationJson(mapping_text);
  ASSERT_TRUE(fallback.ok()) << fallback.status();
  EXPECT_FALSE(fallback->rule.has_value());
  EXPECT_TRUE(fallback->derived.empty());
  EXPECT_EQ(fallback->mapping, report->old_mapping);
  EXPECT_EQ(fallback->mapping.size(), catalog->types().size() - 5);
  EXPECT_EQ(fallback->mapping.at("H100-80GB"), "A100-80GB");
  EXPECT_EQ(fallback->mapping.at("T4"), "V100-16GB");
  {
    const nlohmann::json d = nlohmann::json::parse(mapping_text);
    EXPECT_FALSE(d.contains("derived"));
    EXPECT_FALSE(d.contains("unmeasured_rule"));
    EXPECT_FALSE(d.contains("leave_one_gpu_out"));
  }

  // The default file: fitted parameters, errors, rule, derived types and
  // leave-one-GPU-out to 1e-6.
  nlohmann::json j = nlohmann::json::parse(ReadRepoFile(kJson));
  absl::StatusOr<CalibrationSet> shipped =
      ParseCalibrationJson(ReadRepoFile(kJson));
  ASSERT_TRUE(shipped.ok()) << shipped.status();
  ASSERT_EQ(shipped->fitted.size(), report->gpus.size());
  for (const GpuFit& g : report->gpus) {
    SCOPED_TRACE(g.gpu_id);
    ASSERT_TRUE(shipped->by_gpu.contains(g.gpu_id));
    const CalibrationParams& s = shipped->by_gpu.at(g.gpu_id);
    EXPECT_LT(Rel(s.gemm_eff_max, g.params.gemm_eff_max), 1e-6);
    EXPECT_LT(Rel(s.gemm_half_gflop, g.params.gemm_half_gflop), 1e-6);
    EXPECT_LT(Rel(s.fp32_gemm_eff_max, g.params.fp32_gemm_eff_max), 1e-6);
    EXPECT_LT(Rel(s.attn_eff_rel, g.params.attn_eff_rel), 1e-6);
    EXPECT_LT(Rel(s.mem_eff, g.params.mem_eff), 1e-6);
    EXPECT_LT(Rel(s.bwd_eff_rel, g.params.bwd_eff_rel), 1e-6);
    EXPECT_LT(Rel(s.layer_overhead_us, g.params.layer_overhead_us), 1e-6);
    const auto& fj = j["fitted"][g.gpu_id];
    ExpectStatsEq(fj["errors"]["all"], g.all, "all");
    ExpectStatsEq(fj["errors"]["fp16_llama"], g.fp16_llama, "fp16_llama");
    ExpectStatsEq(fj["errors"]["heldout"], g.heldout, "heldout");
    // The target: fp16 LLaMA fwd+bwd MAPE well under 15 % per GPU.
    EXPECT_LT(g.fp16_llama.mape_total, 10.0);
  }
  ExpectStatsEq(j["errors"]["all"], report->overall, "overall");
  ExpectStatsEq(j["errors"]["heldout"], report->overall_heldout, "heldout");
  EXPECT_EQ(shipped->mapping, report->mapping);
  EXPECT_TRUE(shipped->mapping.empty());
  // Both files carry the same fit.
  for (const GpuFit& g : report->gpus)
    EXPECT_EQ(fallback->by_gpu.at(g.gpu_id), shipped->by_gpu.at(g.gpu_id))
        << g.gpu_id;

  // The error table in docs/calibration.md: every figure within 1e-6.
  const std::string doc = ReadRepoFile(kDoc);
  int checked = 0;
  for (absl::string_view line : absl::StrSplit(doc, '\n')) {
    std::vector<std::string> cells;
    for (absl::string_view c : absl::StrSplit(line, '|'))
      cells.emplace_back(absl::StripAsciiWhitespace(c));
    // | GPU | keys | rows | series | fwd | bwd | total | max | ...
    if (cells.size() != 14) continue;
    const GpuFit* g = nullptr;
    for (const GpuFit& f : report->gpus)
      if (f.gpu_id == cells[1]) g = &f;
    const bool all = cells[1] == "**all**";
    if (g == nullptr && !all) continue;
    const ErrorStats& s = all ? report->overall : g->all;
    const double want[] = {s.mape_fwd, s.mape_bwd, s.mape_total, s.max_ape};
    for (int i = 0; i < 4; ++i) {
      double v;
      ASSERT_TRUE(absl::SimpleAtod(cells[5 + i], &v)) << line;
      EXPECT_NEAR(v, want[i], 1e-6) << line;
    }
    double held;
    ASSERT_TRUE(absl::SimpleAtod(cells[12], &held)) << line;
    EXPECT_NEAR(held, all ? report->overall_heldout.mape_total
                          : g->heldout.mape_total, 1e-6) << line;
    ++checked;
  }
  EXPECT_EQ(checked, 6);

  // Leave-one-GPU-out: the JSON and the doc table carry the recomputed
  // figures.
  ASSERT_EQ(report->logo.size(), 5u);
  ASSERT_EQ(j["leave_one_gpu_out"].size(), 5u);
  for (size_t i = 0; i < report->logo.size(); ++i) {
    const LogoResult& l = report->logo[i];
    const auto& lj = j["leave_one_gpu_out"][i];
    SCOPED_TRACE(l.gpu_id);
    EXPECT_EQ(lj["gpu"].get<std::string>(), l.gpu_id);
    EXPECT_EQ(lj["rows"].get<int>(), l.rows);
    EXPECT_EQ(lj["old_source"].get<std::string>(), l.old_source);
    EXPECT_NEAR(lj["old_median_pct"].get<double>(), l.old_median, 1e-6);
    EXPECT_NEAR(lj["old_mean_pct"].get<double>(), l.old_mean, 1e-6);
    EXPECT_NEAR(lj["new_median_pct"].get<double>(), l.new_median, 1e-6);
    EXPECT_NEAR(lj["new_mean_pct"].get<double>(), l.new_mean, 1e-6);
  }
  int logo_checked = 0;
  bool in_logo = false;
  for (absl::string_view line : absl::StrSplit(doc, '\n')) {
    if (absl::StartsWith(line, "### ")) in_logo = line == "### Leave-one-GPU-out";
    if (!in_logo) continue;
    std::vector<std::string> cells;
    for (absl::string_view c : absl::StrSplit(line, '|'))
      cells.emplace_back(absl::StripAsciiWhitespace(c));
    // | GPU | rows | old copies | old med | old mean | new med | new mean |
    // best | best med | best mean |
    if (cells.size() != 12) continue;
    const LogoResult* l = cells[1] == "**all**" ? &report->logo_all : nullptr;
    for (const LogoResult& x : report->logo)
      if (x.gpu_id == cells[1]) l = &x;
    if (l == nullptr) continue;
    SCOPED_TRACE(line);
    int rows;
    ASSERT_TRUE(absl::SimpleAtoi(cells[2], &rows));
    EXPECT_EQ(rows, l->rows);
    const double want[] = {l->old_median, l->old_mean, l->new_median,
                           l->new_mean};
    for (int i = 0; i < 4; ++i) {
      double v;
      ASSERT_TRUE(absl::SimpleAtod(cells[4 + i], &v));
      EXPECT_NEAR(v, want[i], 1e-6);
    }
    ++logo_checked;
  }
  EXPECT_EQ(logo_checked, 6);
  // The new rule beats the old one pooled over all 1,276 rows, on median
  // and mean, and on every type but A6000 (whose eager-attention and FP32
  // rows no other type predicts; the old rule gave it the defaults, which
  // happen to fit it better). On A100-40GB, which the old rule predicts
  // with its own sibling A100-80GB, the medians tie (within 1 %) and the
  // new rule's mean is lower.
  EXPECT_EQ(report->logo_all.rows, 1276);
  EXPECT_LT(report->logo_all.new_median, 0.7 * report->logo_all.old_median);
  EXPECT_LT(report->logo_all.new_mean, 0.7 * report->logo_all.old_mean);
  for (const LogoResult& l : report->logo) {
    SCOPED_TRACE(l.gpu_id);
    if (l.gpu_id == "A6000") continue;
    if (l.gpu_id == "A100-40GB")
      EXPECT_LT(l.new_median, 1.01 * l.old_median);
    else
      EXPECT_LT(l.new_median, l.old_median);
    EXPECT_LT(l.new_mean, l.old_mean);
  }
  // Planning with the derived file gets the derived parameters: every
  // unfitted catalog type is in its set, T4 and L4 (power-limited) below the
  // fitted parts.
  EXPECT_EQ(shipped->derived.size(), catalog->types().size() - 5);
  ASSERT_TRUE(shipped->rule.has_value());
  EXPECT_EQ(*shipped->rule, *report->rule);
  for (const DerivedGpu& d : report->derived) {
    SCOPED_TRACE(d.gpu_id);
    ASSERT_TRUE(shipped->by_gpu.contains(d.gpu_id));
    EXPECT_LT(Rel(shipped->by_gpu.at(d.gpu_id).gemm_eff_max,
                  d.params.gemm_eff_max), 1e-6);
  }
  const GpuType& t4 = catalog->type(*catalog->IndexOf("T4"));
  const GpuType& l4 = catalog->type(*catalog->IndexOf("L4"));
  for (const GpuFit& g : report->gpus) {
    EXPECT_LT(shipped->For(t4).gemm_eff_max, g.params.gemm_eff_max) << g.gpu_id;
    if (g.gpu_id != "P100") {
      EXPECT_LT(shipped->For(l4).gemm_eff_max, g.params.gemm_eff_max)
          << g.gpu_id;
    }
  }
  // The doc's old-vs-derived examples: the power-limited parts and MI300X
  // get markedly slower under the derived rule than the copy gave them.
  absl::StatusOr<UnmeasuredGpuExamples> examples =
      ComputeUnmeasuredGpuExamples(*report, *catalog);
  ASSERT_TRUE(examples.ok()) << examples.status();
  ASSERT_EQ(examples->rows.size(), UnmeasuredExampleGpus().size());
  for (const UnmeasuredGpuExample& e : examples->rows) {
    SCOPED_TRACE(e.gpu_id);
    EXPECT_EQ(e.mapping_source, report->old_mapping.at(e.gpu_id));
    EXPECT_GT(e.mapping_ms, 0);
    EXPECT_GT(e.derived_ms, 0);
    if (e.gpu_id == "T4" || e.gpu_id == "L4" || e.gpu_id == "MI300X") {
      EXPECT_GT(e.derived_ms, 1.2 * e.mapping_ms);
    }
  }
  // The doc says which rule ships and why.
  EXPECT_THAT(doc, HasSubstr("The shipped default, `profiles/calibration.json`, "
                             "uses the derived\nrule"));
  EXPECT_THAT(doc, HasSubstr("cp profiles/reference/calibration-mapping.json "
                             "/tmp/p/calibration.json"));
  EXPECT_THAT(doc, HasSubstr("arachne train --model llama3-8b"));
  EXPECT_EQ(doc, RenderCalibrationMarkdown(*report, *examples));
}

TEST(Calibration, IsDeterministic) {
  absl::StatusOr<GpuCatalog> catalog = LoadGpuCatalog();
  ASSERT_TRUE(catalog.ok()) << catalog.status();
  std::vector<MeasuredLayer> rows = ShippedRows();
  auto a = Calibrate(rows, *catalog);
  auto b = Calibrate(rows, *catalog);
  ASSERT_TRUE(a.ok() && b.ok());
  for (size_t i = 0; i < a->gpus.size(); ++i)
    EXPECT_EQ(a->gpus[i].params, b->gpus[i].params);
}

TEST(Calibration, SkipsGpusOutsideTheCatalog) {
  GpuType a100;
  a100.id = "A100-40GB";
  a100.product_name = "NVIDIA A100-SXM4-40GB";
  a100.peak_bf16_tflops = 312;
  a100.peak_fp32_tflops = 19.5;
  a100.memory_gib = 40;
  a100.hbm_gbps = 1555;
  a100.intra_node_gbps = 300;
  a100.intra_node_link = "NVLink3";
  a100.usd_per_hour = 1;
  GpuType h100 = a100;
  h100.id = "H100-80GB";
  h100.peak_bf16_tflops = 989.4;
  h100.peak_fp32_tflops = 66.9;
  h100.hbm_gbps = 3350;
  h100.memory_gib = 80;
  auto catalog = GpuCatalog::Create({a100, h100});
  ASSERT_TRUE(catalog.ok()) << catalog.status();
  auto report = Calibrate(ShippedRows(), *catalog);
  ASSERT_TRUE(report.ok()) << report.status();
  ASSERT_EQ(report->gpus.size(), 1u);
  EXPECT_EQ(report->gpus[0].all.rows, 328);
  EXPECT_FALSE(report->mapping.contains("H100-80GB"));
  EXPECT_FALSE(report->notes.empty());
  // One fitted type: no leave-one-GPU-out, but the rule (from A100-40GB
  // alone) gives H100 its parameters.
  EXPECT_TRUE(report->logo.empty());
  ASSERT_TRUE(report->rule.has_value());
  ASSERT_EQ(report->derived.size(), 1u);
  EXPECT_EQ(report->derived[0].gpu_id, "H100-80GB");
  EXPECT_EQ(report->derived[0].basis, "measured");
  CalibrationSet set = report->ToSet();
  EXPECT_EQ(set.For(h100), ApplyUnmeasuredGpuRule(*report->rule, h100,
                                                  ThroughputOf(h100),
                                                  set.defaults));
  EXPECT_NE(set.For(h100), set.defaults);
  EXPECT_EQ(set.For(a100), report->gpus[0].params);
  // An explicit override copies the fitted type instead.
  auto over = Calibrate(ShippedRows(), *catalog, {{"H100-80GB", "A100-40GB"}});
  ASSERT_TRUE(over.ok()) << over.status();
  EXPECT_TRUE(over->derived.empty());
  EXPECT_EQ(over->ToSet().For(h100), report->gpus[0].params);
  auto bad = Calibrate(ShippedRows(), *catalog, {{"H100-80GB", "B9"}});
  ASSERT_FALSE(bad.ok());
  EXPECT_THAT(bad.status().message(), HasSubstr("override H100-80GB -> B9"));
}

// The small-GEMM half-point is fitted only where the rows determine it.
// Per layer it adds the same time to every GEMM call, so it is told apart
// from the per-layer overhead only by layers with different numbers of
// GEMM calls (LLaMA's SwiGLU MLP and flash attention against GPT's GeLU MLP
// and eager attention). Rows made from known parameters with +-4 %
// deterministic noise: on large layers it is a sliver of the time, and the
// fit keeps the start value (1 GFLOP) rather than chase the noise; on small
// layers a 5 GFLOP half-point dominates, and the fit recovers it.
TEST(Calibration, HalfPointIsFittedOnlyWhereTheRowsDetermineIt) {
  absl::StatusOr<GpuCatalog> shipped = LoadGpuCatalog();
  ASSERT_TRUE(shipped.ok());
  const GpuType a100 = shipped->type(*shipped->IndexOf("A100-40GB"));
  auto catalog = GpuCatalog::Create({a100});
  ASSERT_TRUE(catalog.ok()) << catalog.status();
  auto rows_for = [&](int hidden, std::initializer_list<int> seqs,
                      double half) {
    CalibrationParams truth;
    truth.gemm_eff_max = 0.75;
    truth.gemm_half_gflop = half;
    truth.attn_eff_rel = 0.45;
    truth.mem_eff = 0.7;
    truth.bwd_eff_rel = 1.0;
    truth.layer_overhead_us = 100;
    std::vector<MeasuredLayer> rows;
    int i = 0;
    for (const char* family : {"llama", "gpt"}) {
      for (int seq : seqs) {
        for (int batch : {1, 2, 4, 8}) {
          MeasuredLayer r;
          r.line = 2 + i;
          r.model = absl::StrCat("synthetic_", family, "_", hidden);
          r.family = family;
          r.swiglu = r.family == "llama";
          r.hidden = hidden, r.heads = hidden / 64, r.kv_heads = r.heads;
          r.ffn = r.swiglu ? hidden * 8 / 3 : 4 * hidden;
          r.seq = seq;
          r.gpu = "a100x40";
          r.batch = batch;
          const LayerTime t = PredictMeasuredLayer(r, a100, truth);
          const double noise = 0.04 * std::sin(2.3 * ++i);
          r.fwd_ms = t.fwd_ms * (1 + noise);
          r.bwd_ms = t.bwd_ms * (1 - noise);
          rows.push_back(r);
        }
      }
    }
    return rows;
  };
  auto large = Calibrate(rows_for(8192, {2048, 4096}, 1.0), *catalog);
  ASSERT_TRUE(large.ok()) << large.status();
  ASSERT_EQ(large->gpus.size(), 1u);
  EXPECT_EQ(large->gpus[0].params.gemm_half_gflop, 1.0);
  auto small = Calibrate(rows_for(1024, {128, 256}, 5.0), *catalog);
  ASSERT_TRUE(small.ok()) << small.status();
  ASSERT_EQ(small->gpus.size(), 1u);
  EXPECT_NEAR(small->gpus[0].params.gemm_half_gflop, 5.0, 1.0);
}

TEST(Calibration, PredictionMatchesMeasurementScale) {
  absl::StatusOr<GpuCatalog> catalog = LoadGpuCatalog();
  ASSERT_TRUE(catalog.ok());
  absl::StatusOr<CalibrationSet> set = LoadCalibration(kSrc + "/profiles");
  ASSERT_TRUE(set.ok()) << set.status();
  // deepspeedllama_7b, a100x80, seq 2048, float16, batch 4.
  for (const MeasuredLayer& r : ShippedRows()) {
    if (r.model != "deepspeedllama_7b" || r.gpu != "a100x80" || r.seq != 2048 ||
        r.batch != 4)
      continue;
    const GpuType& g = catalog->type(*catalog->IndexOf("A100-80GB"));
    LayerTime t = PredictMeasuredLayer(r, g, set->For("A100-80GB"));
    EXPECT_NEAR(t.fwd_ms / r.fwd_ms, 1.0, 0.1);
    EXPECT_NEAR(t.bwd_ms / r.bwd_ms, 1.0, 0.1);
  }
}

GpuType TestGpu(const std::string& id, double peak16, double peak32) {
  GpuType g;
  g.id = id;
  g.product_name = id;
  g.peak_bf16_tflops = peak16;
  g.peak_fp32_tflops = peak32;
  g.memory_gib = 24;
  g.hbm_gbps = 300;
  g.intra_node_gbps = 24;
  return g;
}

UnmeasuredGpuRule TestRule() {
  UnmeasuredGpuRule r;
  r.gemm_eff_per_matmul = 0.9;
  r.fp32_eff_per_matmul = 0.95;
  r.matmul_fraction = 0.8;
  r.matmul_fraction_low_power = 0.4;
  r.fp32_matmul_fraction = 0.7;
  r.gemm_half_us = 10;
  r.attn_eff_rel = 0.5;
  r.mem_eff = 0.75;
  r.bwd_eff_rel = 1.02;
  r.layer_overhead_us = 50;
  return r;
}

TEST(UnmeasuredGpuRule, PowerLimitedPartGetsLowerGemmEfficiency) {
  // Same datasheet figures (121 / 30.3 TFLOPS); only the measured matmul
  // and the board power differ.
  const GpuType g = TestGpu("X", 121, 30.3);
  const UnmeasuredGpuRule r = TestRule();
  const CalibrationParams base;
  GpuThroughput limited;  // L4-like: 56.9 TFLOPS sustained at 72 W
  limited.matmul_tflops = 56.9;
  limited.matmul_fp32_tflops = 11.11;
  limited.tdp_w = 72;
  GpuThroughput full;  // measured near its peak
  full.matmul_tflops = 96.8;
  full.tdp_w = 300;
  const CalibrationParams pl = ApplyUnmeasuredGpuRule(r, g, limited, base);
  const CalibrationParams pf = ApplyUnmeasuredGpuRule(r, g, full, base);
  EXPECT_DOUBLE_EQ(pl.gemm_eff_max, 0.9 * 56.9 / 121);  // 0.42322
  EXPECT_DOUBLE_EQ(pf.gemm_eff_max, 0.9 * 96.8 / 121);  // 0.72
  EXPECT_LT(pl.gemm_eff_max, pf.gemm_eff_max);
  EXPECT_DOUBLE_EQ(pl.fp32_gemm_eff_max, 0.95 * 11.11 / 30.3);
  EXPECT_DOUBLE_EQ(pf.fp32_gemm_eff_max, 0.95 * 0.7);  // fallback fraction
  // The half-point is the same 10 us at each part's effective throughput.
  EXPECT_DOUBLE_EQ(pl.gemm_half_gflop, 1e-3 * 10 * pl.gemm_eff_max * 121);
  EXPECT_DOUBLE_EQ(pf.gemm_half_gflop, 1e-3 * 10 * 0.72 * 121);
  EXPECT_DOUBLE_EQ(pl.mem_eff, 0.75);
  EXPECT_DOUBLE_EQ(pl.attn_eff_rel, 0.5);
  EXPECT_DOUBLE_EQ(pl.bwd_eff_rel, 1.02);
  EXPECT_DOUBLE_EQ(pl.layer_overhead_us, 50);
  EXPECT_DOUBLE_EQ(pl.tp_loss_per_degree, base.tp_loss_per_degree);

  // Without a measurement the power class decides: 72 W takes the
  // low-power fraction, 300 W (or unknown) the other.
  GpuThroughput low_unmeasured;
  low_unmeasured.tdp_w = 72;
  GpuThroughput high_unmeasured;
  high_unmeasured.tdp_w = 300;
  EXPECT_DOUBLE_EQ(
      ApplyUnmeasuredGpuRule(r, g, low_unmeasured, base).gemm_eff_max,
      0.9 * 0.4);
  EXPECT_DOUBLE_EQ(
      ApplyUnmeasuredGpuRule(r, g, high_unmeasured, base).gemm_eff_max,
      0.9 * 0.8);
  EXPECT_DOUBLE_EQ(ApplyUnmeasuredGpuRule(r, g, {}, base).gemm_eff_max,
                   0.9 * 0.8);
  // The result stays inside the fit's range.
  GpuThroughput over;
  over.matmul_tflops = 130;  // 0.9 x 130/121 = 0.967
  EXPECT_DOUBLE_EQ(ApplyUnmeasuredGpuRule(r, g, over, base).gemm_eff_max,
                   0.95);
}

TEST(UnmeasuredGpuRule, ShippedLowPowerPartsSitBelowFullPowerOnes) {
  // The published figures: T4 and L4 reach well under half their peak
  // under sustained GEMMs, A100 and H100 about 80 %.
  auto frac = [](const char* id, double peak) {
    return PublishedGpuThroughput().at(id).matmul_tflops / peak;
  };
  EXPECT_NEAR(frac("T4", 65), 0.369231, 1e-6);
  EXPECT_NEAR(frac("L4", 121), 0.470248, 1e-6);
  EXPECT_NEAR(frac("A100-80GB", 312), 0.847853, 1e-6);
  EXPECT_NEAR(frac("H100-80GB", 989.4), 0.792056, 1e-6);
  for (const auto& [id, t] : PublishedGpuThroughput()) {
    SCOPED_TRACE(id);
    EXPECT_FALSE(t.source.empty());
    EXPECT_GT(t.matmul_tflops, 0);
    EXPECT_GE(t.matmul_fp32_tflops, 0);
  }
}

TEST(UnmeasuredGpuRule, DerivesMediansFromDonors) {
  // Two donors with ids the published table has, so the reference
  // fractions are known: A100-40GB 246.33/312, T4 24/65 (70 W), L4
  // 56.9/121 (72 W).
  CalibrationDonor a, b;
  a.gpu = TestGpu("A100-40GB", 312, 19.5);
  a.throughput = ThroughputOf(a.gpu);
  a.params.gemm_eff_max = 0.75;
  a.params.fp32_gemm_eff_max = 0.9;
  a.params.gemm_half_gflop = 2.34;
  a.params.attn_eff_rel = 0.4;
  a.params.mem_eff = 0.6;
  a.params.bwd_eff_rel = 1.0;
  a.params.layer_overhead_us = 100;
  a.fp32_fitted = a.attn_fitted = true;
  b.gpu = TestGpu("B", 100, 10);
  b.throughput.matmul_tflops = 80;
  b.params.gemm_eff_max = 0.6;
  b.params.gemm_half_gflop = 0.6;
  b.params.attn_eff_rel = 0.2;  // not fitted: ignored
  b.params.mem_eff = 0.8;
  b.params.bwd_eff_rel = 1.2;
  b.params.layer_overhead_us = 20;
  const std::vector<GpuType> ref = {a.gpu, TestGpu("T4", 65, 8.1),
                                    TestGpu("L4", 121, 30.3)};
  auto r = DeriveUnmeasuredGpuRule({a, b}, ref);
  ASSERT_TRUE(r.ok()) << r.status();
  EXPECT_DOUBLE_EQ(r->gemm_eff_per_matmul,
                   0.5 * (0.75 / (246.33 / 312) + 0.6 / 0.8));
  EXPECT_DOUBLE_EQ(r->fp32_eff_per_matmul, 0.9 / (18.11 / 19.5));
  // 2.34 GFLOP at 0.75 x 312 TFLOPS = 10 us; 0.6 at 0.6 x 100 = 10 us.
  EXPECT_NEAR(r->gemm_half_us, 10, 1e-12);
  EXPECT_DOUBLE_EQ(r->attn_eff_rel, 0.4);
  EXPECT_DOUBLE_EQ(r->mem_eff, 0.7);
  EXPECT_DOUBLE_EQ(r->bwd_eff_rel, 1.1);
  EXPECT_DOUBLE_EQ(r->layer_overhead_us, 60);
  EXPECT_DOUBLE_EQ(r->matmul_fraction, 246.33 / 312);
  EXPECT_DOUBLE_EQ(r->matmul_fraction_low_power,
                   0.5 * (24.0 / 65 + 56.9 / 121));
  // FP32 fractions 0.929 (A100), 0.515 (T4), 0.367 (L4): the median.
  EXPECT_DOUBLE_EQ(r->fp32_matmul_fraction, 4.17 / 8.1);
  EXPECT_EQ(r->donors, (std::vector<std::string>{"A100-40GB", "B"}));
}

TEST(UnmeasuredGpuRule, Errors) {
  auto none = DeriveUnmeasuredGpuRule({}, {});
  ASSERT_FALSE(none.ok());
  EXPECT_EQ(none.status().code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_THAT(none.status().message(), HasSubstr("no fitted GPU type"));

  CalibrationDonor d;
  d.gpu = TestGpu("NOFIG", 100, 10);
  auto no_fig = DeriveUnmeasuredGpuRule({d}, {});
  ASSERT_FALSE(no_fig.ok());
  EXPECT_EQ(no_fig.status().code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_THAT(no_fig.status().message(),
              HasSubstr("(NOFIG) has a published 16-bit matmul_tflops"));

  d.throughput.matmul_tflops = -1;
  auto neg = DeriveUnmeasuredGpuRule({d}, {});
  ASSERT_FALSE(neg.ok());
  EXPECT_EQ(neg.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(neg.status().message(),
              HasSubstr("gpu NOFIG: matmul_tflops must be a number >= 0, got -1"));

  d.throughput.matmul_tflops = 80;
  d.throughput.matmul_fp32_tflops = 16;  // 1.6x the 10 TFLOPS peak
  auto high = DeriveUnmeasuredGpuRule({d}, {});
  ASSERT_FALSE(high.ok());
  EXPECT_THAT(high.status().message(),
              HasSubstr("gpu NOFIG: matmul_fp32_tflops 16 exceeds 1.5x the "
                        "datasheet peak 10"));
}

TEST(UnmeasuredGpuRule, SetAppliesRuleToTypesOutsideTheFile) {
  CalibrationSet set;
  set.rule = TestRule();
  GpuType g = TestGpu("CUSTOM-NEW", 200, 50);
  const CalibrationParams p = set.For(g);
  EXPECT_DOUBLE_EQ(p.gemm_eff_max, 0.9 * 0.8);
  EXPECT_DOUBLE_EQ(p.fp32_gemm_eff_max, 0.95 * 0.7);
  // By id the same set has nothing: defaults.
  EXPECT_EQ(set.For("CUSTOM-NEW"), set.defaults);
  // Without a rule (an old file) the old mapping applies.
  CalibrationSet old;
  old.by_gpu["A6000"].gemm_eff_max = 0.123;
  EXPECT_DOUBLE_EQ(old.For(g).gemm_eff_max, 0.123);
}

TEST(UnmeasuredGpuRule, JsonErrorsNameTheField) {
  auto rule = ParseCalibrationJson(
      R"({"fitted": {}, "unmeasured_rule": {"mem_eff": 0.5}})", "c.json");
  ASSERT_FALSE(rule.ok());
  EXPECT_THAT(rule.status().message(),
              HasSubstr("c.json: unmeasured_rule.gemm_eff_per_matmul: must be "
                        "a number"));
  auto derived = ParseCalibrationJson(
      R"({"fitted": {}, "derived": {"L4": {"basis": "measured"}}})", "c.json");
  ASSERT_FALSE(derived.ok());
  EXPECT_THAT(derived.status().message(),
              HasSubstr("c.json: derived.L4.params: missing"));
}

TEST(UnmeasuredGpuRule, FileMappingOverridesDerivedParameters) {
  // A hand-added mapping entry copies the fitted type instead of the
  // derived parameters.
  auto set = ParseCalibrationJson(R"({
    "fitted": {"A": {"params": {"gemm_eff_max": 0.7}}},
    "derived": {"B": {"params": {"gemm_eff_max": 0.3}},
                "C": {"params": {"gemm_eff_max": 0.4}}},
    "mapping": {"B": "A"}})");
  ASSERT_TRUE(set.ok()) << set.status();
  EXPECT_DOUBLE_EQ(set->For("B").gemm_eff_max, 0.7);
  EXPECT_DOUBLE_EQ(set->For("C").gemm_eff_max, 0.4);
  EXPECT_FALSE(set->rule.has_value());
}

}  // namespace
}  // namespace arachne
