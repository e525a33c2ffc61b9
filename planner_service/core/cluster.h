// The GPUs available now: a list of nodes, each with one GPU type and any
// number of GPUs (1-GPU and 8-GPU nodes may mix), and its NIC bandwidth.
#ifndef ARACHNE_PLANNER_SERVICE_CORE_CLUSTER_H_
#define ARACHNE_PLANNER_SERVICE_CORE_CLUSTER_H_

#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "planner_service/core/gpu_catalog.h"

namespace arachne {

inline constexpr double kDefaultInterNodeGbps = 100.0;

struct Node {
  std::string name;
  int gpu_type = -1;  // index into the GpuCatalog
  int num_gpus = 0;
  double nic_gbps = kDefaultInterNodeGbps;  // gigabits/s, shared by the node
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

 private:
  std::vector<Node> nodes_;
  std::vector<int> types_present_;
  std::vector<int> gpus_by_type_;      // indexed by catalog type
  std::vector<int> max_node_by_type_;  // indexed by catalog type
  int total_gpus_ = 0;
};

}  // namespace arachne

#endif  // ARACHNE_PLANNER_SERVICE_CORE_CLUSTER_H_
