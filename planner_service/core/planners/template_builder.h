// Building blocks the baseline planners share to turn the structure their
// search decided (GPU type and TP degree per stage, replicas, micro-batch
// size, layer split) into a placed template the cost model can price. Each
// baseline applies its own rules; these only do the bookkeeping.
#ifndef ARACHNE_PLANNER_SERVICE_CORE_PLANNERS_TEMPLATE_BUILDER_H_
#define ARACHNE_PLANNER_SERVICE_CORE_PLANNERS_TEMPLATE_BUILDER_H_

#include <vector>

#include "planner_service/core/planners/auto_fill.h"
#include "planner_service/core/model/cluster.h"
#include "planner_service/core/cost/cost_model.h"
#include "planner_service/core/model/node_pool.h"
#include "planner_service/core/model/plan.h"

namespace arachne {

// Whether every node of the cluster has the same GPU count. AMP, Espresso
// and Sailor assume so; on other clusters they get the paper's reading in
// which every GPU is its own node, so their TP degree is 1.
bool UniformNodeSizes(const Cluster& cluster);

// A template of `structure` (no placement yet), micro-batch size `mbs`.
Template MakeTemplate(const std::vector<StageChoice>& structure, int mbs);

// Expert tiling of a planner without the expert dimension: the routed
// experts are sharded like the dense MLP, by the stage's TP degree
// (ETP = tp, EP = 1, EDP = replicas); 1x1x1 on stages without MoE layers.
// Requires the stages' layer ranges and the template's replicas to be set.
void ShardExpertsByTp(Template& t, const ModelSpec& model);

// Places `replicas` replicas of t's stages on `pool` (taking their GPUs)
// and sets t.replicas; false, with `pool` and `t` unchanged, when they do
// not all fit.
bool PlaceReplicas(Template& t, int replicas, NodePool& pool);

// Most replicas of `stages` the pool can hold (the pool is not changed).
int CountReplicas(const std::vector<Stage>& stages, const NodePool& pool);

// Micro-batch sizes a planner may pick: powers of two up to the largest the
// profiles cover.
std::vector<int> MicroBatchSizes(const CostModel& cost_model);

// Every permutation of `items` (lexicographic order of the sorted input).
std::vector<std::vector<int>> Permutations(std::vector<int> items);

}  // namespace arachne

#endif  // ARACHNE_PLANNER_SERVICE_CORE_PLANNERS_TEMPLATE_BUILDER_H_
