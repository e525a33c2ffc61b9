// The Agent messages <-> the runtime's types: a PrepareRequest written from
// PrepareArgs reads back as the same args, and each malformed request is
// INVALID_ARGUMENT naming the field (what the service answers before the
// runtime sees the request).
#include "worker_agent/agent_proto_convert.h"

#include <cmath>
#include <limits>
#include <string>
#include <vector>

#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "planner_service/io/model_io.h"
#include "test/migration/migration_fixture.h"

namespace arachne::agent {
namespace {

using ::arachne::migration::testing::MakeCluster;
using ::arachne::migration::testing::MakePlan;
using ::arachne::migration::testing::MakeStage;
using ::arachne::migration::testing::MakeTemplate;
using ::arachne::migration::testing::TinyModel;
using ::arachne::migration::testing::ToyCatalog;
using ::arachne::testing::kFast;
using ::testing::HasSubstr;

// Two nodes of 2 FAST GPUs; plan: 2 stages of TP 1 on n0, replicated onto
// n1 (the new plan) or only on n0 (the old plan).
class AgentProtoConvertTest : public ::testing::Test {
 protected:
  AgentProtoConvertTest()
      : catalog_(ToyCatalog()),
        cluster_(MakeCluster({{"n0", kFast, 2}, {"n1", kFast, 2}})),
        old_cluster_(MakeCluster({{"n0", kFast, 2}})) {
    Template t = MakeTemplate({MakeStage(1, 0, 2), MakeStage(1, 2, 4)}, 2,
                              {{0, {0}}, {0, {1}}, {1, {0}}, {1, {1}}});
    t.total_micro_batches = 4;
    plan_ = MakePlan({t});
    Template old = MakeTemplate({MakeStage(1, 0, 2), MakeStage(1, 2, 4)}, 1,
                                {{0, {0}}, {0, {1}}});
    old.total_micro_batches = 4;
    old_plan_ = MakePlan({old});
  }

  PrepareArgs Args() const {
    PrepareArgs a;
    a.generation = 2;
    a.job.model = TinyModel();
    a.job.training.seq_len = 32;
    a.job.training.global_batch = 8;
    a.job.training.framework =
        FrameworkPresetConfig(FrameworkPreset::kArachneReference);
    a.job.training.framework.fragmentation = 0.05;
    a.job.engine.learning_rate = 1e-3;
    a.job.engine.warmup_iterations = 0;
    a.job.engine.data_seed = 7;
    a.job.engine.lr_schedule = "cosine";
    a.job.engine.decay_iterations = 100;
    a.job.engine.min_learning_rate = 1e-5;
    a.job.engine.grad_clip_norm = 1.5;
    a.cluster = cluster_;
    a.plan = plan_;
    a.old_cluster = old_cluster_;
    a.old_plan = old_plan_;
    a.lost = {{"n0", 1}};
    a.store_address = "127.0.0.1:29500";
    a.checkpoint_dir = "/ckpt";
    return a;
  }

  absl::StatusOr<PrepareArgs> Read(const v1::PrepareRequest& r) const {
    return PrepareArgsFromProto(r, catalog_, /*models=*/{});
  }

  // The error of reading `r`, which must be InvalidArgument.
  std::string Error(const v1::PrepareRequest& r) const {
    absl::StatusOr<PrepareArgs> a = Read(r);
    EXPECT_EQ(a.status().code(), absl::StatusCode::kInvalidArgument)
        << a.status();
    return std::string(a.status().message());
  }

  GpuCatalog catalog_;
  Cluster cluster_;
  Cluster old_cluster_;
  Plan plan_;
  Plan old_plan_;
};

void ExpectSamePlan(const Plan& a, const Plan& b) {
  ASSERT_EQ(a.templates.size(), b.templates.size());
  for (size_t t = 0; t < a.templates.size(); ++t) {
    const Template& x = a.templates[t];
    const Template& y = b.templates[t];
    EXPECT_EQ(x.replicas, y.replicas);
    EXPECT_EQ(x.micro_batch_size, y.micro_batch_size);
    EXPECT_EQ(x.total_micro_batches, y.total_micro_batches);
    ASSERT_EQ(x.stages.size(), y.stages.size());
    for (size_t s = 0; s < x.stages.size(); ++s) {
      EXPECT_EQ(x.stages[s].gpu_type, y.stages[s].gpu_type);
      EXPECT_EQ(x.stages[s].tp, y.stages[s].tp);
      EXPECT_EQ(x.stages[s].layer_begin, y.stages[s].layer_begin);
      EXPECT_EQ(x.stages[s].layer_end, y.stages[s].layer_end);
    }
    ASSERT_EQ(x.placement.size(), y.placement.size());
    for (size_t p = 0; p < x.placement.size(); ++p) {
      EXPECT_EQ(x.placement[p].node, y.placement[p].node);
      EXPECT_EQ(x.placement[p].gpus, y.placement[p].gpus);
    }
  }
}

TEST_F(AgentProtoConvertTest, PrepareArgsRoundTrip) {
  const PrepareArgs args = Args();
  absl::StatusOr<PrepareArgs> back =
      Read(PrepareRequestFromArgs(args, catalog_));
  ASSERT_TRUE(back.ok()) << back.status();
  EXPECT_EQ(back->generation, 2);
  // A model without a profile name reads back with the catalog's default,
  // its own name.
  ModelSpec expected = args.job.model;
  expected.profile_name = expected.name;
  EXPECT_EQ(ModelToJson(back->job.model), ModelToJson(expected));
  EXPECT_EQ(back->job.training.seq_len, 32);
  EXPECT_EQ(back->job.training.global_batch, 8);
  EXPECT_EQ(back->job.training.framework, args.job.training.framework);
  EXPECT_EQ(back->job.engine.learning_rate, 1e-3);
  EXPECT_EQ(back->job.engine.warmup_iterations, 0);
  EXPECT_EQ(back->job.engine.data_seed, 7u);
  EXPECT_EQ(back->job.engine.adam_beta2, EngineConfig{}.adam_beta2);
  EXPECT_EQ(back->job.engine.lr_schedule, "cosine");
  EXPECT_EQ(back->job.engine.decay_iterations, 100);
  EXPECT_EQ(back->job.engine.min_learning_rate, 1e-5);
  EXPECT_EQ(back->job.engine.grad_clip_norm, 1.5);
  ASSERT_EQ(back->cluster.num_nodes(), 2);
  EXPECT_EQ(back->cluster.node(1).name, "n1");
  ExpectSamePlan(back->plan, args.plan);
  ASSERT_TRUE(back->old_plan.has_value());
  ASSERT_TRUE(back->old_cluster.has_value());
  EXPECT_EQ(back->old_cluster->num_nodes(), 1);
  ExpectSamePlan(*back->old_plan, *args.old_plan);
  ASSERT_EQ(back->lost.size(), 1u);
  EXPECT_EQ(back->lost[0], (migration::GpuId{"n0", 1}));
  EXPECT_EQ(back->store_address, "127.0.0.1:29500");
  EXPECT_EQ(back->checkpoint_dir, "/ckpt");
}

TEST_F(AgentProtoConvertTest, FirstGenerationHasNoOldPlan) {
  PrepareArgs args = Args();
  args.generation = 1;
  args.old_cluster.reset();
  args.old_plan.reset();
  args.lost.clear();
  absl::StatusOr<PrepareArgs> back =
      Read(PrepareRequestFromArgs(args, catalog_));
  ASSERT_TRUE(back.ok()) << back.status();
  EXPECT_FALSE(back->old_plan.has_value());
  EXPECT_FALSE(back->old_cluster.has_value());
}

TEST_F(AgentProtoConvertTest, CatalogModelByName) {
  v1::PrepareRequest r = PrepareRequestFromArgs(Args(), catalog_);
  r.clear_model_spec();
  r.mutable_model()->set_name("TINY");
  ModelSpec tiny = TinyModel();
  absl::StatusOr<PrepareArgs> a = PrepareArgsFromProto(r, catalog_, {tiny});
  ASSERT_TRUE(a.ok()) << a.status();
  EXPECT_EQ(a->job.model.name, "tiny");
  r.mutable_model()->set_name("huge");
  EXPECT_THAT(Error(r), HasSubstr("model.name: unknown model \"huge\""));
}

TEST_F(AgentProtoConvertTest, MissingOrBadGeneration) {
  v1::PrepareRequest r = PrepareRequestFromArgs(Args(), catalog_);
  r.clear_generation();
  EXPECT_EQ(Error(r), "generation: must be an integer >= 1, got 0");
  r.set_generation(-3);
  EXPECT_EQ(Error(r), "generation: must be an integer >= 1, got -3");
}

TEST_F(AgentProtoConvertTest, ModelMissingOrGivenTwice) {
  v1::PrepareRequest r = PrepareRequestFromArgs(Args(), catalog_);
  r.mutable_model()->set_name("tiny");
  EXPECT_EQ(Error(r), "model_spec: give either model or model_spec, not both");
  r.clear_model();
  r.clear_model_spec();
  EXPECT_EQ(Error(r),
            "model: required (model.name, model.hf_config_json or "
            "model_spec), got none");
}

TEST_F(AgentProtoConvertTest, BadModelSpecIsNamed) {
  v1::PrepareRequest r = PrepareRequestFromArgs(Args(), catalog_);
  r.mutable_model_spec()->set_num_layers(0);
  EXPECT_THAT(Error(r), HasSubstr("model_spec.num_layers"));
}

TEST_F(AgentProtoConvertTest, BadTrainingIsNamed) {
  v1::PrepareRequest r = PrepareRequestFromArgs(Args(), catalog_);
  r.mutable_training()->set_precision("fp8");
  EXPECT_THAT(Error(r), HasSubstr("training.precision"));
}

// The schedule's and clipping's fields left out read as the defaults
// (constant, off). (Their checks are EngineConfig::Validate's, which the
// engines and the controller's job file reader run.)
TEST_F(AgentProtoConvertTest, ScheduleAndClippingLeftOutAreTheDefaults) {
  v1::PrepareRequest r = PrepareRequestFromArgs(Args(), catalog_);
  r.mutable_engine()->clear_lr_schedule();
  r.mutable_engine()->clear_decay_iterations();
  r.mutable_engine()->clear_min_learning_rate();
  r.mutable_engine()->clear_grad_clip_norm();
  absl::StatusOr<PrepareArgs> back = Read(r);
  ASSERT_TRUE(back.ok()) << back.status();
  EXPECT_EQ(back->job.engine.lr_schedule, "constant");
  EXPECT_EQ(back->job.engine.decay_iterations, 0);
  EXPECT_EQ(back->job.engine.min_learning_rate, 0);
  EXPECT_EQ(back->job.engine.grad_clip_norm, 0);
}

TEST_F(AgentProtoConvertTest, ClusterAndPlanAreRequired) {
  v1::PrepareRequest r = PrepareRequestFromArgs(Args(), catalog_);
  r.clear_cluster();
  EXPECT_EQ(Error(r), "cluster: required, got none");
  r = PrepareRequestFromArgs(Args(), catalog_);
  r.clear_plan();
  EXPECT_EQ(Error(r), "plan: required, got none");
  r = PrepareRequestFromArgs(Args(), catalog_);
  r.mutable_plan()->clear_templates();
  EXPECT_THAT(Error(r), HasSubstr("plan.templates: must not be empty"));
}

TEST_F(AgentProtoConvertTest, UnknownGpuTypeInTheClusterIsNamed) {
  v1::PrepareRequest r = PrepareRequestFromArgs(Args(), catalog_);
  r.mutable_cluster()->mutable_nodes(1)->set_gpu("B300");
  EXPECT_THAT(Error(r), HasSubstr("cluster.nodes[1].gpu"));
  EXPECT_THAT(Error(r), HasSubstr("B300"));
}

TEST_F(AgentProtoConvertTest, PlanOnAnUnknownNodeIsNamed) {
  v1::PrepareRequest r = PrepareRequestFromArgs(Args(), catalog_);
  r.mutable_plan()
      ->mutable_templates(0)
      ->mutable_placement(1)
      ->mutable_stages(0)
      ->set_node("n9");
  EXPECT_THAT(Error(r),
              HasSubstr("plan.templates[0].placement[1].stages[0].node"));
}

TEST_F(AgentProtoConvertTest, OldPlanAndOldClusterComeTogether) {
  v1::PrepareRequest r = PrepareRequestFromArgs(Args(), catalog_);
  r.clear_old_cluster();
  EXPECT_EQ(Error(r), "old_cluster: required with old_plan, got none");
  r = PrepareRequestFromArgs(Args(), catalog_);
  r.clear_old_plan();
  EXPECT_EQ(Error(r), "old_plan: required with old_cluster, got none");
}

TEST_F(AgentProtoConvertTest, LostGpusMustBeOfTheOldCluster) {
  v1::PrepareRequest r = PrepareRequestFromArgs(Args(), catalog_);
  r.mutable_lost(0)->set_node("n1");
  EXPECT_EQ(Error(r), "lost[0].node: unknown node \"n1\" (not in old_cluster)");
  r.mutable_lost(0)->set_node("n0");
  r.mutable_lost(0)->set_index(2);
  EXPECT_EQ(Error(r),
            "lost[0].index: must be in 0..1 (node \"n0\" has 2 GPUs), got 2");
  r.clear_old_plan();
  r.clear_old_cluster();
  EXPECT_EQ(Error(r),
            "lost: only with old_plan (lost GPUs are GPUs of the old plan), "
            "got 1");
}

TEST(PhaseTimeoutTest, ZeroIsTheDefaultAndBadValuesAreNamed) {
  EXPECT_EQ(*PhaseTimeoutFromProto(0, "timeout_s"), absl::Seconds(60));
  EXPECT_EQ(*PhaseTimeoutFromProto(2.5, "timeout_s"), absl::Milliseconds(2500));
  for (double bad :
       {-1.0, std::nan(""), std::numeric_limits<double>::infinity()}) {
    absl::StatusOr<absl::Duration> t = PhaseTimeoutFromProto(bad, "timeout_s");
    EXPECT_EQ(t.status().code(), absl::StatusCode::kInvalidArgument) << bad;
    EXPECT_THAT(t.status().message(),
                HasSubstr("timeout_s: must be >= 0 seconds (0 = 1m), got "));
  }
}

TEST(NodeStatusTest, RoundTripWithEveryField) {
  NodeStatus s;
  s.current_generation = 3;
  s.prepared_generation = 4;
  s.phase = Phase::kMigrated1;
  s.iteration = 17;
  s.loss = 2.5;
  s.ranks.push_back({.gpu = {"n0", 1},
                     .in_plan = true,
                     .iteration = 17,
                     .loss = 2.5,
                     .iteration_seconds = 0.25,
                     .tokens_per_second = 1000,
                     .state_bytes = 1 << 20,
                     .peak_rss_bytes = 1 << 30,
                     .error = "boom"});
  s.pause = {1.5, 0, 0};
  s.stage1 = {2.0, 100, 200};
  s.stage2 = {3.0, 300, 400};
  s.rebuild_groups = {0.5, 0, 0};
  s.rebuild_engines = {0.75, 0, 0};
  s.resume = {0.125, 0, 0};
  const GpuCatalog catalog = ToyCatalog();
  const NodeGpus gpus{
      .node = "n0", .gpu_type = kFast, .count = 2, .virtual_gpus = true};
  const v1::StatusResponse proto = NodeStatusToProto(s, gpus, catalog);
  EXPECT_EQ(proto.phase(), v1::PHASE_MIGRATED1);
  EXPECT_EQ(proto.node(), "n0");
  EXPECT_EQ(proto.gpu_type(), "FAST");
  EXPECT_EQ(proto.gpus(), 2);
  EXPECT_TRUE(proto.virtual_gpus());
  absl::StatusOr<NodeStatus> back = NodeStatusFromProto(proto);
  ASSERT_TRUE(back.ok()) << back.status();
  EXPECT_EQ(back->current_generation, 3);
  EXPECT_EQ(back->prepared_generation, 4);
  EXPECT_EQ(back->phase, Phase::kMigrated1);
  EXPECT_EQ(back->iteration, 17);
  ASSERT_EQ(back->ranks.size(), 1u);
  const RankStatus& r = back->ranks[0];
  EXPECT_EQ(r.gpu, (migration::GpuId{"n0", 1}));
  EXPECT_TRUE(r.in_plan);
  EXPECT_EQ(r.iteration_seconds, 0.25);
  EXPECT_EQ(r.tokens_per_second, 1000);
  EXPECT_EQ(r.state_bytes, 1 << 20);
  EXPECT_EQ(r.peak_rss_bytes, 1 << 30);
  EXPECT_EQ(r.error, "boom");
  EXPECT_EQ(back->stage1.bytes_sent, 100);
  EXPECT_EQ(back->stage2.bytes_received, 400);
  EXPECT_EQ(back->rebuild_engines.seconds, 0.75);
  EXPECT_EQ(back->resume.seconds, 0.125);
}

TEST(PhaseTest, EveryPhaseMapsBothWays) {
  for (Phase p : {Phase::kIdle, Phase::kPrepared, Phase::kPaused,
                  Phase::kMigrated1, Phase::kMigrated2, Phase::kRebuilt,
                  Phase::kRunning, Phase::kStopped, Phase::kFailed}) {
    EXPECT_EQ(*PhaseFromProto(PhaseToProto(p)), p);
  }
  EXPECT_EQ(PhaseFromProto(v1::PHASE_UNSPECIFIED).status().code(),
            absl::StatusCode::kInvalidArgument);
}

TEST(ModelStateProto, RoundTripsAndNamesABadTensor) {
  const migration::ModelState state =
      *migration::ModelState::Create(TinyModel(), {.training_scalars = 2});
  v1::DescribeStateResponse r;
  ModelStateToProto(state, r.mutable_tensors());
  ASSERT_EQ(r.tensors_size(), state.num_tensors());
  EXPECT_EQ(r.tensors(0).name(), "embedding.weight:weight");
  EXPECT_EQ(r.tensors(0).kind(), "weight");
  EXPECT_EQ(r.tensors(0).bytes_per_element(), 2);
  EXPECT_EQ(r.tensors(0).tp_split(), "column");
  absl::StatusOr<migration::ModelState> back =
      ModelStateFromProto(TinyModel(), r.tensors());
  ASSERT_TRUE(back.ok()) << back.status();
  EXPECT_EQ(back->TotalBytes(), state.TotalBytes());
  for (int i = 0; i < state.num_tensors(); ++i) {
    EXPECT_EQ(back->tensor(i).name, state.tensor(i).name);
    EXPECT_EQ(back->tensor(i).kind, state.tensor(i).kind);
    EXPECT_EQ(back->tensor(i).layer, state.tensor(i).layer);
    EXPECT_EQ(back->tensor(i).expert, state.tensor(i).expert);
    EXPECT_EQ(back->tensor(i).shape, state.tensor(i).shape);
    EXPECT_EQ(back->tensor(i).split, state.tensor(i).split);
  }
  // An engine storing fp32 weights cannot exchange bytes with bf16 ones.
  v1::DescribeStateResponse fp32 = r;
  fp32.mutable_tensors(0)->set_bytes_per_element(4);
  EXPECT_EQ(ModelStateFromProto(TinyModel(), fp32.tensors()).status().message(),
            "tensors[0].bytes_per_element: weight is 2 bytes per element, got 4");
  v1::DescribeStateResponse kind = r;
  kind.mutable_tensors(5)->set_kind("grad");
  EXPECT_EQ(ModelStateFromProto(TinyModel(), kind.tensors()).status().message(),
            "tensors[5].kind: must be weight, master, adam_m, adam_v or "
            "scalars, got \"grad\"");
  v1::DescribeStateResponse split = r;
  split.mutable_tensors(6)->set_tp_split("");
  EXPECT_EQ(ModelStateFromProto(TinyModel(), split.tensors()).status().message(),
            "tensors[6].tp_split: must be replicated, column or row, got \"\"");
}

// PrepareRequest.layout: every GPU of the plan in plan-rank order, with its
// role and exactly PlanLayout's holdings.
TEST(PlanLayoutProto, EveryRankWithItsRoleAndHoldings) {
  const migration::ModelState state =
      *migration::ModelState::Create(TinyModel(), {.training_scalars = 2});
  const Cluster cluster = MakeCluster({{"n0", kFast, 2}, {"n1", kFast, 2}});
  // Stage 0 at TP 2 on n0, stage 1 at TP 1 on n1:1.
  const Plan plan = MakePlan({MakeTemplate(
      {MakeStage(2, 0, 2), MakeStage(1, 2, 4)}, 1, {{0, {0, 1}}, {1, {1}}})});
  absl::StatusOr<migration::PlanLayout> layout =
      migration::PlanLayout::Create(state, plan, cluster);
  ASSERT_TRUE(layout.ok()) << layout.status();

  v1::StateLayout out;
  out.add_ranks();  // whatever was there is replaced
  PlanLayoutToProto(*layout, &out);
  ASSERT_EQ(out.ranks_size(), 3);
  ASSERT_EQ(layout->num_gpus(), 3);

  const v1::RankLayout& r1 = out.ranks(1);
  EXPECT_EQ(r1.gpu().node(), "n0");
  EXPECT_EQ(r1.gpu().index(), 1);
  EXPECT_EQ(r1.template_index(), 0);
  EXPECT_EQ(r1.replica(), 0);
  EXPECT_EQ(r1.stage(), 0);
  EXPECT_EQ(r1.tp_rank(), 1);
  const v1::RankLayout& r2 = out.ranks(2);
  EXPECT_EQ(r2.gpu().node(), "n1");
  EXPECT_EQ(r2.gpu().index(), 1);
  EXPECT_EQ(r2.stage(), 1);
  EXPECT_EQ(r2.tp_rank(), 0);

  // TP rank 1 of stage 0 holds the second half of the embedding (tensor 0,
  // split by column).
  ASSERT_GT(r1.holdings_size(), 0);
  const migration::ByteRange half = state.tensor(0).ShardRange(1, 2);
  EXPECT_EQ(r1.holdings(0).tensor(), 0);
  EXPECT_EQ(r1.holdings(0).begin(), half.begin);
  EXPECT_EQ(r1.holdings(0).end(), half.end);
  EXPECT_EQ(half.end - half.begin, state.tensor(0).bytes() / 2);
  EXPECT_GT(half.begin, 0);

  for (int g = 0; g < layout->num_gpus(); ++g) {
    const v1::RankLayout& r = out.ranks(g);
    const migration::GpuRole& role = layout->role(g);
    EXPECT_EQ(r.gpu().node(), layout->gpus()[g].node) << g;
    EXPECT_EQ(r.gpu().index(), layout->gpus()[g].index) << g;
    EXPECT_EQ(r.template_index(), role.template_index) << g;
    EXPECT_EQ(r.replica(), role.replica) << g;
    EXPECT_EQ(r.stage(), role.stage) << g;
    EXPECT_EQ(r.tp_rank(), role.tp_rank) << g;
    const std::vector<migration::Holding>& held = layout->holdings(g);
    ASSERT_EQ(r.holdings_size(), static_cast<int>(held.size())) << g;
    for (int h = 0; h < r.holdings_size(); ++h) {
      EXPECT_EQ(r.holdings(h).tensor(), held[h].tensor) << g << "/" << h;
      EXPECT_EQ(r.holdings(h).begin(), held[h].range.begin) << g << "/" << h;
      EXPECT_EQ(r.holdings(h).end(), held[h].range.end) << g << "/" << h;
    }
  }
  // The last tensor of the state (the training scalars) is on every GPU,
  // whole.
  EXPECT_EQ(out.ranks(0).holdings(out.ranks(0).holdings_size() - 1).tensor(),
            state.num_tensors() - 1);
  const v1::LayoutHolding& scalars = r2.holdings(r2.holdings_size() - 1);
  EXPECT_EQ(scalars.tensor(), state.num_tensors() - 1);
  EXPECT_EQ(scalars.begin(), 0);
  EXPECT_EQ(scalars.end(), 2 * 8);
}

// PrepareRequest.migration: each rank's share is exactly its part of the
// schedule (every transfer it sends or receives, in round order, from the
// right peer, with the transfer's segments) and the bytes it keeps; the
// shares of all ranks add up to the whole diff.
TEST(RankMigrationProto, EachRankGetsItsTransfersInRoundOrder) {
  const migration::ModelState state =
      *migration::ModelState::Create(TinyModel(), {.training_scalars = 2});
  const GpuCatalog catalog = ToyCatalog();
  const Cluster old_cluster = MakeCluster({{"n0", kFast, 2}});
  const Cluster cluster = MakeCluster({{"n0", kFast, 2}, {"n1", kFast, 1}});
  // Two stages of TP 1 on n0 -> stage 0 at TP 2 on n0, stage 1 on n1.
  const Plan old_plan = MakePlan({MakeTemplate(
      {MakeStage(1, 0, 2), MakeStage(1, 2, 4)}, 1, {{0, {0}}, {0, {1}}})});
  const Plan plan = MakePlan({MakeTemplate(
      {MakeStage(2, 0, 2), MakeStage(1, 2, 4)}, 1, {{0, {0, 1}}, {1, {0}}})});
  const migration::MigrationWorld world(cluster, catalog);
  absl::StatusOr<migration::StateDiff> diff = migration::ComputeDiff(
      state, old_plan, old_cluster, plan, cluster, world);
  ASSERT_TRUE(diff.ok()) << diff.status();
  const migration::MigrationSchedule schedule =
      migration::BuildSchedule(*diff, world);
  ASSERT_GT(schedule.stage1.size() + schedule.stage2.size(), 0u);

  int64_t sent = 0, received = 0, kept = 0;
  for (int rank = 0; rank < world.size(); ++rank) {
    v1::RankMigration out;
    out.set_rank(99);  // whatever was there is replaced
    RankMigrationToProto(*diff, schedule, rank, &out);
    EXPECT_EQ(out.rank(), rank);
    EXPECT_EQ(out.world_size(), 3);
    EXPECT_EQ(out.stage1_rounds(), static_cast<int>(schedule.stage1.size()));
    EXPECT_EQ(out.stage2_rounds(), static_cast<int>(schedule.stage2.size()));
    ASSERT_EQ(out.kept_size(), static_cast<int>(diff->kept[rank].size()));
    for (int k = 0; k < out.kept_size(); ++k) {
      EXPECT_EQ(out.kept(k).tensor(), diff->kept[rank][k].tensor);
      EXPECT_EQ(out.kept(k).begin(), diff->kept[rank][k].range.begin);
      EXPECT_EQ(out.kept(k).end(), diff->kept[rank][k].range.end);
      kept += out.kept(k).end() - out.kept(k).begin();
    }
    for (int stage : {1, 2}) {
      const auto& mine = stage == 1 ? out.stage1() : out.stage2();
      // The schedule's transfers of this rank, in the same order.
      std::vector<const migration::Transfer*> expected;
      std::vector<int> rounds;
      const std::vector<migration::Round>& all = schedule.stage(stage);
      for (size_t r = 0; r < all.size(); ++r) {
        for (const migration::Transfer& t : all[r].transfers) {
          if (t.sender == rank || t.receiver == rank) {
            expected.push_back(&t);
            rounds.push_back(static_cast<int>(r));
          }
        }
      }
      ASSERT_EQ(mine.size(), static_cast<int>(expected.size()));
      for (int i = 0; i < mine.size(); ++i) {
        const v1::MigrationTransfer& m = mine[i];
        const migration::Transfer& t = *expected[i];
        EXPECT_EQ(m.round(), rounds[i]);
        EXPECT_EQ(m.send(), t.sender == rank);
        EXPECT_EQ(m.peer(), m.send() ? t.receiver : t.sender);
        ASSERT_EQ(m.segments_size(), static_cast<int>(t.segments.size()));
        int64_t bytes = 0;
        for (int j = 0; j < m.segments_size(); ++j) {
          EXPECT_EQ(m.segments(j).tensor(), t.segments[j].tensor);
          EXPECT_EQ(m.segments(j).begin(), t.segments[j].range.begin);
          EXPECT_EQ(m.segments(j).end(), t.segments[j].range.end);
          bytes += m.segments(j).end() - m.segments(j).begin();
        }
        EXPECT_EQ(bytes, t.bytes);
        (m.send() ? sent : received) += bytes;
      }
    }
  }
  EXPECT_EQ(sent, diff->bytes_moved);
  EXPECT_EQ(received, diff->bytes_moved);
  EXPECT_EQ(kept, diff->bytes_kept);
  EXPECT_GT(diff->bytes_moved, 0);
  EXPECT_GT(diff->bytes_kept, 0);
}

// EngineConfig.token_file round-trips, and a bad one is named (the same
// words as arachne_torch's check).
TEST(EngineConfigProto, TokenFileRoundTripsAndBadFieldsAreNamed) {
  v1::EngineConfig in;
  in.mutable_token_file()->set_path("/data/tokens.bin");
  in.mutable_token_file()->set_token_bytes(2);
  const EngineConfig e = EngineConfigFromProto(in);
  ASSERT_TRUE(e.token_file.has_value());
  EXPECT_EQ(e.token_file->path, "/data/tokens.bin");
  EXPECT_EQ(e.token_file->token_bytes, 2);
  EXPECT_TRUE(e.Validate().ok());
  const v1::EngineConfig back = EngineConfigToProto(e);
  EXPECT_EQ(back.token_file().path(), "/data/tokens.bin");
  EXPECT_EQ(back.token_file().token_bytes(), 2);
  EXPECT_FALSE(EngineConfigToProto(EngineConfig()).has_token_file());
  EXPECT_FALSE(EngineConfigFromProto(v1::EngineConfig()).token_file.has_value());

  auto error = [](std::string path, int token_bytes) {
    EngineConfig c;
    c.token_file = EngineConfig::TokenFile{std::move(path), token_bytes};
    const absl::Status s = c.Validate();
    EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument) << s;
    return std::string(s.message());
  };
  EXPECT_EQ(error("", 2),
            "engine.token_file.path: required (an absolute path), got none");
  EXPECT_EQ(error("data/tokens.bin", 2),
            "engine.token_file.path: must be an absolute path, got "
            "\"data/tokens.bin\"");
  EXPECT_EQ(error(std::string("/a\0b", 4), 2),
            "engine.token_file.path: must not contain a NUL byte");
  EXPECT_THAT(error("/" + std::string(4096, 'x'), 2),
              HasSubstr("engine.token_file.path: at most 4096 bytes, got "
                        "4097 bytes"));
  EXPECT_EQ(error("/data/tokens.bin", 3),
            "engine.token_file.token_bytes: must be 2 (uint16) or 4 (uint32), "
            "got 3");
}

}  // namespace
}  // namespace arachne::agent
