// The strict reading of arachne.v1 messages from JSON / YAML files: every
// rule of message_json.h, on the schema's own messages.
#include "planner_service/io/message_json.h"

#include <string>

#include "arachne/v1/planner.pb.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace arachne {
namespace {

using ::testing::HasSubstr;

std::string ErrorOf(const std::string& text, google::protobuf::Message* m) {
  absl::Status s = ParseMessageText(text, "f.yaml", m);
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument) << text;
  return std::string(s.message());
}

TEST(MessageJsonTest, YamlAndJsonReadToTheSameMessage) {
  v1::Cluster from_yaml;
  v1::Cluster from_json;
  ASSERT_TRUE(ParseMessageText("inter_node_gbps: 200\n"
                               "nodes:\n  - {name: a, gpu: H100, gpus: 8}\n",
                               "c.yaml", &from_yaml)
                  .ok());
  ASSERT_TRUE(ParseMessageText(R"({"inter_node_gbps": 200,
                                   "nodes": [{"name": "a", "gpu": "H100",
                                              "gpus": 8}]})",
                               "c.json", &from_json)
                  .ok());
  EXPECT_EQ(from_yaml.SerializeAsString(), from_json.SerializeAsString());
  EXPECT_TRUE(from_yaml.has_inter_node_gbps());
  EXPECT_FALSE(from_yaml.nodes(0).has_nic_gbps());
  EXPECT_EQ(from_yaml.nodes(0).gpus(), 8);
}

TEST(MessageJsonTest, YamlIntegersInStringFieldsAreTheirText) {
  v1::Cluster c;
  ASSERT_TRUE(
      ParseMessageText("nodes: [{gpu: 3090, gpus: 2}]\n", "c.yaml", &c).ok());
  EXPECT_EQ(c.nodes(0).gpu(), "3090");
}

TEST(MessageJsonTest, NullIsAbsent) {
  v1::Cluster c;
  ASSERT_TRUE(ParseMessageText("inter_node_gbps:\nnodes: [{gpu: H100, gpus: 2, "
                               "nic_gbps: null}]\n",
                               "c.yaml", &c)
                  .ok());
  EXPECT_FALSE(c.has_inter_node_gbps());
  EXPECT_FALSE(c.nodes(0).has_nic_gbps());
}

TEST(MessageJsonTest, RequiredFieldsAreNamed) {
  v1::Cluster c;
  EXPECT_EQ(ErrorOf("node_groups: [{gpu: H100, count: 2}]\n", &c),
            "f.yaml: node_groups[0]: missing required field \"gpus_per_node\"");
  v1::PlanDocument d;
  EXPECT_EQ(ErrorOf("model: x\n", &d),
            "f.yaml: missing required field \"templates\"");
}

TEST(MessageJsonTest, TypeErrorsNameTheFieldAndValue) {
  v1::PlanRequest r;
  EXPECT_EQ(ErrorOf("options: {objective: FASTEST}\n", &r),
            "f.yaml: options.objective: must be one of THROUGHPUT, "
            "USD_PER_TOKEN, got \"FASTEST\"");
  EXPECT_EQ(ErrorOf("options: {budget_s: fast}\n", &r),
            "f.yaml: options.budget_s: must be a finite number, got \"fast\"");
  EXPECT_EQ(ErrorOf("training: {distributed_optimizer: 1}\n", &r),
            "f.yaml: training.distributed_optimizer: must be true or false, "
            "got 1");
  EXPECT_EQ(ErrorOf("options: {seed: -1}\n", &r),
            "f.yaml: options.seed: must be an integer in "
            "[0, 9223372036854775807], got -1");
  EXPECT_EQ(ErrorOf("cluster: [1]\n", &r),
            "f.yaml: cluster: must be a mapping (object), got [1]");
  EXPECT_EQ(ErrorOf("[1, 2]\n", &r),
            "f.yaml: must be a mapping (object), got [1,2]");
  EXPECT_THAT(ErrorOf("", &r), HasSubstr("f.yaml: is empty"));
}

TEST(MessageJsonTest, EnumsAndInt64StringsFollowTheMapping) {
  v1::PlanRequest r;
  ASSERT_TRUE(ParseMessageText(
                  "options: {objective: USD_PER_TOKEN, max_evaluations: "
                  "\"123456789012\"}\n",
                  "r.yaml", &r)
                  .ok());
  EXPECT_EQ(r.options().objective(), v1::PlannerOptions::USD_PER_TOKEN);
  EXPECT_EQ(r.options().max_evaluations(), 123456789012);
}

TEST(MessageJsonTest, BothNamesOfOneFieldAreAnError) {
  v1::Cluster c;
  EXPECT_EQ(ErrorOf("inter_node_gbps: 1\ninterNodeGbps: 2\nnodes: []\n", &c),
            "f.yaml: inter_node_gbps: given twice (as \"inter_node_gbps\" and "
            "\"interNodeGbps\")");
}

TEST(MessageJsonTest, MapsCheckTheirValues) {
  v1::RpcStats stats;
  ASSERT_TRUE(ParseMessageText("codes: {OK: 3}\n", "s.yaml", &stats).ok());
  EXPECT_EQ(stats.codes().at("OK"), 3);
  EXPECT_EQ(ErrorOf("codes: {OK: many}\n", &stats),
            "f.yaml: codes.OK: must be an integer, got \"many\"");
}

TEST(MessageJsonTest, WritesProtoNamesAndZeros) {
  v1::Node node;
  node.set_name("a");
  node.set_gpu("H100");
  nlohmann::json j = MessageToJson(node);
  EXPECT_EQ(j, nlohmann::json::parse(R"({"name": "a", "gpu": "H100",
                                         "gpus": 0})"));
  node.set_nic_gbps(25);
  EXPECT_EQ(MessageToJson(node)["nic_gbps"], 25);
}

TEST(MessageErrorsTest, ServiceErrorsHaveNoSource) {
  const MessageErrors errors("", "cluster");
  EXPECT_EQ(errors.Under("nodes[1]").At("gpus", "bad").message(),
            "cluster.nodes[1].gpus: bad");
  EXPECT_EQ(errors.IntInRange("count", 0, 1, 8).message(),
            "cluster.count: must be an integer > 0, got 0");
  EXPECT_EQ(errors.IntInRange("count", 9, 1, 8).message(),
            "cluster.count: must be an integer <= 8, got 9");
  EXPECT_TRUE(errors.IntInRange("count", 8, 1, 8).ok());
  EXPECT_EQ(MessageErrors("f.yaml", "").At("x", "bad").message(),
            "f.yaml: x: bad");
}

}  // namespace
}  // namespace arachne
