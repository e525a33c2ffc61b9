// HexiScale (Yan et al., MLSys 2026) as the paper's §3.1 describes it: first
// partition the cluster into k disjoint data-parallel groups by bandwidth-
// based graph partitioning (nodes are vertices weighted by compute; edges
// carry the link bandwidth, so a node is never cut and the partition keeps
// compute balanced while cutting the least bandwidth), then search TP and PP
// independently inside each group, strictly on that group's GPUs: each
// group becomes one asymmetric pipeline (a template with one replica). k
// runs over 1..nodes; the best plan over all k is returned.
#ifndef ARACHNE_PLANNER_SERVICE_CORE_PLANNERS_HEXISCALE_PLANNER_H_
#define ARACHNE_PLANNER_SERVICE_CORE_PLANNERS_HEXISCALE_PLANNER_H_

#include <string>
#include <vector>

#include "planner_service/core/model/cluster.h"
#include "planner_service/core/model/gpu_catalog.h"
#include "planner_service/core/planners/planner.h"

namespace arachne {

class HexiScalePlanner : public Planner {
 public:
  std::string name() const override { return "hexiscale"; }
  absl::StatusOr<PlanResult> Run(const CostModel& cost_model,
                                 const PlannerOptions& options) override;

  // The k-way partition of the cluster's nodes: group of each node (0..k-1).
  // Greedy balanced assignment by compute (largest node first, to the group
  // with least compute, ties to the group it shares the most bandwidth
  // with), then single-node moves and pairwise swaps that reduce the
  // compute imbalance. Deterministic. Exposed for tests.
  static std::vector<int> PartitionNodes(const Cluster& cluster,
                                         const GpuCatalog& catalog, int k);
};

}  // namespace arachne

#endif  // ARACHNE_PLANNER_SERVICE_CORE_PLANNERS_HEXISCALE_PLANNER_H_
