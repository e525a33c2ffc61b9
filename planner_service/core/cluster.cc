#include "planner_service/core/cluster.h"

#include <algorithm>

#include "absl/container/flat_hash_set.h"
#include "absl/status/status.h"
#include "absl/strings/str_cat.h"

namespace arachne {

absl::StatusOr<Cluster> Cluster::Create(std::vector<Node> nodes,
                                        const GpuCatalog& catalog) {
  if (nodes.empty()) {
    return absl::InvalidArgumentError("cluster: has no nodes");
  }
  Cluster c;
  c.gpus_by_type_.assign(catalog.size(), 0);
  c.max_node_by_type_.assign(catalog.size(), 0);
  absl::flat_hash_set<std::string> names;
  for (int i = 0; i < static_cast<int>(nodes.size()); ++i) {
    const Node& n = nodes[i];
    const std::string where = absl::StrCat("nodes[", i, "]");
    if (n.name.empty()) {
      return absl::InvalidArgumentError(
          absl::StrCat(where, ".name: must not be empty"));
    }
    if (!names.insert(n.name).second) {
      return absl::InvalidArgumentError(
          absl::StrCat(where, ".name: duplicate node name \"", n.name, "\""));
    }
    if (n.gpu_type < 0 || n.gpu_type >= catalog.size()) {
      return absl::InvalidArgumentError(absl::StrCat(
          where, ".gpu: type index ", n.gpu_type, " is not in the catalog"));
    }
    if (n.num_gpus <= 0) {
      return absl::InvalidArgumentError(
          absl::StrCat(where, ".gpus: must be > 0, got ", n.num_gpus,
                       " (node \"", n.name, "\")"));
    }
    if (n.num_gpus > 64) {
      return absl::InvalidArgumentError(
          absl::StrCat(where, ".gpus: at most 64 GPUs per node, got ",
                       n.num_gpus, " (node \"", n.name, "\")"));
    }
    if (!(n.nic_gbps > 0)) {
      return absl::InvalidArgumentError(
          absl::StrCat(where, ".nic_gbps: must be > 0, got ", n.nic_gbps,
                       " (node \"", n.name, "\")"));
    }
    if (c.gpus_by_type_[n.gpu_type] == 0) c.types_present_.push_back(n.gpu_type);
    c.gpus_by_type_[n.gpu_type] += n.num_gpus;
    c.max_node_by_type_[n.gpu_type] =
        std::max(c.max_node_by_type_[n.gpu_type], n.num_gpus);
    c.total_gpus_ += n.num_gpus;
  }
  c.nodes_ = std::move(nodes);
  return c;
}

int Cluster::GpusOfType(int t) const {
  return t >= 0 && t < static_cast<int>(gpus_by_type_.size())
             ? gpus_by_type_[t]
             : 0;
}

int Cluster::MaxNodeSizeOfType(int t) const {
  return t >= 0 && t < static_cast<int>(max_node_by_type_.size())
             ? max_node_by_type_[t]
             : 0;
}

}  // namespace arachne
