// Hand-made inputs for cost-model and planner tests: two GPU types with round
// figures and a small model whose profile entries are set by hand, so every
// expected value in the tests can be computed on paper.
#ifndef ARACHNE_TEST_CORE_TOY_FIXTURE_H_
#define ARACHNE_TEST_CORE_TOY_FIXTURE_H_

#include <string>
#include <utility>
#include <vector>

#include "glog/logging.h"
#include "planner_service/core/model/cluster.h"
#include "planner_service/core/model/gpu_catalog.h"
#include "planner_service/core/model/model.h"
#include "planner_service/core/model/plan.h"
#include "planner_service/core/cost/profile_store.h"

namespace arachne::testing {

inline constexpr int kFast = 0;
inline constexpr int kSlow = 1;

inline GpuCatalog ToyCatalog() {
  GpuType fast{.id = "FAST", .aliases = {"F"}, .product_name = "fast",
               .peak_bf16_tflops = 100, .peak_fp32_tflops = 10,
               .memory_gib = 10, .hbm_gbps = 1000, .intra_node_gbps = 100,
               .intra_node_link = "NVLink", .default_gpus_per_node = 4,
               .usd_per_hour = 2, .source = "test"};
  GpuType slow{.id = "SLOW", .aliases = {"S"}, .product_name = "slow",
               .peak_bf16_tflops = 50, .peak_fp32_tflops = 5,
               .memory_gib = 10, .hbm_gbps = 500, .intra_node_gbps = 50,
               .intra_node_link = "PCIe", .default_gpus_per_node = 4,
               .usd_per_hour = 1, .source = "test"};
  auto c = GpuCatalog::Create({fast, slow});
  CHECK(c.status().ok());
  return *std::move(c);
}

// 4 dense layers; hidden 1024.
inline ModelSpec ToyModel() {
  ModelSpec m;
  m.name = "toy";
  m.num_layers = 4;
  m.hidden = 1024;
  m.num_heads = 8;
  m.num_kv_heads = 8;
  m.head_dim = 128;
  m.ffn = 4096;
  m.vocab = 1000;
  return m;
}

// The same with every layer MoE: 8 experts, top-2.
inline ModelSpec ToyMoeModel() {
  ModelSpec m = ToyModel();
  m.name = "toymoe";
  m.moe.num_experts = 8;
  m.moe.top_k = 2;
  m.moe.expert_ffn = 1024;
  return m;
}

inline TrainingConfig ToyTraining() {
  TrainingConfig t;
  t.seq_len = 1024;
  t.global_batch = 8;
  return t;
}

// Dense layer per micro-batch of 1: FAST 1 + 2 ms, SLOW 2 + 4 ms; both scale
// linearly with the micro-batch and halve with TP 2 (plus 0.5 ms TP comm).
// 1e6 parameters and 100 MiB of activations per layer at TP 1.
inline ProfileStore ToyProfiles(const std::string& model = "toy") {
  ProfileStore store;
  for (int gpu = 0; gpu < 2; ++gpu) {
    const std::string id = gpu == kFast ? "FAST" : "SLOW";
    const double f = gpu == kFast ? 1.0 : 2.0;
    for (int tp : {1, 2}) {
      for (int mbs : {1, 2, 4}) {
        auto add = [&](LayerKind kind, double fwd, double bwd, double comm,
                       double act, double params) {
          ProfileEntry e;
          e.key = ProfileKey{model, kind, id, tp, mbs, 1024};
          e.fwd_ms = fwd;
          e.bwd_ms = bwd;
          e.tp_comm_ms = comm;
          e.activation_bytes = static_cast<int64_t>(act);
          e.param_count = static_cast<int64_t>(params);
          CHECK(store.Add(e).ok());
        };
        const double comm = tp == 1 ? 0 : 0.5;
        const double act = 100.0 * (1 << 20) * mbs / tp;
        add(LayerKind::kDense, f * mbs / tp, 2 * f * mbs / tp, comm, act,
            1e6 / tp);
        add(LayerKind::kMoeAttention, f * mbs / tp, 2 * f * mbs / tp, comm,
            act, 1e6 / tp);
        // Experts: all 8 on the ETP group; 8e6 parameters at ETP 1.
        add(LayerKind::kMoeExperts, f * mbs / tp, 2 * f * mbs / tp, comm,
            act, 8e6 / tp);
        add(LayerKind::kEmbedding, 0, 0, 0, 0, 0);
        add(LayerKind::kLmHead, 0, 0, 0, 0, 0);
      }
    }
  }
  return store;
}

inline Cluster MakeCluster(const GpuCatalog& catalog,
                           std::vector<std::pair<int, int>> type_and_gpus) {
  std::vector<Node> nodes;
  for (size_t i = 0; i < type_and_gpus.size(); ++i) {
    nodes.push_back(Node{.name = "n" + std::to_string(i),
                         .gpu_type = type_and_gpus[i].first,
                         .num_gpus = type_and_gpus[i].second,
                         .nic_gbps = 100});
  }
  auto c = Cluster::Create(nodes, catalog);
  CHECK(c.status().ok());
  return *std::move(c);
}

inline Stage MakeStage(int type, int tp, int begin, int end) {
  Stage s;
  s.gpu_type = type;
  s.tp = tp;
  s.layer_begin = begin;
  s.layer_end = end;
  return s;
}

// One replica of `stages` placed on `placement` (one entry a stage), micro-
// batches of 1, 8 per iteration (ToyTraining's global batch).
inline Plan OneReplicaPlan(std::vector<Stage> stages,
                           std::vector<StagePlacement> placement) {
  Template t;
  t.stages = std::move(stages);
  t.replicas = 1;
  t.micro_batch_size = 1;
  t.total_micro_batches = 8;
  t.placement = std::move(placement);
  Plan plan;
  plan.templates = {t};
  return plan;
}

}  // namespace arachne::testing

#endif  // ARACHNE_TEST_CORE_TOY_FIXTURE_H_
