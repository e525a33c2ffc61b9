// Cost of one policy decision at planning time (one core), on the shipped
// llama3-8b checkpoint and the paper's 512-GPU cluster, walking greedy
// episodes:
//  - scratch: PolicyNetwork::Logits with one PolicyScratch reused, as the
//    learned planner and the trainer run it (FiLM once per composition, no
//    allocation per decision);
//  - fresh_scratch: a new scratch per decision (FiLM recomputed, buffers
//    allocated), the cost without the cache;
//  - libtorch_module: the same logits through the LibTorch module, the
//    reason the float snapshot exists.
// Run: build/bench/policy_inference_bench (docs/learned-policy.md,
// Inference).
#include <memory>
#include <string>
#include <vector>

#include "benchmark/benchmark.h"
#include "glog/logging.h"
#include "planner_service/core/learned/construction_env.h"
#include "planner_service/io/planning_context.h"
#include "planner_service/policy/checkpoint.h"
#include "planner_service/policy/policy_network.h"

namespace arachne {
namespace {

enum class Path { kScratch, kFreshScratch, kLibTorch };

void BM_Decision(benchmark::State& state, Path path) {
  PlanningRequest req;
  req.model = "llama3-8b";
  req.cluster_file =
      std::string(ARACHNE_SOURCE_DIR) + "/examples/paper-512.yaml";
  auto ctx = PlanningContext::Create(req);
  CHECK(ctx.ok()) << ctx.status();
  auto env = ConstructionEnv::Create((*ctx)->cost_model());
  CHECK(env.ok()) << env.status();
  auto loaded = LoadPolicyCheckpoint(std::string(ARACHNE_SOURCE_DIR) +
                                     "/profiles/policies/llama3-8b.pt");
  CHECK(loaded.ok()) << loaded.status();
  PolicyNetwork& net = *loaded->network;
  PolicyScratch scratch;
  std::vector<float> logits;
  int64_t decisions = 0;
  for (auto _ : state) {
    if (env->done()) env->Reset();
    switch (path) {
      case Path::kScratch:
        net.Logits(*env, scratch, &logits);
        break;
      case Path::kFreshScratch: {
        PolicyScratch fresh;
        net.Logits(*env, fresh, &logits);
        break;
      }
      case Path::kLibTorch:
        logits = net.TorchLogits(*env);
        break;
    }
    int best = 0;
    absl::Span<const uint8_t> mask = env->LegalMask();
    for (size_t a = 1; a < logits.size(); ++a)
      if (mask[a] && (!mask[best] || logits[a] > logits[best]))
        best = static_cast<int>(a);
    state.PauseTiming();  // the environment's step is not the policy's cost
    env->Step(best);
    state.ResumeTiming();
    ++decisions;
  }
  state.counters["decisions_per_s"] =
      benchmark::Counter(decisions, benchmark::Counter::kIsRate);
}
BENCHMARK_CAPTURE(BM_Decision, scratch, Path::kScratch);
BENCHMARK_CAPTURE(BM_Decision, fresh_scratch, Path::kFreshScratch);
BENCHMARK_CAPTURE(BM_Decision, libtorch_module, Path::kLibTorch);

}  // namespace
}  // namespace arachne

BENCHMARK_MAIN();
