#include "planner_service/io/gpu_catalog_io.h"

#include <filesystem>
#include <fstream>
#include <string>

#include "absl/status/status.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace arachne {
namespace {

using ::testing::HasSubstr;

const GpuType& Type(const GpuCatalog& c, const char* name) {
  absl::StatusOr<int> i = c.IndexOf(name);
  EXPECT_TRUE(i.ok()) << i.status();
  return c.type(i.ok() ? *i : 0);
}

TEST(GpuCatalogIoTest, BuiltInCatalogHasEveryCanonicalId) {
  absl::StatusOr<GpuCatalog> c = LoadGpuCatalog();
  ASSERT_TRUE(c.ok()) << c.status();
  const std::vector<std::string> ids = {
      "A100-40GB", "A100-80GB", "H100-80GB",    "H200-141GB",   "B200",
      "A6000",     "A5000",     "RTX-6000-ADA", "RTX-PRO-6000", "L40S",
      "L4",        "A10",       "A10G",         "V100-32GB",    "V100-16GB",
      "T4",        "P100",      "P40",          "RTX-3090",     "MI300X"};
  EXPECT_EQ(c->size(), static_cast<int>(ids.size()));
  for (const std::string& id : ids) {
    absl::StatusOr<int> i = c->IndexOf(id);
    ASSERT_TRUE(i.ok()) << id;
    EXPECT_EQ(c->type(*i).id, id);
    EXPECT_FALSE(c->type(*i).source.empty()) << id;
    EXPECT_FALSE(c->type(*i).product_name.empty()) << id;
    EXPECT_FALSE(c->type(*i).intra_node_link.empty()) << id;
  }
  EXPECT_EQ(Type(*c, "H100-80GB").architecture, "hopper");
  EXPECT_EQ(Type(*c, "H200-141GB").architecture, "hopper");
  EXPECT_EQ(Type(*c, "A100-80GB").architecture, "ampere");
  EXPECT_EQ(Type(*c, "V100-16GB").architecture, "volta");
  EXPECT_EQ(Type(*c, "B200").architecture, "blackwell");
  EXPECT_EQ(Type(*c, "MI300X").architecture, "cdna3");
}

TEST(GpuCatalogIoTest, AliasesResolveCaseInsensitively) {
  GpuCatalog c = *LoadGpuCatalog();
  const std::vector<std::pair<const char*, const char*>> cases = {
      {"A100-40", "A100-40GB"},
      {"a100", "A100-40GB"},
      {"A100-80", "A100-80GB"},
      {"H100", "H100-80GB"},
      {"h100-sxm", "H100-80GB"},
      {"H200", "H200-141GB"},
      {"RTX-A6000", "A6000"},
      {"a5000", "A5000"},
      {"RTX-3090", "RTX-3090"},
      {"3090", "RTX-3090"},
      {"MI300", "MI300X"},
      {"v100", "V100-32GB"},
      {"rtx 6000 ada", "RTX-6000-ADA"}};
  for (const auto& [alias, id] : cases) {
    EXPECT_EQ(Type(c, alias).id, id) << alias;
  }
  absl::StatusOr<int> unknown = c.IndexOf("H300");
  EXPECT_EQ(unknown.status().code(), absl::StatusCode::kNotFound);
  EXPECT_THAT(std::string(unknown.status().message()), HasSubstr("A100-40GB"));
}

TEST(GpuCatalogIoTest, FiguresFollowFactsAndBrief) {
  GpuCatalog c = *LoadGpuCatalog();
  const GpuType& h100 = Type(c, "H100-80GB");
  EXPECT_DOUBLE_EQ(h100.peak_bf16_tflops, 989.4);
  EXPECT_DOUBLE_EQ(h100.peak_fp32_tflops, 66.9);
  EXPECT_DOUBLE_EQ(h100.memory_gib, 80);
  EXPECT_DOUBLE_EQ(h100.hbm_gbps, 3350);
  EXPECT_DOUBLE_EQ(h100.intra_node_gbps, 450);
  EXPECT_EQ(h100.intra_node_link, "NVLink4");
  EXPECT_DOUBLE_EQ(h100.usd_per_hour, 3.78);  // cheaper of AWS / Lambda
  EXPECT_DOUBLE_EQ(Type(c, "A100-40GB").intra_node_gbps, 300);
  EXPECT_DOUBLE_EQ(Type(c, "A100-40GB").usd_per_hour, 1.48);
  EXPECT_DOUBLE_EQ(Type(c, "A100-40GB").hbm_gbps, 1555);
  EXPECT_DOUBLE_EQ(Type(c, "A100-80GB").hbm_gbps, 2039);
  EXPECT_DOUBLE_EQ(Type(c, "H200").intra_node_gbps, 450);
  EXPECT_DOUBLE_EQ(Type(c, "H200").memory_gib, 141);
  EXPECT_DOUBLE_EQ(Type(c, "B200").intra_node_gbps, 900);
  EXPECT_DOUBLE_EQ(Type(c, "V100-32GB").intra_node_gbps, 150);
  EXPECT_DOUBLE_EQ(Type(c, "V100-32GB").peak_bf16_tflops, 125);
  EXPECT_DOUBLE_EQ(Type(c, "A6000").peak_bf16_tflops, 154.8);
  EXPECT_DOUBLE_EQ(Type(c, "A6000").intra_node_gbps, 24);
  EXPECT_EQ(Type(c, "A6000").intra_node_link, "PCIe4");
  EXPECT_DOUBLE_EQ(Type(c, "A5000").peak_bf16_tflops, 111);
  EXPECT_DOUBLE_EQ(Type(c, "RTX-PRO-6000").intra_node_gbps, 32);
  EXPECT_EQ(Type(c, "RTX-PRO-6000").intra_node_link, "PCIe5");
  EXPECT_DOUBLE_EQ(Type(c, "RTX-PRO-6000").memory_gib, 96);
  EXPECT_DOUBLE_EQ(Type(c, "T4").intra_node_gbps, 12);
  EXPECT_DOUBLE_EQ(Type(c, "T4").peak_bf16_tflops, 65);
  EXPECT_DOUBLE_EQ(Type(c, "T4").usd_per_hour, 0.59);
  EXPECT_DOUBLE_EQ(Type(c, "L40S").usd_per_hour, 1.95);
  EXPECT_DOUBLE_EQ(Type(c, "MI300X").intra_node_gbps, 128);
  EXPECT_DOUBLE_EQ(Type(c, "MI300X").memory_gib, 192);
  // P40 has no fast fp16: its 16-bit figure is the fp32 one.
  EXPECT_DOUBLE_EQ(Type(c, "P40").peak_bf16_tflops, 11.8);
  EXPECT_DOUBLE_EQ(Type(c, "P40").peak_fp32_tflops, 11.8);
  EXPECT_DOUBLE_EQ(Type(c, "P100").peak_bf16_tflops, 18.7);
  EXPECT_DOUBLE_EQ(Type(c, "RTX-3090").peak_bf16_tflops, 71);
  EXPECT_DOUBLE_EQ(Type(c, "V100-16GB").memory_gib, 16);
  for (const char* id : {"P100", "P40", "RTX-3090", "V100-16GB"}) {
    EXPECT_THAT(Type(c, id).source,
                HasSubstr("NVIDIA datasheet: "))
        << id;
  }
  for (const char* id : {"H200", "B200", "A5000", "MI300X", "RTX-3090"}) {
    EXPECT_THAT(Type(c, id).source, HasSubstr("estimate")) << id;
  }
  EXPECT_THAT(Type(c, "MI300X").source, HasSubstr("896"));
}

TEST(GpuCatalogIoTest, ToJsonRoundTrips) {
  GpuCatalog c = *LoadGpuCatalog();
  nlohmann::json rows = nlohmann::json::array();
  for (const GpuType& t : c.types()) rows.push_back(GpuTypeToJson(t));
  absl::StatusOr<GpuCatalog> again =
      ParseGpuCatalog(nlohmann::json{{"gpus", rows}}.dump(), "dump.json");
  ASSERT_TRUE(again.ok()) << again.status();
  ASSERT_EQ(again->size(), c.size());
  for (int i = 0; i < c.size(); ++i) {
    EXPECT_EQ(GpuTypeToJson(again->type(i)), GpuTypeToJson(c.type(i)));
  }
}

constexpr char kOneGpu[] = R"(
gpus:
  - id: X1
    aliases: [x]
    product_name: Test GPU
    architecture: ampere
    peak_bf16_tflops: 100
    peak_fp32_tflops: 10
    memory_gib: 16
    hbm_gbps: 500
    intra_node_gbps: 24
    intra_node_link: PCIe4
    default_gpus_per_node: 4
    usd_per_hour: 0
    source: test
)";

TEST(GpuCatalogIoTest, ParsesAMinimalCatalog) {
  absl::StatusOr<GpuCatalog> c = ParseGpuCatalog(kOneGpu, "gpus.yaml");
  ASSERT_TRUE(c.ok()) << c.status();
  EXPECT_EQ(c->size(), 1);
  EXPECT_EQ(Type(*c, "X").id, "X1");
  EXPECT_EQ(c->type(0).default_gpus_per_node, 4);
}

TEST(GpuCatalogIoTest, ErrorsNameSourceAndField) {
  std::string text = kOneGpu;
  auto replace = [](std::string s, const std::string& from,
                    const std::string& to) {
    s.replace(s.find(from), from.size(), to);
    return s;
  };
  absl::StatusOr<GpuCatalog> c = ParseGpuCatalog(
      replace(text, "memory_gib: 16", "memory_gib: 0"), "gpus.yaml");
  EXPECT_EQ(c.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(std::string(c.status().message()),
            "gpus.yaml: gpus[0].memory_gib: must be a number > 0, got 0");

  c = ParseGpuCatalog(replace(text, "hbm_gbps", "hbm_gbs"), "gpus.yaml");
  EXPECT_THAT(std::string(c.status().message()),
              HasSubstr("gpus.yaml: gpus[0]: unknown field \"hbm_gbs\""));

  c = ParseGpuCatalog(replace(text, "    source: test\n", ""), "gpus.yaml");
  EXPECT_EQ(std::string(c.status().message()),
            "gpus.yaml: gpus[0]: missing required field \"source\"");

  c = ParseGpuCatalog(
      replace(text, "default_gpus_per_node: 4", "default_gpus_per_node: 4.5"),
      "gpus.yaml");
  EXPECT_THAT(
      std::string(c.status().message()),
      HasSubstr("gpus[0].default_gpus_per_node: must be an integer, got 4.5"));
  c = ParseGpuCatalog(
      replace(text, "default_gpus_per_node: 4", "default_gpus_per_node: 0"),
      "gpus.yaml");
  EXPECT_THAT(
      std::string(c.status().message()),
      HasSubstr("gpus[0].default_gpus_per_node: must be an integer > 0, got 0"));

  // Duplicate names are caught by GpuCatalog::Create; the source is added.
  c = ParseGpuCatalog(replace(text, "aliases: [x]", "aliases: [x, X1]") +
                          replace(replace(text, "gpus:\n", ""), "X1", "X2"),
                      "gpus.yaml");
  EXPECT_EQ(c.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(std::string(c.status().message()),
              HasSubstr("gpus.yaml: gpu X2"));

  c = ParseGpuCatalog(replace(text, "    architecture: ampere\n", ""),
                      "gpus.yaml");
  EXPECT_EQ(std::string(c.status().message()),
            "gpus.yaml: gpus[0]: missing required field \"architecture\"");
  c = ParseGpuCatalog(
      replace(text, "architecture: ampere", "architecture: hopper2"),
      "gpus.yaml");
  EXPECT_EQ(c.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(std::string(c.status().message()),
            "gpus.yaml: gpus[0].architecture: must be one of pascal, volta, "
            "turing, ampere, ada, hopper, blackwell, cdna3, got \"hopper2\"");

  c = ParseGpuCatalog("gpus: []\n", "gpus.yaml");
  EXPECT_EQ(std::string(c.status().message()),
            "gpus.yaml: gpus: must not be empty");
}

TEST(GpuCatalogIoTest, ProfilesDirOverridesBuiltIn) {
  std::filesystem::path dir =
      std::filesystem::temp_directory_path() / "arachne_gpu_catalog_io_test";
  std::filesystem::create_directories(dir);
  std::ofstream(dir / "gpus.yaml") << kOneGpu;
  absl::StatusOr<GpuCatalog> c = LoadGpuCatalog(dir.string());
  ASSERT_TRUE(c.ok()) << c.status();
  EXPECT_EQ(c->size(), 1);
  // A directory without gpus.yaml falls back to the built-in catalog.
  std::filesystem::remove(dir / "gpus.yaml");
  c = LoadGpuCatalog(dir.string());
  ASSERT_TRUE(c.ok()) << c.status();
  EXPECT_EQ(c->size(), 20);
  std::filesystem::remove_all(dir);
}

}  // namespace
}  // namespace arachne
