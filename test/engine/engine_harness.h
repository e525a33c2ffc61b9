// Runs the reference engine under a plan with every rank a thread of this
// process, over real c10d Gloo groups and a real TCPStore on 127.0.0.1:
// what an agent does for its ranks, without the RPCs.
#ifndef ARACHNE_TEST_ENGINE_ENGINE_HARNESS_H_
#define ARACHNE_TEST_ENGINE_ENGINE_HARNESS_H_

#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/str_cat.h"
#include "migration/core/executor.h"
#include "migration/core/state_layout.h"
#include "planner_service/core/model/cluster.h"
#include "planner_service/core/model/gpu_catalog.h"
#include "planner_service/core/model/plan.h"
#include "planner_service/io/gpu_catalog_io.h"
#include "planner_service/io/model_io.h"
#include "worker_agent/checkpoint.h"
#include "worker_agent/engine/reference_engine.h"
#include "worker_agent/job_store.h"

namespace arachne::agent::testing {

// tiny-gpt, 16 sequences of 32 tokens per iteration.
inline JobSpec TinyJob() {
  JobSpec job;
  job.model = *ResolveModel("tiny-gpt");
  job.training.seq_len = 32;
  job.training.global_batch = 16;
  job.engine.learning_rate = 1e-3;
  job.engine.data_seed = 7;
  job.engine.init_seed = 11;
  return job;
}

struct StageShape {
  int tp = 1;
  int layer_begin = 0;
  int layer_end = 0;
};

// A template of `stages`, `replicas` replicas, placed on consecutive GPUs of
// node `node` starting at *next_gpu.
inline Template MakeTemplate(const std::vector<StageShape>& stages,
                             int replicas, int mbs, int total_micro_batches,
                             int node, int* next_gpu, int gpu_type = 0) {
  Template t;
  for (const StageShape& s : stages) {
    Stage st;
    st.gpu_type = gpu_type;
    st.tp = s.tp;
    st.layer_begin = s.layer_begin;
    st.layer_end = s.layer_end;
    t.stages.push_back(st);
  }
  t.replicas = replicas;
  t.micro_batch_size = mbs;
  t.total_micro_batches = total_micro_batches;
  for (int r = 0; r < replicas; ++r) {
    for (const StageShape& s : stages) {
      StagePlacement p;
      p.node = node;
      for (int k = 0; k < s.tp; ++k) p.gpus.push_back((*next_gpu)++);
      t.placement.push_back(p);
    }
  }
  return t;
}

inline GpuCatalog Catalog() { return *LoadGpuCatalog(); }

// One node "n0" of 8 A6000s (or `nodes` nodes of `gpus` each).
inline Cluster TestCluster(int nodes = 1, int gpus = 8) {
  GpuCatalog catalog = Catalog();
  std::vector<Node> ns;
  for (int i = 0; i < nodes; ++i) {
    ns.push_back(Node{.name = absl::StrCat("n", i),
                      .gpu_type = *catalog.IndexOf("A6000"),
                      .num_gpus = gpus});
  }
  return *Cluster::Create(ns, catalog);
}

struct RunResult {
  std::vector<double> losses;  // per iteration, as rank 0 saw it
  FullState state;             // after the last iteration
};

// Trains `iterations` iterations of `plan` from the initial weights (or from
// `start` when given) and gathers the whole state.
inline absl::StatusOr<RunResult> RunPlan(const JobSpec& job, const Plan& plan,
                                         const Cluster& cluster,
                                         int iterations,
                                         const FullState* start = nullptr) {
  absl::StatusOr<migration::ModelState> state = ReferenceModelState(job);
  if (!state.ok()) return state.status();
  absl::StatusOr<migration::PlanLayout> layout =
      migration::PlanLayout::Create(*state, plan, cluster);
  if (!layout.ok()) return layout.status();
  auto server = JobStoreServer::Start("127.0.0.1", 0);
  if (!server.ok()) return server.status();
  const int n = layout->num_gpus();
  std::vector<absl::Status> status(n);
  std::vector<std::vector<double>> losses(n);
  std::vector<migration::ShardSet> shards(n);
  std::vector<std::thread> threads;
  for (int g = 0; g < n; ++g) {
    threads.emplace_back([&, g]() {
      EngineArgs args;
      args.job = job;
      args.plan = plan;
      args.state = &*state;
      args.layout = &*layout;
      args.plan_rank = g;
      args.store_address = (*server)->address();
      args.initialize = start == nullptr;
      absl::StatusOr<std::unique_ptr<Engine>> engine =
          CreateReferenceEngine(args);
      if (!engine.ok()) {
        status[g] = engine.status();
        return;
      }
      if (start != nullptr) {
        migration::ShardSet in(layout->holdings(g));
        FillFromState(*start, &in);
        if (absl::Status s = (*engine)->LoadState(in); !s.ok()) {
          status[g] = s;
          return;
        }
      }
      for (int i = 0; i < iterations; ++i) {
        absl::StatusOr<IterationResult> r = (*engine)->RunIteration();
        if (!r.ok()) {
          status[g] = r.status();
          return;
        }
        losses[g].push_back(r->loss);
      }
      shards[g] = migration::ShardSet(layout->holdings(g));
      status[g] = (*engine)->SaveState(&shards[g]);
    });
  }
  for (std::thread& t : threads) t.join();
  for (const absl::Status& s : status) {
    if (!s.ok()) return s;
  }
  for (int g = 1; g < n; ++g) {
    if (losses[g] != losses[0]) {
      return absl::InternalError(
          absl::StrCat("rank ", g, " saw other losses than rank 0"));
    }
  }
  std::vector<const migration::ShardSet*> ptrs;
  for (const migration::ShardSet& s : shards) ptrs.push_back(&s);
  absl::StatusOr<FullState> full = AssembleState(*state, ptrs);
  if (!full.ok()) return full.status();
  return RunResult{losses[0], *std::move(full)};
}

}  // namespace arachne::agent::testing

#endif  // ARACHNE_TEST_ENGINE_ENGINE_HARNESS_H_
