// A parallelism plan: a set of templates (pipeline structures), each with its
// data-parallel replicas, micro-batching and concrete GPU placement, and the
// prediction the cost model makes for it.
#ifndef ARACHNE_PLANNER_SERVICE_CORE_MODEL_PLAN_H_
#define ARACHNE_PLANNER_SERVICE_CORE_MODEL_PLAN_H_

#include <string>
#include <vector>

#include "absl/container/inlined_vector.h"

namespace arachne {

// Expert tiling of a MoE stage: ep * etp * edp = GPUs of the stage over all
// replicas of its template (tp * replicas). All 1 for dense stages.
struct ExpertTiling {
  int ep = 1;   // expert parallel: experts split across ranks
  int etp = 1;  // expert tensor parallel: each expert sliced, inside a node
  int edp = 1;  // expert data parallel: the rest
  friend bool operator==(const ExpertTiling&, const ExpertTiling&) = default;
};

struct Stage {
  int gpu_type = -1;  // catalog index
  int tp = 1;
  int layer_begin = 0;  // [layer_begin, layer_end) of the transformer blocks
  int layer_end = 0;
  ExpertTiling tiling;
  int num_layers() const { return layer_end - layer_begin; }
};

// The GPUs of one TP group: `tp` local GPU indices on one node. Inline up
// to 8 (the largest node of every shipped cluster): searches copy plans of
// hundreds of TP groups, and a heap block per group made the copies most of
// their cost.
struct StagePlacement {
  int node = -1;  // cluster node index
  absl::InlinedVector<int, 8> gpus;
};

struct Template {
  std::vector<Stage> stages;
  int replicas = 1;
  int micro_batch_size = 1;
  // Micro-batches of all replicas together; replica r runs
  // total / replicas (+1 for the first total % replicas replicas).
  int total_micro_batches = 1;
  // placement[r * depth + s]: the TP group of stage s in replica r.
  std::vector<StagePlacement> placement;

  int depth() const { return static_cast<int>(stages.size()); }
  // Micro-batches of the busiest replica.
  int max_micro_batches() const {
    return (total_micro_batches + replicas - 1) / replicas;
  }
  const StagePlacement& at(int replica, int stage) const {
    return placement[replica * depth() + stage];
  }
  int gpus_per_replica() const {
    int n = 0;
    for (const Stage& s : stages) n += s.tp;
    return n;
  }
};

// Where the time of an iteration goes (seconds, on the critical replica).
struct TimeBreakdown {
  double compute_s = 0;    // fwd + bwd (+ recompute) on the critical path
  double tp_comm_s = 0;    // TP collectives on the critical path
  double p2p_s = 0;        // activation sends between stages
  double bubble_s = 0;     // pipeline fill/drain idle time
  double dp_sync_s = 0;    // gradient all-reduce (slowest stage)
  double all_to_all_s = 0; // MoE dispatch + combine on the critical path
  double optimizer_s = 0;  // optimizer step
};

struct StageMemory {
  double weights_gib = 0;      // weights + gradients + optimizer state
  double activations_gib = 0;  // in-flight activations (+ logits on last)
  double reserve_gib = 0;      // framework reserve
  double total_gib() const { return weights_gib + activations_gib + reserve_gib; }
};

struct Prediction {
  double iteration_time_s = 0;
  double throughput_iters_per_s = 0;
  double tokens_per_s = 0;
  double mfu = 0;
  double usd_per_hour = 0;  // price of the GPUs the plan uses
  TimeBreakdown breakdown;
  // stage_memory[t][s]: peak memory per GPU of stage s of template t.
  std::vector<std::vector<StageMemory>> stage_memory;
  double max_memory_gib = 0;
};

struct Plan {
  std::vector<Template> templates;
  int used_gpus() const {
    int n = 0;
    for (const Template& t : templates) n += t.gpus_per_replica() * t.replicas;
    return n;
  }
};

// Whether every group of `group` consecutive GPUs of stage `s` (the stage's
// GPUs flattened replica-major, tp per replica) lies inside one node. Expert
// groups are formed this way: ETP innermost, then EP, then EDP.
bool GroupsStayInNode(const Template& t, int s, int group);

}  // namespace arachne

#endif  // ARACHNE_PLANNER_SERVICE_CORE_MODEL_PLAN_H_
