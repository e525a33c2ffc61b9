// Every shipped example cluster parses and has the GPU counts its comment
// states.
#include <filesystem>
#include <map>
#include <string>

#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "planner_service/io/cluster_io.h"
#include "planner_service/io/gpu_catalog_io.h"

namespace arachne {
namespace {

const std::string kExamples = std::string(ARACHNE_SOURCE_DIR) + "/examples/";

struct Expected {
  int total;
  std::map<std::string, int> by_type;
  int nodes;
};

std::map<std::string, Expected> ExpectedClusters() {
  return {
      {"paper-512.yaml",
       {512, {{"A100-40GB", 128}, {"A6000", 128}, {"H100-80GB", 256}}, 128}},
      {"paper-256.yaml",
       {256, {{"A100-40GB", 64}, {"A6000", 64}, {"H100-80GB", 128}}, 64}},
      {"paper-128.yaml",
       {128, {{"A100-40GB", 32}, {"A6000", 32}, {"H100-80GB", 64}}, 32}},
      {"a100-h100-64.yaml", {64, {{"A100-40GB", 32}, {"H100-80GB", 32}}, 16}},
      {"a100-h100-160.yaml", {160, {{"A100-40GB", 80}, {"H100-80GB", 80}}, 40}},
      {"a100-h100-256.yaml",
       {256, {{"A100-40GB", 128}, {"H100-80GB", 128}}, 64}},
      {"nonuniform-ls1.yaml",
       {52, {{"A100-40GB", 16}, {"A100-80GB", 12}, {"H100-80GB", 24}}, 22}},
      {"testbed-19.yaml",
       {19, {{"RTX-PRO-6000", 3}, {"A6000", 12}, {"A5000", 4}}, 5}},
      {"small-8.yaml", {8, {{"A100-40GB", 4}, {"A6000", 4}}, 2}},
      {"mix5-52.yaml",
       {52,
        {{"H100-80GB", 16}, {"A100-80GB", 8}, {"A100-40GB", 12},
         {"A6000", 8}, {"L40S", 8}},
        10}},
      {"mix8-96.yaml",
       {96,
        {{"H200-141GB", 8}, {"H100-80GB", 16}, {"A100-80GB", 8},
         {"A100-40GB", 16}, {"L40S", 8}, {"RTX-6000-ADA", 8}, {"A6000", 16},
         {"V100-32GB", 16}},
        18}},
  };
}

TEST(ExampleClustersTest, EveryExampleParsesWithStatedCounts) {
  GpuCatalog catalog = *LoadGpuCatalog();
  const auto expected = ExpectedClusters();
  int seen = 0;
  for (const auto& entry : std::filesystem::directory_iterator(kExamples)) {
    const std::string file = entry.path().filename().string();
    if (entry.path().extension() != ".yaml") continue;
    SCOPED_TRACE(file);
    // Only cluster files live in examples/ itself (jobs are in examples/jobs/).
    auto it = expected.find(file);
    ASSERT_NE(it, expected.end()) << "no expectation for " << file;
    ++seen;
    absl::StatusOr<Cluster> c = LoadClusterFile(entry.path().string(), catalog);
    ASSERT_TRUE(c.ok()) << c.status();
    EXPECT_EQ(c->total_gpus(), it->second.total);
    EXPECT_EQ(c->num_nodes(), it->second.nodes);
    int sum = 0;
    for (const auto& [type, count] : it->second.by_type) {
      EXPECT_EQ(c->GpusOfType(*catalog.IndexOf(type)), count) << type;
      sum += count;
    }
    EXPECT_EQ(sum, it->second.total);
    EXPECT_EQ(static_cast<int>(c->types_present().size()),
              static_cast<int>(it->second.by_type.size()));
  }
  EXPECT_EQ(seen, static_cast<int>(expected.size()));
}

TEST(ExampleClustersTest, NonuniformMixesNodeSizes) {
  GpuCatalog catalog = *LoadGpuCatalog();
  Cluster c = *LoadClusterFile(kExamples + "nonuniform-ls1.yaml", catalog);
  int one = 0, four = 0;
  for (const Node& n : c.nodes()) (n.num_gpus == 1 ? one : four) += 1;
  EXPECT_EQ(one, 12);
  EXPECT_EQ(four, 10);
  EXPECT_EQ(c.node(3).name, "a100-40gb-3");
  EXPECT_EQ(c.node(3).num_gpus, 1);
}

TEST(ExampleClustersTest, TestbedHasThreeGpuNode) {
  GpuCatalog catalog = *LoadGpuCatalog();
  Cluster c = *LoadClusterFile(kExamples + "testbed-19.yaml", catalog);
  EXPECT_EQ(c.node(0).num_gpus, 3);
  EXPECT_EQ(c.MaxNodeSizeOfType(*catalog.IndexOf("RTX-PRO-6000")), 3);
  for (const Node& n : c.nodes()) EXPECT_DOUBLE_EQ(n.nic_gbps, 100);
}

}  // namespace
}  // namespace arachne
