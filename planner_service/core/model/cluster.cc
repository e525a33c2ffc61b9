#include "planner_service/core/model/cluster.h"

#include <algorithm>
#include <cmath>
#include <limits>
#include <string>
#include <vector>

#include "absl/container/flat_hash_set.h"
#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "glog/logging.h"

namespace arachne {

namespace {

// Highest NVLink count one GPU pair can have (NVLink 4: 18 links a GPU).
constexpr int kMaxNvLinksPerPair = 18;

// Whether NVLink alone joins GPUs first..first+n-1.
bool NvLinkConnected(const NodeTopology& t, int first, int n) {
  std::vector<bool> seen(n, false);
  std::vector<int> stack = {0};
  seen[0] = true;
  int reached = 1;
  while (!stack.empty()) {
    const int i = stack.back();
    stack.pop_back();
    for (int j = 0; j < n; ++j) {
      if (!seen[j] && t.gpu_links[first + i][first + j] > 0) {
        seen[j] = true;
        ++reached;
        stack.push_back(j);
      }
    }
  }
  return reached == n;
}

}  // namespace

double NodeTopology::GroupGbps(int first, int tp) const {
  CHECK(!empty());
  CHECK(first >= 0 && tp >= 1 &&
        first + tp <= static_cast<int>(gpu_links.size()));
  if (tp == 1) return 0;
  if (!NvLinkConnected(*this, first, tp)) return pcie_gbps;
  int slowest = std::numeric_limits<int>::max();
  for (int i = first; i < first + tp; ++i) {
    int links = 0;
    for (int j = first; j < first + tp; ++j) links += gpu_links[i][j];
    slowest = std::min(slowest, links);
  }
  return slowest * nvlink_gbps;
}

absl::Status ValidateNodeTopology(const NodeTopology& t, int num_gpus) {
  if (t.empty()) return absl::OkStatus();
  const int n = static_cast<int>(t.gpu_links.size());
  if (n != num_gpus) {
    return absl::InvalidArgumentError(absl::StrCat(
        "gpu_links: one row per GPU of the node (", num_gpus, "), got ", n));
  }
  bool any_link = false;
  for (int i = 0; i < n; ++i) {
    if (static_cast<int>(t.gpu_links[i].size()) != n) {
      return absl::InvalidArgumentError(
          absl::StrCat("gpu_links[", i, "]: one entry per GPU of the node (", n,
                       "), got ", t.gpu_links[i].size()));
    }
    for (int j = 0; j < n; ++j) {
      const int v = t.gpu_links[i][j];
      const std::string at = absl::StrCat("gpu_links[", i, "][", j, "]");
      if (i == j && v != 0) {
        return absl::InvalidArgumentError(
            absl::StrCat(at, ": a GPU has no link to itself, got ", v));
      }
      if (v < 0 || v > kMaxNvLinksPerPair) {
        return absl::InvalidArgumentError(
            absl::StrCat(at, ": NVLinks between two GPUs must be in 0..",
                         kMaxNvLinksPerPair, ", got ", v));
      }
      if (v != t.gpu_links[j][i]) {
        return absl::InvalidArgumentError(absl::StrCat(
            at, ": links are symmetric, but GPU ", i, " -> ", j, " has ", v,
            " and ", j, " -> ", i, " has ", t.gpu_links[j][i]));
      }
      any_link = any_link || v > 0;
    }
  }
  if (any_link && !(t.nvlink_gbps > 0 && std::isfinite(t.nvlink_gbps))) {
    return absl::InvalidArgumentError(absl::StrCat(
        "nvlink_gbps: the GB/s of one NVLink per direction must be a finite "
        "number > 0 when NVLinks are given (25 for NVLink 2-4), got ",
        t.nvlink_gbps));
  }
  if (t.pcie_gbps != 0 && !(t.pcie_gbps > 0 && std::isfinite(t.pcie_gbps))) {
    return absl::InvalidArgumentError(absl::StrCat(
        "pcie_gbps: must be a finite number > 0, got ", t.pcie_gbps));
  }
  if (t.pcie_gbps == 0) {
    for (int tp = 2; tp <= n; tp *= 2) {
      for (int first = 0; first + tp <= n; first += tp) {
        if (!NvLinkConnected(t, first, tp)) {
          return absl::InvalidArgumentError(absl::StrCat(
              "pcie_gbps: NVLink does not join GPUs ", first, "-",
              first + tp - 1, ", so a group of ", tp,
              " there goes through PCIe: give its GB/s per direction"));
        }
      }
    }
  }
  return absl::OkStatus();
}

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
    if (absl::Status s = ValidateNodeTopology(n.topology, n.num_gpus);
        !s.ok()) {
      return absl::InvalidArgumentError(absl::StrCat(
          where, ".topology.", s.message(), " (node \"", n.name, "\")"));
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

double Cluster::SlowestTpGroupGbps(int t, int tp, double switch_gbps) const {
  if (tp <= 1) return switch_gbps;  // no collective
  double slowest = std::numeric_limits<double>::infinity();
  for (const Node& n : nodes_) {
    if (n.gpu_type != t || n.num_gpus < tp) continue;
    if (n.topology.empty()) {
      slowest = std::min(slowest, switch_gbps);
      continue;
    }
    for (int first = 0; first + tp <= n.num_gpus; first += tp)
      slowest = std::min(slowest, n.topology.GroupGbps(first, tp));
  }
  return std::isfinite(slowest) ? slowest : switch_gbps;
}

int Cluster::MaxNodeSizeOfType(int t) const {
  return t >= 0 && t < static_cast<int>(max_node_by_type_.size())
             ? max_node_by_type_[t]
             : 0;
}

}  // namespace arachne
