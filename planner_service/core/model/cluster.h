// The GPUs available now: a list of nodes, each with one GPU type and any
// number of GPUs (1-GPU and 8-GPU nodes may mix), and its NIC bandwidth.
#ifndef ARACHNE_PLANNER_SERVICE_CORE_MODEL_CLUSTER_H_
#define ARACHNE_PLANNER_SERVICE_CORE_MODEL_CLUSTER_H_

#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "planner_service/core/model/gpu_catalog.h"

namespace arachne {

inline constexpr double kDefaultInterNodeGbps = 100.0;

// How a node's GPUs are joined, for nodes where the pairs differ (the DGX-1
// hybrid cube-mesh, PCIe cards with 2-way NVLink bridges). Absent (no rows),
// every group of the node's GPUs gets the catalog's intra_node_gbps, as on
// an NVSwitch node.
struct NodeTopology {
  // gpu_links[i][j]: bonded NVLinks between local GPUs i and j (0 = none);
  // square, symmetric, zero diagonal, one row per GPU of the node.
  std::vector<std::vector<int>> gpu_links;
  double nvlink_gbps = 0;  // GB/s per link and direction
  // GB/s per direction of a group whose GPUs NVLink does not join
  // (through PCIe and the host); 0 = not given.
  double pcie_gbps = 0;

  bool empty() const { return gpu_links.empty(); }
  // Bandwidth of the tensor-parallel group of `tp` consecutive local GPUs
  // starting at `first` (Megatron's layout puts TP ranks on consecutive
  // local ranks): NCCL runs a ring per link direction, so a GPU moves at
  // most (its NVLinks to other members) x nvlink_gbps, and the group at its
  // slowest member's rate; a group NVLink does not connect goes through
  // pcie_gbps. Requires !empty() and a valid range.
  double GroupGbps(int first, int tp) const;
};

// Checks `t` for a node of `num_gpus` GPUs: the shape of gpu_links, link
// counts in 0..18 (NVLink 4's per-GPU maximum), symmetry, nvlink_gbps > 0
// when any link is given, and pcie_gbps > 0 when some aligned power-of-two
// group of consecutive GPUs is not joined by NVLink. Messages start at the
// field inside the topology ("gpu_links[2][5]: ...", "pcie_gbps: ...").
absl::Status ValidateNodeTopology(const NodeTopology& t, int num_gpus);

struct Node {
  std::string name;
  int gpu_type = -1;  // index into the GpuCatalog
  int num_gpus = 0;
  double nic_gbps = kDefaultInterNodeGbps;  // gigabits/s, shared by the node
  NodeTopology topology;
};

class Cluster {
 public:
  // Validates names (non-empty, unique), GPU counts (> 0), type indices and
  // NIC bandwidth (> 0); errors name the node and field.
  static absl::StatusOr<Cluster> Create(std::vector<Node> nodes,
                                        const GpuCatalog& catalog);
  Cluster() = default;

  const std::vector<Node>& nodes() const { return nodes_; }
  const Node& node(int i) const { return nodes_[i]; }
  int num_nodes() const { return static_cast<int>(nodes_.size()); }
  int total_gpus() const { return total_gpus_; }
  // GPUs of catalog type `t` (0 when absent).
  int GpusOfType(int t) const;
  // Largest node of type `t` (0 when absent).
  int MaxNodeSizeOfType(int t) const;
  // Catalog indices of the types present, in first-appearance order.
  const std::vector<int>& types_present() const { return types_present_; }
  // NIC bandwidth of node `i` in GB/s (bytes).
  double NicGBps(int i) const { return nodes_[i].nic_gbps / 8.0; }
  // Slowest aligned group of `tp` consecutive GPUs on any node of type `t`
  // with at least `tp` GPUs, in GB/s per direction: `switch_gbps` (the
  // catalog's intra_node_gbps) on nodes without a topology. `switch_gbps`
  // when no node of the type holds `tp` GPUs.
  double SlowestTpGroupGbps(int t, int tp, double switch_gbps) const;

 private:
  std::vector<Node> nodes_;
  std::vector<int> types_present_;
  std::vector<int> gpus_by_type_;      // indexed by catalog type
  std::vector<int> max_node_by_type_;  // indexed by catalog type
  int total_gpus_ = 0;
};

}  // namespace arachne

#endif  // ARACHNE_PLANNER_SERVICE_CORE_MODEL_CLUSTER_H_
