#include "planner_service/core/calibration.h"

#include <chrono>
#include <cmath>
#include <cstdlib>
#include <set>
#include <string>
#include <vector>

#include "absl/strings/numbers.h"
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
// catalog and checks profiles/calibration.json and docs/calibration.md
// against it. With ARACHNE_UPDATE_CALIBRATION=1 it rewrites both instead.
TEST(ShippedCalibration, ReproducesJsonAndDocs) {
  absl::StatusOr<GpuCatalog> catalog = LoadGpuCatalog();
  ASSERT_TRUE(catalog.ok()) << catalog.status();
  const char* update = std::getenv("ARACHNE_UPDATE_CALIBRATION");
  if (update != nullptr && std::string(update) == "1") {
    auto r = CalibrateFiles(kCsv, *catalog, kJson, kDoc);
    ASSERT_TRUE(r.ok()) << r.status();
    GTEST_SKIP() << "rewrote " << kJson << " and " << kDoc;
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

  // Fitted parameters equal the shipped calibration.json.
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
  EXPECT_EQ(doc, RenderCalibrationMarkdown(*report));
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
  CalibrationSet set = report->ToSet();
  // H100 maps to A100-80GB, which is not fitted here: defaults.
  EXPECT_EQ(set.For(h100), set.defaults);
  EXPECT_EQ(set.For(a100), report->gpus[0].params);
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

}  // namespace
}  // namespace arachne
