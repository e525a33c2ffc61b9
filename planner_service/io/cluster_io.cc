#include "planner_service/io/cluster_io.h"

#include <cmath>
#include <map>
#include <utility>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "absl/status/status.h"
#include "absl/strings/ascii.h"
#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"
#include "planner_service/core/model/node_pool.h"
#include "planner_service/io/data_files.h"
#include "planner_service/io/json_yaml.h"
#include "planner_service/io/message_json.h"

namespace arachne {
namespace {

absl::StatusOr<int> ResolveGpuType(const std::string& name,
                                   const GpuCatalog& catalog,
                                   const MessageErrors& errors,
                                   const std::string& field) {
  if (name.empty()) return errors.At(field, "must name a GPU type, got \"\"");
  absl::StatusOr<int> index = catalog.IndexOf(name);
  if (!index.ok()) {
    return errors.At(field, AbbreviateQuoted(index.status().message(), name));
  }
  return *index;
}

// Node names and group prefixes appear in every plan, log line and error
// about the node; longer than kMaxNodeNameBytes is a mistake.
absl::Status CheckName(const std::string& name, const MessageErrors& errors,
                       const std::string& field) {
  if (name.size() > static_cast<size_t>(kMaxNodeNameBytes)) {
    return errors.At(field,
                     absl::StrCat("must be at most ", kMaxNodeNameBytes,
                                  " bytes, got ", QuoteForMessage(name)));
  }
  return absl::OkStatus();
}

absl::Status CheckGpuCount(int gpus, const MessageErrors& errors,
                           const std::string& field) {
  return errors.IntInRange(field, gpus, 1, kMaxGpusPerNode);
}

// An optional NIC speed: absent takes `fallback`; given, it must be a
// positive number (proto3 `optional` keeps presence over the wire too, so a
// 0 is a mistake, not a default).
absl::StatusOr<double> NicOr(bool has, double value, double fallback,
                             const MessageErrors& errors,
                             const std::string& field) {
  if (!has) return fallback;
  // A request's double may be inf or NaN (a file's cannot: the schema
  // check refuses them); neither is a bandwidth.
  if (!std::isfinite(value)) {
    return errors.At(field,
                     absl::StrCat("must be a finite number > 0, got ", value));
  }
  if (!(value > 0)) {
    return errors.At(field, absl::StrCat("must be a number > 0, got ", value));
  }
  return value;
}

// `nvidia-smi topo -m` path kinds that carry no NVLink.
bool IsNonNvLinkPath(absl::string_view token) {
  return token == "SYS" || token == "NODE" || token == "PHB" ||
         token == "PXB" || token == "PIX";
}

// The topology message of a node (or group) at `field`: each row's tokens
// become link counts, then ValidateNodeTopology checks the whole.
absl::StatusOr<NodeTopology> TopologyOf(const v1::NodeTopology& m, int num_gpus,
                                        const MessageErrors& errors,
                                        const std::string& field) {
  NodeTopology t;
  for (int i = 0; i < m.gpu_links_size(); ++i) {
    const std::string row_field = IndexFieldPath(field + ".gpu_links", i);
    std::vector<int> row;
    const std::vector<absl::string_view> tokens =
        absl::StrSplit(m.gpu_links(i), ' ', absl::SkipWhitespace());
    for (int j = 0; j < static_cast<int>(tokens.size()); ++j) {
      const absl::string_view tok = tokens[j];
      const std::string quoted = QuoteForMessage(std::string(tok));
      int links = 0;
      if (j == i) {
        if (tok != "X") {
          return errors.At(row_field,
                           absl::StrCat("entry ", i, " is the GPU itself: "
                                        "\"X\", got ", quoted));
        }
      } else if (tok == "X") {
        return errors.At(row_field,
                         absl::StrCat("entry ", j, " is \"X\" (the GPU "
                                      "itself), which belongs at entry ", i));
      } else if (!(absl::StartsWith(tok, "NV") &&
                   absl::SimpleAtoi(tok.substr(2), &links) && links > 0) &&
                 !IsNonNvLinkPath(tok)) {
        return errors.At(
            row_field,
            absl::StrCat("entry ", j, " is ", quoted,
                         "; expected X, NV<k> or one of SYS, NODE, PHB, PXB, "
                         "PIX (nvidia-smi topo -m)"));
      }
      row.push_back(links);
    }
    t.gpu_links.push_back(std::move(row));
  }
  if (m.has_nvlink_gbps()) t.nvlink_gbps = m.nvlink_gbps();
  if (m.has_pcie_gbps()) {
    if (!(m.pcie_gbps() > 0)) {
      return errors.At(
          field + ".pcie_gbps",
          absl::StrCat("must be a number > 0, got ", m.pcie_gbps()));
    }
    t.pcie_gbps = m.pcie_gbps();
  }
  if (t.empty() && (m.has_nvlink_gbps() || m.has_pcie_gbps())) {
    return errors.At(field + ".gpu_links",
                     "nvlink_gbps / pcie_gbps need the rows they apply to");
  }
  if (absl::Status s = ValidateNodeTopology(t, num_gpus); !s.ok()) {
    return errors.At(field, s.message());
  }
  return t;
}

}  // namespace

absl::StatusOr<Cluster> ClusterFromMessage(const v1::Cluster& message,
                                           const GpuCatalog& catalog,
                                           absl::string_view source,
                                           absl::string_view path) {
  const MessageErrors errors(source, path);
  absl::StatusOr<double> default_nic =
      NicOr(message.has_inter_node_gbps(), message.inter_node_gbps(),
            kDefaultInterNodeGbps, errors, "inter_node_gbps");
  if (!default_nic.ok()) return default_nic.status();

  // Count first: a group's count is checked before any node is made.
  int64_t total_nodes = message.nodes_size();
  for (int g = 0; g < message.node_groups_size(); ++g) {
    const int count = message.node_groups(g).count();
    if (absl::Status s =
            errors.IntInRange(IndexFieldPath("node_groups", g) + ".count",
                              count, 1, kMaxClusterNodes);
        !s.ok()) {
      return s;
    }
    total_nodes += count;
  }
  if (total_nodes == 0) {
    return errors.At("", "cluster has no nodes: give `nodes` and/or "
                         "`node_groups`");
  }
  if (total_nodes > kMaxClusterNodes) {
    return errors.At("", absl::StrCat("at most ", kMaxClusterNodes,
                                      " nodes, got ", total_nodes));
  }

  std::vector<Node> nodes;
  nodes.reserve(total_nodes);
  // Node name -> the field that defined it, for collision messages.
  absl::flat_hash_map<std::string, std::string> origin_by_name;
  const std::string prefix_path = std::string(path);

  for (int i = 0; i < message.nodes_size(); ++i) {
    const v1::Node& m = message.nodes(i);
    const std::string field = IndexFieldPath("nodes", i);
    Node n;
    ARACHNE_IO_RETURN_IF_ERROR(CheckName(m.name(), errors, field + ".name"));
    n.name = m.name().empty() ? absl::StrCat("node-", i) : m.name();
    absl::StatusOr<int> type =
        ResolveGpuType(m.gpu(), catalog, errors, field + ".gpu");
    if (!type.ok()) return type.status();
    n.gpu_type = *type;
    if (absl::Status s = CheckGpuCount(m.gpus(), errors, field + ".gpus");
        !s.ok()) {
      return s;
    }
    n.num_gpus = m.gpus();
    absl::StatusOr<double> nic = NicOr(m.has_nic_gbps(), m.nic_gbps(),
                                       *default_nic, errors, field + ".nic_gbps");
    if (!nic.ok()) return nic.status();
    n.nic_gbps = *nic;
    absl::StatusOr<NodeTopology> topology =
        TopologyOf(m.topology(), n.num_gpus, errors, field + ".topology");
    if (!topology.ok()) return topology.status();
    n.topology = *std::move(topology);
    auto [it, inserted] = origin_by_name.emplace(
        n.name, JoinFieldPath(prefix_path, field + ".name"));
    if (!inserted) {
      return errors.At(
          field + ".name",
          absl::StrCat("duplicate node name ", QuoteForMessage(n.name),
                       " (also ", it->second, ")"));
    }
    nodes.push_back(std::move(n));
  }

  absl::flat_hash_map<std::string, int> next_index_by_prefix;
  for (int g = 0; g < message.node_groups_size(); ++g) {
    const v1::NodeGroup& m = message.node_groups(g);
    const std::string field = IndexFieldPath("node_groups", g);
    absl::StatusOr<int> type =
        ResolveGpuType(m.gpu(), catalog, errors, field + ".gpu");
    if (!type.ok()) return type.status();
    if (absl::Status s =
            CheckGpuCount(m.gpus_per_node(), errors, field + ".gpus_per_node");
        !s.ok()) {
      return s;
    }
    absl::StatusOr<double> nic = NicOr(m.has_nic_gbps(), m.nic_gbps(),
                                       *default_nic, errors, field + ".nic_gbps");
    if (!nic.ok()) return nic.status();
    ARACHNE_IO_RETURN_IF_ERROR(
        CheckName(m.name_prefix(), errors, field + ".name_prefix"));
    const std::string prefix =
        m.name_prefix().empty() ? absl::AsciiStrToLower(catalog.type(*type).id)
                                : m.name_prefix();
    absl::StatusOr<NodeTopology> topology = TopologyOf(
        m.topology(), m.gpus_per_node(), errors, field + ".topology");
    if (!topology.ok()) return topology.status();
    int& next = next_index_by_prefix[prefix];
    for (int k = 0; k < m.count(); ++k) {
      Node n;
      n.name = absl::StrCat(prefix, "-", next++);
      n.gpu_type = *type;
      n.num_gpus = m.gpus_per_node();
      n.nic_gbps = *nic;
      n.topology = *topology;
      auto [it, inserted] =
          origin_by_name.emplace(n.name, JoinFieldPath(prefix_path, field));
      if (!inserted) {
        return errors.At(
            field, absl::StrCat("generated node name ", QuoteForMessage(n.name),
                                " collides with ", it->second,
                                "; set a different name_prefix"));
      }
      nodes.push_back(std::move(n));
    }
  }

  absl::StatusOr<Cluster> cluster = Cluster::Create(std::move(nodes), catalog);
  if (!cluster.ok()) return errors.At("", cluster.status().message());
  return cluster;
}

v1::Cluster ClusterToMessage(const Cluster& cluster,
                             const GpuCatalog& catalog) {
  // The most common NIC speed becomes inter_node_gbps; only nodes that
  // differ carry their own nic_gbps.
  std::map<double, int> nodes_by_nic;
  for (const Node& n : cluster.nodes()) ++nodes_by_nic[n.nic_gbps];
  double common_nic = kDefaultInterNodeGbps;
  int most = 0;
  for (const auto& [nic, count] : nodes_by_nic) {
    if (count > most) {
      most = count;
      common_nic = nic;
    }
  }
  v1::Cluster message;
  message.set_inter_node_gbps(common_nic);
  for (const Node& n : cluster.nodes()) {
    v1::Node* m = message.add_nodes();
    m->set_name(n.name);
    m->set_gpu(catalog.type(n.gpu_type).id);
    m->set_gpus(n.num_gpus);
    if (n.nic_gbps != common_nic) m->set_nic_gbps(n.nic_gbps);
    if (!n.topology.empty()) {
      v1::NodeTopology* t = m->mutable_topology();
      const int g = static_cast<int>(n.topology.gpu_links.size());
      for (int i = 0; i < g; ++i) {
        std::vector<std::string> row;
        for (int j = 0; j < g; ++j) {
          const int links = n.topology.gpu_links[i][j];
          row.push_back(i == j      ? "X"
                        : links > 0 ? absl::StrCat("NV", links)
                                    : "SYS");
        }
        t->add_gpu_links(absl::StrJoin(row, " "));
      }
      if (n.topology.nvlink_gbps > 0)
        t->set_nvlink_gbps(n.topology.nvlink_gbps);
      if (n.topology.pcie_gbps > 0) t->set_pcie_gbps(n.topology.pcie_gbps);
    }
  }
  return message;
}

absl::StatusOr<Cluster> ParseCluster(absl::string_view text,
                                     absl::string_view source,
                                     const GpuCatalog& catalog) {
  v1::Cluster message;
  if (absl::Status s = ParseMessageText(text, source, &message); !s.ok()) {
    return s;
  }
  return ClusterFromMessage(message, catalog, source);
}

absl::StatusOr<Cluster> LoadClusterFile(const std::string& path,
                                        const GpuCatalog& catalog) {
  ARACHNE_IO_ASSIGN_OR_RETURN(std::string text, ReadFileToString(path));
  return ParseCluster(text, path, catalog);
}

nlohmann::json ClusterToJson(const Cluster& cluster,
                             const GpuCatalog& catalog) {
  nlohmann::json j = MessageToJson(ClusterToMessage(cluster, catalog));
  // Empty fields of the explicit-node form say nothing to a reader.
  j.erase("node_groups");
  j.erase("description");
  return j;
}

}  // namespace arachne
