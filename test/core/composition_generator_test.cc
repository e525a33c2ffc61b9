// The training-composition generator: determinism, bounds, exclusion of
// given compositions (the bench suite), config validation.
#include "planner_service/core/planners/composition_generator.h"

#include <set>
#include <string>
#include <vector>

#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "planner_service/io/gpu_catalog_io.h"
#include "planner_service/io/scenario_io.h"
#include "test/core/toy_fixture.h"

namespace arachne {
namespace {

using ::arachne::testing::kFast;
using ::arachne::testing::kSlow;
using ::arachne::testing::MakeCluster;
using ::testing::HasSubstr;
using ::testing::UnorderedElementsAre;

class CompositionGeneratorTest : public ::testing::Test {
 protected:
  void SetUp() override {
    auto catalog = LoadGpuCatalog();
    ASSERT_TRUE(catalog.ok()) << catalog.status();
    catalog_ = *std::move(catalog);
    for (const char* id : {"A100-40GB", "A100-80GB", "H100-80GB", "A6000"}) {
      auto t = catalog_.IndexOf(id);
      ASSERT_TRUE(t.ok()) << t.status();
      types_.push_back(*t);
    }
  }
  CompositionGenerator Make(CompositionGeneratorConfig config,
                            const std::vector<Cluster>& excluded = {}) {
    auto g =
        CompositionGenerator::Create(catalog_, std::move(config), excluded);
    CHECK(g.ok()) << g.status();
    return *std::move(g);
  }

  GpuCatalog catalog_;
  std::vector<int> types_;
};

// Everything that identifies a generated cluster.
std::vector<std::string> Describe(const std::vector<Cluster>& clusters) {
  std::vector<std::string> out;
  for (const Cluster& c : clusters) {
    std::string s;
    for (const Node& n : c.nodes())
      s += n.name + ":" + std::to_string(n.gpu_type) + ":" +
           std::to_string(n.num_gpus) + ":" + std::to_string(n.nic_gbps) + ";";
    out.push_back(s);
  }
  return out;
}

TEST_F(CompositionGeneratorTest, SameSeedSameCompositions) {
  const CompositionGenerator gen = Make({.gpu_types = types_});
  auto a = gen.Generate(40, 17);
  auto b = gen.Generate(40, 17);
  auto c = gen.Generate(40, 18);
  ASSERT_TRUE(a.ok() && b.ok() && c.ok());
  EXPECT_EQ(Describe(*a), Describe(*b));
  EXPECT_NE(Describe(*a), Describe(*c));
  // A batch is a prefix of a longer batch of the same seed.
  auto longer = gen.Generate(50, 17);
  ASSERT_TRUE(longer.ok());
  std::vector<std::string> prefix = Describe(*longer);
  prefix.resize(40);
  EXPECT_EQ(Describe(*a), prefix);
}

TEST_F(CompositionGeneratorTest, CompositionsStayInBoundsAndVary) {
  const CompositionGenerator gen = Make({.gpu_types = types_});
  auto clusters = gen.Generate(300, 5);
  ASSERT_TRUE(clusters.ok()) << clusters.status();
  std::set<CompositionKey> keys;
  std::set<int> type_counts, node_sizes, dominant;
  std::set<double> nics;
  int mixed = 0, small = 0, large = 0;
  for (const Cluster& c : *clusters) {
    EXPECT_GE(c.total_gpus(), 8);
    EXPECT_LE(c.total_gpus(), 512);
    small += c.total_gpus() <= 64;
    large += c.total_gpus() > 256;
    const int k = static_cast<int>(c.types_present().size());
    EXPECT_GE(k, 2);
    EXPECT_LE(k, 4);
    type_counts.insert(k);
    int most = -1;
    for (int t : c.types_present()) {
      EXPECT_THAT(types_, ::testing::Contains(t));
      if (most < 0 || c.GpusOfType(t) > c.GpusOfType(most)) most = t;
      std::set<int> sizes_of_type;
      for (const Node& n : c.nodes())
        if (n.gpu_type == t) sizes_of_type.insert(n.num_gpus);
      mixed += sizes_of_type.size() > 1;
    }
    dominant.insert(most);
    for (const Node& n : c.nodes()) {
      EXPECT_THAT(n.num_gpus, ::testing::AnyOf(1, 2, 4, 8));
      node_sizes.insert(n.num_gpus);
      nics.insert(n.nic_gbps);
      EXPECT_EQ(n.nic_gbps, c.node(0).nic_gbps);
    }
    keys.insert(CompositionKeyOf(c));
  }
  EXPECT_EQ(keys.size(), 300u);  // pairwise distinct
  EXPECT_EQ(type_counts, (std::set<int>{2, 3, 4}));
  EXPECT_EQ(node_sizes, (std::set<int>{1, 2, 4, 8}));
  EXPECT_EQ(dominant.size(), 4u);  // every type holds the most GPUs somewhere
  EXPECT_EQ(nics, (std::set<double>{50, 100, 200}));
  EXPECT_GT(mixed, 0);
  EXPECT_GT(small, 0);
  EXPECT_GT(large, 0);
}

TEST_F(CompositionGeneratorTest, NeverEmitsAnExcludedComposition) {
  // Toy catalog, 8-GPU nodes, 16-24 GPUs: the only compositions are
  // F8+S8 (16), 2xF8+S8 and F8+2xS8 (24). Excluding F8+S8 (under other node
  // names, order and NIC) leaves the two 24-GPU ones, and a third is
  // impossible.
  const GpuCatalog toy = testing::ToyCatalog();
  std::vector<Node> nodes = {
      {.name = "x", .gpu_type = kSlow, .num_gpus = 8},
      {.name = "y", .gpu_type = kFast, .num_gpus = 8, .nic_gbps = 400}};
  auto excluded = Cluster::Create(nodes, toy);
  ASSERT_TRUE(excluded.ok());
  auto gen = CompositionGenerator::Create(toy,
                                          {.gpu_types = {kFast, kSlow},
                                           .min_types = 2,
                                           .max_types = 2,
                                           .min_gpus = 16,
                                           .max_gpus = 24,
                                           .node_sizes = {8},
                                           .max_attempts = 2000},
                                          {*excluded});
  ASSERT_TRUE(gen.ok()) << gen.status();
  auto two = gen->Generate(2, 1);
  ASSERT_TRUE(two.ok()) << two.status();
  std::vector<CompositionKey> keys;
  for (const Cluster& c : *two) keys.push_back(CompositionKeyOf(c));
  EXPECT_THAT(
      keys, UnorderedElementsAre(CompositionKey{{kFast, 8, 2}, {kSlow, 8, 1}},
                                 CompositionKey{{kFast, 8, 1}, {kSlow, 8, 2}}));
  auto three = gen->Generate(3, 1);
  EXPECT_EQ(three.status().code(), absl::StatusCode::kResourceExhausted);
  EXPECT_THAT(three.status().message(),
              HasSubstr("no new composition outside the excluded ones after "
                        "2000 draws (composition 2 of 3)"));
}

TEST_F(CompositionGeneratorTest, NeverEmitsABenchComposition) {
  auto suite = LoadScenarioSuite(
      std::string(ARACHNE_SOURCE_DIR) + "/bench/scenarios", {}, catalog_);
  ASSERT_TRUE(suite.ok()) << suite.status();
  std::vector<Cluster> bench;
  for (const Scenario& s : *suite)
    for (const Composition& c : s.compositions) bench.push_back(c.cluster);
  ASSERT_GT(bench.size(), 40u);
  const CompositionGenerator gen = Make({.gpu_types = types_}, bench);
  auto clusters = gen.Generate(500, 9);
  ASSERT_TRUE(clusters.ok()) << clusters.status();
  std::set<CompositionKey> bench_keys;
  for (const Cluster& c : bench) bench_keys.insert(CompositionKeyOf(c));
  for (const Cluster& c : *clusters)
    EXPECT_FALSE(bench_keys.contains(CompositionKeyOf(c)));
}

TEST_F(CompositionGeneratorTest, CompositionKeyIgnoresNamesOrderAndNic) {
  const GpuCatalog toy = testing::ToyCatalog();
  const Cluster a = MakeCluster(toy, {{kFast, 4}, {kSlow, 1}, {kFast, 4}});
  const Cluster b = MakeCluster(toy, {{kSlow, 1}, {kFast, 4}, {kFast, 4}});
  EXPECT_EQ(CompositionKeyOf(a), CompositionKeyOf(b));
  EXPECT_EQ(CompositionKeyOf(a),
            (CompositionKey{{kFast, 4, 2}, {kSlow, 1, 1}}));
  EXPECT_NE(CompositionKeyOf(a),
            CompositionKeyOf(MakeCluster(toy, {{kFast, 8}, {kSlow, 1}})));
}

TEST_F(CompositionGeneratorTest, CreateRejectsBadConfigs) {
  auto error = [&](CompositionGeneratorConfig config) {
    return CompositionGenerator::Create(catalog_, std::move(config), {})
        .status();
  };
  absl::Status s = error({.gpu_types = {types_[0], types_[0]}});
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(s.message(), HasSubstr("gpu_types[1]: repeated type index, got"));
  EXPECT_THAT(error({.gpu_types = {999, types_[0]}}).message(),
              HasSubstr("gpu_types[0]: not a catalog type index, got 999"));
  EXPECT_THAT(
      error({.gpu_types = {types_[0]}}).message(),
      HasSubstr("gpu_types: must hold at least min_types = 2 types, got 1"));
  EXPECT_THAT(error({.gpu_types = types_, .min_types = 5}).message(),
              HasSubstr("min_types: must be in [1, max_types = 4], got 5"));
  EXPECT_THAT(
      error({.gpu_types = types_, .min_gpus = 64, .max_gpus = 32}).message(),
      HasSubstr("max_gpus: must be >= min_gpus = 64, got 32"));
  EXPECT_THAT(error({.gpu_types = types_, .node_sizes = {4, 65}}).message(),
              HasSubstr("node_sizes[1]: must be in [1, 64], got 65"));
  EXPECT_THAT(
      error({.gpu_types = types_, .mixed_node_size_probability = 1.5})
          .message(),
      HasSubstr("mixed_node_size_probability: must be in [0, 1], got 1.5"));
  EXPECT_THAT(
      error({.gpu_types = types_, .inter_node_gbps = {100, 0}}).message(),
      HasSubstr("inter_node_gbps[1]: must be > 0, got 0"));
}

}  // namespace
}  // namespace arachne
