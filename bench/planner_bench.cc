// Plan evaluations per second (one core) and exact-planner runs on the
// paper's clusters. Run: build/bench/planner_bench (see docs/benchmarks.md).
#include <cmath>
#include <memory>
#include <string>

#include "absl/time/time.h"
#include "benchmark/benchmark.h"
#include "glog/logging.h"
#include "planner_service/core/planners/exact_planner.h"
#include "planner_service/io/planning_context.h"

namespace arachne {
namespace {

std::unique_ptr<PlanningContext> Context(const std::string& model,
                                         const std::string& cluster) {
  PlanningRequest req;
  req.model = model;
  req.cluster_file = std::string(ARACHNE_SOURCE_DIR) + "/examples/" + cluster;
  auto ctx = PlanningContext::Create(req);
  CHECK(ctx.ok()) << ctx.status();
  return *std::move(ctx);
}

// A plan found by a short, deterministic exact search.
Plan FindPlan(const CostModel& cm, int64_t evaluations) {
  ExactPlanner planner;
  PlannerOptions options;
  options.max_evaluations = evaluations;
  options.budget = absl::Hours(1);
  auto r = planner.Run(cm, options);
  CHECK(r.ok()) << r.status();
  return r->plan;
}

// Full pricing of one plan: memory of every stage, stage times, pipeline,
// gradient sync, optimizer (what every search step pays).
void BM_PlanEvaluation(benchmark::State& state, const char* model,
                       const char* cluster) {
  auto ctx = Context(model, cluster);
  const CostModel& cm = ctx->cost_model();
  const Plan plan = FindPlan(cm, 20000);
  double sink = 0;
  for (auto _ : state) {
    sink += cm.IterationTime(plan);
    benchmark::DoNotOptimize(sink);
  }
  state.SetItemsProcessed(state.iterations());
  int stages = 0, groups = 0;
  for (const Template& t : plan.templates) {
    stages += t.depth();
    groups += t.depth() * t.replicas;
  }
  state.counters["tp_groups"] = groups;
  state.counters["templates"] = plan.templates.size();
  state.counters["stages"] = stages;
  state.counters["gpus"] = plan.used_gpus();
}
BENCHMARK_CAPTURE(BM_PlanEvaluation, llama3_8b_64gpu, "llama3-8b",
                  "a100-h100-64.yaml");
BENCHMARK_CAPTURE(BM_PlanEvaluation, llama3_8b_512gpu, "llama3-8b",
                  "paper-512.yaml");
BENCHMARK_CAPTURE(BM_PlanEvaluation, qwen3_32b_512gpu, "qwen3-32b",
                  "paper-512.yaml");

// What one candidate of a fill costs (AutoFill): the placement facts kept
// in a PricingScratch, one layer moved between the first two stages of the
// first template and back, the micro-batches rebalanced, the plan priced.
void BM_PlanRepricing(benchmark::State& state, const char* model,
                      const char* cluster) {
  auto ctx = Context(model, cluster);
  const CostModel& cm = ctx->cost_model();
  Plan plan = FindPlan(cm, 20000);
  CHECK_GE(plan.templates[0].depth(), 2);
  Stage& first = plan.templates[0].stages[0];
  Stage& second = plan.templates[0].stages[1];
  CHECK_GE(second.num_layers(), 2);
  CostModel::PricingScratch scratch;
  double sink = 0;
  int step = 0;
  for (auto _ : state) {
    const int move = (step++ % 2 == 0) ? 1 : -1;
    first.layer_end += move;
    second.layer_begin += move;
    sink += cm.BalanceAndPrice(plan, nullptr, &scratch);
    benchmark::DoNotOptimize(sink);
  }
  CHECK(std::isfinite(sink)) << "a repriced candidate did not fit";
  state.SetItemsProcessed(state.iterations());
}
BENCHMARK_CAPTURE(BM_PlanRepricing, llama3_8b_512gpu, "llama3-8b",
                  "paper-512.yaml");
BENCHMARK_CAPTURE(BM_PlanRepricing, qwen3_32b_512gpu, "qwen3-32b",
                  "paper-512.yaml");

// The exact planner with a fixed evaluation budget (deterministic): wall
// time and the throughput of the plan it returns.
void BM_ExactPlanner(benchmark::State& state, const char* model,
                     const char* cluster) {
  auto ctx = Context(model, cluster);
  const CostModel& cm = ctx->cost_model();
  PlanResult last;
  for (auto _ : state) {
    ExactPlanner planner;
    PlannerOptions options;
    options.max_evaluations = state.range(0);
    options.budget = absl::Hours(1);
    auto r = planner.Run(cm, options);
    CHECK(r.ok()) << r.status();
    last = *std::move(r);
  }
  state.counters["iter_per_s"] = last.prediction.throughput_iters_per_s;
  state.counters["evaluations"] = last.stats.evaluations;
  state.counters["evals_per_s"] =
      benchmark::Counter(last.stats.evaluations * state.iterations(),
                         benchmark::Counter::kIsRate);
}
BENCHMARK_CAPTURE(BM_ExactPlanner, llama3_8b_512gpu, "llama3-8b",
                  "paper-512.yaml")
    ->Arg(100000)->Arg(1000000)->Unit(benchmark::kSecond)->Iterations(1);
BENCHMARK_CAPTURE(BM_ExactPlanner, llama3_8b_64gpu, "llama3-8b",
                  "a100-h100-64.yaml")
    ->Arg(100000)->Arg(1000000)->Unit(benchmark::kSecond)->Iterations(1);

}  // namespace
}  // namespace arachne

BENCHMARK_MAIN();
