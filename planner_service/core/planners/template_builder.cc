#include "planner_service/core/planners/template_builder.h"

#include <algorithm>

namespace arachne {

bool UniformNodeSizes(const Cluster& cluster) {
  for (const Node& n : cluster.nodes())
    if (n.num_gpus != cluster.node(0).num_gpus) return false;
  return true;
}

Template MakeTemplate(const std::vector<StageChoice>& structure, int mbs) {
  Template t;
  t.micro_batch_size = mbs;
  for (const StageChoice& c : structure) {
    Stage st;
    st.gpu_type = c.gpu_type;
    st.tp = c.tp;
    t.stages.push_back(st);
  }
  return t;
}

void ShardExpertsByTp(Template& t, const ModelSpec& model) {
  for (Stage& st : t.stages) {
    st.tiling = model.MoeLayersIn(st.layer_begin, st.layer_end) > 0
                    ? ExpertTiling{1, st.tp, t.replicas}
                    : ExpertTiling{};
  }
}

bool PlaceReplicas(Template& t, int replicas, NodePool& pool) {
  if (replicas <= 0) return false;
  NodePool trial = pool;
  std::vector<StagePlacement> placement;
  for (int r = 0; r < replicas; ++r) {
    if (!trial.PlaceReplica(t.stages, &placement)) return false;
  }
  pool = trial;
  t.placement = std::move(placement);
  t.replicas = replicas;
  return true;
}

int CountReplicas(const std::vector<Stage>& stages, const NodePool& pool) {
  NodePool trial = pool;
  std::vector<StagePlacement> placement;
  int n = 0;
  while (trial.PlaceReplica(stages, &placement)) ++n;
  return n;
}

std::vector<int> MicroBatchSizes(const CostModel& cm) {
  std::vector<int> out;
  for (int mbs = 1; mbs <= cm.params().max_micro_batch_size &&
                    mbs <= cm.training().global_batch;
       mbs *= 2) {
    out.push_back(mbs);
  }
  return out;
}

std::vector<std::vector<int>> Permutations(std::vector<int> items) {
  std::sort(items.begin(), items.end());
  std::vector<std::vector<int>> out;
  do {
    out.push_back(items);
  } while (std::next_permutation(items.begin(), items.end()));
  return out;
}

}  // namespace arachne
