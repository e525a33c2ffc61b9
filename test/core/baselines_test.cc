// The baseline planners on the shipped catalogs: every plan validates, each
// keeps the restriction that defines it, budgets and seeds make runs
// reproducible, and the exact planner is never beaten on small clusters.
#include <algorithm>
#include <cstdlib>
#include <fstream>
#include <iterator>
#include <memory>
#include <set>
#include <string>

#include "absl/strings/str_cat.h"
#include "glog/logging.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "planner_service/core/planners/amp_planner.h"
#include "planner_service/core/planners/hexiscale_planner.h"
#include "planner_service/core/planners/layer_split.h"
#include "planner_service/core/learned/learned_planner.h"
#include "planner_service/core/cost/plan_validation.h"
#include "planner_service/core/planners.h"
#include "planner_service/core/planners/random_planner.h"
#include "planner_service/core/planners/sailor_planner.h"
#include "planner_service/io/cluster_io.h"
#include "planner_service/io/gpu_catalog_io.h"
#include "planner_service/io/model_io.h"
#include "planner_service/io/planning_context.h"

namespace arachne {
namespace {

using ::testing::ElementsAre;
using ::testing::HasSubstr;

constexpr char kTwoTypes32[] = R"(
inter_node_gbps: 100
node_groups:
  - {gpu: A100-40GB, gpus_per_node: 4, count: 4}
  - {gpu: H100-80GB, gpus_per_node: 4, count: 4}
)";

// Non-uniform node sizes: 1-GPU and 4-GPU nodes of three types (24 GPUs).
constexpr char kNonUniform24[] = R"(
inter_node_gbps: 100
node_groups:
  - {gpu: A100-40GB, gpus_per_node: 4, count: 1}
  - {gpu: A100-40GB, gpus_per_node: 1, count: 4}
  - {gpu: A100-80GB, gpus_per_node: 4, count: 1}
  - {gpu: H100-80GB, gpus_per_node: 4, count: 2}
  - {gpu: H100-80GB, gpus_per_node: 1, count: 4}
)";

std::unique_ptr<PlanningContext> Context(const std::string& model,
                                         const std::string& cluster_yaml,
                                         int global_batch = 2048) {
  absl::StatusOr<GpuCatalog> catalog = LoadGpuCatalog();
  CHECK(catalog.ok()) << catalog.status();
  absl::StatusOr<ModelSpec> spec = ResolveModel(model);
  CHECK(spec.ok()) << spec.status();
  absl::StatusOr<Cluster> cluster = ParseCluster(cluster_yaml, "test", *catalog);
  CHECK(cluster.ok()) << cluster.status();
  TrainingConfig training;
  training.global_batch = global_batch;
  auto ctx = PlanningContext::Create(*catalog, *spec, training, *cluster, "");
  CHECK(ctx.ok()) << ctx.status();
  return *std::move(ctx);
}

// Deterministic: an evaluation limit, never the clock.
PlannerOptions Limited(int64_t evaluations) {
  PlannerOptions o;
  o.budget = absl::Hours(1);
  o.max_evaluations = evaluations;
  return o;
}

PlanResult RunOk(const std::string& planner, const CostModel& cm,
                 int64_t evaluations = 20000) {
  auto p = MakePlanner(planner);
  CHECK(p.ok());
  absl::StatusOr<PlanResult> r = (*p)->Run(cm, Limited(evaluations));
  CHECK(r.ok()) << planner << ": " << r.status();
  return *std::move(r);
}

TEST(Baselines, RegistryKnowsEveryPlanner) {
  EXPECT_THAT(PlannerNames(), ElementsAre("exact", "amp", "espresso",
                                          "hexiscale", "metis", "sailor",
                                          "random"));
  for (const std::string& name : PlannerNames()) {
    auto p = MakePlanner(name);
    ASSERT_TRUE(p.ok()) << name;
    EXPECT_EQ((*p)->name(), name);
  }
  EXPECT_EQ(MakePlanner("AMP").value()->name(), "amp");
  EXPECT_THAT(MakePlanner("alpa").status().message(),
              HasSubstr("unknown planner \"alpa\""));
}

struct Case {
  std::string model;
  const char* cluster;
  int global_batch;
};

class EveryPlanner
    : public ::testing::TestWithParam<std::tuple<std::string, int>> {};

const Case kCases[] = {
    {"llama3-8b", kTwoTypes32, 2048},
    {"llama3-8b", kNonUniform24, 2048},
    {"mixtral-8x7b", kTwoTypes32, 2048},
    {"gpt-neo-2.7b", kNonUniform24, 128},
};

TEST_P(EveryPlanner, ReturnsAValidPlanWithStatistics) {
  const auto& [planner, index] = GetParam();
  const Case& c = kCases[index];
  auto ctx = Context(c.model, c.cluster, c.global_batch);
  const PlanResult r = RunOk(planner, ctx->cost_model());
  EXPECT_EQ(r.planner, planner);
  EXPECT_TRUE(ValidatePlan(r.plan, ctx->cost_model()).ok());
  EXPECT_GT(r.prediction.throughput_iters_per_s, 0);
  EXPECT_GT(r.stats.evaluations, 0);
  EXPECT_LE(r.stats.evaluations, 20000 + 1000);  // one candidate may overrun
  // The progress curve climbs to the returned plan.
  ASSERT_FALSE(r.stats.progress.empty());
  for (size_t i = 1; i < r.stats.progress.size(); ++i) {
    EXPECT_GT(r.stats.progress[i].throughput_iters_per_s,
              r.stats.progress[i - 1].throughput_iters_per_s);
    EXPECT_GE(r.stats.progress[i].evaluations,
              r.stats.progress[i - 1].evaluations);
  }
  EXPECT_NEAR(r.stats.progress.back().throughput_iters_per_s,
              r.prediction.throughput_iters_per_s,
              1e-9 * r.prediction.throughput_iters_per_s);
}

INSTANTIATE_TEST_SUITE_P(
    AllCases, EveryPlanner,
    ::testing::Combine(::testing::Values("exact", "amp", "espresso",
                                         "hexiscale", "metis", "sailor",
                                         "random"),
                       ::testing::Range(0, 4)),
    [](const auto& info) {
      std::string model = kCases[std::get<1>(info.param)].model;
      std::replace(model.begin(), model.end(), '-', '_');
      std::replace(model.begin(), model.end(), '.', '_');
      return std::get<0>(info.param) + "_" + model + "_" +
             std::to_string(std::get<1>(info.param));
    });

TEST(Baselines, EspressoKeepsTpOneEverywhere) {
  for (const Case& c : kCases) {
    auto ctx = Context(c.model, c.cluster, c.global_batch);
    const PlanResult r = RunOk("espresso", ctx->cost_model());
    for (const Template& t : r.plan.templates)
      for (const Stage& s : t.stages) EXPECT_EQ(s.tp, 1) << c.model;
  }
}

TEST(Baselines, SailorSplitsLayersEvenly) {
  for (const Case& c : kCases) {
    auto ctx = Context(c.model, c.cluster, c.global_batch);
    const PlanResult r = RunOk("sailor", ctx->cost_model());
    const int depth = r.plan.templates[0].depth();
    for (const Template& t : r.plan.templates) {
      EXPECT_EQ(t.depth(), depth);  // one PP degree per plan
      std::vector<int> split;
      for (const Stage& s : t.stages) split.push_back(s.num_layers());
      EXPECT_EQ(split, EvenSplit(ctx->model().num_layers, depth)) << c.model;
    }
  }
}

TEST(Baselines, SailorTpIsAtLeastTheSmallestThatFits) {
  // Qwen3-32B at depth 2 on A100-40GB: one half of the model does not fit
  // one 40 GB GPU, so TP must grow; on a 1-GPU-node reading it cannot.
  auto ctx = Context("qwen3-32b", kTwoTypes32);
  const CostModel& cm = ctx->cost_model();
  const int a100 = cm.catalog().IndexOf("A100-40GB").value();
  const int tp = SailorPlanner::TpDegree(cm, a100, 0, 2, 1, 4);
  EXPECT_EQ(tp, 0);  // 32 layers per stage need more than 4 x 40 GB
  const int deep = SailorPlanner::TpDegree(cm, a100, 0, 16, 1, 4);
  EXPECT_GE(deep, 1);
  EXPECT_EQ(SailorPlanner::TpDegree(cm, a100, 0, 16, 1, 1),
            deep == 1 ? 1 : 0);
}

TEST(Baselines, HexiScaleReplicasAreDisjointNodePools) {
  for (const Case& c : kCases) {
    auto ctx = Context(c.model, c.cluster, c.global_batch);
    const PlanResult r = RunOk("hexiscale", ctx->cost_model());
    std::set<int> seen;
    for (const Template& t : r.plan.templates) {
      EXPECT_EQ(t.replicas, 1);  // each group is one asymmetric pipeline
      std::set<int> nodes;
      for (const StagePlacement& p : t.placement) nodes.insert(p.node);
      for (int n : nodes) EXPECT_TRUE(seen.insert(n).second) << c.model;
    }
  }
}

TEST(Baselines, HexiScalePartitionBalancesCompute) {
  auto ctx = Context("llama3-8b", kTwoTypes32);
  const Cluster& cluster = ctx->cluster();
  // 4 A100 nodes and 4 H100 nodes into 4 groups: one of each per group.
  const std::vector<int> group =
      HexiScalePlanner::PartitionNodes(cluster, ctx->catalog(), 4);
  ASSERT_EQ(group.size(), 8u);
  for (int g = 0; g < 4; ++g) {
    int a100 = 0, h100 = 0;
    for (int i = 0; i < 8; ++i) {
      if (group[i] != g) continue;
      (ctx->catalog().type(cluster.node(i).gpu_type).id == "A100-40GB" ? a100
                                                                       : h100)++;
    }
    EXPECT_EQ(a100, 1) << "group " << g;
    EXPECT_EQ(h100, 1) << "group " << g;
  }
  EXPECT_THAT(HexiScalePlanner::PartitionNodes(cluster, ctx->catalog(), 1),
              ElementsAre(0, 0, 0, 0, 0, 0, 0, 0));
}

bool PowerOfTwo(int v) { return v > 0 && (v & (v - 1)) == 0; }

TEST(Baselines, MetisUsesPowerOfTwoDeviceGroupsInOnePipeline) {
  for (const Case& c : kCases) {
    auto ctx = Context(c.model, c.cluster, c.global_batch);
    const PlanResult r = RunOk("metis", ctx->cost_model());
    ASSERT_EQ(r.plan.templates.size(), 1u);
    const Template& t = r.plan.templates[0];
    for (const Stage& s : t.stages)
      EXPECT_TRUE(PowerOfTwo(s.tp * t.replicas)) << c.model;
  }
}

TEST(Baselines, AmpRunsOneTemplateWithOneTpDegree) {
  for (const Case& c : kCases) {
    auto ctx = Context(c.model, c.cluster, c.global_batch);
    const PlanResult r = RunOk("amp", ctx->cost_model());
    ASSERT_EQ(r.plan.templates.size(), 1u);
    for (const Stage& s : r.plan.templates[0].stages)
      EXPECT_EQ(s.tp, r.plan.templates[0].stages[0].tp);
  }
}

TEST(Baselines, AmpPartitionMinimisesTheSlowestStage) {
  // Heavy first and last layers: the middle stage takes the light ones.
  EXPECT_THAT(AmpPlanner::PartitionLayers({5, 1, 1, 1, 1, 5}, 0, 0, 3),
              ElementsAre(1, 4, 1));
  EXPECT_THAT(AmpPlanner::PartitionLayers({5, 1, 1, 1, 1, 5}, 0, 0, 2),
              ElementsAre(3, 3));
  // The embedding's cost on the first stage pushes layers back.
  EXPECT_THAT(AmpPlanner::PartitionLayers({1, 1, 1, 1}, 2, 0, 2),
              ElementsAre(1, 3));
  EXPECT_TRUE(AmpPlanner::PartitionLayers({1, 1}, 0, 0, 3).empty());
}

TEST(Baselines, NonUniformNodesGiveAmpAndSailorTpOne) {
  // The paper's reading for planners that need uniform node sizes: every
  // GPU its own node, so no TP.
  for (const std::string planner : {"amp", "sailor"}) {
    auto ctx = Context("llama3-8b", kNonUniform24);
    const PlanResult r = RunOk(planner, ctx->cost_model());
    for (const Template& t : r.plan.templates)
      for (const Stage& s : t.stages) EXPECT_EQ(s.tp, 1) << planner;
  }
}

TEST(Baselines, RandomIsDeterministicForASeed) {
  auto ctx = Context("llama3-8b", kTwoTypes32);
  const PlanResult a = RunOk("random", ctx->cost_model(), 3000);
  const PlanResult b = RunOk("random", ctx->cost_model(), 3000);
  EXPECT_EQ(a.prediction.iteration_time_s, b.prediction.iteration_time_s);
  EXPECT_EQ(a.stats.progress.size(), b.stats.progress.size());
  const std::vector<PlanSample> s1 =
      SamplePlanStructures(ctx->cost_model(), 200, 7);
  const std::vector<PlanSample> s2 =
      SamplePlanStructures(ctx->cost_model(), 200, 7);
  ASSERT_FALSE(s1.empty());
  ASSERT_EQ(s1.size(), s2.size());
  for (size_t i = 0; i < s1.size(); ++i) {
    EXPECT_EQ(s1[i].max_depth, s2[i].max_depth);
    EXPECT_EQ(s1[i].throughput_iters_per_s, s2[i].throughput_iters_per_s);
    EXPECT_GE(s1[i].max_depth, 1);
    EXPECT_LE(s1[i].max_depth, 16);
  }
}

// What a seeded random run draws, as text: the plan random returns and the
// depths it samples.
std::string RandomRunSignature(const CostModel& cm) {
  PlannerOptions o;
  o.max_evaluations = 300;
  o.seed = 5;
  auto r = RandomPlanner().Run(cm, o);
  CHECK(r.ok()) << r.status();
  std::string out = absl::StrCat(r->prediction.iteration_time_s, " ",
                                 r->plan.used_gpus(), ":");
  for (const PlanSample& s : SamplePlanStructures(cm, 60, 7))
    absl::StrAppend(&out, " ", s.max_depth);
  return out;
}

// A seed reproduces a run in another process too, which is what --seed
// promises. Within one process the test above cannot tell: absl::BitGen
// salts its seed with OS entropy once per process, so a BitGen-based random
// planner matched itself in-process and drew differently in each run. The
// "threadsafe" death-test style re-executes this binary, so the child draws
// in a fresh process; it writes what it drew and the parent compares.
TEST(Baselines, RandomIsDeterministicForASeedAcrossProcesses) {
  GTEST_FLAG_SET(death_test_style, "threadsafe");
  const std::string path =
      absl::StrCat(::testing::TempDir(), "/random_run_signature.txt");
  auto ctx = Context("llama3-8b", kTwoTypes32);
  EXPECT_EXIT(
      {
        std::ofstream(path) << RandomRunSignature(ctx->cost_model());
        std::exit(0);
      },
      ::testing::ExitedWithCode(0), "");
  std::ifstream in(path);
  std::string child((std::istreambuf_iterator<char>(in)),
                    std::istreambuf_iterator<char>());
  EXPECT_EQ(child, RandomRunSignature(ctx->cost_model()));
  EXPECT_THAT(child, HasSubstr(":"));
}

TEST(Baselines, NoBaselineBeatsTheExhaustiveSearch) {
  // Small enough for the exact planner to search the whole space.
  constexpr char kSmall[] = R"(
inter_node_gbps: 100
nodes:
  - {name: a, gpu: A100-80GB, gpus: 2}
  - {name: h, gpu: H100-80GB, gpus: 2}
)";
  auto ctx = Context("llama3-8b", kSmall, 64);
  auto exact = MakePlanner("exact").value();
  PlannerOptions o;
  o.budget = absl::Hours(1);
  absl::StatusOr<PlanResult> best = exact->Run(ctx->cost_model(), o);
  ASSERT_TRUE(best.ok()) << best.status();
  ASSERT_TRUE(best->stats.exhaustive);
  for (const std::string& name : PlannerNames()) {
    const PlanResult r = RunOk(name, ctx->cost_model(), 5000);
    EXPECT_LE(r.prediction.throughput_iters_per_s,
              best->prediction.throughput_iters_per_s * (1 + 1e-9))
        << name;
  }
}

TEST(Baselines, NoPlanIsAPreciseError) {
  constexpr char kTiny[] = R"(
nodes:
  - {name: a, gpu: A5000, gpus: 1}
)";
  auto ctx = Context("llama3-70b", kTiny);
  for (const std::string& name : PlannerNames()) {
    auto p = MakePlanner(name).value();
    absl::StatusOr<PlanResult> r = p->Run(ctx->cost_model(), Limited(2000));
    if (name == "random") {
      // Random search never ends on its own: the limit stops it, and one
      // layer does fit, so it cannot say that no plan fits.
      EXPECT_EQ(r.status().code(), absl::StatusCode::kResourceExhausted);
      EXPECT_THAT(r.status().message(),
                  HasSubstr("random: the search was stopped before any plan "
                            "was found, by the evaluation limit"));
      continue;
    }
    EXPECT_EQ(r.status().code(), absl::StatusCode::kFailedPrecondition) << name;
    EXPECT_THAT(r.status().message(), HasSubstr("no plan fits llama3-70b"))
        << name;
  }
}

}  // namespace
}  // namespace arachne

namespace arachne {
namespace {

TEST(Baselines, CancelledSearchStopsAndSaysSo) {
  auto ctx = Context("llama3-8b", kTwoTypes32);
  std::atomic<bool> cancelled{true};
  for (const std::string& name : PlannerNames()) {
    PlannerOptions o;
    o.budget = absl::Hours(1);
    o.cancelled = &cancelled;
    absl::StatusOr<PlanResult> r =
        MakePlanner(name).value()->Run(ctx->cost_model(), o);
    EXPECT_EQ(r.status().code(), absl::StatusCode::kCancelled) << name;
    EXPECT_THAT(r.status().message(),
                HasSubstr("cancelled after 0 plan evaluations"))
        << name;
  }
}

}  // namespace
}  // namespace arachne

namespace arachne {
namespace {

// The ablation planner runs only when named, needs no policy factory and
// plans with the learned planner's search; unknown names list it.
TEST(Baselines, TemplateSearchRunsWithoutAPolicyWhenNamed) {
  EXPECT_THAT(AblationPlannerNames(), ElementsAre("template-search"));
  EXPECT_THAT(PlannerNames(),
              ::testing::Not(::testing::Contains("template-search")));
  ASSERT_FALSE(HasLearnedPolicyFactory());
  auto ctx = Context("llama3-8b", kTwoTypes32);
  auto planner = MakePlanner("Template-Search");
  ASSERT_TRUE(planner.ok()) << planner.status();
  EXPECT_EQ((*planner)->name(), "template-search");
  absl::StatusOr<PlanResult> r = (*planner)->Run(ctx->cost_model(), Limited(20000));
  ASSERT_TRUE(r.ok()) << r.status();
  EXPECT_EQ(r->planner, "template-search");
  EXPECT_TRUE(ValidatePlan(r->plan, ctx->cost_model()).ok());
  EXPECT_THAT(MakePlanner("alpa").status().message(),
              HasSubstr("known: exact, amp, espresso, hexiscale, metis, "
                        "sailor, random, template-search"));
}

}  // namespace
}  // namespace arachne
