// The training framework: presets, overrides by name, and each memory and
// time term the cost model and the synthesizer take from it, on
// hand-computed cases (toy_fixture.h: a FAST dense layer is 1 + 2 ms per
// micro-batch of 1, 1e6 parameters, 100 MiB of activations).
#include "planner_service/core/model/framework.h"

#include <utility>
#include <vector>

#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "planner_service/core/cost/cost_model.h"
#include "planner_service/core/cost/profile_synthesizer.h"
#include "test/core/toy_fixture.h"

namespace arachne {
namespace {

using ::arachne::testing::kFast;
using ::arachne::testing::MakeCluster;
using ::arachne::testing::MakeStage;
using ::testing::ElementsAre;
using ::testing::HasSubstr;
using ::testing::Pair;

constexpr double kMs = 1e-3;
constexpr double kGiB = 1024.0 * 1024 * 1024;

TEST(FrameworkConfigTest, PresetsParseByNameAndValidate) {
  for (FrameworkPreset p : kAllFrameworkPresets) {
    absl::StatusOr<FrameworkPreset> parsed =
        ParseFrameworkPreset(FrameworkPresetName(p));
    ASSERT_TRUE(parsed.ok()) << parsed.status();
    EXPECT_EQ(*parsed, p);
    const FrameworkConfig f = FrameworkPresetConfig(p);
    EXPECT_EQ(f.preset, p);
    EXPECT_TRUE(f.Validate().ok()) << FrameworkPresetName(p);
    EXPECT_TRUE(FrameworkOverrides(f).empty());
  }
  EXPECT_EQ(ParseFrameworkPreset("megatron-lm").status().message(),
            "framework: must be one of megatron-core, megatron-deepspeed, "
            "deepspeed-zero1, fsdp, arachne-reference, got \"megatron-lm\"");
  // The struct's defaults are the megatron-core preset.
  EXPECT_EQ(FrameworkConfig{},
            FrameworkPresetConfig(FrameworkPreset::kMegatronCore));
}

TEST(FrameworkConfigTest, FieldsSetByNameAndRoundTrip) {
  FrameworkConfig f = FrameworkPresetConfig(FrameworkPreset::kMegatronDeepSpeed);
  ASSERT_TRUE(SetFrameworkField(f, "attention", "flash2").ok());
  EXPECT_EQ(f.attention, AttentionKernel::kFlash2);
  EXPECT_EQ(*FrameworkFieldValue(f, "attention"), "flash2");
  ASSERT_TRUE(SetFrameworkField(f, "attention", "flash").ok());
  ASSERT_TRUE(SetFrameworkField(f, "micro_batch_fixed_ms", "2.5").ok());
  ASSERT_TRUE(SetFrameworkField(f, "sharding", "gradients").ok());
  EXPECT_EQ(f.attention, AttentionKernel::kFlash);
  EXPECT_DOUBLE_EQ(f.micro_batch_fixed_s, 2.5e-3);
  EXPECT_EQ(f.sharding, StateSharding::kGradients);
  EXPECT_EQ(*FrameworkFieldValue(f, "micro_batch_fixed_ms"), "2.5");
  EXPECT_THAT(FrameworkOverrides(f),
              ElementsAre(Pair("attention", "flash"),
                          Pair("sharding", "gradients"),
                          Pair("micro_batch_fixed_ms", "2.5")));
  // Every field's text form reads back to the same config.
  FrameworkConfig copy = FrameworkPresetConfig(f.preset);
  for (const std::string& name : FrameworkFieldNames()) {
    ASSERT_TRUE(SetFrameworkField(copy, name, *FrameworkFieldValue(f, name)).ok())
        << name;
  }
  EXPECT_EQ(copy, f);
}

TEST(FrameworkConfigTest, BadNamesAndValuesAreRefusedAndChangeNothing) {
  FrameworkConfig f;
  const FrameworkConfig before = f;
  EXPECT_EQ(SetFrameworkField(f, "attention", "eager").message(),
            "framework.attention: must be flash, flash2 or materialized, got "
            "\"eager\"");
  EXPECT_EQ(SetFrameworkField(f, "fragmentation", "1.5").message(),
            "framework.fragmentation: must be a number in [0, 1], got \"1.5\"");
  EXPECT_EQ(SetFrameworkField(f, "sequence_parallel", "yes").message(),
            "framework.sequence_parallel: must be true or false, got \"yes\"");
  EXPECT_EQ(SetFrameworkField(f, "iteration_fixed_ms", "nan").message(),
            "framework.iteration_fixed_ms: must be a number in [0, 1000000], "
            "got \"nan\"");
  const absl::Status unknown = SetFrameworkField(f, "flash", "true");
  EXPECT_EQ(unknown.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(unknown.message(),
              HasSubstr("framework: unknown field \"flash\" (fields: "
                        "attention, attention_dropout, sequence_parallel,"));
  EXPECT_EQ(f, before);
  // A value set directly is checked by Validate, and by the training config.
  f.tp_comm_exposed_fraction = 2;
  EXPECT_EQ(f.Validate().message(),
            "framework.tp_comm_exposed_fraction: must be a number in [0, 1], "
            "got \"2\"");
  TrainingConfig training;
  training.framework = f;
  EXPECT_EQ(training.Validate().code(), absl::StatusCode::kInvalidArgument);
}

class FrameworkCostTest : public ::testing::Test {
 protected:
  CostModel Build(const Cluster& cluster, const TrainingConfig& training,
                  CostParams params = {}) {
    auto cm = CostModel::Create(catalog_, testing::ToyModel(), training,
                                cluster, profiles_, params);
    CHECK(cm.status().ok()) << cm.status();
    return *std::move(cm);
  }
  static TrainingConfig With(FrameworkPreset preset) {
    TrainingConfig t = testing::ToyTraining();
    t.framework = FrameworkPresetConfig(preset);
    return t;
  }
  // One FAST GPU, or `replicas` FAST GPUs of one node (4 layers each).
  static Plan OneStage(int replicas, int tp = 1) {
    Plan plan;
    Template t;
    t.stages = {MakeStage(kFast, tp, 0, 4)};
    t.replicas = replicas;
    t.micro_batch_size = 1;
    t.total_micro_batches = 8;
    for (int r = 0; r < replicas; ++r) {
      StagePlacement place;
      place.node = 0;
      for (int g = 0; g < tp; ++g) place.gpus.push_back(r * tp + g);
      t.placement.push_back(place);
    }
    plan.templates = {t};
    return plan;
  }
  GpuCatalog catalog_ = testing::ToyCatalog();
  ProfileStore profiles_ = testing::ToyProfiles();
};

TEST_F(FrameworkCostTest, MegatronDeepSpeedStateAndBuckets) {
  const Cluster cluster = MakeCluster(catalog_, {{kFast, 2}});
  const CostModel cm =
      Build(cluster, With(FrameworkPreset::kMegatronDeepSpeed));
  const StageMemory m = cm.StageMemoryOf(OneStage(2), 0, 0);
  // fp16 weight 2 + fp16 grad 2 whole; Adam 12 + fp32 grad copy 4 over
  // ZeRO-1's 2 replicas: 4e6 x (4 + 16 / 2) B.
  EXPECT_NEAR(m.weights_gib, 4e6 * 12 / kGiB, 1e-12);
  // CUDA context 1.5 GiB + two 5e8-element 16-bit buckets.
  EXPECT_NEAR(m.reserve_gib, 1.5 + 2 * 5e8 * 2 / kGiB, 1e-12);
}

TEST_F(FrameworkCostTest, MegatronFp32MainGradsOverride) {
  // Megatron's bf16 default: fp32 main_grad buffer and all-reduce, 18 B per
  // parameter, 6 + 12 / d with the distributed optimizer (Megatron-LM
  // distributed optimizer docs).
  const Cluster cluster = MakeCluster(catalog_, {{kFast, 2}});
  TrainingConfig training = testing::ToyTraining();
  ASSERT_TRUE(SetFrameworkField(training.framework, "grad_bytes_per_param", "4").ok());
  ASSERT_TRUE(SetFrameworkField(training.framework, "grad_reduce_bytes_per_param", "4").ok());
  EXPECT_NEAR(Build(cluster, training).StageMemoryOf(OneStage(2), 0, 0).weights_gib,
              4e6 * 18 / kGiB, 1e-12);
  training.distributed_optimizer = true;
  EXPECT_NEAR(Build(cluster, training).StageMemoryOf(OneStage(2), 0, 0).weights_gib,
              4e6 * (6 + 12.0 / 2) / kGiB, 1e-12);
}

TEST_F(FrameworkCostTest, FsdpShardsEverythingAndHoldsTwoGatheredLayers) {
  const Cluster cluster = MakeCluster(catalog_, {{kFast, 2}});
  const CostModel cm = Build(cluster, With(FrameworkPreset::kFsdp));
  const StageMemory m = cm.StageMemoryOf(OneStage(2), 0, 0);
  // fp32 parameters 4 + fp32 grads 4 + Adam m, v 8, all over 2 replicas,
  // plus the 16-bit weights of the layer running and the one prefetched.
  EXPECT_NEAR(m.weights_gib, (4e6 * 16 / 2 + 2 * 1e6 * 2) / kGiB, 1e-12);
}

TEST_F(FrameworkCostTest, FragmentationAndReserveAddToTheTensors) {
  const Cluster cluster = MakeCluster(catalog_, {{kFast, 1}});
  TrainingConfig training = testing::ToyTraining();
  training.framework.fragmentation = 0.25;
  training.framework.context_reserve_gib = 0.5;
  const StageMemory m = Build(cluster, training).StageMemoryOf(OneStage(1), 0, 0);
  // 4e6 x 16 B of state; 1 micro-batch in flight of 4 x 100 MiB.
  const double tensors = 4e6 * 16 / kGiB + 400.0 / 1024;
  EXPECT_NEAR(m.weights_gib + m.activations_gib, tensors, 1e-12);
  EXPECT_NEAR(m.reserve_gib, 0.5 + 0.25 * tensors, 1e-12);
}

TEST_F(FrameworkCostTest, FixedCostsPerMicroBatchAndIteration) {
  const Cluster cluster = MakeCluster(catalog_, {{kFast, 1}});
  TrainingConfig training = testing::ToyTraining();
  ASSERT_TRUE(SetFrameworkField(training.framework, "micro_batch_fixed_ms", "1").ok());
  ASSERT_TRUE(SetFrameworkField(training.framework, "iteration_fixed_ms", "5").ok());
  const CostModel cm = Build(cluster, training);
  absl::StatusOr<Prediction> p = cm.Predict(OneStage(1));
  ASSERT_TRUE(p.ok()) << p.status();
  // 8 micro-batches x (4 layers x 3 ms + 1 ms) + 5 ms + the Adam step.
  const double optimizer = 4e6 * 30 / 1000e9;
  EXPECT_NEAR(p->iteration_time_s, 8 * 13 * kMs + 5 * kMs + optimizer, 1e-12);
  // The parts still add up.
  const TimeBreakdown& b = p->breakdown;
  EXPECT_NEAR(b.compute_s + b.tp_comm_s + b.p2p_s + b.all_to_all_s +
                  b.bubble_s + b.dp_sync_s + b.optimizer_s,
              p->iteration_time_s, 1e-12);
}

TEST_F(FrameworkCostTest, Fp16PaysTheLossScalersGradientRead) {
  const Cluster cluster = MakeCluster(catalog_, {{kFast, 1}});
  TrainingConfig training = testing::ToyTraining();
  training.precision = Precision::kFp16;
  absl::StatusOr<Prediction> p = Build(cluster, training).Predict(OneStage(1));
  ASSERT_TRUE(p.ok()) << p.status();
  // Adam's 30 B plus one read of the 2-byte gradients per parameter.
  EXPECT_NEAR(p->breakdown.optimizer_s, 4e6 * 32 / 1000e9, 1e-15);
}

TEST_F(FrameworkCostTest, ComputeScaleAndExposedTpComm) {
  const Cluster cluster = MakeCluster(catalog_, {{kFast, 2}});
  TrainingConfig training = testing::ToyTraining();
  training.framework.tp_comm_exposed_fraction = 0.5;
  CostParams params;
  params.compute_scale["FAST"] = 2.0;
  const CostModel cm = Build(cluster, training, params);
  // TP 2: a layer is 0.5 + 1 ms of compute (x 2) and 0.5 ms of TP comm:
  // half of it exposed, the hidden half slowing the compute it overlaps by
  // 0.189 / 1.189 of its length.
  const double c = 0.189;
  EXPECT_NEAR(cm.StageTime(OneStage(1, 2), 0, 0),
              4 * (3 + 0.25 + 0.25 * c / (1 + c)) * kMs, 1e-12);
  // Without the slowdown only the exposed half counts.
  params.overlap_compute_slowdown = 0;
  EXPECT_NEAR(Build(cluster, training, params).StageTime(OneStage(1, 2), 0, 0),
              4 * (3 + 0.25) * kMs, 1e-12);
}

TEST(OverlappedTimeTest, HiddenCommSlowsTheComputeLongerCommIsExposed) {
  // 10 ms of compute, 20% slower while a collective overlaps it.
  EXPECT_DOUBLE_EQ(OverlappedTime(10, 0, 0.2), 10);
  // A 6 ms collective stretches the 5 ms of compute it overlaps to 6 ms.
  EXPECT_DOUBLE_EQ(OverlappedTime(10, 6, 0.2), 11);
  // Up to 12 ms (all the compute, slowed) it is hidden, then exposed.
  EXPECT_DOUBLE_EQ(OverlappedTime(10, 12, 0.2), 12);
  EXPECT_DOUBLE_EQ(OverlappedTime(10, 15, 0.2), 15);
  // No slowdown: the larger of the two.
  EXPECT_DOUBLE_EQ(OverlappedTime(10, 6, 0), 10);
  EXPECT_DOUBLE_EQ(OverlappedTime(10, 15, 0), 15);
}

TEST_F(FrameworkCostTest, OverlappedGradReduceHidesBehindTheBackward) {
  const Cluster cluster = MakeCluster(catalog_, {{kFast, 1}, {kFast, 1}});
  Plan plan = OneStage(2);
  plan.templates[0].placement = {{0, {0}}, {1, {0}}};
  TrainingConfig training = testing::ToyTraining();
  absl::StatusOr<Prediction> exposed = Build(cluster, training).Predict(plan);
  ASSERT_TRUE(exposed.ok()) << exposed.status();
  // 4e6 bf16 gradients over the 100 Gb/s NIC: 0.68 ms exposed ...
  EXPECT_NEAR(exposed->breakdown.dp_sync_s,
              8.4e-6 + 2 * 9.6e-6 + 8e6 / (12.5 * 0.976 * 1e9), 1e-12);
  // ... hidden by two thirds of the 12 ms stage, which it slows by
  // 0.189 / 1.189 of its own length while it overlaps it.
  training.framework.overlap_grad_reduce = true;
  absl::StatusOr<Prediction> hidden = Build(cluster, training).Predict(plan);
  ASSERT_TRUE(hidden.ok()) << hidden.status();
  const double c = 0.189;
  EXPECT_NEAR(hidden->breakdown.dp_sync_s,
              exposed->breakdown.dp_sync_s * c / (1 + c), 1e-12);
  EXPECT_NEAR(exposed->iteration_time_s - hidden->iteration_time_s,
              exposed->breakdown.dp_sync_s / (1 + c), 1e-12);
}

TEST_F(FrameworkCostTest, FsdpGathersSlowTheComputeTheyHideBehind) {
  // Two FAST GPUs on two nodes: each micro-batch gathers the 4e6 16-bit
  // weights twice through the 100 Gb/s NIC (12.2 GB/s achieved), 0.33 ms
  // each, behind 12 ms of compute.
  const Cluster cluster = MakeCluster(catalog_, {{kFast, 1}, {kFast, 1}});
  Plan plan = OneStage(2);
  plan.templates[0].placement = {{0, {0}}, {1, {0}}};
  const double gather =
      2 * (8.4e-6 + 9.6e-6 + 0.5 * 8e6 / (12.5 * 0.976 * 1e9));
  const double c = 0.189;
  EXPECT_NEAR(Build(cluster, With(FrameworkPreset::kFsdp)).StageTime(plan, 0, 0),
              12 * kMs + gather * c / (1 + c), 1e-12);
  CostParams none;
  none.overlap_compute_slowdown = 0;
  EXPECT_NEAR(Build(cluster, With(FrameworkPreset::kFsdp), none)
                  .StageTime(plan, 0, 0),
              12 * kMs, 1e-12);
}

TEST_F(FrameworkCostTest, PipelineSendsWithoutScatterGatherMoveTheWholeTensorPerRank) {
  // Two nodes of 2 FAST GPUs, one TP 2 stage on each: the boundary crosses
  // the NIC. One micro-batch's activation is 2 B x 1024 tokens x 1024.
  const Cluster cluster = MakeCluster(catalog_, {{kFast, 2}, {kFast, 2}});
  Plan plan = testing::OneReplicaPlan(
      {MakeStage(kFast, 2, 0, 2), MakeStage(kFast, 2, 2, 4)},
      {{0, {0, 1}}, {1, {0, 1}}});
  auto p2p_of = [&](bool sequence_parallel, bool scatter_gather) {
    TrainingConfig training = testing::ToyTraining();
    training.framework.sequence_parallel = sequence_parallel;
    training.framework.pipeline_scatter_gather = scatter_gather;
    absl::StatusOr<Prediction> p = Build(cluster, training).Predict(plan);
    CHECK(p.ok()) << p.status();
    return p->breakdown.p2p_s;
  };
  const double bytes = 2.0 * 1024 * 1024;
  // The TP group's two NIC shares, 2 x 12.5 x 0.976 / 2 GB/s: each rank
  // sends its half of the tensor (scatter/gather) ...
  const double group_gbps = 12.5 * 0.976;
  const double scattered = 8 * 2 * (bytes / (group_gbps * 1e9) + 20e-6);
  EXPECT_NEAR(p2p_of(false, true), scattered, 1e-12);
  // ... or, without it, the whole tensor: the NIC carries 2 copies.
  EXPECT_NEAR(p2p_of(false, false),
              8 * 2 * (2 * bytes / (group_gbps * 1e9) + 20e-6), 1e-12);
  // Sequence parallelism shards the boundary tensor whatever the flag says.
  EXPECT_NEAR(p2p_of(true, false), scattered, 1e-12);
  EXPECT_NEAR(p2p_of(true, true), scattered, 1e-12);

  // Inside one node each rank has its own link: no change.
  const Cluster one_node = MakeCluster(catalog_, {{kFast, 4}});
  plan.templates[0].placement = {{0, {0, 1}}, {0, {2, 3}}};
  TrainingConfig training = testing::ToyTraining();
  training.framework.sequence_parallel = false;
  training.framework.pipeline_scatter_gather = false;
  absl::StatusOr<Prediction> intra = Build(one_node, training).Predict(plan);
  ASSERT_TRUE(intra.ok()) << intra.status();
  EXPECT_NEAR(intra->breakdown.p2p_s, 8 * 2 * (bytes / 100e9 + 20e-6), 1e-12);
}

// A LLaMA-shaped layer small enough to compute by hand.
ModelSpec SmallLlama() {
  ModelSpec m;
  m.name = "small";
  m.num_layers = 2;
  m.hidden = 256;
  m.num_heads = 4;
  m.num_kv_heads = 4;
  m.head_dim = 64;
  m.ffn = 512;
  m.vocab = 1000;
  return m;
}

TEST(FrameworkKernelsTest, MaterializedAttentionKeepsTheScores) {
  const GpuCatalog catalog = testing::ToyCatalog();
  const GpuType& gpu = catalog.type(kFast);
  const ModelSpec m = SmallLlama();
  const int tp = 2, mbs = 2, seq = 128;
  const ProfileSynthesizer flash;
  SynthesisKernels eager;
  eager.flash_attention = false;
  const ProfileSynthesizer materialized({}, eager);
  eager.attention_dropout = true;
  const ProfileSynthesizer with_dropout({}, eager);
  auto entry = [&](const ProfileSynthesizer& s) {
    absl::StatusOr<ProfileEntry> e =
        s.Synthesize(m, LayerKind::kDense, gpu, tp, mbs, seq);
    CHECK(e.ok()) << e.status();
    return *e;
  };
  const ProfileEntry f = entry(flash), e = entry(materialized),
                     d = entry(with_dropout);
  // Scores per GPU: mbs x heads / tp x seq^2; the flash softmax statistics
  // (4 B per head and token) are gone.
  const double scores = 2.0 * 4 / tp * seq * seq;
  const double lse = 2.0 * seq * 4 * 4 / tp;
  EXPECT_EQ(e.activation_bytes - f.activation_bytes,
            std::llround(scores * 2 - lse));
  EXPECT_EQ(d.activation_bytes - f.activation_bytes,
            std::llround(scores * 5 - lse));
  EXPECT_GT(e.fwd_ms, f.fwd_ms);
  EXPECT_GT(e.bwd_ms, f.bwd_ms);
  EXPECT_GT(d.fwd_ms, e.fwd_ms);
  EXPECT_EQ(e.param_count, f.param_count);
}

TEST(FrameworkKernelsTest, FlashAttention2IsSlowerOnHopperOnly) {
  // (0.35 / 0.615) / (0.694 / 0.784): FlashAttention-2's share of peak on
  // H100 against A100, over the GEMMs' (profile_synthesizer.h).
  EXPECT_NEAR(kFlash2OnHopperAttentionFactor, 0.64291, 1e-5);
  EXPECT_EQ(KernelsOf(FrameworkPresetConfig(FrameworkPreset::kFsdp)).flash2,
            true);
  EXPECT_EQ(
      KernelsOf(FrameworkPresetConfig(FrameworkPreset::kDeepSpeedZero1)).flash2,
      true);
  EXPECT_EQ(
      KernelsOf(FrameworkPresetConfig(FrameworkPreset::kMegatronCore)).flash2,
      false);
  const GpuCatalog catalog = testing::ToyCatalog();
  GpuType hopper = catalog.type(kFast), ampere = catalog.type(kFast);
  hopper.architecture = "hopper";
  ampere.architecture = "ampere";
  const ModelSpec m = SmallLlama();
  SynthesisKernels fa2;
  fa2.flash2 = true;
  const ProfileSynthesizer flash, flash2({}, fa2);
  auto entry = [&](const ProfileSynthesizer& s, const GpuType& gpu) {
    absl::StatusOr<ProfileEntry> e =
        s.Synthesize(m, LayerKind::kDense, gpu, 2, 2, 128);
    CHECK(e.ok()) << e.status();
    return *e;
  };
  // Ampere: the same kernel as "flash".
  const ProfileEntry a = entry(flash, ampere), a2 = entry(flash2, ampere);
  EXPECT_EQ(a2.fwd_ms, a.fwd_ms);
  EXPECT_EQ(a2.bwd_ms, a.bwd_ms);
  // Hopper: the attention core (and only it) takes 1 / 0.643 as long.
  const ProfileEntry h = entry(flash, hopper), h2 = entry(flash2, hopper);
  ASSERT_GT(h.attention_fwd_ms, 0);
  EXPECT_DOUBLE_EQ(h2.attention_fwd_ms,
                   h.attention_fwd_ms / kFlash2OnHopperAttentionFactor);
  EXPECT_DOUBLE_EQ(h2.attention_bwd_ms,
                   h.attention_bwd_ms / kFlash2OnHopperAttentionFactor);
  EXPECT_NEAR(h2.fwd_ms - h.fwd_ms, h2.attention_fwd_ms - h.attention_fwd_ms,
              1e-12);
  EXPECT_NEAR(h2.bwd_ms - h.bwd_ms, h2.attention_bwd_ms - h.attention_bwd_ms,
              1e-12);
  EXPECT_EQ(h2.activation_bytes, h.activation_bytes);
  EXPECT_EQ(h2.tp_comm_ms, h.tp_comm_ms);
}

TEST(FrameworkKernelsTest, WithoutSequenceParallelismNormsRunOnEveryRank) {
  const GpuCatalog catalog = testing::ToyCatalog();
  const GpuType& gpu = catalog.type(kFast);
  const ModelSpec m = SmallLlama();
  SynthesisKernels no_sp;
  no_sp.sequence_parallel = false;
  const ProfileSynthesizer sp, replicated({}, no_sp);
  auto entry = [&](const ProfileSynthesizer& s, int tp) {
    absl::StatusOr<ProfileEntry> e =
        s.Synthesize(m, LayerKind::kDense, gpu, tp, 1, 128);
    CHECK(e.ok()) << e.status();
    return *e;
  };
  // TP 4: the norm inputs and the QKV and MLP inputs (2 x 2h + 2 x 2h bytes
  // per token) are held whole instead of 1/4 of them.
  EXPECT_EQ(entry(replicated, 4).activation_bytes - entry(sp, 4).activation_bytes,
            std::llround(128 * 8.0 * 256 * 0.75));
  EXPECT_GT(entry(replicated, 4).fwd_ms, entry(sp, 4).fwd_ms);
  // One rank: nothing to replicate.
  EXPECT_EQ(entry(replicated, 1).activation_bytes, entry(sp, 1).activation_bytes);
  EXPECT_EQ(entry(replicated, 1).fwd_ms, entry(sp, 1).fwd_ms);
}

}  // namespace
}  // namespace arachne
