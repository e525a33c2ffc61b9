// Cluster spec files: which nodes (GPU type, GPU count, NIC) are available.
//
//   inter_node_gbps: 100          # NIC per node, Gbit/s (default 100)
//   nodes:                        # explicit nodes ...
//     - {name: big-a100, gpu: A100-40GB, gpus: 8, nic_gbps: 200}
//   node_groups:                  # ... and/or groups of identical nodes
//     - {gpu: H100, gpus_per_node: 4, count: 8, name_prefix: h100}
//
// See docs/formats.md for the full format and its error messages.
#ifndef ARACHNE_PLANNER_SERVICE_IO_CLUSTER_IO_H_
#define ARACHNE_PLANNER_SERVICE_IO_CLUSTER_IO_H_

#include <string>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "nlohmann/json.hpp"
#include "planner_service/core/cluster.h"
#include "planner_service/core/gpu_catalog.h"

namespace arachne {

// Parses a cluster spec (YAML or JSON). Nodes come in file order: `nodes`
// first, then each group's nodes. Group nodes are named
// "<name_prefix or lowercased canonical GPU id>-<i>", i counting from 0 per
// prefix across all groups (so two A100-40GB groups give a100-40gb-0..3 and
// a100-40gb-4..7). All errors are InvalidArgument naming `source` and the
// field path: unknown GPU type (with the known ids), counts <= 0, an empty
// cluster, duplicate or colliding names, wrong types, unknown fields,
// malformed YAML/JSON (with line and column).
absl::StatusOr<Cluster> ParseCluster(absl::string_view text,
                                     absl::string_view source,
                                     const GpuCatalog& catalog);

// Reads and parses the file at `path` (errors name the path).
absl::StatusOr<Cluster> LoadClusterFile(const std::string& path,
                                        const GpuCatalog& catalog);

// The explicit-node form of `cluster`: {inter_node_gbps, nodes: [{name, gpu
// (canonical id), gpus, nic_gbps (only where it differs from
// inter_node_gbps)}]}. ParseCluster(ClusterToJson(c).dump()) == c.
nlohmann::json ClusterToJson(const Cluster& cluster, const GpuCatalog& catalog);

}  // namespace arachne

#endif  // ARACHNE_PLANNER_SERVICE_IO_CLUSTER_IO_H_
