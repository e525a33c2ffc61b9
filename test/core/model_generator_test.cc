// Generated model shapes for the model-conditioned policy: valid,
// deterministic for a seed, spread over dense and MoE, plannable on
// synthesized profiles, and bad configs named.
#include "planner_service/core/model/model_generator.h"

#include <set>
#include <vector>

#include "absl/strings/str_cat.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "planner_service/core/learned/construction_env.h"
#include "planner_service/io/gpu_catalog_io.h"
#include "planner_service/io/planning_context.h"

namespace arachne {
namespace {

using ::testing::HasSubstr;

TEST(ModelGeneratorTest, ShapesAreValidDeterministicAndMixed) {
  auto a = GenerateModelShapes({}, 200, 7);
  ASSERT_TRUE(a.ok()) << a.status();
  auto b = GenerateModelShapes({}, 200, 7);
  ASSERT_TRUE(b.ok());
  ASSERT_EQ(a->size(), 200u);
  int moe = 0;
  std::set<int> layers;
  for (size_t i = 0; i < a->size(); ++i) {
    const ModelSpec& m = (*a)[i];
    EXPECT_TRUE(m.Validate().ok()) << m.name;
    EXPECT_EQ(m.name, absl::StrCat("generated-", i));
    EXPECT_EQ(m.hidden % 128, 0) << m.name;
    EXPECT_GE(m.num_layers, 12);
    EXPECT_LE(m.num_layers, 96);
    EXPECT_GE(m.hidden, 1536);
    EXPECT_LE(m.hidden, 12288);
    EXPECT_EQ(m.num_layers, (*b)[i].num_layers);
    EXPECT_EQ(m.hidden, (*b)[i].hidden);
    EXPECT_EQ(m.moe.num_experts, (*b)[i].moe.num_experts);
    if (m.is_moe()) ++moe;
    layers.insert(m.num_layers);
  }
  // moe_share 0.35 of 200: well inside [40, 100] for any seed's draw.
  EXPECT_GT(moe, 40);
  EXPECT_LT(moe, 100);
  EXPECT_GT(layers.size(), 30u);
  auto other = GenerateModelShapes({}, 200, 8);
  ASSERT_TRUE(other.ok());
  int same = 0;
  for (size_t i = 0; i < other->size(); ++i)
    same += (*other)[i].hidden == (*a)[i].hidden &&
            (*other)[i].num_layers == (*a)[i].num_layers;
  EXPECT_LT(same, 20);
}

TEST(ModelGeneratorTest, GeneratedShapesArePlannedOnSynthesizedProfiles) {
  auto catalog = LoadGpuCatalog("");
  ASSERT_TRUE(catalog.ok()) << catalog.status();
  auto shapes = GenerateModelShapes({}, 6, 3);
  ASSERT_TRUE(shapes.ok());
  auto h100 = catalog->IndexOf("H100-80GB");
  ASSERT_TRUE(h100.ok());
  std::vector<Node> nodes;
  for (int n = 0; n < 8; ++n)
    nodes.push_back({.name = absl::StrCat("h", n), .gpu_type = *h100,
                     .num_gpus = 8});
  auto cluster = Cluster::Create(nodes, *catalog);
  ASSERT_TRUE(cluster.ok()) << cluster.status();
  for (const ModelSpec& m : *shapes) {
    auto ctx = PlanningContext::Create(*catalog, m, TrainingConfig{}, *cluster,
                                       "");
    ASSERT_TRUE(ctx.ok()) << m.name << ": " << ctx.status();
    auto env = ConstructionEnv::Create((*ctx)->cost_model(), {});
    ASSERT_TRUE(env.ok()) << m.name << ": " << env.status();
    EXPECT_FLOAT_EQ(env->ModelSummary()[env_model_feature::kMoe],
                    m.is_moe() ? 1 : 0);
  }
}

TEST(ModelGeneratorTest, BadConfigNamesTheField) {
  EXPECT_THAT(GenerateModelShapes({}, -1, 1).status().message(),
              HasSubstr("count must be >= 0, got -1"));
  ModelGeneratorConfig c;
  c.max_layers = 4;
  absl::Status s = GenerateModelShapes(c, 1, 1).status();
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(s.message(), HasSubstr("max_layers must be in [min_layers=12"));
  c = {};
  c.moe_share = 1.5;
  EXPECT_THAT(GenerateModelShapes(c, 1, 1).status().message(),
              HasSubstr("moe_share must be in [0, 1], got 1.5"));
}

}  // namespace
}  // namespace arachne
