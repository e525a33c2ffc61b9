// State migration on the paper's joins (issue 6, paper §5.6): bytes moved
// and kept, the schedule's estimated makespan against its lower bound, and
// bytes against a naive diff that re-sends every shard; plus executor
// throughput on loopback Gloo. Plans come from the exact planner with a
// small, fixed evaluation budget (deterministic). Each join benchmark times
// ComputeDiff + BuildSchedule. Run:
//   build/bench/migration_bench --benchmark_counters_tabular=true
// Figures measured on the development machine are in docs/migration.md.
#include <sys/wait.h>
#include <unistd.h>

#include <cstdio>
#include <fstream>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/time/time.h"
#include "benchmark/benchmark.h"
#include "glog/logging.h"
#include "migration/core/diff.h"
#include "migration/core/executor.h"
#include "migration/core/schedule.h"
#include "migration/core/state_layout.h"
#include "planner_service/core/planners/exact_planner.h"
#include "planner_service/io/planning_context.h"
#ifdef ARACHNE_HAVE_GLOO
#include "migration/gloo/gloo_transport.h"
#endif

namespace arachne::migration {
namespace {

constexpr int64_t kPlannerEvaluations = 3000;

Plan FindPlan(const CostModel& cm) {
  ExactPlanner planner;
  PlannerOptions options;
  options.max_evaluations = kPlannerEvaluations;
  options.budget = absl::Hours(1);
  auto r = planner.Run(cm, options);
  CHECK(r.ok()) << r.status();
  return r->plan;
}

// A join (or leave): old and new clusters are prefixes of one node list.
struct Join {
  std::unique_ptr<PlanningContext> old_ctx, new_ctx;
  ModelState state;
  Plan old_plan, new_plan;
  StateDiff diff;
  MigrationSchedule schedule;
};

std::unique_ptr<PlanningContext> Context(const PlanningContext& base,
                                         std::vector<Node> nodes) {
  auto cluster = Cluster::Create(std::move(nodes), base.catalog());
  CHECK(cluster.ok()) << cluster.status();
  auto ctx = PlanningContext::Create(base.catalog(), base.model(),
                                     base.training(), *cluster, "");
  CHECK(ctx.ok()) << ctx.status();
  return *std::move(ctx);
}

// `file`'s nodes plus `extra_h100_nodes` 4-GPU H100 nodes: the old cluster
// is the first `old_nodes`, the new one the first `new_nodes` (0: all).
const Join& GetJoin(const std::string& model, const std::string& file,
                    int global_batch, int extra_h100_nodes, int old_nodes,
                    int new_nodes) {
  static auto* cache = new std::map<std::string, std::unique_ptr<Join>>();
  const std::string key = absl::StrCat(model, file, extra_h100_nodes, "/",
                                       old_nodes, "/", new_nodes);
  if (auto it = cache->find(key); it != cache->end()) return *it->second;
  PlanningRequest req;
  req.model = model;
  req.cluster_file = absl::StrCat(ARACHNE_SOURCE_DIR, "/examples/", file);
  req.training.global_batch = global_batch;
  auto base = PlanningContext::Create(req);
  CHECK(base.ok()) << base.status();
  std::vector<Node> nodes = (*base)->cluster().nodes();
  auto h100 = (*base)->catalog().IndexOf("H100-80GB");
  CHECK(h100.ok());
  for (int i = 0; i < extra_h100_nodes; ++i) {
    nodes.push_back({.name = absl::StrCat("h100-join-", i),
                     .gpu_type = *h100, .num_gpus = 4});
  }
  auto j = std::make_unique<Join>();
  j->old_ctx = Context(**base, {nodes.begin(), nodes.begin() + old_nodes});
  if (new_nodes > 0) nodes.resize(new_nodes);
  j->new_ctx = Context(**base, nodes);
  auto state = ModelState::Create((*base)->model());
  CHECK(state.ok());
  j->state = *std::move(state);
  j->old_plan = FindPlan(j->old_ctx->cost_model());
  j->new_plan = FindPlan(j->new_ctx->cost_model());
  const MigrationWorld world(j->new_ctx->cluster(), j->new_ctx->catalog());
  auto diff = ComputeDiff(j->state, j->old_plan, j->old_ctx->cluster(),
                          j->new_plan, j->new_ctx->cluster(), world);
  CHECK(diff.ok()) << diff.status();
  j->diff = *std::move(diff);
  j->schedule = BuildSchedule(j->diff, world);
  return *cache->emplace(key, std::move(j)).first->second;
}

void RunJoin(benchmark::State& st, const Join& j) {
  const MigrationWorld world(j.new_ctx->cluster(), j.new_ctx->catalog());
  for (auto _ : st) {
    auto diff = ComputeDiff(j.state, j.old_plan, j.old_ctx->cluster(),
                            j.new_plan, j.new_ctx->cluster(), world);
    CHECK(diff.ok());
    benchmark::DoNotOptimize(BuildSchedule(*diff, world).makespan_s);
  }
  st.counters["old_gpus"] = j.old_plan.used_gpus();
  st.counters["new_gpus"] = j.new_plan.used_gpus();
  st.counters["moved_GB"] = j.diff.bytes_moved / 1e9;
  st.counters["kept_GB"] = j.diff.bytes_kept / 1e9;
  st.counters["naive_GB"] = j.diff.naive_bytes / 1e9;
  st.counters["moved/naive"] =
      static_cast<double>(j.diff.bytes_moved) / j.diff.naive_bytes;
  st.counters["tuples"] = j.diff.tuples.size();
  st.counters["rounds1"] = j.schedule.stage1.size();
  st.counters["rounds2"] = j.schedule.stage2.size();
  st.counters["makespan_s"] = j.schedule.makespan_s;
  st.counters["bound_s"] = j.schedule.lower_bound_s;
  st.counters["ratio"] = j.schedule.ratio();
  st.counters["s1_s"] = j.schedule.stage1_s;
  st.counters["s1_bound"] = j.schedule.stage1_bound_s;
  st.counters["s2_s"] = j.schedule.stage2_s;
  st.counters["s2_bound"] = j.schedule.stage2_bound_s;
}

// LLaMA-3-8B on 128 A100-40GB + 128 A6000 + 256 H100, then 64 H100 join.
void BM_Join_Llama3_8B_Paper512_Plus64H100(benchmark::State& st) {
  RunJoin(st, GetJoin("llama3-8b", "paper-512.yaml", 2048, 16, 128, 0));
}
BENCHMARK(BM_Join_Llama3_8B_Paper512_Plus64H100)->Unit(benchmark::kMillisecond);

// The reverse: 16 H100 nodes (64 GPUs) leave the 512-GPU cluster.
void BM_Leave_Llama3_8B_Paper512_Minus64H100(benchmark::State& st) {
  RunJoin(st, GetJoin("llama3-8b", "paper-512.yaml", 2048, 0, 128, 112));
}
BENCHMARK(BM_Leave_Llama3_8B_Paper512_Minus64H100)
    ->Unit(benchmark::kMillisecond);

// GPT-Neo-2.7B on the testbed grown node by node from the RTX PRO 6000
// node: range(0) old nodes join one more (3->7, 7->11, 11->15, 15->19 GPUs).
void BM_Join_GptNeo_Testbed(benchmark::State& st) {
  const int old_nodes = static_cast<int>(st.range(0));
  RunJoin(st, GetJoin("gpt-neo-2.7b", "testbed-19.yaml", 128, 0, old_nodes,
                      old_nodes + 1));
}
BENCHMARK(BM_Join_GptNeo_Testbed)->DenseRange(1, 4)->Unit(benchmark::kMillisecond);

#ifdef ARACHNE_HAVE_GLOO
// Executor throughput on loopback Gloo: a 2-layer model (hidden 1024, FFN
// 4096, vocabulary 8192; 0.7 GB of state) moves from node a's GPU to node
// b's (two forked ranks); GB/s of the received bytes per second of stage 2.
void BM_ExecutorGlooLoopback(benchmark::State& st) {
  ModelSpec m;
  m.name = "bench";
  m.num_layers = 2;
  m.hidden = 1024;
  m.num_heads = 8;
  m.num_kv_heads = 8;
  m.head_dim = 128;
  m.ffn = 4096;
  m.vocab = 8192;
  GpuType fast;
  fast.id = "FAST";
  fast.peak_bf16_tflops = fast.peak_fp32_tflops = fast.hbm_gbps = 1;
  fast.memory_gib = 80;
  fast.intra_node_gbps = 100;
  fast.default_gpus_per_node = 1;
  fast.usd_per_hour = 1;
  auto catalog = GpuCatalog::Create({fast});
  CHECK(catalog.ok());
  auto old_c = Cluster::Create({{.name = "a", .gpu_type = 0, .num_gpus = 1}},
                               *catalog);
  auto new_c = Cluster::Create({{.name = "a", .gpu_type = 0, .num_gpus = 1},
                                {.name = "b", .gpu_type = 0, .num_gpus = 1}},
                               *catalog);
  CHECK(old_c.ok() && new_c.ok());
  Plan p, q;
  Template one;
  one.stages.push_back(Stage{.gpu_type = 0, .tp = 1, .layer_begin = 0,
                             .layer_end = 2, .tiling = {}});
  one.placement = {{0, {0}}};
  p.templates.push_back(one);
  q = p;
  q.templates[0].replicas = 2;
  q.templates[0].placement.push_back({1, {0}});
  auto state = ModelState::Create(m);
  CHECK(state.ok());
  const MigrationWorld world(*new_c, *catalog);
  auto diff = ComputeDiff(*state, p, *old_c, q, *new_c, world);
  CHECK(diff.ok());
  const MigrationSchedule schedule =
      BuildSchedule(*diff, world, {.min_piece_bytes = 64 << 20});
  double gbps = 0, bytes = 0;
  for (auto _ : st) {
    char dir[] = "/tmp/arachne_bench_XXXXXX";
    CHECK(mkdtemp(dir) != nullptr);
    std::vector<pid_t> pids;
    for (int rank = 0; rank < 2; ++rank) {
      const pid_t pid = fork();
      if (pid == 0) {
        FileRendezvousStore store(dir);
        auto t = MakeGlooTransportFactory()->Create(
            {.rank = rank, .world_size = 2}, &store);
        CHECK(t.ok()) << t.status();
        std::vector<Holding> old_h = rank == 0 ? diff->required[0]
                                               : std::vector<Holding>{};
        ShardSet old_state(old_h), new_state(diff->required[rank]);
        ExecutionReport report;
        absl::Status s = ExecuteMigration(*state, *diff, schedule, old_state,
                                          t->get(), &new_state, &report);
        CHECK(s.ok()) << s;
        if (rank == 1) {
          std::ofstream(absl::StrCat(dir, "/gbps"))
              << report.stage2.received_gbytes_per_s() << " "
              << report.stage2.bytes_received;
        }
        _exit(0);
      }
      pids.push_back(pid);
    }
    for (pid_t pid : pids) {
      int status = 0;
      waitpid(pid, &status, 0);
      CHECK(WIFEXITED(status) && WEXITSTATUS(status) == 0);
    }
    std::ifstream(absl::StrCat(dir, "/gbps")) >> gbps >> bytes;
  }
  st.counters["GB"] = bytes / 1e9;
  st.counters["GB/s"] = gbps;
  st.counters["rounds"] = schedule.stage2.size();
}
BENCHMARK(BM_ExecutorGlooLoopback)->Unit(benchmark::kMillisecond)->Iterations(3);
#endif

}  // namespace
}  // namespace arachne::migration

BENCHMARK_MAIN();
