#include "migration/core/state_layout.h"

#include <functional>
#include <set>
#include <string>
#include <vector>

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

TEST(ModelStateTest, FromTensorsKeepsAnEnginesOwnList) {
  const ModelState created = *ModelState::Create(TinyMoeModel(), {.training_scalars = 3});
  absl::StatusOr<ModelState> same =
      ModelState::FromTensors(TinyMoeModel(), created.tensors());
  ASSERT_TRUE(same.ok()) << same.status();
  EXPECT_EQ(same->num_tensors(), created.num_tensors());
  EXPECT_EQ(same->TotalBytes(), created.TotalBytes());
  EXPECT_EQ(same->TotalParams(), created.TotalParams());
  // Another engine's list, in its own order, is taken as it is.
  std::vector<TensorSpec> reversed(created.tensors().rbegin(),
                                   created.tensors().rend());
  absl::StatusOr<ModelState> other =
      ModelState::FromTensors(TinyMoeModel(), reversed);
  ASSERT_TRUE(other.ok()) << other.status();
  EXPECT_EQ(other->tensor(0).name, "train_state:scalars");
}

TEST(ModelStateTest, FromTensorsNamesTheFieldOfAnUnplaceableTensor) {
  const ModelState created = *ModelState::Create(TinyMoeModel(), {.training_scalars = 3});
  auto error = [&](const std::function<void(std::vector<TensorSpec>&)>& edit) {
    std::vector<TensorSpec> t = created.tensors();
    edit(t);
    absl::StatusOr<ModelState> s = ModelState::FromTensors(TinyMoeModel(), t);
    return s.ok() ? std::string("ok") : std::string(s.status().message());
  };
  EXPECT_EQ(error([](auto& t) { t.clear(); }),
            "tensors: must list 1 to 10000000 tensors, got 0");
  EXPECT_EQ(error([](auto& t) { t[1].name = ""; }),
            "tensors[1].name: must have 1 to 512 characters, got 0");
  EXPECT_EQ(error([](auto& t) { t[2].name = t[0].name; }),
            "tensors[2].name: \"embedding.weight:weight\" is listed twice");
  EXPECT_EQ(error([](auto& t) { t[3].layer = 4; }),
            "tensors[3].layer: must be in [-3, 4) for this model, got 4");
  EXPECT_EQ(error([](auto& t) { t[3].expert = 8; }),
            "tensors[3].expert: must be -1, or a routed expert in [0, 4) of a "
            "transformer block, got 8 (layer -1)");
  EXPECT_EQ(error([](auto& t) { t[4].shape = {64, 0}; }),
            "tensors[4].shape: every dimension must be >= 1 and the tensor at "
            "most 2^40 elements, got a dimension 0");
  EXPECT_EQ(error([](auto& t) { t[4].shape = {}; }),
            "tensors[4].shape: must have 1 to 8 dimensions, got 0");
  EXPECT_EQ(error([](auto& t) {
              t[4].shape = {64};
              t[4].split = TpSplit::kRow;
            }),
            "tensors[4].tp_split: row splits a 2-D [out, in] tensor, got 1 "
            "dimensions");
  EXPECT_EQ(error([](auto& t) { t.back().layer = 0; }),
            "tensors[" + std::to_string(created.num_tensors() - 1) +
                "].kind: scalars are held by every GPU (layer -3, "
                "replicated), got layer 0, replicated");
}

TEST(ModelStateTest, KindAndSplitNamesReadBack) {
  for (int k = 0; k < kNumStateKinds; ++k) {
    const StateKind kind = static_cast<StateKind>(k);
    EXPECT_EQ(*StateKindFromName(StateKindName(kind), "kind"), kind);
  }
  for (TpSplit s : {TpSplit::kReplicated, TpSplit::kColumn, TpSplit::kRow}) {
    EXPECT_EQ(*TpSplitFromName(TpSplitName(s), "split"), s);
  }
  EXPECT_EQ(StateKindFromName("fp8", "t.kind").status().message(),
            "t.kind: must be weight, master, adam_m, adam_v or scalars, got "
            "\"fp8\"");
  EXPECT_EQ(TpSplitFromName("diagonal", "t.tp_split").status().message(),
            "t.tp_split: must be replicated, column or row, got \"diagonal\"");
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
