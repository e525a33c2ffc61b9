#include "planner_service/io/cluster_io.h"

#include <string>
#include <vector>

#include "absl/status/status.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "planner_service/io/gpu_catalog_io.h"

namespace arachne {
namespace {

using ::testing::HasSubstr;

class ClusterIoTest : public ::testing::Test {
 protected:
  void SetUp() override {
    absl::StatusOr<GpuCatalog> c = LoadGpuCatalog();
    ASSERT_TRUE(c.ok()) << c.status();
    catalog_ = *std::move(c);
  }
  int TypeOf(const char* name) { return *catalog_.IndexOf(name); }
  absl::StatusOr<Cluster> Parse(const std::string& text) {
    return ParseCluster(text, "cluster.yaml", catalog_);
  }
  // Parses text expected to fail; returns the message.
  std::string ErrorOf(const std::string& text) {
    absl::StatusOr<Cluster> c = Parse(text);
    EXPECT_FALSE(c.ok());
    EXPECT_EQ(c.status().code(), absl::StatusCode::kInvalidArgument)
        << c.status();
    return std::string(c.status().message());
  }
  GpuCatalog catalog_;
};

TEST_F(ClusterIoTest, NodesAndGroups) {
  absl::StatusOr<Cluster> c = Parse(R"(
inter_node_gbps: 200
nodes:
  - {name: big, gpu: a100, gpus: 8, nic_gbps: 400}
  - {name: small, gpu: RTX-A6000, gpus: 2}
node_groups:
  - {gpu: H100, gpus_per_node: 4, count: 2}
  - {gpu: A6000, gpus_per_node: 1, count: 1, name_prefix: ws, nic_gbps: 25}
)");
  ASSERT_TRUE(c.ok()) << c.status();
  ASSERT_EQ(c->num_nodes(), 5);
  EXPECT_EQ(c->total_gpus(), 8 + 2 + 8 + 1);
  EXPECT_EQ(c->node(0).name, "big");
  EXPECT_EQ(c->node(0).gpu_type, TypeOf("A100-40GB"));
  EXPECT_DOUBLE_EQ(c->node(0).nic_gbps, 400);
  EXPECT_DOUBLE_EQ(c->node(1).nic_gbps, 200);  // file default
  EXPECT_EQ(c->node(2).name, "h100-80gb-0");
  EXPECT_EQ(c->node(3).name, "h100-80gb-1");
  EXPECT_EQ(c->node(3).num_gpus, 4);
  EXPECT_EQ(c->node(4).name, "ws-0");
  EXPECT_DOUBLE_EQ(c->node(4).nic_gbps, 25);
  EXPECT_EQ(c->GpusOfType(TypeOf("A6000")), 3);
  EXPECT_EQ(c->MaxNodeSizeOfType(TypeOf("A6000")), 2);
}

TEST_F(ClusterIoTest, DefaultsAndJsonInput) {
  absl::StatusOr<Cluster> c = ParseCluster(
      R"({"node_groups": [{"gpu": "L4", "gpus_per_node": 8, "count": 1}]})",
      "c.json", catalog_);
  ASSERT_TRUE(c.ok()) << c.status();
  EXPECT_EQ(c->node(0).name, "l4-0");
  EXPECT_DOUBLE_EQ(c->node(0).nic_gbps, kDefaultInterNodeGbps);
}

TEST_F(ClusterIoTest, SameTypeGroupsKeepCounting) {
  absl::StatusOr<Cluster> c = Parse(R"(
node_groups:
  - {gpu: A100-40GB, gpus_per_node: 4, count: 2}
  - {gpu: A100-40GB, gpus_per_node: 1, count: 2}
)");
  ASSERT_TRUE(c.ok()) << c.status();
  EXPECT_EQ(c->node(2).name, "a100-40gb-2");
  EXPECT_EQ(c->node(3).name, "a100-40gb-3");
  EXPECT_EQ(c->node(3).num_gpus, 1);
}

TEST_F(ClusterIoTest, NumericGpuAliasWorks) {
  absl::StatusOr<Cluster> c = Parse("nodes: [{name: n, gpu: 3090, gpus: 2}]\n");
  ASSERT_TRUE(c.ok()) << c.status();
  EXPECT_EQ(c->node(0).gpu_type, TypeOf("RTX-3090"));
}

TEST_F(ClusterIoTest, NegativeCount) {
  EXPECT_EQ(
      ErrorOf(R"(
node_groups:
  - {gpu: H100, gpus_per_node: 4, count: 1}
  - {gpu: H100, gpus_per_node: 4, count: -2}
)"),
      "cluster.yaml: node_groups[1].count: must be an integer > 0, got -2");
}

TEST_F(ClusterIoTest, ZeroGpus) {
  EXPECT_EQ(ErrorOf("nodes: [{name: n, gpu: H100, gpus: 0}]\n"),
            "cluster.yaml: nodes[0].gpus: must be an integer > 0, got 0");
  EXPECT_THAT(
      ErrorOf("node_groups: [{gpu: H100, gpus_per_node: 0, count: 1}]\n"),
      HasSubstr("cluster.yaml: node_groups[0].gpus_per_node: must be an "
                "integer > 0, got 0"));
}

TEST_F(ClusterIoTest, AbsurdCountIsRejectedBeforeAllocating) {
  EXPECT_EQ(ErrorOf("node_groups: [{gpu: H100, gpus_per_node: 4, count: "
                    "1000000000}]\n"),
            "cluster.yaml: node_groups[0].count: must be an integer <= 4096, "
            "got 1000000000");
}

TEST_F(ClusterIoTest, UnknownGpuTypeNamesFieldValueAndKnownIds) {
  const std::string msg = ErrorOf(R"(
node_groups:
  - {gpu: A100, gpus_per_node: 4, count: 1}
  - {gpu: H300, gpus_per_node: 4, count: 1}
)");
  EXPECT_THAT(msg, HasSubstr("cluster.yaml: node_groups[1].gpu: unknown GPU "
                             "type \"H300\"; known: A100-40GB, A100-80GB"));
  EXPECT_THAT(msg, HasSubstr("MI300X"));
}

TEST_F(ClusterIoTest, EmptyCluster) {
  EXPECT_EQ(ErrorOf("inter_node_gbps: 100\n"),
            "cluster.yaml: cluster has no nodes: give `nodes` and/or "
            "`node_groups`");
  EXPECT_EQ(ErrorOf("nodes: []\nnode_groups: []\n"),
            "cluster.yaml: cluster has no nodes: give `nodes` and/or "
            "`node_groups`");
  EXPECT_THAT(ErrorOf(""), HasSubstr("cluster.yaml: is empty"));
}

TEST_F(ClusterIoTest, DuplicateAndCollidingNames) {
  EXPECT_EQ(ErrorOf(R"(
nodes:
  - {name: a, gpu: H100, gpus: 4}
  - {name: a, gpu: H100, gpus: 4}
)"),
            "cluster.yaml: nodes[1].name: duplicate node name \"a\" (also "
            "nodes[0].name)");
  EXPECT_EQ(ErrorOf(R"(
nodes:
  - {name: h100-80gb-1, gpu: H100, gpus: 4}
node_groups:
  - {gpu: H100, gpus_per_node: 4, count: 2}
)"),
            "cluster.yaml: node_groups[0]: generated node name \"h100-80gb-1\" "
            "collides with nodes[0].name; set a different name_prefix");
}

TEST_F(ClusterIoTest, WrongTypesAndUnknownFields) {
  EXPECT_EQ(
      ErrorOf("nodes: [{name: n, gpu: H100, gpus: four}]\n"),
      "cluster.yaml: nodes[0].gpus: must be an integer, got \"four\"");
  EXPECT_EQ(ErrorOf("nodes: [{name: n, gpu_typ: H100, gpus: 4}]\n"),
            "cluster.yaml: nodes[0]: unknown field \"gpu_typ\" (allowed: name, "
            "gpu, gpus, nic_gbps, topology)");
  EXPECT_EQ(ErrorOf("nodes: [{name: n, gpus: 4}]\n"),
            "cluster.yaml: nodes[0]: missing required field \"gpu\"");
  EXPECT_THAT(ErrorOf("node: []\n"),
              HasSubstr("cluster.yaml: unknown field \"node\" (allowed: "
                        "inter_node_gbps, nodes, node_groups, description)"));
  EXPECT_EQ(ErrorOf("nodes: {name: n}\n"),
            "cluster.yaml: nodes: must be a list, got {\"name\":\"n\"}");
  EXPECT_EQ(ErrorOf("nodes: [h100]\n"),
            "cluster.yaml: nodes[0]: must be a mapping (object), got \"h100\"");
  EXPECT_EQ(
      ErrorOf("inter_node_gbps: 0\nnodes: [{name: n, gpu: H100, gpus: 4}]\n"),
      "cluster.yaml: inter_node_gbps: must be a number > 0, got 0");
  EXPECT_EQ(ErrorOf("nodes: [{name: n, gpu: H100, gpus: 4, nic_gbps: -1}]\n"),
            "cluster.yaml: nodes[0].nic_gbps: must be a number > 0, got -1");
  EXPECT_EQ(ErrorOf("nodes: [{name: n, gpu: H100, gpus: 4.5}]\n"),
            "cluster.yaml: nodes[0].gpus: must be an integer, got 4.5");
  EXPECT_EQ(ErrorOf("nodes: [{name: n, gpu: H100, gpus: 4294967296}]\n"),
            "cluster.yaml: nodes[0].gpus: must be an integer in "
            "[-2147483648, 2147483647], got 4294967296");
  EXPECT_EQ(ErrorOf("nodes: [{name: n, gpu: [H100], gpus: 4}]\n"),
            "cluster.yaml: nodes[0].gpu: must be a string, got [\"H100\"]");
}

TEST_F(ClusterIoTest, UnnamedNodesAreNumberedAsOverRpc) {
  // The schema's rule, the same for files and requests.
  absl::StatusOr<Cluster> c = Parse(
      "nodes: [{gpu: H100, gpus: 4}, {name: \"\", gpu: H100, gpus: 4}]\n");
  ASSERT_TRUE(c.ok()) << c.status();
  EXPECT_EQ(c->node(0).name, "node-0");
  EXPECT_EQ(c->node(1).name, "node-1");
}

TEST_F(ClusterIoTest, LowerCamelCaseNamesOfTheMappingAreAccepted) {
  absl::StatusOr<Cluster> c = Parse(
      "interNodeGbps: 200\nnodeGroups: [{gpu: H100, gpusPerNode: 4, "
      "count: 2}]\n");
  ASSERT_TRUE(c.ok()) << c.status();
  EXPECT_EQ(c->num_nodes(), 2);
  EXPECT_DOUBLE_EQ(c->node(1).nic_gbps, 200);
  EXPECT_EQ(ErrorOf("nodes: []\nnodes_groups: []\n"),
            "cluster.yaml: unknown field \"nodes_groups\" (allowed: "
            "inter_node_gbps, nodes, node_groups, description)");
}

TEST_F(ClusterIoTest, MalformedInputNamesLine) {
  EXPECT_THAT(ErrorOf("nodes:\n  - {name: n, gpu: H100, gpus: 4\n"),
              HasSubstr("cluster.yaml:"));
  absl::StatusOr<Cluster> c = ParseCluster(
      "{\"nodes\": [\n  {\"name\": \"n\",}\n]}", "c.json", catalog_);
  EXPECT_EQ(c.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(std::string(c.status().message()), HasSubstr("c.json:2:"));
}

TEST_F(ClusterIoTest, ToJsonRoundTrips) {
  absl::StatusOr<Cluster> c = Parse(R"(
inter_node_gbps: 200
nodes:
  - {name: big, gpu: a100, gpus: 8, nic_gbps: 400}
node_groups:
  - {gpu: H100, gpus_per_node: 4, count: 2}
)");
  ASSERT_TRUE(c.ok()) << c.status();
  nlohmann::json j = ClusterToJson(*c, catalog_);
  EXPECT_EQ(j["nodes"][1]["gpu"], "H100-80GB");
  EXPECT_FALSE(j["nodes"][1].contains("nic_gbps"));
  absl::StatusOr<Cluster> again =
      ParseCluster(j.dump(), "again.json", catalog_);
  ASSERT_TRUE(again.ok()) << again.status();
  ASSERT_EQ(again->num_nodes(), c->num_nodes());
  for (int i = 0; i < c->num_nodes(); ++i) {
    EXPECT_EQ(again->node(i).name, c->node(i).name);
    EXPECT_EQ(again->node(i).gpu_type, c->node(i).gpu_type);
    EXPECT_EQ(again->node(i).num_gpus, c->node(i).num_gpus);
    EXPECT_DOUBLE_EQ(again->node(i).nic_gbps, c->node(i).nic_gbps);
  }
}

// DLPerf's V100 nodes (Oneflow-Inc/DLPerf Megatron-LM/README.md @01e43de4,
// `nvidia-smi topo -m`): the DGX-1 hybrid cube-mesh.
constexpr char kDgx1Group[] = R"(
node_groups:
  - gpu: V100-16GB
    gpus_per_node: 8
    count: 2
    topology:
      nvlink_gbps: 25
      gpu_links:
        - "X   NV1 NV1 NV2 NV2 SYS SYS SYS"
        - "NV1 X   NV2 NV1 SYS NV2 SYS SYS"
        - "NV1 NV2 X   NV2 SYS SYS NV1 SYS"
        - "NV2 NV1 NV2 X   SYS SYS SYS NV1"
        - "NV2 SYS SYS SYS X   NV1 NV1 NV2"
        - "SYS NV2 SYS SYS NV1 X   NV2 NV1"
        - "SYS SYS NV1 SYS NV1 NV2 X   NV2"
        - "SYS SYS SYS NV1 NV2 NV1 NV2 X"
)";

TEST_F(ClusterIoTest, TopologyRowsBecomeLinkCountsAndGroupBandwidths) {
  absl::StatusOr<Cluster> c = Parse(kDgx1Group);
  ASSERT_TRUE(c.ok()) << c.status();
  ASSERT_EQ(c->num_nodes(), 2);
  const NodeTopology& t = c->node(1).topology;
  ASSERT_EQ(t.gpu_links.size(), 8u);
  EXPECT_EQ(t.gpu_links[0], (std::vector<int>{0, 1, 1, 2, 2, 0, 0, 0}));
  EXPECT_EQ(t.gpu_links[7], (std::vector<int>{0, 0, 0, 1, 2, 1, 2, 0}));
  EXPECT_DOUBLE_EQ(t.nvlink_gbps, 25);
  // Megatron's TP pairs: (0,1) and (4,5) share one NVLink, (2,3) and (6,7)
  // two; the quads 0-3 and 4-7 give their slowest GPU 1+1+2 = 4 links;
  // the whole node every GPU's 6.
  EXPECT_DOUBLE_EQ(t.GroupGbps(0, 2), 25);
  EXPECT_DOUBLE_EQ(t.GroupGbps(2, 2), 50);
  EXPECT_DOUBLE_EQ(t.GroupGbps(0, 4), 100);
  EXPECT_DOUBLE_EQ(t.GroupGbps(4, 4), 100);
  EXPECT_DOUBLE_EQ(t.GroupGbps(0, 8), 150);
  const int v100 = TypeOf("V100-16GB");
  EXPECT_DOUBLE_EQ(c->SlowestTpGroupGbps(v100, 2, 150), 25);
  EXPECT_DOUBLE_EQ(c->SlowestTpGroupGbps(v100, 4, 150), 100);
  EXPECT_DOUBLE_EQ(c->SlowestTpGroupGbps(v100, 8, 150), 150);
  EXPECT_DOUBLE_EQ(c->SlowestTpGroupGbps(v100, 16, 150), 150);  // no node
  EXPECT_DOUBLE_EQ(c->SlowestTpGroupGbps(v100, 1, 150), 150);

  // The explicit-node form keeps the topology.
  absl::StatusOr<Cluster> again =
      ParseCluster(ClusterToJson(*c, catalog_).dump(), "again.json", catalog_);
  ASSERT_TRUE(again.ok()) << again.status();
  EXPECT_EQ(again->node(0).topology.gpu_links, t.gpu_links);
  EXPECT_DOUBLE_EQ(again->node(0).topology.nvlink_gbps, 25);
  EXPECT_DOUBLE_EQ(again->node(0).topology.pcie_gbps, 0);
}

TEST_F(ClusterIoTest, BridgedPairsNeedThePcieBandwidthOfTheirQuad) {
  // Four PCIe cards, NVLink bridges on (0,1) and (2,3): a TP 4 group
  // crosses PCIe.
  const std::string bridged = R"(
nodes:
  - name: ws
    gpu: A6000
    gpus: 4
    topology:
      nvlink_gbps: 14.0625
      gpu_links: ["X NV4 SYS SYS", "NV4 X SYS SYS", "SYS SYS X NV4", "SYS SYS NV4 X"]
)";
  EXPECT_EQ(ErrorOf(bridged),
            "cluster.yaml: nodes[0].topology: pcie_gbps: NVLink does not "
            "join GPUs 0-3, so a group of 4 there goes through PCIe: give its "
            "GB/s per direction");
  absl::StatusOr<Cluster> c = Parse(bridged + "      pcie_gbps: 24\n");
  ASSERT_TRUE(c.ok()) << c.status();
  EXPECT_DOUBLE_EQ(c->node(0).topology.GroupGbps(0, 2), 4 * 14.0625);
  EXPECT_DOUBLE_EQ(c->node(0).topology.GroupGbps(0, 4), 24);
}

TEST_F(ClusterIoTest, TopologyErrorsNameTheRowAndEntry) {
  auto with_rows = [](const std::string& rows, const std::string& extra) {
    return "nodes:\n  - {name: n, gpu: V100-16GB, gpus: 2, topology: "
           "{gpu_links: [" + rows + "]" + extra + "}}\n";
  };
  const struct {
    const char* rows;
    const char* extra;
    const char* error;
  } kCases[] = {
      {R"("X NV2", "NV2 X")", "",
       "cluster.yaml: nodes[0].topology: nvlink_gbps: the GB/s of one NVLink "
       "per direction must be a finite number > 0 when NVLinks are given (25 "
       "for NVLink 2-4), got 0"},
      {R"("X NV2", "NV1 X")", ", nvlink_gbps: 25",
       "cluster.yaml: nodes[0].topology: gpu_links[0][1]: links are "
       "symmetric, but GPU 0 -> 1 has 2 and 1 -> 0 has 1"},
      {R"("X NV2", "NV2")", ", nvlink_gbps: 25",
       "cluster.yaml: nodes[0].topology: gpu_links[1]: one entry per GPU of "
       "the node (2), got 1"},
      {R"("X NV2")", ", nvlink_gbps: 25",
       "cluster.yaml: nodes[0].topology: gpu_links: one row per GPU of the "
       "node (2), got 1"},
      {R"("X NVL", "NV2 X")", ", nvlink_gbps: 25",
       "cluster.yaml: nodes[0].topology.gpu_links[0]: entry 1 is \"NVL\"; "
       "expected X, NV<k> or one of SYS, NODE, PHB, PXB, PIX (nvidia-smi topo "
       "-m)"},
      {R"("NV2 X", "X NV2")", ", nvlink_gbps: 25",
       "cluster.yaml: nodes[0].topology.gpu_links[0]: entry 0 is the GPU "
       "itself: \"X\", got \"NV2\""},
      {R"("X NV19", "NV19 X")", ", nvlink_gbps: 25",
       "cluster.yaml: nodes[0].topology: gpu_links[0][1]: NVLinks between two "
       "GPUs must be in 0..18, got 19"},
      {R"("X NV2", "NV2 X")", ", nvlink_gbps: 25, pcie_gbps: -1",
       "cluster.yaml: nodes[0].topology.pcie_gbps: must be a number > 0, got "
       "-1"},
  };
  for (const auto& c : kCases) {
    EXPECT_EQ(ErrorOf(with_rows(c.rows, c.extra)), c.error) << c.rows;
  }
  EXPECT_EQ(ErrorOf("nodes:\n  - {name: n, gpu: V100-16GB, gpus: 2, "
                    "topology: {nvlink_gbps: 25}}\n"),
            "cluster.yaml: nodes[0].topology.gpu_links: nvlink_gbps / "
            "pcie_gbps need the rows they apply to");
}

TEST_F(ClusterIoTest, LoadClusterFileNamesMissingPath) {
  absl::StatusOr<Cluster> c = LoadClusterFile("/nonexistent/c.yaml", catalog_);
  EXPECT_EQ(c.status().code(), absl::StatusCode::kNotFound);
  EXPECT_THAT(std::string(c.status().message()),
              HasSubstr("/nonexistent/c.yaml"));
}

}  // namespace
}  // namespace arachne
