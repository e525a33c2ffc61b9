#include "planner_service/io/cluster_io.h"

#include <map>
#include <utility>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "absl/status/status.h"
#include "absl/strings/ascii.h"
#include "absl/strings/str_cat.h"
#include "planner_service/io/data_files.h"
#include "planner_service/io/json_yaml.h"

namespace arachne {
namespace {

using Json = nlohmann::json;

// Bounds that catch typos (count: 1000000000) before they allocate millions
// of nodes; far above any real cluster.
constexpr int kMaxGpusPerNode = 1024;
constexpr int kMaxGroupCount = 65536;

// Resolves the `gpu` field of a node or group to a catalog index. An integer
// is taken as its decimal text, so `gpu: 3090` (which YAML reads as a number)
// still finds the RTX-3090 alias.
absl::StatusOr<int> ReadGpuType(const ObjectReader& r,
                                const GpuCatalog& catalog) {
  const Json* v = r.Find("gpu");
  if (v == nullptr) return r.MissingError("gpu");
  std::string name;
  if (v->is_number_integer()) {
    name = v->dump();
  } else if (v->is_string() && !v->get_ref<const std::string&>().empty()) {
    name = v->get<std::string>();
  } else {
    return r.Error("gpu", absl::StrCat("must be a GPU type name, got ",
                                       DescribeJsonValue(*v)));
  }
  absl::StatusOr<int> index = catalog.IndexOf(name);
  if (!index.ok()) return r.Error("gpu", index.status().message());
  return *index;
}

}  // namespace

absl::StatusOr<Cluster> ParseCluster(absl::string_view text,
                                     absl::string_view source,
                                     const GpuCatalog& catalog) {
  ARACHNE_IO_ASSIGN_OR_RETURN(Json root, ParseJsonOrYaml(text, source));
  if (root.is_null()) {
    return FieldError(source, "",
                      "is empty; expected a mapping with `nodes` and/or "
                      "`node_groups`");
  }
  ARACHNE_IO_ASSIGN_OR_RETURN(ObjectReader top,
                              ObjectReader::Create(root, source, ""));
  ARACHNE_IO_RETURN_IF_ERROR(top.AllowOnly(
      {"inter_node_gbps", "nodes", "node_groups", "description"}));
  ARACHNE_IO_RETURN_IF_ERROR(top.StringOr("description", "").status());
  ARACHNE_IO_ASSIGN_OR_RETURN(
      const double default_nic,
      top.NumberOr("inter_node_gbps", kDefaultInterNodeGbps, 0, true));
  ARACHNE_IO_ASSIGN_OR_RETURN(const Json* node_list, top.ArrayOr("nodes"));
  ARACHNE_IO_ASSIGN_OR_RETURN(const Json* group_list,
                              top.ArrayOr("node_groups"));

  std::vector<Node> nodes;
  // Node name -> the field that defined it, for collision messages.
  absl::flat_hash_map<std::string, std::string> origin_by_name;

  for (int i = 0; i < static_cast<int>(node_list->size()); ++i) {
    const std::string path = IndexFieldPath("nodes", i);
    ARACHNE_IO_ASSIGN_OR_RETURN(
        ObjectReader r, ObjectReader::Create((*node_list)[i], source, path));
    ARACHNE_IO_RETURN_IF_ERROR(
        r.AllowOnly({"name", "gpu", "gpus", "nic_gbps"}));
    Node n;
    ARACHNE_IO_ASSIGN_OR_RETURN(n.name, r.String("name"));
    ARACHNE_IO_ASSIGN_OR_RETURN(n.gpu_type, ReadGpuType(r, catalog));
    ARACHNE_IO_ASSIGN_OR_RETURN(n.num_gpus, r.Int("gpus", 1, kMaxGpusPerNode));
    ARACHNE_IO_ASSIGN_OR_RETURN(n.nic_gbps,
                                r.NumberOr("nic_gbps", default_nic, 0, true));
    auto [it, inserted] =
        origin_by_name.emplace(n.name, JoinFieldPath(path, "name"));
    if (!inserted) {
      return r.Error("name", absl::StrCat("duplicate node name \"", n.name,
                                          "\" (also ", it->second, ")"));
    }
    nodes.push_back(std::move(n));
  }

  absl::flat_hash_map<std::string, int> next_index_by_prefix;
  for (int g = 0; g < static_cast<int>(group_list->size()); ++g) {
    const std::string path = IndexFieldPath("node_groups", g);
    ARACHNE_IO_ASSIGN_OR_RETURN(
        ObjectReader r, ObjectReader::Create((*group_list)[g], source, path));
    ARACHNE_IO_RETURN_IF_ERROR(r.AllowOnly(
        {"gpu", "gpus_per_node", "count", "name_prefix", "nic_gbps"}));
    ARACHNE_IO_ASSIGN_OR_RETURN(const int type, ReadGpuType(r, catalog));
    ARACHNE_IO_ASSIGN_OR_RETURN(const int gpus,
                                r.Int("gpus_per_node", 1, kMaxGpusPerNode));
    ARACHNE_IO_ASSIGN_OR_RETURN(const int count,
                                r.Int("count", 1, kMaxGroupCount));
    ARACHNE_IO_ASSIGN_OR_RETURN(
        const std::string prefix,
        r.StringOr("name_prefix",
                   absl::AsciiStrToLower(catalog.type(type).id)));
    ARACHNE_IO_ASSIGN_OR_RETURN(const double nic,
                                r.NumberOr("nic_gbps", default_nic, 0, true));
    int& next = next_index_by_prefix[prefix];
    for (int k = 0; k < count; ++k) {
      Node n;
      n.name = absl::StrCat(prefix, "-", next++);
      n.gpu_type = type;
      n.num_gpus = gpus;
      n.nic_gbps = nic;
      auto [it, inserted] = origin_by_name.emplace(n.name, path);
      if (!inserted) {
        return FieldError(
            source, path,
            absl::StrCat("generated node name \"", n.name, "\" collides with ",
                         it->second, "; set a different name_prefix"));
      }
      nodes.push_back(std::move(n));
    }
  }

  if (nodes.empty()) {
    return FieldError(source, "",
                      "cluster has no nodes: give `nodes` and/or "
                      "`node_groups`");
  }
  absl::StatusOr<Cluster> cluster = Cluster::Create(std::move(nodes), catalog);
  if (!cluster.ok()) {
    return absl::InvalidArgumentError(
        absl::StrCat(source, ": ", cluster.status().message()));
  }
  return cluster;
}

absl::StatusOr<Cluster> LoadClusterFile(const std::string& path,
                                        const GpuCatalog& catalog) {
  ARACHNE_IO_ASSIGN_OR_RETURN(std::string text, ReadFileToString(path));
  return ParseCluster(text, path, catalog);
}

nlohmann::json ClusterToJson(const Cluster& cluster,
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
  Json nodes = Json::array();
  for (const Node& n : cluster.nodes()) {
    Json j{{"name", n.name},
           {"gpu", catalog.type(n.gpu_type).id},
           {"gpus", n.num_gpus}};
    if (n.nic_gbps != common_nic) j["nic_gbps"] = n.nic_gbps;
    nodes.push_back(std::move(j));
  }
  return Json{{"inter_node_gbps", common_nic}, {"nodes", std::move(nodes)}};
}

}  // namespace arachne
