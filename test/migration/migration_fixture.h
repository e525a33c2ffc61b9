// Small hand-made inputs for the migration tests: a tiny model whose byte
// counts can be worked out on paper, the toy GPU catalog, clusters from
// (name, type, GPUs) rows and plans from stages and placements.
#ifndef ARACHNE_TEST_MIGRATION_MIGRATION_FIXTURE_H_
#define ARACHNE_TEST_MIGRATION_MIGRATION_FIXTURE_H_

#include <string>
#include <utility>
#include <vector>

#include "glog/logging.h"
#include "planner_service/core/model/cluster.h"
#include "planner_service/core/model/gpu_catalog.h"
#include "planner_service/core/model/model.h"
#include "planner_service/core/model/plan.h"
#include "test/core/toy_fixture.h"

namespace arachne::migration::testing {

using ::arachne::testing::kFast;
using ::arachne::testing::kSlow;
using ::arachne::testing::ToyCatalog;

// 4 dense SwiGLU layers, hidden 64, 4 heads of 16 (2 KV heads), FFN 128,
// vocabulary 256. Parameters: attention 12,416 and MLP 24,576 per layer,
// embedding 16,384, final norm 64 + LM head 16,384; 180,800 in all.
inline ModelSpec TinyModel() {
  ModelSpec m;
  m.name = "tiny";
  m.num_layers = 4;
  m.hidden = 64;
  m.num_heads = 4;
  m.num_kv_heads = 2;
  m.head_dim = 16;
  m.ffn = 128;
  m.vocab = 256;
  return m;
}

// The same with every layer MoE: 4 routed experts of width 32, top-2.
inline ModelSpec TinyMoeModel() {
  ModelSpec m = TinyModel();
  m.name = "tinymoe";
  m.moe.num_experts = 4;
  m.moe.top_k = 2;
  m.moe.expert_ffn = 32;
  return m;
}

struct NodeRow {
  std::string name;
  int type;
  int gpus;
};
inline Cluster MakeCluster(const std::vector<NodeRow>& rows) {
  std::vector<Node> nodes;
  for (const NodeRow& r : rows) {
    nodes.push_back({.name = r.name, .gpu_type = r.type, .num_gpus = r.gpus});
  }
  auto c = Cluster::Create(std::move(nodes), ToyCatalog());
  CHECK(c.ok()) << c.status();
  return *std::move(c);
}

inline Stage MakeStage(int tp, int begin, int end, ExpertTiling tiling = {}) {
  return Stage{.gpu_type = kFast, .tp = tp, .layer_begin = begin,
               .layer_end = end, .tiling = tiling};
}

// One template; `placement` is replica-major (placement[r * depth + s]).
inline Template MakeTemplate(std::vector<Stage> stages, int replicas,
                             std::vector<StagePlacement> placement) {
  Template t;
  t.stages = std::move(stages);
  t.replicas = replicas;
  t.placement = std::move(placement);
  return t;
}

inline Plan MakePlan(std::vector<Template> templates) {
  Plan p;
  p.templates = std::move(templates);
  return p;
}

}  // namespace arachne::migration::testing

#endif  // ARACHNE_TEST_MIGRATION_MIGRATION_FIXTURE_H_
