#include "planner_service/core/cost/profile_synthesizer.h"

#include <cmath>

#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "planner_service/core/cost/profile_store.h"

namespace arachne {
namespace {

using ::testing::HasSubstr;

ModelSpec Llama3_8b() {
  ModelSpec m;
  m.name = "llama3-8b";
  m.num_layers = 32;
  m.hidden = 4096;
  m.num_heads = 32;
  m.num_kv_heads = 8;
  m.head_dim = 128;
  m.ffn = 14336;
  m.vocab = 128256;
  m.mlp = MlpKind::kSwiGlu;
  return m;
}

ModelSpec SmallMoe() {
  ModelSpec m = Llama3_8b();
  m.name = "moe-test";
  m.profile_name = "moe-profile";
  m.moe.num_experts = 8;
  m.moe.top_k = 2;
  m.moe.expert_ffn = 14336;
  m.moe.shared_experts = 1;
  m.moe.shared_expert_ffn = 4096;
  m.moe.dense_first_layers = 1;
  return m;
}

// H100-SXM5-80GB, NVIDIA H100 datasheet.
GpuType H100() {
  GpuType g;
  g.id = "H100-80GB";
  g.peak_bf16_tflops = 989.4;
  g.peak_fp32_tflops = 66.9;
  g.memory_gib = 80;
  g.hbm_gbps = 3350;
  g.intra_node_gbps = 450;
  g.intra_node_link = "NVLink4";
  return g;
}

ProfileEntry Syn(const ModelSpec& m, LayerKind k, int tp, int mbs,
                 int seq = 2048, const GpuType& g = H100()) {
  absl::StatusOr<ProfileEntry> e =
      ProfileSynthesizer().Synthesize(m, k, g, tp, mbs, seq);
  EXPECT_TRUE(e.ok()) << e.status();
  return e.ok() ? *e : ProfileEntry{};
}

TEST(ProfileSynthesizer, KeyAndSource) {
  ProfileEntry e = Syn(Llama3_8b(), LayerKind::kDense, 2, 4, 4096);
  EXPECT_EQ(e.key.model, "llama3-8b");
  EXPECT_EQ(e.key.gpu, "H100-80GB");
  EXPECT_EQ(e.key.kind, LayerKind::kDense);
  EXPECT_EQ(e.key.tp, 2);
  EXPECT_EQ(e.key.mbs, 4);
  EXPECT_EQ(e.key.seq, 4096);
  EXPECT_EQ(e.source, ProfileSource::kSynthesized);
  EXPECT_EQ(Syn(SmallMoe(), LayerKind::kMoeExperts, 1, 1).key.model,
            "moe-profile");
}

TEST(ProfileSynthesizer, DenseParamCountsAndActivations) {
  const ModelSpec m = Llama3_8b();
  // Attention 4096*(4096+2*1024) + 4096*4096 + 2 norms = 41,951,232;
  // MLP 3*4096*14336 = 176,160,768.
  EXPECT_EQ(Syn(m, LayerKind::kDense, 1, 1).param_count, 218112000);
  EXPECT_EQ(Syn(m, LayerKind::kDense, 2, 1).param_count, 109056000);
  EXPECT_EQ(Syn(m, LayerKind::kDense, 8, 1).param_count, 27264000);
  // Per token: norms 4h + QKV input 2h + Q,K,V 2*(4096+1024+1024) + out-proj
  // input 2*4096 + LSE 4*32 = 45,184; MLP 2h + 6*14336 = 94,208;
  // total 139,392 = 34h + 4a.
  EXPECT_DOUBLE_EQ(AttentionActivationBytesPerToken(m), 45184);
  EXPECT_DOUBLE_EQ(DenseMlpActivationBytesPerToken(m), 94208);
  EXPECT_EQ(Syn(m, LayerKind::kDense, 1, 1).activation_bytes,
            int64_t{139392} * 2048);
  EXPECT_EQ(Syn(m, LayerKind::kDense, 2, 1).activation_bytes,
            int64_t{139392} * 2048 / 2);
  EXPECT_EQ(Syn(m, LayerKind::kDense, 4, 3).activation_bytes,
            int64_t{139392} * 3 * 2048 / 4);
}

TEST(ProfileSynthesizer, StandardGptBlockIsKorthikanti34) {
  ModelSpec m;
  m.name = "gpt";
  m.num_layers = 1;
  m.hidden = 4096;
  m.num_heads = 32;
  m.num_kv_heads = 32;
  m.head_dim = 128;
  m.ffn = 4 * 4096;
  m.vocab = 50257;
  m.mlp = MlpKind::kGelu;
  EXPECT_DOUBLE_EQ(
      AttentionActivationBytesPerToken(m) + DenseMlpActivationBytesPerToken(m),
      34.0 * 4096 + 4 * 32);
}

TEST(ProfileSynthesizer, EmbeddingAndLmHead) {
  const ModelSpec m = Llama3_8b();
  ProfileEntry emb1 = Syn(m, LayerKind::kEmbedding, 1, 2);
  EXPECT_EQ(emb1.param_count, int64_t{128256} * 4096);
  EXPECT_EQ(emb1.activation_bytes, 2 * 2048 * 8);
  EXPECT_EQ(Syn(m, LayerKind::kEmbedding, 2, 2).param_count,
            int64_t{64128} * 4096);
  EXPECT_EQ(emb1.tp_comm_ms, 0);

  ProfileEntry lm1 = Syn(m, LayerKind::kLmHead, 1, 1);
  EXPECT_EQ(lm1.param_count, 4096 + int64_t{128256} * 4096);
  const int64_t logits = int64_t{2048} * 128256 * (4 + 2);
  EXPECT_EQ(lm1.activation_bytes, int64_t{2048} * 4 * 4096 + logits);
  EXPECT_GT(lm1.activation_bytes, logits);
  ProfileEntry lm2 = Syn(m, LayerKind::kLmHead, 2, 1);
  EXPECT_EQ(lm2.param_count, (4096 + int64_t{128256} * 4096) / 2);
  EXPECT_EQ(lm2.activation_bytes, (int64_t{2048} * 4 * 4096 + logits) / 2);
  EXPECT_GT(lm2.tp_comm_ms, 0);
  ModelSpec tied = m;
  tied.tied_embeddings = true;
  EXPECT_EQ(Syn(tied, LayerKind::kLmHead, 1, 1).param_count, 4096);
}

TEST(ProfileSynthesizer, MoeKinds) {
  const ModelSpec m = SmallMoe();
  ProfileEntry ex = Syn(m, LayerKind::kMoeExperts, 2, 1);
  EXPECT_EQ(ex.param_count, int64_t{8} * 3 * 4096 * 14336 / 2);
  // pairs = 2048 * 2; per pair 4h + 4 + 6 * 14336 / 2.
  EXPECT_EQ(ex.activation_bytes,
            int64_t{2048} * 2 * (4 * 4096 + 4 + 6 * 7168));
  EXPECT_GT(ex.tp_comm_ms, 0);
  EXPECT_EQ(Syn(m, LayerKind::kMoeExperts, 1, 1).tp_comm_ms, 0);
  ProfileEntry at = Syn(m, LayerKind::kMoeAttention, 1, 1);
  EXPECT_EQ(at.param_count, m.AttentionParams() + m.RouterAndSharedParams());
  EXPECT_EQ(at.activation_bytes,
            2048 * (45184 + 2 * 4096 + 8 * 8 + 6 * 4096));
  // Experts slower per token than the attention part for equal top-k work.
  EXPECT_GT(ex.fwd_ms, 0);
  EXPECT_GT(ex.bwd_ms, ex.fwd_ms);
}

TEST(ProfileSynthesizer, MonotonicInMbsAndPerSequenceFlattens) {
  const ModelSpec m = Llama3_8b();
  double prev_fwd = 0, prev_per_seq = 1e30;
  std::vector<double> per_seq;
  for (int mbs : {1, 2, 4, 8, 16, 32}) {
    ProfileEntry e = Syn(m, LayerKind::kDense, 1, mbs, 1024);
    EXPECT_GT(e.fwd_ms, prev_fwd) << mbs;
    EXPECT_GT(e.bwd_ms, e.fwd_ms) << mbs;
    const double s = (e.fwd_ms + e.bwd_ms) / mbs;
    EXPECT_LT(s, prev_per_seq) << mbs;
    prev_fwd = e.fwd_ms;
    prev_per_seq = s;
    per_seq.push_back(s);
  }
  // Falls noticeably at first, then flattens.
  EXPECT_LT(per_seq[1] / per_seq[0], 0.99);
  EXPECT_GT(per_seq[5] / per_seq[4], 0.98);
}

TEST(ProfileSynthesizer, TensorParallelismSplitsComputeAndAddsComm) {
  const ModelSpec m = Llama3_8b();
  ProfileEntry t1 = Syn(m, LayerKind::kDense, 1, 2);
  ProfileEntry t2 = Syn(m, LayerKind::kDense, 2, 2);
  const double c1 = t1.fwd_ms + t1.bwd_ms, c2 = t2.fwd_ms + t2.bwd_ms;
  EXPECT_LT(c2, c1);
  EXPECT_GT(c2, c1 / 2);  // TP efficiency loss
  EXPECT_EQ(t1.tp_comm_ms, 0);
  // 8 collectives of 2*2048*4096*2 bytes over NVLink (450 GB/s x 0.75):
  // 8.4 us + 1 * (3.4 us + S / (2 * 337.5e9)).
  const double S = 2.0 * 2048 * 4096 * 2;
  const double one = 8.4e-3 + 3.4e-3 + 1e3 * S / (2 * 450e9 * 0.75);
  EXPECT_NEAR(t2.tp_comm_ms, 8 * one, 1e-12);
  // PCIe uses the PCIe step latency.
  GpuType pcie = H100();
  pcie.intra_node_link = "PCIe5";
  pcie.intra_node_gbps = 32;
  const double one_pcie = 8.4e-3 + 5.7e-3 + 1e3 * S / (2 * 32e9 * 0.75);
  EXPECT_NEAR(Syn(m, LayerKind::kDense, 2, 2, 2048, pcie).tp_comm_ms,
              8 * one_pcie, 1e-12);
}

TEST(ProfileSynthesizer, PlausibleMfuOnH100) {
  // Dense llama3-8b layer, mbs 2, seq 4096: 6 * params * tokens + attention.
  const ModelSpec m = Llama3_8b();
  ProfileEntry e = Syn(m, LayerKind::kDense, 1, 2, 4096);
  const double flops = m.LayerTrainFlopsPerToken(0, 4096) * 2 * 4096;
  const double mfu = flops / ((e.fwd_ms + e.bwd_ms) * 1e-3) / 989.4e12;
  EXPECT_GT(mfu, 0.3);
  EXPECT_LT(mfu, 0.8);
}

TEST(ProfileSynthesizer, InvalidArguments) {
  const ModelSpec m = Llama3_8b();
  ProfileSynthesizer s;
  auto bad_mbs = s.Synthesize(m, LayerKind::kDense, H100(), 1, 0, 2048);
  ASSERT_FALSE(bad_mbs.ok());
  EXPECT_EQ(bad_mbs.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(bad_mbs.status().message(), HasSubstr("mbs"));
  auto bad_tp = s.Synthesize(m, LayerKind::kDense, H100(), 3, 1, 2048);
  ASSERT_FALSE(bad_tp.ok());
  EXPECT_THAT(bad_tp.status().message(), HasSubstr("num_heads"));
  auto bad_kv = s.Synthesize(m, LayerKind::kDense, H100(), 16, 1, 2048);
  ASSERT_FALSE(bad_kv.ok());
  EXPECT_THAT(bad_kv.status().message(), HasSubstr("num_kv_heads"));
  auto bad_seq = s.Synthesize(m, LayerKind::kDense, H100(), 1, 1, 0);
  ASSERT_FALSE(bad_seq.ok());
  EXPECT_THAT(bad_seq.status().message(), HasSubstr("seq"));
  auto not_moe = s.Synthesize(m, LayerKind::kMoeExperts, H100(), 1, 1, 2048);
  ASSERT_FALSE(not_moe.ok());
  EXPECT_THAT(not_moe.status().message(), HasSubstr("layer_kind"));
  // The vocabulary is padded, so any tp works for the embedding.
  EXPECT_TRUE(s.Synthesize(m, LayerKind::kEmbedding, H100(), 3, 1, 2048).ok());
}

TEST(ProfileSynthesizer, FillAddsEveryKindWithoutOverwriting) {
  const ModelSpec m = Llama3_8b();
  ProfileStore store;
  ProfileEntry measured = Syn(m, LayerKind::kDense, 1, 1);
  measured.fwd_ms = 123;
  measured.source = ProfileSource::kMeasured;
  ASSERT_TRUE(store.Add(measured).ok());
  const std::vector<int> tps = {1, 2, 4, 8, 16};
  const std::vector<int> mbss = {1, 2, 4};
  const int added =
      ProfileSynthesizer().Fill(m, H100(), tps, mbss, 2048, &store);
  // dense: tp 16 does not divide 8 kv heads -> 4 tps; embedding, lm_head: 5.
  EXPECT_EQ(added, 4 * 3 + 5 * 3 + 5 * 3 - 1);
  EXPECT_EQ(store.Find(measured.key)->fwd_ms, 123);
  ProfileKey k{"llama3-8b", LayerKind::kLmHead, "H100-80GB", 8, 4, 2048};
  ASSERT_NE(store.Find(k), nullptr);
  EXPECT_EQ(store.Find(k)->source, ProfileSource::kSynthesized);

  ProfileStore moe_store;
  ProfileSynthesizer().Fill(SmallMoe(), H100(), {1}, {1}, 2048, &moe_store);
  EXPECT_EQ(moe_store.size(), 5u);  // moe_attention, experts, dense, emb, head
  EXPECT_EQ(ProfileSynthesizer::KindsOf(Llama3_8b()).size(), 3u);
}

}  // namespace
}  // namespace arachne
