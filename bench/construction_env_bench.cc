// Episodes per second of the construction environment (one core) with
// random legal actions, the rate GRPO training and sampled inference can
// run rollouts at before any network cost. Run:
//   build/bench/construction_env_bench
// (see docs/learned-policy.md, "Construction environment").
#include <memory>
#include <random>
#include <string>

#include "absl/random/random.h"
#include "benchmark/benchmark.h"
#include "glog/logging.h"
#include "planner_service/core/learned/construction_env.h"
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

// Whole episodes with uniform legal actions; `read_state` also reads the
// state and the candidate features at every decision, as a policy does.
void BM_RandomEpisodes(benchmark::State& state, const char* model,
                       const char* cluster, bool read_state) {
  auto ctx = Context(model, cluster);
  auto env = ConstructionEnv::Create(ctx->cost_model());
  CHECK(env.ok()) << env.status();
  std::seed_seq seq{1};
  absl::BitGen rng(seq);
  int64_t episodes = 0, decisions = 0, templates = 0, plans = 0;
  const int64_t evaluations_before = env->evaluations();
  double sink = 0;
  for (auto _ : state) {
    env->Reset();
    while (!env->done()) {
      if (read_state) {
        sink += env->State()[0] + env->DepthCandidates()[0] +
                env->DeviceCandidates()[0];
      }
      env->Step(env->UniformLegalAction(rng));
      ++decisions;
    }
    templates += env->templates_placed();
    plans += !env->plan().templates.empty();
    ++episodes;
  }
  benchmark::DoNotOptimize(sink);
  state.SetItemsProcessed(episodes);
  state.counters["episodes_per_s"] =
      benchmark::Counter(episodes, benchmark::Counter::kIsRate);
  state.counters["gpus"] = ctx->cluster().total_gpus();
  state.counters["decisions_per_episode"] =
      static_cast<double>(decisions) / episodes;
  state.counters["templates_per_episode"] =
      static_cast<double>(templates) / episodes;
  state.counters["evals_per_episode"] =
      static_cast<double>(env->evaluations() - evaluations_before) / episodes;
  state.counters["feasible_share"] = static_cast<double>(plans) / episodes;
}
BENCHMARK_CAPTURE(BM_RandomEpisodes, llama3_8b_64gpu, "llama3-8b",
                  "a100-h100-64.yaml", false);
BENCHMARK_CAPTURE(BM_RandomEpisodes, llama3_8b_64gpu_with_state, "llama3-8b",
                  "a100-h100-64.yaml", true);
BENCHMARK_CAPTURE(BM_RandomEpisodes, llama3_8b_512gpu, "llama3-8b",
                  "paper-512.yaml", false);
BENCHMARK_CAPTURE(BM_RandomEpisodes, llama3_8b_512gpu_with_state, "llama3-8b",
                  "paper-512.yaml", true);
BENCHMARK_CAPTURE(BM_RandomEpisodes, qwen3_32b_512gpu, "qwen3-32b",
                  "paper-512.yaml", false);
BENCHMARK_CAPTURE(BM_RandomEpisodes, mixtral_8x7b_512gpu, "mixtral-8x7b",
                  "paper-512.yaml", false);

// A converged-policy workload: the same 8 action sequences over and over
// (the rollouts of a group on one composition repeat their templates), with
// and without the fill cache.
void BM_RepeatedEpisodes(benchmark::State& state, const char* model,
                         const char* cluster, int cache_entries) {
  auto ctx = Context(model, cluster);
  auto env = ConstructionEnv::Create(ctx->cost_model(),
                                     {.fill_cache_entries = cache_entries});
  CHECK(env.ok()) << env.status();
  int64_t episodes = 0;
  for (auto _ : state) {
    std::seed_seq seq{static_cast<int>(episodes % 8)};
    absl::BitGen rng(seq);
    env->Reset();
    env->RunUniformEpisode(rng);
    ++episodes;
  }
  state.SetItemsProcessed(episodes);
  state.counters["episodes_per_s"] =
      benchmark::Counter(episodes, benchmark::Counter::kIsRate);
  state.counters["cache_hit_share"] =
      env->fills() > 0
          ? static_cast<double>(env->fill_cache_hits()) / env->fills()
          : 0;
}
BENCHMARK_CAPTURE(BM_RepeatedEpisodes, llama3_8b_512gpu_cache, "llama3-8b",
                  "paper-512.yaml", 256);
BENCHMARK_CAPTURE(BM_RepeatedEpisodes, llama3_8b_512gpu_no_cache, "llama3-8b",
                  "paper-512.yaml", 0);
BENCHMARK_CAPTURE(BM_RepeatedEpisodes, mixtral_8x7b_512gpu_cache,
                  "mixtral-8x7b", "paper-512.yaml", 256);
BENCHMARK_CAPTURE(BM_RepeatedEpisodes, mixtral_8x7b_512gpu_no_cache,
                  "mixtral-8x7b", "paper-512.yaml", 0);

// The state alone (no auto-fill): what one decision costs the environment.
void BM_StateVector(benchmark::State& state, const char* cluster) {
  auto ctx = Context("llama3-8b", cluster);
  auto env = ConstructionEnv::Create(ctx->cost_model());
  CHECK(env.ok()) << env.status();
  env->Step(env->FeasibleDepth(env->FeasibleDepthCount() - 1));
  double sink = 0;
  for (auto _ : state) {
    // Step() invalidates the cached state; Reset() + one depth step is the
    // cheapest way to force a recomputation each time.
    env->Reset();
    env->Step(2);
    sink += env->State()[0] + env->DeviceCandidates()[0];
  }
  benchmark::DoNotOptimize(sink);
  state.SetItemsProcessed(state.iterations());
}
BENCHMARK_CAPTURE(BM_StateVector, gpus64, "a100-h100-64.yaml");
BENCHMARK_CAPTURE(BM_StateVector, gpus512, "paper-512.yaml");

}  // namespace
}  // namespace arachne

BENCHMARK_MAIN();
