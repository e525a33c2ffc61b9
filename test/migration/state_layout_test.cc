#include "migration/core/state_layout.h"

#include <set>

#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "test/migration/migration_fixture.h"

namespace arachne::migration {
namespace {

using testing::MakeCluster;
using testing::MakePlan;
using testing::MakeStage;
using testing::MakeTemplate;
using testing::TinyModel;
using testing::TinyMoeModel;

int FindTensor(const ModelState& s, const std::string& name) {
  for (int i = 0; i < s.num_tensors(); ++i) {
    if (s.tensor(i).name == name) return i;
  }
  return -1;
}

TEST(ModelStateTest, ParamsAndBytesMatchTheModel) {
  auto s = ModelState::Create(TinyModel());
  ASSERT_TRUE(s.ok()) << s.status();
  EXPECT_EQ(s->TotalParams(), 180800);
  EXPECT_EQ(s->TotalParams(), TinyModel().TotalParams());
  // bf16 weight 2 + fp32 master, m, v 12 = 14 bytes per parameter.
  EXPECT_EQ(s->TotalBytes(), 180800 * 14);
  const int o = FindTensor(*s, "layers.0.attn.o.weight:weight");
  ASSERT_GE(o, 0);
  EXPECT_EQ(s->tensor(o).split, TpSplit::kRow);
  EXPECT_EQ(s->tensor(o).bytes(), 64 * 64 * 2);
  EXPECT_EQ(s->tensor(o).ShardRange(1, 2), (ByteRange{4096, 8192}));
  const int m = FindTensor(*s, "layers.3.mlp.gate.weight:adam_v");
  ASSERT_GE(m, 0);
  EXPECT_EQ(s->tensor(m).kind, StateKind::kAdamV);
  EXPECT_EQ(s->tensor(m).bytes(), 128 * 64 * 4);
  EXPECT_EQ(s->tensor(m).ShardRange(3, 4), (ByteRange{3 * 8192, 4 * 8192}));
  const int norm = FindTensor(*s, "final_norm.weight:master");
  ASSERT_GE(norm, 0);
  EXPECT_EQ(s->tensor(norm).ShardRange(1, 2), (ByteRange{0, 256}));
}

TEST(ModelStateTest, UnevenSplitCoversTheTensorOnce) {
  TensorSpec t{.name = "x", .kind = StateKind::kMasterWeight, .shape = {5, 3},
               .split = TpSplit::kColumn};
  // 5 rows of 12 bytes over 4 ranks: 1, 1, 1, 2 rows.
  EXPECT_EQ(t.ShardRange(0, 4), (ByteRange{0, 12}));
  EXPECT_EQ(t.ShardRange(3, 4), (ByteRange{36, 60}));
}

TEST(ModelStateTest, MoeListsEveryExpertAndMatchesTheModel) {
  auto s = ModelState::Create(TinyMoeModel());
  ASSERT_TRUE(s.ok()) << s.status();
  EXPECT_EQ(s->TotalParams(), TinyMoeModel().TotalParams());
  const int e = FindTensor(*s, "layers.2.experts.3.down.weight:weight");
  ASSERT_GE(e, 0);
  EXPECT_EQ(s->tensor(e).expert, 3);
  EXPECT_EQ(s->tensor(e).layer, 2);
}

TEST(ModelStateTest, GeluAndMlaCountsMatchTheModel) {
  ModelSpec gpt = TinyModel();
  gpt.mlp = MlpKind::kGelu;
  gpt.num_kv_heads = 4;
  gpt.tied_embeddings = true;
  auto s = ModelState::Create(gpt);
  ASSERT_TRUE(s.ok()) << s.status();
  EXPECT_EQ(s->TotalParams(), gpt.TotalParams());
  ModelSpec mla = TinyModel();
  mla.attention = AttentionKind::kMla;
  mla.mla = {.q_lora_rank = 32, .kv_lora_rank = 16, .qk_nope_head_dim = 8,
             .qk_rope_head_dim = 4, .v_head_dim = 8};
  auto s2 = ModelState::Create(mla);
  ASSERT_TRUE(s2.ok()) << s2.status();
  EXPECT_EQ(s2->TotalParams(), mla.TotalParams());
}

TEST(PlanLayoutTest, TwoStagePipelineExactBytes) {
  auto s = ModelState::Create(TinyModel());
  ASSERT_TRUE(s.ok());
  const Cluster c = MakeCluster({{"a", testing::kFast, 4}});
  const Plan p = MakePlan({MakeTemplate(
      {MakeStage(2, 0, 2), MakeStage(1, 2, 4)}, 1, {{0, {0, 1}}, {0, {3}}})});
  auto l = PlanLayout::Create(*s, p, c);
  ASSERT_TRUE(l.ok()) << l.status();
  ASSERT_EQ(l->num_gpus(), 3);
  EXPECT_EQ(l->gpus()[2], (GpuId{"a", 3}));
  EXPECT_EQ(l->role(1).tp_rank, 1);
  // Stage 0, TP rank: half the embedding (8,192) and, per layer, half of
  // every split matrix plus both norms (18,560): 45,312 params x 14 bytes.
  EXPECT_EQ(l->BytesOn(0), 45312 * 14);
  EXPECT_EQ(l->BytesOn(1), 45312 * 14);
  // Stage 1: two whole layers (73,984) and the head (16,448).
  EXPECT_EQ(l->BytesOn(2), 90432 * 14);
  // Replicated norms of layers 0-1 are held twice.
  EXPECT_EQ(l->TotalBytes(), s->TotalBytes() + 2 * 128 * 14);
}

TEST(PlanLayoutTest, TiedEmbeddingsAreAlsoOnTheLastStage) {
  ModelSpec m = TinyModel();
  m.tied_embeddings = true;
  auto s = ModelState::Create(m);
  ASSERT_TRUE(s.ok());
  const Cluster c = MakeCluster({{"a", testing::kFast, 2}});
  const Plan p = MakePlan({MakeTemplate(
      {MakeStage(1, 0, 2), MakeStage(1, 2, 4)}, 1, {{0, {0}}, {0, {1}}})});
  auto l = PlanLayout::Create(*s, p, c);
  ASSERT_TRUE(l.ok()) << l.status();
  const int emb = FindTensor(*s, "embedding.weight:adam_m");
  auto holds = [&](int g, int tensor) {
    for (const Holding& h : l->holdings(g)) {
      if (h.tensor == tensor) return true;
    }
    return false;
  };
  EXPECT_TRUE(holds(0, emb));
  EXPECT_TRUE(holds(1, emb));
  // Stage 1: two layers, the final norm and the embedding copy.
  EXPECT_EQ(l->BytesOn(1), (2 * 36992 + 64 + 16384) * 14);
}

TEST(PlanLayoutTest, ExpertParallelSpreadsExperts) {
  auto s = ModelState::Create(TinyMoeModel());
  ASSERT_TRUE(s.ok());
  const Cluster c = MakeCluster({{"a", testing::kFast, 4}});
  // 4 replicas of one TP-1 stage; experts tiled EP 2 x ETP 1 x EDP 2.
  const Plan p = MakePlan({MakeTemplate(
      {MakeStage(1, 0, 4, {.ep = 2, .etp = 1, .edp = 2})}, 4,
      {{0, {0}}, {0, {1}}, {0, {2}}, {0, {3}}})});
  auto l = PlanLayout::Create(*s, p, c);
  ASSERT_TRUE(l.ok()) << l.status();
  auto experts_on = [&](int g) {
    std::set<int> e;
    for (const Holding& h : l->holdings(g)) {
      if (s->tensor(h.tensor).expert >= 0) e.insert(s->tensor(h.tensor).expert);
    }
    return e;
  };
  EXPECT_EQ(experts_on(0), (std::set<int>{0, 1}));
  EXPECT_EQ(experts_on(1), (std::set<int>{2, 3}));
  EXPECT_EQ(experts_on(2), (std::set<int>{0, 1}));
  EXPECT_EQ(experts_on(3), (std::set<int>{2, 3}));
}

TEST(PlanLayoutTest, RejectsMalformedPlans) {
  auto s = ModelState::Create(TinyModel());
  ASSERT_TRUE(s.ok());
  const Cluster c = MakeCluster({{"a", testing::kFast, 2}});
  const Plan gap = MakePlan({MakeTemplate(
      {MakeStage(1, 0, 1), MakeStage(1, 2, 4)}, 1, {{0, {0}}, {0, {1}}})});
  EXPECT_EQ(PlanLayout::Create(*s, gap, c).status(),
            absl::InvalidArgumentError(
                "templates[0].stages[1]: layers [2, 4) do not continue the "
                "pipeline at layer 1"));
  const Plan twice = MakePlan({MakeTemplate({MakeStage(1, 0, 4)}, 2,
                                            {{0, {1}}, {0, {1}}})});
  EXPECT_EQ(PlanLayout::Create(*s, twice, c).status(),
            absl::InvalidArgumentError("templates[0].placement[replica 1, "
                                       "stage 0]: GPU a:1 is used twice"));
  const Plan missing = MakePlan({MakeTemplate({MakeStage(1, 0, 4)}, 1,
                                              {{0, {2}}})});
  EXPECT_EQ(PlanLayout::Create(*s, missing, c).status(),
            absl::InvalidArgumentError("templates[0].placement[replica 0, "
                                       "stage 0]: node a has no GPU 2"));
}

}  // namespace
}  // namespace arachne::migration
