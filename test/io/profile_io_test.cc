#include "planner_service/io/profile_io.h"

#include <filesystem>
#include <fstream>
#include <string>

#include <unistd.h>

#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "nlohmann/json.hpp"
#include "planner_service/core/cost/profile_synthesizer.h"
#include "planner_service/io/data_files.h"
#include "planner_service/io/gpu_catalog_io.h"
#include "planner_service/io/model_io.h"
#include "planner_service/io/planning_context.h"

namespace arachne {
namespace {

using ::testing::HasSubstr;

GpuType Gpu(const std::string& id, std::vector<std::string> aliases = {}) {
  GpuType g;
  g.id = id;
  g.aliases = std::move(aliases);
  g.peak_bf16_tflops = 312;
  g.peak_fp32_tflops = 19.5;
  g.memory_gib = 80;
  g.hbm_gbps = 2039;
  g.intra_node_gbps = 300;
  g.intra_node_link = "NVLink3";
  g.usd_per_hour = 2.5;
  return g;
}

GpuCatalog SmallCatalog() {
  auto c = GpuCatalog::Create({Gpu("A100-80GB", {"a100"}), Gpu("H100-80GB")});
  EXPECT_TRUE(c.ok()) << c.status();
  return *c;
}

constexpr char kHeader[] =
    "model,layer_kind,gpu,tp,mbs,seq,fwd_ms,bwd_ms,tp_comm_ms,"
    "activation_bytes,param_count,source\n";

TEST(ProfileCsv, ParsesAndRoundTrips) {
  const std::string text = std::string(kHeader) +
                           "# comment\n"
                           "llama3-8b,dense,A100-80GB,1,2,2048,12.5,25.25,0,"
                           "570949632,218112000,measured\n"
                           "\n"
                           "llama3-8b,lm_head,a100,2,1,2048,3.1,6.2,0.4,100,"
                           "262670336,synthesized\n";
  auto entries = ParseProfileCsv(text, "x.csv");
  ASSERT_TRUE(entries.ok()) << entries.status();
  ASSERT_EQ(entries->size(), 2u);
  const ProfileEntry& e = (*entries)[0];
  EXPECT_EQ(e.key.model, "llama3-8b");
  EXPECT_EQ(e.key.kind, LayerKind::kDense);
  EXPECT_EQ(e.key.gpu, "A100-80GB");
  EXPECT_EQ(e.key.tp, 1);
  EXPECT_EQ(e.key.mbs, 2);
  EXPECT_EQ(e.key.seq, 2048);
  EXPECT_EQ(e.fwd_ms, 12.5);
  EXPECT_EQ(e.bwd_ms, 25.25);
  EXPECT_EQ(e.activation_bytes, 570949632);
  EXPECT_EQ(e.param_count, 218112000);
  EXPECT_EQ(e.source, ProfileSource::kMeasured);
  EXPECT_EQ((*entries)[1].key.kind, LayerKind::kLmHead);
  EXPECT_EQ((*entries)[1].tp_comm_ms, 0.4);
  EXPECT_EQ((*entries)[1].source, ProfileSource::kSynthesized);

  ProfileEntry odd = e;
  odd.fwd_ms = 0.1 + 0.2;  // not exactly representable in few digits
  const std::string out = SerializeProfileCsv({odd, (*entries)[1]});
  EXPECT_EQ(out.substr(0, out.find('\n') + 1), kHeader);
  auto back = ParseProfileCsv(out);
  ASSERT_TRUE(back.ok()) << back.status();
  ASSERT_EQ(back->size(), 2u);
  EXPECT_EQ((*back)[0].fwd_ms, 0.1 + 0.2);
  EXPECT_EQ((*back)[0].key, odd.key);
  EXPECT_EQ((*back)[1].key, (*entries)[1].key);
  EXPECT_EQ((*back)[1].param_count, 262670336);
}

TEST(ProfileCsv, ErrorsNameLineColumnAndValue) {
  auto bad = ParseProfileCsv(std::string(kHeader) +
                                 "m,dense,A100-80GB,1,2,2048,1,2,0,1,1,measured\n"
                                 "m,dense,A100-80GB,1,x2,2048,1,2,0,1,1,measured\n",
                             "f.csv");
  ASSERT_FALSE(bad.ok());
  EXPECT_EQ(bad.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(std::string(bad.status().message()),
              HasSubstr("f.csv: line 3, column 5 (mbs)"));
  EXPECT_THAT(std::string(bad.status().message()), HasSubstr("\"x2\""));

  auto kind = ParseProfileCsv(std::string(kHeader) +
                              "m,mlp,A100-80GB,1,2,2048,1,2,0,1,1,measured\n");
  ASSERT_FALSE(kind.ok());
  EXPECT_THAT(std::string(kind.status().message()), HasSubstr("line 2, column 2 (layer_kind)"));

  auto src = ParseProfileCsv(std::string(kHeader) +
                             "m,dense,A100-80GB,1,2,2048,1,2,0,1,1,guessed\n");
  ASSERT_FALSE(src.ok());
  EXPECT_THAT(std::string(src.status().message()), HasSubstr("column 12 (source)"));

  auto comm = ParseProfileCsv(std::string(kHeader) +
                              "m,dense,A100-80GB,1,2,2048,1,2,0.5,1,1,measured\n");
  ASSERT_FALSE(comm.ok());
  EXPECT_THAT(std::string(comm.status().message()), HasSubstr("column 9 (tp_comm_ms)"));

  auto cols = ParseProfileCsv(std::string(kHeader) + "m,dense,A100-80GB\n");
  ASSERT_FALSE(cols.ok());
  EXPECT_THAT(std::string(cols.status().message()), HasSubstr("line 2"));

  auto header = ParseProfileCsv("model,kind,gpu\n");
  ASSERT_FALSE(header.ok());
  EXPECT_THAT(std::string(header.status().message()), HasSubstr("line 1, column 2"));
}

class ProfileDirTest : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = std::filesystem::temp_directory_path() /
           ("arachne_profile_io_" + std::to_string(::getpid()));
    std::filesystem::remove_all(dir_);
    std::filesystem::create_directories(dir_ / "measured");
  }
  void TearDown() override { std::filesystem::remove_all(dir_); }
  void Write(const std::string& rel, const std::string& text) {
    std::ofstream(dir_ / rel) << text;
  }
  std::filesystem::path dir_;
};

// The built-in default plans H100 (unmeasured) with the derived rule's
// parameters; a profiles dir whose calibration.json is the old mapping file
// (kept for comparison) copies A100-80GB instead.
TEST_F(ProfileDirTest, DefaultCalibrationPlansH100ByTheDerivedRule) {
  absl::StatusOr<std::string> text = ReadFileToString(
      std::string(ARACHNE_SOURCE_DIR) +
      "/profiles/reference/calibration-mapping.json");
  ASSERT_TRUE(text.ok()) << text.status();
  Write("calibration.json", *text);
  absl::StatusOr<std::string> default_text = ReadDataFile("calibration.json", "");
  ASSERT_TRUE(default_text.ok()) << default_text.status();
  const nlohmann::json j = nlohmann::json::parse(*default_text);
  absl::StatusOr<CalibrationSet> shipped = LoadCalibration();
  ASSERT_TRUE(shipped.ok()) << shipped.status();
  const CalibrationParams& h100_derived = shipped->by_gpu.at("H100-80GB");
  EXPECT_DOUBLE_EQ(h100_derived.gemm_eff_max,
                   j["derived"]["H100-80GB"]["params"]["gemm_eff_max"]
                       .get<double>());

  absl::StatusOr<CalibrationSet> old = LoadCalibration(dir_.string());
  ASSERT_TRUE(old.ok()) << old.status();
  EXPECT_TRUE(shipped->rule.has_value());
  EXPECT_FALSE(old->rule.has_value());
  EXPECT_NE(shipped->For("H100-80GB"), shipped->For("A100-80GB"));
  EXPECT_EQ(old->For("H100-80GB"), old->For("A100-80GB"));
  // Fitted types are the same in both.
  EXPECT_EQ(old->For("A100-80GB"), shipped->For("A100-80GB"));

  // Planning: the context synthesizes H100's profiles from the file in the
  // profiles dir, else from the built-in one.
  auto plan_h100 = [](const std::string& profiles_dir)
      -> absl::StatusOr<ProfileEntry> {
    PlanningRequest req;
    req.model = "llama3-8b";
    req.cluster_file =
        std::string(ARACHNE_SOURCE_DIR) + "/examples/a100-h100-64.yaml";
    req.training.seq_len = 4096;
    req.profiles_dir = profiles_dir;
    auto ctx = PlanningContext::Create(req);
    if (!ctx.ok()) return ctx.status();
    const ProfileEntry* e = (*ctx)->profiles().Find(
        ProfileKey{"llama3-8b", LayerKind::kDense, "H100-80GB", 1, 1, 4096});
    if (e == nullptr) return absl::NotFoundError("no H100 entry");
    return *e;
  };
  absl::StatusOr<ProfileEntry> derived = plan_h100("");
  ASSERT_TRUE(derived.ok()) << derived.status();
  absl::StatusOr<ProfileEntry> mapped = plan_h100(dir_.string());
  ASSERT_TRUE(mapped.ok()) << mapped.status();
  absl::StatusOr<GpuCatalog> catalog = LoadGpuCatalog();
  ASSERT_TRUE(catalog.ok());
  const GpuType& h100 = catalog->type(*catalog->IndexOf("H100-80GB"));
  absl::StatusOr<ModelSpec> model = ResolveModel("llama3-8b");
  ASSERT_TRUE(model.ok());
  const TrainingConfig training;
  absl::StatusOr<ProfileEntry> want =
      ProfileSynthesizer(h100_derived, KernelsOf(training.framework))
          .Synthesize(*model, LayerKind::kDense, h100, 1, 1, 4096);
  ASSERT_TRUE(want.ok()) << want.status();
  EXPECT_DOUBLE_EQ(derived->fwd_ms, want->fwd_ms);
  EXPECT_DOUBLE_EQ(derived->bwd_ms, want->bwd_ms);
  // The derived H100 is slower than the A100-80GB copy made it.
  // (11.61 against 11.25 ms for this layer).
  EXPECT_GT(derived->fwd_ms + derived->bwd_ms,
            1.02 * (mapped->fwd_ms + mapped->bwd_ms));
}

TEST_F(ProfileDirTest, LoadsMeasuredFilesWithCanonicalIds) {
  Write("measured/a.csv", std::string(kHeader) +
                              "m,dense,a100,1,1,2048,1,2,0,1,1,measured\n");
  Write("measured/b.csv", std::string(kHeader) +
                              "m,dense,H100-80GB,1,1,2048,1,2,0,1,1,measured\n");
  Write("measured/readme.txt", "not a csv");
  ProfileStore store;
  ASSERT_TRUE(LoadProfileFiles(dir_.string(), SmallCatalog(), &store).ok());
  EXPECT_EQ(store.size(), 2u);
  ProfileKey k{"m", LayerKind::kDense, "A100-80GB", 1, 1, 2048};
  ASSERT_NE(store.Find(k), nullptr);
  EXPECT_EQ(store.Find(k)->source, ProfileSource::kMeasured);
}

TEST_F(ProfileDirTest, UnknownGpuNamesFileAndLine) {
  Write("measured/a.csv", std::string(kHeader) + "\n" +
                              "m,dense,A100-80GB,1,1,2048,1,2,0,1,1,measured\n"
                              "m,dense,TPUv5,1,1,2048,1,2,0,1,1,measured\n");
  ProfileStore store;
  absl::Status s = LoadProfileFiles(dir_.string(), SmallCatalog(), &store);
  ASSERT_FALSE(s.ok());
  EXPECT_THAT(std::string(s.message()), HasSubstr("measured/a.csv: line 4"));
  EXPECT_THAT(std::string(s.message()), HasSubstr("TPUv5"));
}

TEST_F(ProfileDirTest, DuplicatesAcrossFilesAreErrors) {
  Write("measured/a.csv", std::string(kHeader) +
                              "m,dense,A100-80GB,1,1,2048,1,2,0,1,1,measured\n");
  Write("measured/b.csv", std::string(kHeader) +
                              "m,dense,a100,1,1,2048,1,2,0,1,1,measured\n");
  ProfileStore store;
  absl::Status s = LoadProfileFiles(dir_.string(), SmallCatalog(), &store);
  ASSERT_FALSE(s.ok());
  EXPECT_THAT(std::string(s.message()), HasSubstr("measured/b.csv: line 2"));
  EXPECT_THAT(std::string(s.message()), HasSubstr("duplicate"));
  EXPECT_THAT(std::string(s.message()), HasSubstr("measured/a.csv: line 2"));
}

TEST(Calibration, ShippedFileResolvesEveryCatalogGpuByTheRule) {
  absl::StatusOr<GpuCatalog> catalog = LoadGpuCatalog();
  ASSERT_TRUE(catalog.ok()) << catalog.status();
  absl::StatusOr<CalibrationSet> set = LoadCalibration();
  ASSERT_TRUE(set.ok()) << set.status();
  EXPECT_EQ(set->fitted.size(), 5u);
  for (const GpuType& t : catalog->types()) {
    SCOPED_TRACE(t.id);
    EXPECT_TRUE(set->by_gpu.contains(t.id));
    EXPECT_NE(set->For(t), set->defaults);
  }
  // Unfitted types get the unmeasured-GPU rule (synthesizer_fit.h), not a copy:
  // the power-limited T4 sits below the V100 the old mapping copied.
  EXPECT_TRUE(set->mapping.empty());
  EXPECT_EQ(set->derived.size(), catalog->types().size() - 5);
  EXPECT_TRUE(set->rule.has_value());
  EXPECT_LT(set->For("T4").gemm_eff_max, set->For("V100-16GB").gemm_eff_max);
  EXPECT_NE(set->For("H100-80GB"), set->For("A100-80GB"));
  EXPECT_EQ(&set->For("no-such-gpu"), &set->defaults);
}

const std::string kMappingCalibration =
    std::string(ARACHNE_SOURCE_DIR) +
    "/profiles/reference/calibration-mapping.json";

TEST(Calibration, ReferenceMappingFileCopiesAFittedType) {
  absl::StatusOr<GpuCatalog> catalog = LoadGpuCatalog();
  ASSERT_TRUE(catalog.ok()) << catalog.status();
  absl::StatusOr<std::string> text = ReadFileToString(kMappingCalibration);
  ASSERT_TRUE(text.ok()) << text.status();
  absl::StatusOr<CalibrationSet> set =
      ParseCalibrationJson(*text, "calibration-mapping.json");
  ASSERT_TRUE(set.ok()) << set.status();
  EXPECT_EQ(set->fitted.size(), 5u);
  for (const GpuType& t : catalog->types()) {
    SCOPED_TRACE(t.id);
    EXPECT_TRUE(set->by_gpu.contains(t.id));
    EXPECT_NE(set->For(t), set->defaults);
  }
  // The old mapping rule: unfitted types copy a fitted one.
  EXPECT_FALSE(set->rule.has_value());
  EXPECT_TRUE(set->derived.empty());
  EXPECT_EQ(set->mapping.size(), catalog->types().size() - 5);
  EXPECT_EQ(set->mapping.at("H100-80GB"), "A100-80GB");
  EXPECT_EQ(set->For("H100-80GB"), set->For("A100-80GB"));
  EXPECT_EQ(set->For("T4"), set->For("V100-16GB"));
  // Not built in: only the default calibration.json is embedded.
  EXPECT_TRUE(
      ReadDataFile("reference/calibration-mapping.json", "").status().code() ==
      absl::StatusCode::kNotFound);
}

TEST(Calibration, JsonErrorsAndRoundTrip) {
  auto bad = ParseCalibrationJson(R"({"fitted": {"A": {"params": {"mem_eff": "x"}}}})",
                                  "c.json");
  ASSERT_FALSE(bad.ok());
  EXPECT_THAT(std::string(bad.status().message()), HasSubstr("c.json: fitted.A.params.mem_eff"));
  auto unknown = ParseCalibrationJson(R"({"fitted": {"A": {"params": {"speed": 1}}}})");
  ASSERT_FALSE(unknown.ok());
  EXPECT_THAT(std::string(unknown.status().message()), HasSubstr("speed: unknown parameter"));
  auto map = ParseCalibrationJson(
      R"({"fitted": {"A": {"params": {"mem_eff": 0.5}}}, "mapping": {"B": "C"}})");
  ASSERT_FALSE(map.ok());
  EXPECT_THAT(std::string(map.status().message()), HasSubstr("mapping.B"));

  CalibrationReport r;
  GpuFit g;
  g.gpu_id = "A";
  g.params.mem_eff = 0.123456789012345678;
  g.params.layer_overhead_us = 77;
  r.gpus.push_back(g);
  r.mapping["B"] = "A";
  DerivedGpu d;
  d.gpu_id = "C";
  d.params.gemm_eff_max = 0.4321;
  r.derived.push_back(d);
  r.rule = UnmeasuredGpuRule{};
  r.rule->gemm_eff_per_matmul = 0.87654321;
  r.rule->donors = {"A"};
  auto set = ParseCalibrationJson(CalibrationReportToJson(r));
  ASSERT_TRUE(set.ok()) << set.status();
  EXPECT_EQ(set->For("A"), g.params);
  EXPECT_EQ(set->For("B"), g.params);
  EXPECT_EQ(set->For("C"), d.params);
  EXPECT_EQ(set->derived, std::vector<std::string>{"C"});
  ASSERT_TRUE(set->rule.has_value());
  EXPECT_EQ(*set->rule, *r.rule);
  EXPECT_EQ(set->For("Z"), CalibrationParams{});
}

}  // namespace
}  // namespace arachne
