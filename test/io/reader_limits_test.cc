// Regression tests of issue 16's reader defects (crashes and messages on bad
// input) and of the input limits of json_yaml.h (docs/formats.md, "Input
// limits"): each bad input is InvalidArgument with a message naming what is
// wrong, never a crash, an abort or a silent default.
#include <unistd.h>

#include <cstdio>
#include <filesystem>
#include <fstream>
#include <string>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "arachne/v1/planner.pb.h"
#include "arachne/v1/server_config.pb.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "planner_service/io/cluster_io.h"
#include "planner_service/io/config_file.h"
#include "planner_service/io/data_files.h"
#include "planner_service/io/gpu_catalog_io.h"
#include "planner_service/io/json_yaml.h"
#include "planner_service/io/message_json.h"
#include "planner_service/io/model_io.h"
#include "planner_service/io/plan_io.h"

namespace arachne {
namespace {

using ::testing::HasSubstr;
using Json = nlohmann::json;

const GpuCatalog& Catalog() {
  static const GpuCatalog* const catalog = new GpuCatalog(*LoadGpuCatalog());
  return *catalog;
}

// `depth` nested lists around `inner`.
std::string Nested(int depth, absl::string_view inner = "1") {
  return absl::StrCat(std::string(depth, '['), inner, std::string(depth, ']'));
}

constexpr absl::string_view kSmallCluster =
    "nodes: [{name: n, gpu: H100, gpus: 4}]\n";

// --- Item 1: a request's hf_config_json nested ~70,000 deep.

TEST(ReaderLimitsTest, DeepHfConfigIsAnErrorNotACrash) {
  const std::string text =
      absl::StrCat(R"({"architectures": )", Nested(70'000), "}");
  absl::StatusOr<ModelSpec> m =
      ModelFromHfConfigText(text, "custom", "model.hf_config_json");
  ASSERT_EQ(m.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(std::string(m.status().message()),
              HasSubstr("model.hf_config_json: architectures"));
  EXPECT_THAT(std::string(m.status().message()),
              HasSubstr("nested deeper than the limit of 64 levels"));

  // The tree as the service's handler parses it today (nlohmann without
  // limits): the converter's message no longer recurses through it.
  const Json deep = Json::parse(text);
  m = ModelFromHfConfig(deep, "custom");
  ASSERT_EQ(m.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(std::string(m.status().message()),
              HasSubstr("architectures[0]: must be a non-empty string, got "
                        "[[[[[...]]]]]"));
}

// --- Item 2: a cluster value nested ~100,000 deep.

TEST(ReaderLimitsTest, DeepClusterJsonIsAnErrorNotACrash) {
  const std::string text = absl::StrCat(R"({"nodes": )", Nested(100'000), "}");
  absl::StatusOr<Cluster> c = ParseCluster(text, "cluster.json", Catalog());
  ASSERT_EQ(c.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(std::string(c.status().message()),
              HasSubstr("cluster.json: nodes[0][0][0]"));
  EXPECT_THAT(std::string(c.status().message()),
              HasSubstr("nested deeper than the limit of 64 levels"));
}

TEST(ReaderLimitsTest, DescribeJsonValueOfAnyDepthIsShort) {
  Json deep = 1;
  for (int i = 0; i < 200'000; ++i) deep = Json::array({std::move(deep)});
  EXPECT_EQ(DescribeJsonValue(deep), "[[[[[...]]]]]");
}

TEST(ReaderLimitsTest, NestingLimitIsExactly64Levels) {
  EXPECT_TRUE(ParseJsonOrYaml(Nested(kMaxNestingDepth - 1), "a.json").ok());
  absl::StatusOr<Json> j = ParseJsonOrYaml(Nested(kMaxNestingDepth), "a.json");
  ASSERT_EQ(j.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(std::string(j.status().message()),
              HasSubstr("nested deeper than the limit of 64 levels"));
  // YAML: block style, one level per line.
  std::string yaml;
  for (int i = 0; i < kMaxNestingDepth; ++i) {
    absl::StrAppend(&yaml, std::string(2 * i, ' '), "k:\n");
  }
  absl::StrAppend(&yaml, std::string(2 * kMaxNestingDepth, ' '), "k: 1\n");
  j = ParseJsonOrYaml(yaml, "a.yaml");
  ASSERT_EQ(j.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(std::string(j.status().message()), HasSubstr("a.yaml:64:"));
  EXPECT_THAT(std::string(j.status().message()),
              HasSubstr("nested deeper than the limit of 64 levels"));
}

// --- Item 3: a JSON number beyond a double (1e999) in a cluster, a plan and
// an HF config.

TEST(ReaderLimitsTest, JsonNumberOverflowIsAnErrorWithItsPosition) {
  absl::StatusOr<Cluster> c = ParseCluster(
      R"({"inter_node_gbps": 1e999, "nodes": []})", "cluster.json", Catalog());
  ASSERT_EQ(c.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(std::string(c.status().message()), HasSubstr("cluster.json:1:"));
  EXPECT_THAT(std::string(c.status().message()),
              HasSubstr("number \"1e999\" is out of the range of a double"));

  absl::StatusOr<Json> plan =
      ParseJsonOrYaml(R"({"templates": [{"replicas": -1e999}]})", "plan.json");
  ASSERT_EQ(plan.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(std::string(plan.status().message()),
              HasSubstr("number \"-1e999\" is out of the range of a double"));

  absl::StatusOr<ModelSpec> m = ModelFromHfConfigText(
      R"({"architectures": ["LlamaForCausalLM"], "rope_theta": 1e999})",
      "custom", "model.hf_config_json");
  ASSERT_EQ(m.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(std::string(m.status().message()),
              HasSubstr("model.hf_config_json:1:"));
  EXPECT_THAT(std::string(m.status().message()),
              HasSubstr("out of the range of a double"));
}

// --- Item 4: YAML floats out of range or subnormal, also in a config file.

TEST(ReaderLimitsTest, YamlFloatOutOfRangeIsAnError) {
  absl::StatusOr<Cluster> c =
      ParseCluster(absl::StrCat("inter_node_gbps: 1e999\n", kSmallCluster),
                   "cluster.yaml", Catalog());
  ASSERT_EQ(c.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(std::string(c.status().message()),
              HasSubstr("cluster.yaml:1:18: number \"1e999\" is out of the "
                        "range of a double"));
  // A decimal integer beyond any double too.
  absl::StatusOr<Json> j = ParseJsonOrYaml(
      absl::StrCat("n: ", std::string(400, '9'), "\n"), "a.yaml");
  ASSERT_EQ(j.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(std::string(j.status().message()),
              HasSubstr("is out of the range of a double"));
}

TEST(ReaderLimitsTest, YamlSubnormalFloatsReadAsJsonReadsThem) {
  absl::StatusOr<Json> j =
      ParseJsonOrYaml("a: 1e-310\nb: 5.0e-324\nc: 1e-400\n", "a.yaml");
  ASSERT_TRUE(j.ok()) << j.status();
  EXPECT_EQ((*j)["a"].get<double>(), Json::parse("1e-310").get<double>());
  EXPECT_EQ((*j)["b"].get<double>(), Json::parse("5.0e-324").get<double>());
  EXPECT_EQ((*j)["c"].get<double>(), 0.0);
}

TEST(ReaderLimitsTest, ServerConfigFloatOutOfRangeIsAnError) {
  v1::ServerConfig config;
  absl::Status s = ParseConfigText("workers: 1e999\n", "planner.yaml", &config);
  ASSERT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(std::string(s.message()),
              HasSubstr("planner.yaml:1:10: number \"1e999\" is out of the "
                        "range of a double"));
}

// --- Item 5: invalid or truncated UTF-8 in a YAML scalar or key.

TEST(ReaderLimitsTest, InvalidUtf8IsAnErrorWithItsPosition) {
  absl::StatusOr<Cluster> c = ParseCluster("\xc6", "cluster.yaml", Catalog());
  ASSERT_EQ(c.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(std::string(c.status().message()),
              HasSubstr("cluster.yaml:1:1: a string is not valid UTF-8 (byte "
                        "0xC6 at offset 0)"));
  absl::StatusOr<Json> j = ParseJsonOrYaml("nodes:\n  k\xff: 1\n", "a.yaml");
  ASSERT_EQ(j.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(std::string(j.status().message()),
              HasSubstr("a.yaml:2:3: a key is not valid UTF-8 (byte 0xFF at "
                        "offset 1)"));
  // Overlong forms and surrogates are not UTF-8 either.
  for (absl::string_view bad :
       {"\xc0\xaf", "\xed\xa0\x80", "\xf4\x90\x80\x80", "\xe2\x82"}) {
    j = ParseJsonOrYaml(absl::StrCat("s: a", bad, "\n"), "a.yaml");
    EXPECT_EQ(j.status().code(), absl::StatusCode::kInvalidArgument) << bad;
  }
  EXPECT_TRUE(
      ParseJsonOrYaml("s: \"H100 \xe2\x80\x94 \xf0\x9f\x9a\x80\"\n", "a.yaml")
          .ok());
}

// --- Item 6: a YAML "billion laughs" alias file.

TEST(ReaderLimitsTest, BillionLaughsIsRefusedEarly) {
  std::string yaml = "a0: &a0 [lol, lol, lol, lol, lol, lol, lol, lol, lol]\n";
  for (int i = 1; i < 10; ++i) {
    absl::StrAppend(&yaml, "a", i, ": &a", i, " [");
    for (int k = 0; k < 9; ++k) {
      absl::StrAppend(&yaml, k == 0 ? "" : ", ", "*a", i - 1);
    }
    absl::StrAppend(&yaml, "]\n");
  }
  ASSERT_LT(yaml.size(), 600u);
  absl::StatusOr<Json> j = ParseJsonOrYaml(yaml, "laughs.yaml");
  ASSERT_EQ(j.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(std::string(j.status().message()),
              HasSubstr("YAML aliases expand to more than the limit of 100000 "
                        "values"));
}

TEST(ReaderLimitsTest, AliasesWithinTheLimitsExpand) {
  absl::StatusOr<Json> j = ParseJsonOrYaml(
      "base: &n {gpu: H100, gpus: 4}\nnodes: [*n, *n]\n", "a.yaml");
  ASSERT_TRUE(j.ok()) << j.status();
  EXPECT_EQ((*j)["nodes"][1]["gpus"].get<int>(), 4);
  j = ParseJsonOrYaml("a: &x [1, *x]\n", "a.yaml");
  ASSERT_EQ(j.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(std::string(j.status().message()),
              HasSubstr("alias refers to a node that contains it"));
}

// --- Item 7: endless or huge files.

TEST(ReaderLimitsTest, EndlessFileIsRefusedAfterTheLimit) {
  absl::StatusOr<Cluster> c = LoadClusterFile("/dev/zero", Catalog());
  ASSERT_EQ(c.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(std::string(c.status().message()),
              HasSubstr("/dev/zero: file is larger than the limit of 16777216 "
                        "bytes (16 MiB)"));
  v1::ServerConfig config;
  absl::Status s = LoadConfigFile("/dev/zero", &config);
  ASSERT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(std::string(s.message()),
              HasSubstr("config: /dev/zero: file is larger than the limit"));
}

TEST(ReaderLimitsTest, InputTextLongerThanTheLimitIsRefused) {
  const std::string text(kMaxInputBytes + 1, ' ');
  absl::StatusOr<Json> j = ParseJsonOrYaml(text, "big.yaml");
  ASSERT_EQ(j.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(std::string(j.status().message()),
              HasSubstr("big.yaml: input of 16777217 bytes is longer than the "
                        "limit of 16777216 bytes"));
}

// --- Item 15: YAML .nan / .inf, and hf_config_json errors with positions.

TEST(ReaderLimitsTest, NonFiniteYamlFloatsAreNamedNotNull) {
  absl::StatusOr<Cluster> c =
      ParseCluster(absl::StrCat("inter_node_gbps: .nan\n", kSmallCluster),
                   "cluster.yaml", Catalog());
  EXPECT_EQ(c.status().message(),
            "cluster.yaml: inter_node_gbps: must be a finite number, got .nan");
  c = ParseCluster(absl::StrCat("inter_node_gbps: -.inf\n", kSmallCluster),
                   "cluster.yaml", Catalog());
  EXPECT_EQ(
      c.status().message(),
      "cluster.yaml: inter_node_gbps: must be a finite number, got -.inf");
}

TEST(ReaderLimitsTest, HfConfigTextErrorsHaveAPosition) {
  absl::StatusOr<ModelSpec> m = ModelFromHfConfigText(
      R"({"architectures": ["\ud800"]})", "custom", "model.hf_config_json");
  ASSERT_EQ(m.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(std::string(m.status().message()),
              HasSubstr("model.hf_config_json:1:"));
  EXPECT_THAT(std::string(m.status().message()), HasSubstr("surrogate"));
  m = ModelFromHfConfigText("[1]", "custom", "model.hf_config_json");
  EXPECT_EQ(m.status().message(),
            "model.hf_config_json: must be a mapping (object), got [1]");
  // JSON only: YAML is no config.json.
  m = ModelFromHfConfigText("architectures: [LlamaForCausalLM]\n", "custom",
                            "model.hf_config_json");
  EXPECT_THAT(std::string(m.status().message()),
              HasSubstr("model.hf_config_json:1:1: invalid JSON"));
}

// --- Item 17: error messages quote a bounded part of a value.

TEST(ReaderLimitsTest, LongValuesAreQuotedAbbreviated) {
  const std::string name(5'000'000, 'A');
  v1::Cluster message;
  v1::Node* node = message.add_nodes();
  node->set_gpu(name);
  node->set_gpus(4);
  absl::StatusOr<Cluster> c =
      ClusterFromMessage(message, Catalog(), "", "cluster");
  ASSERT_EQ(c.status().code(), absl::StatusCode::kInvalidArgument);
  const std::string error(c.status().message());
  EXPECT_LT(error.size(), 1000u);
  EXPECT_THAT(error, HasSubstr(absl::StrCat("cluster.nodes[0].gpu: unknown GPU "
                                            "type \"",
                                            std::string(64, 'A'),
                                            "...\" (5000000 bytes); known: ")));
  EXPECT_EQ(QuoteForMessage("a\"b"), "\"a\\\"b\"");
  EXPECT_EQ(QuoteForMessage(std::string(65, 'x')),
            absl::StrCat("\"", std::string(64, 'x'), "...\" (65 bytes)"));
}

TEST(ReaderLimitsTest, StringsLongerThanTheLimitAreRefused) {
  const std::string yaml = absl::StrCat(
      "nodes: [{name: n, gpu: ", std::string(kMaxStringBytes + 1, 'A'),
      ", gpus: 4}]\n");
  absl::StatusOr<Cluster> c = ParseCluster(yaml, "cluster.yaml", Catalog());
  ASSERT_EQ(c.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(std::string(c.status().message()),
              HasSubstr("cluster.yaml:1:24: a string of 1048577 bytes is "
                        "longer than the limit of 1048576 bytes"));
  const std::string json =
      absl::StrCat(R"({"nodes": [{"name": ")",
                   std::string(kMaxStringBytes + 1, 'n'), "\"}]}");
  c = ParseCluster(json, "cluster.json", Catalog());
  EXPECT_THAT(std::string(c.status().message()),
              HasSubstr("cluster.json: nodes[0].name: a string of 1048577 "
                        "bytes is longer than the limit"));
}

// --- Item 18: a quoted integer where the format wants an integer.

TEST(ReaderLimitsTest, QuotedInt32IsAnError) {
  absl::StatusOr<Cluster> c =
      ParseCluster("nodes: [{name: n, gpu: H100, gpus: \"4\"}]\n",
                   "cluster.yaml", Catalog());
  EXPECT_EQ(c.status().message(),
            "cluster.yaml: nodes[0].gpus: must be an integer (without quotes), "
            "got \"4\"");
  // 64-bit integers may be strings: the JSON mapping writes them so.
  absl::StatusOr<std::vector<ModelSpec>> models = ParseModelCatalog(
      "models: [{name: m, num_layers: 2, hidden: 64, num_heads: 4, ffn: 128, "
      "vocab: \"1000\"}]\n",
      "models.yaml");
  ASSERT_TRUE(models.ok()) << models.status();
  EXPECT_EQ((*models)[0].vocab, 1000);
}

// --- Limits on what one value may hold.

TEST(ReaderLimitsTest, ValueCountLimit) {
  std::string json = "[";
  for (int64_t i = 0; i < kMaxInputValues; ++i) json += i == 0 ? "0" : ",0";
  json += "]";
  absl::StatusOr<Json> j = ParseJsonOrYaml(json, "a.json");
  ASSERT_EQ(j.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(std::string(j.status().message()),
              HasSubstr("a.json: [999999]: holds more than the limit of "
                        "1000000 values"));
}

TEST(ReaderLimitsTest, MoreThanOneYamlDocumentIsAnError) {
  absl::StatusOr<Json> j = ParseJsonOrYaml("a: 1\n---\nb: 2\n", "a.yaml");
  ASSERT_EQ(j.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(std::string(j.status().message()),
              HasSubstr("a.yaml:2:1: holds more than one YAML document"));
  EXPECT_TRUE(ParseJsonOrYaml("---\na: 1\n", "a.yaml").ok());
}

TEST(ReaderLimitsTest, LongNodeNamesAreRefused) {
  absl::StatusOr<Cluster> c = ParseCluster(
      absl::StrCat("nodes: [{name: ", std::string(kMaxNodeNameBytes + 1, 'n'),
                   ", gpu: H100, gpus: 4}]\n"),
      "cluster.yaml", Catalog());
  ASSERT_EQ(c.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(std::string(c.status().message()),
              HasSubstr("cluster.yaml: nodes[0].name: must be at most 253 "
                        "bytes, got \"nnnn"));
}

TEST(ReaderLimitsTest, InfiniteBandwidthFromARequestIsRefused) {
  v1::Cluster message;
  message.set_inter_node_gbps(std::numeric_limits<double>::infinity());
  v1::Node* node = message.add_nodes();
  node->set_gpu("H100");
  node->set_gpus(4);
  absl::StatusOr<Cluster> c =
      ClusterFromMessage(message, Catalog(), "", "cluster");
  EXPECT_EQ(c.status().message(),
            "cluster.inter_node_gbps: must be a finite number > 0, got inf");
}

TEST(ReaderLimitsTest, PlanSizesAreBoundedBeforeTheyAreBuilt) {
  absl::StatusOr<Cluster> cluster =
      ParseCluster(kSmallCluster, "cluster.yaml", Catalog());
  ASSERT_TRUE(cluster.ok()) << cluster.status();
  v1::Plan plan;
  v1::Template* t = plan.add_templates();
  t->set_replicas(1);
  t->set_micro_batch_size(1);
  t->set_total_micro_batches(1);
  for (int s = 0; s < 200'000; ++s) {
    v1::Stage* stage = t->add_stages();
    stage->set_gpu_type("H100");
    stage->set_tp(1);
    stage->add_layers(s);
    stage->add_layers(s + 1);
  }
  absl::StatusOr<Plan> p =
      PlanFromMessage(plan.templates(), *cluster, Catalog(), "", "plan");
  EXPECT_EQ(p.status().message(),
            "plan.templates[0].stages: must have at most 1024 stages, got "
            "200000");
}

TEST(ReaderLimitsTest, ModelDimensionsAreBounded) {
  absl::StatusOr<std::vector<ModelSpec>> models = ParseModelCatalog(
      "models: [{name: m, num_layers: 2, hidden: 2147483647, num_heads: 1, "
      "vocab: 10}]\n",
      "models.yaml");
  EXPECT_EQ(models.status().message(),
            "models.yaml: models[0].hidden: must be an integer <= 16777216, "
            "got 2147483647");
  absl::StatusOr<ModelSpec> m = ModelFromHfConfigText(
      R"({"architectures": ["GPT2LMHeadModel"], "n_layer": 2,
          "n_embd": 2000000000, "n_head": 1, "vocab_size": 10})",
      "gpt", "config.json");
  EXPECT_THAT(std::string(m.status().message()),
              HasSubstr("config.json: n_embd: must be an integer <= 16777216"));
}

}  // namespace
}  // namespace arachne
