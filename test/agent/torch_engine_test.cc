// The PyTorch engine (python/arachne_torch, docs/pytorch.md) under real
// arachne-agent processes on 127.0.0.1, one engine process per GPU:
//   - the same mathematics as the reference engine: 8 iterations of a plan
//     with pipeline stages of different TP degrees (dense) and of expert
//     parallelism over two replicas on two nodes (MoE) give the reference
//     engine's losses within 1e-4 relative, and its state;
//   - a checkpoint is the one canonical format: the reference engine's
//     loads into this engine, and a switch to another plan (TP and PP
//     change) through this engine's checkpoint restores the state bit for
//     bit, then training follows an unswitched run;
//   - live switches (TP and PP change, a node joins; an MoE join that moves
//     experts) move the state bit for bit, and losses follow an unswitched
//     run.
//   - with the cosine schedule and gradient clipping on, a live switch
//     follows the reference engine's unswitched run on another plan.
#include <cmath>
#include <cstring>
#include <filesystem>
#include <string>
#include <vector>

#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "test/agent/agent_harness.h"

namespace arachne::agent {
namespace {

using testing::Driver;
using testing::MaxMasterDifference;
using testing::NamedCluster;
using testing::Place;
using testing::RunPlan;
using testing::TinyJob;

std::string TempDir(const std::string& name) {
  std::string d = std::string(::testing::TempDir()) + "arachne-torch-" +
                  name + "-" + std::to_string(getpid());
  std::filesystem::remove_all(d);
  std::filesystem::create_directories(d);
  return d;
}

// The agent flag that runs the PyTorch engine: the launcher the build
// writes (python/arachne-torch-engine.in).
std::vector<std::string> TorchEngine() {
  return {"--engine-command",
          std::string(ARACHNE_BINARY_DIR) + "/python/arachne-torch-engine"};
}

JobSpec TinyMoeJob() {
  JobSpec job = TinyJob();
  job.model = *ResolveModel("tiny-moe");
  return job;
}

void ExpectLossesWithin(const std::map<int64_t, double>& losses,
                        const std::vector<double>& reference, double rel) {
  ASSERT_FALSE(losses.empty());
  for (const auto& [i, loss] : losses) {
    ASSERT_LE(i, static_cast<int64_t>(reference.size()));
    EXPECT_NEAR(loss, reference[i - 1], rel * std::abs(reference[i - 1]))
        << "iteration " << i;
  }
}

TEST(TorchEngine, DensePipelineOfTwoTpDegreesTrainsAsTheReferenceEngine) {
  const std::string dir = TempDir("dense");
  Driver d(TinyJob(), dir);
  d.Agent("a", 2, TorchEngine());
  d.Agent("b", 2, TorchEngine());
  const Cluster ab = NamedCluster({{"a", 2}, {"b", 2}});
  // Stage 0 (layers 0-1) TP 2 on a, stage 1 (layers 2-3) TP 1 on b.
  const Plan plan{{Place({{2, 0, 2}, {1, 2, 4}}, 1, 4, 4,
                         {{0, 0}, {0, 1}, {1, 0}})}};
  ASSERT_TRUE(d.Start(plan, ab).ok());
  ASSERT_TRUE(d.TrainUntil(8).ok());
  EXPECT_EQ(d.losses().size(), 8u);
  auto reference = RunPlan(TinyJob(), plan, ab, 8);
  ASSERT_TRUE(reference.ok()) << reference.status();
  ExpectLossesWithin(d.losses(), reference->losses, 1e-4);
  absl::StatusOr<FullState> state = d.Gather("after");
  ASSERT_TRUE(state.ok()) << state.status();
  EXPECT_LT(MaxMasterDifference(TinyJob(), *state, reference->state), 1e-5);
}

TEST(TorchEngine, MoeExpertParallelAcrossNodesTrainsAsTheReferenceEngine) {
  const JobSpec job = TinyMoeJob();
  const std::string dir = TempDir("moe");
  Driver d(job, dir);
  d.Agent("a", 1, TorchEngine());
  d.Agent("b", 1, TorchEngine());
  const Cluster ab = NamedCluster({{"a", 1}, {"b", 1}});
  // EP 2 over two one-GPU replicas, one on each node: the replicas'
  // gradients reduce across nodes, their tokens go to each other's experts.
  Plan ep2{{Place({{1, 0, 4}}, 2, 4, 4, {{0, 0}, {1, 0}})}};
  ep2.templates[0].stages[0].tiling = {2, 1, 1};
  ASSERT_TRUE(d.Start(ep2, ab).ok());
  ASSERT_TRUE(d.TrainUntil(8).ok());
  EXPECT_EQ(d.losses().size(), 8u);
  auto reference = RunPlan(job, ep2, ab, 8);
  ASSERT_TRUE(reference.ok()) << reference.status();
  ExpectLossesWithin(d.losses(), reference->losses, 1e-4);
}

TEST(TorchEngine, ReferenceCheckpointLoadsAndAPlanChangeRestoresBitwise) {
  const JobSpec job = TinyJob();
  const std::string dir = TempDir("ckpt");
  const Cluster ab = NamedCluster({{"a", 2}, {"b", 2}});
  // Three iterations on the reference engine, saved as a checkpoint.
  const Plan dp2{{Place({{1, 0, 4}}, 2, 4, 4, {{0, 0}, {1, 0}})}};
  std::filesystem::create_directories(dir + "/cpp");
  std::filesystem::create_directories(dir + "/torch");
  std::string reference_ckpt;
  {
    Driver c(job, dir + "/cpp");
    c.Agent("a", 2);
    c.Agent("b", 2);
    ASSERT_TRUE(c.Start(dp2, ab).ok());
    ASSERT_TRUE(c.TrainUntil(3).ok());
    ASSERT_TRUE(c.Gather("ckpt").ok());
    reference_ckpt = dir + "/cpp/ckpt";
  }
  Driver d(job, dir + "/torch");
  // Their checkpoint root holds the reference engine's checkpoint too.
  std::vector<std::string> args = TorchEngine();
  args.insert(args.end(), {"--checkpoint-root", dir});
  d.Agent("a", 2, args);
  d.Agent("b", 2, args);
  // The same plan on this engine, from the reference engine's state.
  absl::Status started = d.Start(dp2, ab, reference_ckpt);
  ASSERT_TRUE(started.ok()) << started;
  absl::StatusOr<FullState> loaded = d.Gather("loaded");
  ASSERT_TRUE(loaded.ok()) << loaded.status();
  absl::StatusOr<FullState> saved =
      ReadCheckpoint(reference_ckpt, *ReferenceModelState(job));
  ASSERT_TRUE(saved.ok()) << saved.status();
  EXPECT_TRUE(*loaded == *saved)
      << FirstDifference(*ReferenceModelState(job), *saved, *loaded);
  ASSERT_TRUE(d.TrainUntil(5).ok());
  // Another plan (TP 2 then TP 1 over a pipeline of two) through this
  // engine's own checkpoint: the state right after is the state right
  // before, bit for bit.
  absl::StatusOr<FullState> before = d.Gather("before");
  ASSERT_TRUE(before.ok()) << before.status();
  const Plan pp2{{Place({{2, 0, 2}, {1, 2, 4}}, 1, 4, 4,
                        {{1, 0}, {1, 1}, {0, 0}})}};
  absl::Status sw = d.Switch(pp2, ab, testing::SwitchStep::kNone, nullptr,
                             dir + "/torch/before");
  ASSERT_TRUE(sw.ok()) << sw;
  absl::StatusOr<FullState> after = d.Gather("after");
  ASSERT_TRUE(after.ok()) << after.status();
  EXPECT_TRUE(*before == *after)
      << FirstDifference(*ReferenceModelState(job), *before, *after);
  ASSERT_TRUE(d.TrainUntil(8).ok());
  // Losses follow an unswitched reference run.
  auto reference = RunPlan(job, dp2, ab, 8);
  ASSERT_TRUE(reference.ok()) << reference.status();
  ExpectLossesWithin(d.losses(), reference->losses, 1e-4);
}

// A live switch on this engine: each rank moves its share of the agent's
// schedule over Gloo, reading the old plan's tensors and writing the new
// plan's in place.
TEST(TorchEngine, LiveSwitchesChangeTpAndPpAndMoveTheStateBitwise) {
  const JobSpec job = TinyJob();
  const std::string dir = TempDir("live");
  Driver d(job, dir);
  d.Agent("a", 2, TorchEngine());
  d.Agent("b", 2, TorchEngine());
  const Cluster ab = NamedCluster({{"a", 2}, {"b", 2}});
  const Plan dp2{{Place({{1, 0, 4}}, 2, 4, 4, {{0, 0}, {1, 0}})}};
  ASSERT_TRUE(d.Start(dp2, ab).ok());
  ASSERT_TRUE(d.TrainUntil(3).ok());
  // Two replicas -> a pipeline of TP 2 (layers 0-1) then TP 1 (2-3).
  absl::StatusOr<FullState> before = d.Gather("before1");
  ASSERT_TRUE(before.ok()) << before.status();
  const Plan pp2{{Place({{2, 0, 2}, {1, 2, 4}}, 1, 4, 4,
                        {{1, 0}, {1, 1}, {0, 0}})}};
  absl::Status sw = d.Switch(pp2, ab);
  ASSERT_TRUE(sw.ok()) << sw;
  // The agents' migration estimate is the schedule they computed, whatever
  // the engine answers (arachne_torch prices none): it moved bytes, so > 0.
  EXPECT_GT(d.last_estimate_s(), 0);
  absl::StatusOr<FullState> after = d.Gather("after1");
  ASSERT_TRUE(after.ok()) << after.status();
  EXPECT_TRUE(*before == *after)
      << FirstDifference(*ReferenceModelState(job), *before, *after);
  ASSERT_TRUE(d.TrainUntil(5).ok());
  // A third node joins: TP 1 (layers 0-2) on it, TP 2 (layer 3) on b.
  d.Agent("c", 1, TorchEngine());
  const Cluster abc = NamedCluster({{"a", 2}, {"b", 2}, {"c", 1}});
  const Plan joined{{Place({{1, 0, 3}, {2, 3, 4}}, 1, 4, 4,
                           {{2, 0}, {1, 0}, {1, 1}})}};
  before = d.Gather("before2");
  ASSERT_TRUE(before.ok()) << before.status();
  sw = d.Switch(joined, abc);
  ASSERT_TRUE(sw.ok()) << sw;
  after = d.Gather("after2");
  ASSERT_TRUE(after.ok()) << after.status();
  EXPECT_TRUE(*before == *after)
      << FirstDifference(*ReferenceModelState(job), *before, *after);
  ASSERT_TRUE(d.TrainUntil(8).ok());
  EXPECT_EQ(d.generation(), 3);
  // Losses follow an unswitched run.
  auto reference = RunPlan(job, dp2, ab, 8);
  ASSERT_TRUE(reference.ok()) << reference.status();
  ExpectLossesWithin(d.losses(), reference->losses, 1e-4);
}

// The cosine schedule and gradient clipping (0.1, below the gradient's
// norm at every iteration) on: this engine, two replicas for 3 iterations
// then, after a live switch, a pipeline of TP 2 then TP 1, trains the
// reference engine's iterations on one GPU (the clip's norm counted once
// under every plan, the schedule's position carried across the switch).
TEST(TorchEngine, CosineScheduleAndClippingTrainAsTheReferenceEngineAcrossASwitch) {
  JobSpec job = TinyJob();
  job.engine.warmup_iterations = 2;
  job.engine.lr_schedule = "cosine";
  job.engine.decay_iterations = 7;
  job.engine.min_learning_rate = 1e-4;
  job.engine.grad_clip_norm = 0.1;
  const std::string dir = TempDir("cosine-clip");
  Driver d(job, dir);
  d.Agent("a", 2, TorchEngine());
  d.Agent("b", 2, TorchEngine());
  const Cluster ab = NamedCluster({{"a", 2}, {"b", 2}});
  const Plan dp2{{Place({{1, 0, 4}}, 2, 4, 4, {{0, 0}, {1, 0}})}};
  ASSERT_TRUE(d.Start(dp2, ab).ok());
  ASSERT_TRUE(d.TrainUntil(3).ok());
  const Plan pp2{{Place({{2, 0, 2}, {1, 2, 4}}, 1, 4, 4,
                        {{1, 0}, {1, 1}, {0, 0}})}};
  absl::Status sw = d.Switch(pp2, ab);
  ASSERT_TRUE(sw.ok()) << sw;
  ASSERT_TRUE(d.TrainUntil(8).ok());
  EXPECT_EQ(d.losses().size(), 8u);
  const Cluster a = NamedCluster({{"a", 1}});
  const Plan one{{Place({{1, 0, 4}}, 1, 4, 4, {{0, 0}})}};
  auto reference = RunPlan(job, one, a, 8);
  ASSERT_TRUE(reference.ok()) << reference.status();
  ExpectLossesWithin(d.losses(), reference->losses, 1e-4);
  auto plain = RunPlan(TinyJob(), one, a, 8);
  ASSERT_TRUE(plain.ok()) << plain.status();
  EXPECT_GT(std::abs(plain->losses.back() - reference->losses.back()), 1e-3)
      << "the schedule and clipping change the run";
  absl::StatusOr<FullState> state = d.Gather("after");
  ASSERT_TRUE(state.ok()) << state.status();
  EXPECT_LT(MaxMasterDifference(job, *state, reference->state), 1e-5);
  // Adam's first moment carries the clip's scales (the losses and weights
  // hardly move when every scale is off by one factor, as with a norm that
  // counted some gradient twice): within 1e-4 in relative L2.
  auto model = ReferenceModelState(job);
  ASSERT_TRUE(model.ok()) << model.status();
  double diff = 0, norm = 0;
  for (int id = 0; id < model->num_tensors(); ++id) {
    if (model->tensor(id).kind != migration::StateKind::kAdamM) continue;
    for (size_t o = 0; o + 4 <= state->tensors[id].size(); o += 4) {
      float u, v;
      std::memcpy(&u, state->tensors[id].data() + o, 4);
      std::memcpy(&v, reference->state.tensors[id].data() + o, 4);
      diff += (double(u) - v) * (double(u) - v);
      norm += double(v) * v;
    }
  }
  EXPECT_LT(std::sqrt(diff / norm), 1e-4);
}

TEST(TorchEngine, MoeLiveJoinMovesExpertsBitwise) {
  const JobSpec job = TinyMoeJob();
  const std::string dir = TempDir("live-moe");
  Driver d(job, dir);
  d.Agent("a", 1, TorchEngine());
  const Cluster a = NamedCluster({{"a", 1}});
  const Plan one{{Place({{1, 0, 4}}, 1, 4, 4, {{0, 0}})}};
  ASSERT_TRUE(d.Start(one, a).ok());
  ASSERT_TRUE(d.TrainUntil(3).ok());
  absl::StatusOr<FullState> before = d.Gather("before");
  ASSERT_TRUE(before.ok()) << before.status();
  // b joins: EP 2 over the two nodes, half the experts move to b.
  d.Agent("b", 1, TorchEngine());
  const Cluster ab = NamedCluster({{"a", 1}, {"b", 1}});
  Plan ep2{{Place({{1, 0, 4}}, 2, 4, 4, {{0, 0}, {1, 0}})}};
  ep2.templates[0].stages[0].tiling = {2, 1, 1};
  absl::Status sw = d.Switch(ep2, ab);
  ASSERT_TRUE(sw.ok()) << sw;
  absl::StatusOr<FullState> after = d.Gather("after");
  ASSERT_TRUE(after.ok()) << after.status();
  EXPECT_TRUE(*before == *after)
      << FirstDifference(*ReferenceModelState(job), *before, *after);
  ASSERT_TRUE(d.TrainUntil(6).ok());
  auto reference = RunPlan(job, one, a, 6);
  ASSERT_TRUE(reference.ok()) << reference.status();
  ExpectLossesWithin(d.losses(), reference->losses, 1e-4);
}

}  // namespace
}  // namespace arachne::agent
