// Scenario files: fields, defaults, exact error messages, and the shipped
// suite in bench/scenarios (every file parses; every composition has the GPU
// count its label states and issue 3 asks for).
#include "planner_service/io/scenario_io.h"

#include <filesystem>
#include <fstream>
#include <map>
#include <regex>
#include <string>
#include <vector>

#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "planner_service/io/cluster_io.h"
#include "planner_service/io/gpu_catalog_io.h"

namespace arachne {
namespace {

using ::testing::ElementsAre;
using ::testing::HasSubstr;

const GpuCatalog& Catalog() {
  static const GpuCatalog* catalog = new GpuCatalog(*LoadGpuCatalog());
  return *catalog;
}

const char kValid[] = R"yaml(
name: fig07a-llama3-8b
figure: "7a"
description: "LLaMA-3-8B on A100-40GB + H100"
kind: compare
model: llama3-8b
training: {seq_len: 4096, global_batch: 512, precision: fp16, optimizer: adam,
           recompute: full, distributed_optimizer: true}
compositions:
  - label: "4+4 (8 GPUs)"
    gpus: 8
    cluster:
      inter_node_gbps: 200
      node_groups:
        - {gpu: A100-40GB, gpus_per_node: 4, count: 1}
        - {gpu: H100, gpus_per_node: 4, count: 1}
  - label: "one node (4 GPUs)"
    gpus: 4
    cluster:
      nodes:
        - {name: n0, gpu: A6000, gpus: 4}
)yaml";

std::string ErrorOf(const std::string& text) {
  absl::StatusOr<Scenario> s = ParseScenario(text, "s.yaml", Catalog());
  EXPECT_FALSE(s.ok());
  EXPECT_EQ(s.status().code(), absl::StatusCode::kInvalidArgument)
      << s.status();
  return std::string(s.status().message());
}

// A minimal valid scenario with `extra` top-level lines and `composition`
// as its only composition.
std::string Minimal(
    const std::string& extra,
    const std::string& composition =
        "  - label: \"one node (4 GPUs)\"\n"
        "    gpus: 4\n"
        "    cluster: {nodes: [{name: n0, gpu: A6000, gpus: 4}]}\n") {
  return "name: x\nfigure: \"1\"\nmodel: llama3-8b\n" + extra +
         "compositions:\n" + composition;
}

TEST(ScenarioIoTest, ParsesEveryField) {
  absl::StatusOr<Scenario> s = ParseScenario(kValid, "s.yaml", Catalog());
  ASSERT_TRUE(s.ok()) << s.status();
  EXPECT_EQ(s->source, "s.yaml");
  EXPECT_EQ(s->name, "fig07a-llama3-8b");
  EXPECT_EQ(s->figure, "7a");
  EXPECT_EQ(s->description, "LLaMA-3-8B on A100-40GB + H100");
  EXPECT_EQ(s->kind, ScenarioKind::kCompare);
  EXPECT_EQ(s->model, "llama3-8b");
  EXPECT_EQ(s->model_spec.name, "llama3-8b");
  EXPECT_EQ(s->model_spec.num_layers, 32);
  EXPECT_EQ(s->training.seq_len, 4096);
  EXPECT_EQ(s->training.global_batch, 512);
  EXPECT_EQ(s->training.precision, Precision::kFp16);
  EXPECT_EQ(s->training.recompute, Recompute::kFull);
  EXPECT_TRUE(s->training.distributed_optimizer);
  ASSERT_EQ(s->compositions.size(), 2u);
  const Composition& c = s->compositions[0];
  EXPECT_EQ(c.label, "4+4 (8 GPUs)");
  EXPECT_EQ(c.gpus, 8);
  ASSERT_EQ(c.cluster.num_nodes(), 2);
  EXPECT_EQ(c.cluster.node(0).name, "a100-40gb-0");
  EXPECT_EQ(c.cluster.node(1).name, "h100-80gb-0");
  EXPECT_EQ(Catalog().type(c.cluster.node(1).gpu_type).id, "H100-80GB");
  EXPECT_DOUBLE_EQ(c.cluster.node(0).nic_gbps, 200);
  EXPECT_EQ(s->compositions[1].cluster.node(0).name, "n0");
  EXPECT_EQ(s->max_evaluations, 0);
  EXPECT_EQ(s->samples, 0);
}

TEST(ScenarioIoTest, KindDefaultsAndKindSpecificFields) {
  absl::StatusOr<Scenario> s =
      ParseScenario(Minimal("kind: growth\n"), "s.yaml", Catalog());
  ASSERT_TRUE(s.ok()) << s.status();
  EXPECT_EQ(s->kind, ScenarioKind::kGrowth);
  EXPECT_EQ(s->description, "");
  const TrainingConfig defaults;
  EXPECT_EQ(s->training.seq_len, defaults.seq_len);
  EXPECT_EQ(s->training.global_batch, defaults.global_batch);
  EXPECT_EQ(s->training.recompute, Recompute::kNone);

  s = ParseScenario(Minimal("kind: search_curve\nmax_evaluations: 100000\n"),
                    "s.yaml", Catalog());
  ASSERT_TRUE(s.ok()) << s.status();
  EXPECT_EQ(s->kind, ScenarioKind::kSearchCurve);
  EXPECT_EQ(s->max_evaluations, 100000);

  s = ParseScenario(Minimal("kind: scatter\nsamples: 20000\n"), "s.yaml",
                    Catalog());
  ASSERT_TRUE(s.ok()) << s.status();
  EXPECT_EQ(s->kind, ScenarioKind::kScatter);
  EXPECT_EQ(s->samples, 20000);
}

TEST(ScenarioIoTest, ErrorsNameTheFileFieldAndValue) {
  EXPECT_EQ(ErrorOf(Minimal("kind: compare\nfigures: 2\n")),
            "s.yaml: unknown field \"figures\" (allowed: name, figure, "
            "description, kind, model, training, max_evaluations, samples, "
            "compositions)");
  EXPECT_EQ(ErrorOf(Minimal("kind: bars\n")),
            "s.yaml: kind: must be compare, search_curve, growth or scatter, "
            "got \"bars\"");
  EXPECT_EQ(ErrorOf(Minimal("")), "s.yaml: missing required field \"kind\"");
  EXPECT_EQ(ErrorOf(Minimal("kind: compare\ntraining: {optimiser: adam}\n")),
            "s.yaml: training: unknown field \"optimiser\" (allowed: seq_len, "
            "global_batch, precision, recompute, distributed_optimizer, "
            "optimizer, framework)");
  EXPECT_EQ(ErrorOf(Minimal("kind: compare\ntraining: {optimizer: sgd}\n")),
            "s.yaml: training.optimizer: must be adam (the only optimizer the "
            "cost model prices), got \"sgd\"");
  EXPECT_EQ(ErrorOf(Minimal("kind: compare\ntraining: {precision: fp8}\n")),
            "s.yaml: training.precision: must be bf16 or fp16, got \"fp8\"");
  EXPECT_EQ(ErrorOf(Minimal("kind: compare\ntraining: {recompute: some}\n")),
            "s.yaml: training.recompute: must be none, selective or full, got "
            "\"some\"");
  EXPECT_EQ(ErrorOf(Minimal("kind: compare\ntraining: {global_batch: 0}\n")),
            "s.yaml: training.global_batch: must be an integer > 0, got 0");
  EXPECT_EQ(ErrorOf(Minimal("kind: compare\nsamples: 10\n")),
            "s.yaml: samples: only applies to kind scatter, not compare");
  EXPECT_EQ(ErrorOf(Minimal("kind: compare\nmax_evaluations: 10\n")),
            "s.yaml: max_evaluations: only applies to kind search_curve, not "
            "compare");
  EXPECT_EQ(ErrorOf(Minimal("kind: scatter\n")),
            "s.yaml: missing required field \"samples\"");
  EXPECT_EQ(ErrorOf(Minimal("kind: search_curve\nmax_evaluations: 0\n")),
            "s.yaml: max_evaluations: must be an integer > 0, got 0");
  EXPECT_THAT(
      ErrorOf("name: x\nfigure: \"1\"\nkind: compare\nmodel: llama4\n"
              "compositions: []\n"),
      HasSubstr("s.yaml: model: unknown model \"llama4\": neither a catalog "
                "model nor"));
  EXPECT_EQ(ErrorOf(Minimal("kind: compare\n", " []\n")),
            "s.yaml: compositions: must not be empty");
  EXPECT_EQ(
      ErrorOf("name: x\nfigure: \"1\"\nkind: compare\nmodel: llama3-8b\n"),
      "s.yaml: missing required field \"compositions\"");
  EXPECT_EQ(ErrorOf(""),
            "s.yaml: is empty; expected a mapping with name, figure, kind, "
            "model and compositions");
}

TEST(ScenarioIoTest, CompositionErrorsNameTheCompositionAndClusterField) {
  EXPECT_EQ(ErrorOf(Minimal("kind: compare\n",
                            "  - label: a\n    gpus: 8\n"
                            "    cluster: {nodes: [{name: n0, gpu: A6000, "
                            "gpus: 4}]}\n")),
            "s.yaml: compositions[0].gpus: must equal the cluster's GPU count "
            "4, got 8");
  EXPECT_EQ(ErrorOf(Minimal("kind: compare\n",
                            "  - label: a\n    gpus: 4\n"
                            "    cluster: {node_groups: [{gpu_typ: A6000, "
                            "gpus_per_node: 4, count: 1}]}\n")),
            "s.yaml: compositions[0].cluster: node_groups[0]: unknown field "
            "\"gpu_typ\" (allowed: gpu, gpus_per_node, count, name_prefix, "
            "nic_gbps, topology)");
  EXPECT_THAT(ErrorOf(Minimal("kind: compare\n",
                              "  - label: a\n    gpus: 4\n"
                              "    cluster: {nodes: [{name: n0, gpu: H300, "
                              "gpus: 4}]}\n")),
              HasSubstr("s.yaml: compositions[0].cluster: nodes[0].gpu: "
                        "unknown GPU type \"H300\""));
  EXPECT_EQ(ErrorOf(Minimal("kind: compare\n",
                            "  - label: a\n    gpus: 4\n    cluster: big\n")),
            "s.yaml: compositions[0].cluster: must be a mapping (object), got "
            "\"big\"");
  EXPECT_EQ(ErrorOf(Minimal("kind: compare\n", "  - label: a\n    gpus: 4\n")),
            "s.yaml: compositions[0]: missing required field \"cluster\"");
  EXPECT_EQ(ErrorOf(Minimal("kind: compare\n",
                            "  - {label: a, gpus: 4, cluster: {nodes: [{name: "
                            "n, gpu: A6000, gpus: 4}]}}\n"
                            "  - {label: a, gpus: 4, cluster: {nodes: [{name: "
                            "n, gpu: A6000, gpus: 4}]}}\n")),
            "s.yaml: compositions[1].label: duplicate label \"a\" (also "
            "compositions[0])");
  EXPECT_EQ(
      ErrorOf(Minimal("kind: compare\n",
                      "  - {label: a, gpus: 4, nodes: 1, cluster: {}}\n")),
      "s.yaml: compositions[0]: unknown field \"nodes\" (allowed: label, "
      "gpus, cluster)");
}

std::string SuiteDir() {
  return std::string(ARACHNE_SOURCE_DIR) + "/bench/scenarios";
}

// The GPU count a label states: "LS3 (160 GPUs)" -> 160.
int GpusInLabel(const std::string& label) {
  std::smatch m;
  static const std::regex re(R"(\((\d+) GPUs\)$)");
  if (!std::regex_search(label, m, re)) return -1;
  return std::stoi(m[1]);
}

TEST(ScenarioSuiteTest, EveryShippedScenarioParsesAndLabelsStateTheGpuCount) {
  absl::StatusOr<std::vector<Scenario>> suite =
      LoadScenarioSuite(SuiteDir(), {}, Catalog());
  ASSERT_TRUE(suite.ok()) << suite.status();
  std::map<std::string, std::vector<int>> gpus_by_scenario;
  for (const Scenario& s : *suite) {
    for (const Composition& c : s.compositions) {
      EXPECT_EQ(GpusInLabel(c.label), c.cluster.total_gpus())
          << s.name << ": " << c.label;
      gpus_by_scenario[s.name].push_back(c.cluster.total_gpus());
    }
    if (s.name != "testbed-gpt-neo-2.7b") {
      EXPECT_EQ(s.training.seq_len, 2048) << s.name;
      EXPECT_EQ(s.training.global_batch, 2048) << s.name;
      EXPECT_EQ(s.training.precision, Precision::kBf16) << s.name;
    }
    EXPECT_EQ(s.training.recompute, s.name == "fig10b-qwen3-64b"
                                        ? Recompute::kFull
                                        : Recompute::kNone)
        << s.name;
  }
  // Issue 3 section 2, composition by composition.
  const std::map<std::string, std::vector<int>> expected = {
      {"fig01-llama3-8b", {128, 256, 512}},
      {"fig01-qwen3-32b", {128, 256, 512}},
      {"fig04-llama3-8b", {512}},
      {"fig04-qwen3-32b", {512}},
      {"fig07a-llama3-8b", {64, 160, 256}},
      {"fig07b-llama3-8b", {128, 256, 512}},
      {"fig07c-llama3-8b", {52, 100, 160, 208, 416}},
      {"fig07d-qwen3-32b", {64, 160, 256}},
      {"fig07e-qwen3-32b", {128, 256, 512}},
      {"fig07f-qwen3-32b", {52, 100, 160, 208, 416}},
      {"fig09a-mixtral-8x7b", {64, 160, 256}},
      {"fig09b-qwen3-30b-a3b", {64, 160, 256}},
      {"fig09c-deepseek-v3", {160, 256, 512}},
      {"fig10a-llama3-8b", {48, 56, 64, 112, 192}},
      {"fig10b-qwen3-64b", {128, 256, 512}},
      {"fig11-llama3-8b", {160}},
      {"testbed-gpt-neo-2.7b", {3, 7, 11, 15, 19}},
  };
  EXPECT_EQ(gpus_by_scenario, expected);
}

// The node list of a cluster, comparable across files.
std::vector<std::string> NodesOf(const Cluster& c) {
  std::vector<std::string> nodes;
  for (const Node& n : c.nodes()) {
    nodes.push_back(n.name + ":" + Catalog().type(n.gpu_type).id + "x" +
                    std::to_string(n.num_gpus) + "@" +
                    std::to_string(n.nic_gbps));
  }
  return nodes;
}

const Composition& Find(const std::vector<Scenario>& suite,
                        const std::string& name, int gpus) {
  for (const Scenario& s : suite) {
    if (s.name != name) continue;
    for (const Composition& c : s.compositions) {
      if (c.gpus == gpus) return c;
    }
  }
  ADD_FAILURE() << name << " has no " << gpus << "-GPU composition";
  static const Composition* none = new Composition();
  return *none;
}

TEST(ScenarioSuiteTest, CompositionsMatchTheShippedExampleClusters) {
  absl::StatusOr<std::vector<Scenario>> suite =
      LoadScenarioSuite(SuiteDir(), {}, Catalog());
  ASSERT_TRUE(suite.ok()) << suite.status();
  const std::string ex = std::string(ARACHNE_SOURCE_DIR) + "/examples/";
  const std::vector<std::pair<std::string, std::pair<std::string, int>>> same =
      {{"paper-512.yaml", {"fig01-llama3-8b", 512}},
       {"paper-128.yaml", {"fig07e-qwen3-32b", 128}},
       {"a100-h100-160.yaml", {"fig07a-llama3-8b", 160}},
       {"nonuniform-ls1.yaml", {"fig07c-llama3-8b", 52}},
       {"nonuniform-ls1.yaml", {"fig07f-qwen3-32b", 52}},
       {"testbed-19.yaml", {"testbed-gpt-neo-2.7b", 19}}};
  for (const auto& [file, where] : same) {
    absl::StatusOr<Cluster> example = LoadClusterFile(ex + file, Catalog());
    ASSERT_TRUE(example.ok()) << example.status();
    EXPECT_EQ(NodesOf(Find(*suite, where.first, where.second).cluster),
              NodesOf(*example))
        << file << " vs " << where.first;
  }
}

TEST(ScenarioSuiteTest, PatternsSelectByNameAndUnmatchedPatternsAreErrors) {
  absl::StatusOr<std::vector<Scenario>> suite = LoadScenarioSuite(
      SuiteDir(), {"fig07[ad]-*", "testbed-gpt-neo-2.7b"}, Catalog());
  ASSERT_TRUE(suite.ok()) << suite.status();
  std::vector<std::string> names;
  for (const Scenario& s : *suite) names.push_back(s.name);
  EXPECT_THAT(names, ElementsAre("fig07a-llama3-8b", "fig07d-qwen3-32b",
                                 "testbed-gpt-neo-2.7b"));

  suite = LoadScenarioSuite(SuiteDir(), {"fig99*"}, Catalog());
  ASSERT_FALSE(suite.ok());
  EXPECT_EQ(suite.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(suite.status().message(),
              HasSubstr("--scenarios: \"fig99*\" matches no scenario in "));
  EXPECT_THAT(suite.status().message(),
              HasSubstr("; scenarios: fig01-llama3-8b, fig01-qwen3-32b, "));
}

TEST(ScenarioSuiteTest, DirectoryErrors) {
  absl::StatusOr<std::vector<Scenario>> suite =
      LoadScenarioSuite("/nonexistent/suite", {}, Catalog());
  ASSERT_FALSE(suite.ok());
  EXPECT_EQ(suite.status().code(), absl::StatusCode::kNotFound);
  EXPECT_EQ(suite.status().message(),
            "--suite: /nonexistent/suite is not a directory");

  const std::filesystem::path dir =
      std::filesystem::temp_directory_path() / "arachne_scenario_suite_test";
  std::filesystem::remove_all(dir);
  std::filesystem::create_directories(dir);
  suite = LoadScenarioSuite(dir.string(), {}, Catalog());
  ASSERT_FALSE(suite.ok());
  EXPECT_EQ(suite.status().message(),
            "--suite: " + dir.string() +
                " holds no scenario file (*.yaml, *.yml, *.json)");

  std::ofstream(dir / "a.yaml") << Minimal("kind: compare\n");
  std::ofstream(dir / "b.yaml") << Minimal("kind: growth\n");
  suite = LoadScenarioSuite(dir.string(), {}, Catalog());
  ASSERT_FALSE(suite.ok());
  EXPECT_EQ(suite.status().message(),
            (dir / "b.yaml").string() +
                ": name: duplicate scenario name \"x\" (also in " +
                (dir / "a.yaml").string() + ")");
  std::filesystem::remove_all(dir);
}

}  // namespace
}  // namespace arachne
