// The reference training engine (LibTorch, CPU): a decoder-only GPT of the
// LLaMA shape (RMSNorm, rotary attention, SwiGLU MLP, untied LM head) built
// from the same ModelSpec the planner plans, trained on SyntheticCorpus.
// It executes any plan of migration::PlanLayout's structure, dense or MoE:
//  - pipeline stages on the 1F1B schedule, exchanging activations and their
//    gradients point to point between stages (any TP degree on either side);
//  - Megatron tensor parallelism: column-parallel q/k/v/gate/up and LM head,
//    row-parallel o/down, a vocabulary-parallel embedding;
//  - gradient sync over every replica (of any template) that holds a
//    parameter, in canonical layout, so replicas of different TP degrees and
//    layer splits reduce together;
//  - MoE layers (router, shared experts, routed experts) under any expert
//    tiling EP x ETP x EDP, tokens dispatched to and combined from the
//    stage's expert group (every GPU of the stage over its replicas);
//  - the global batch split into the plan's micro-batches by sample index,
//    and the loss scaled by the global token count, so one iteration's
//    mathematics is the same under every plan.
// It computes in fp32 on the master weights; the bf16 weight tensor of the
// layout is kept as their rounding after every step, so the state moved is
// that of a mixed-precision engine. Collectives are c10d ProcessGroupGloo
// groups created through the job's TCPStore under "arachne/g<N>/<group>".
// This header keeps LibTorch out of its includers.
#ifndef ARACHNE_WORKER_AGENT_ENGINE_REFERENCE_ENGINE_H_
#define ARACHNE_WORKER_AGENT_ENGINE_REFERENCE_ENGINE_H_

#include <cstdint>
#include <memory>
#include <string>
#include <string_view>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "migration/core/state_layout.h"
#include "planner_service/core/model/cluster.h"
#include "planner_service/core/model/plan.h"
#include "worker_agent/engine/engine.h"

namespace arachne::agent {

// The int64 scalars the reference engine keeps in "train_state:scalars".
inline constexpr int kReferenceScalars = 8;
enum ReferenceScalar {
  kScalarFormat = 0,     // kReferenceStateFormat
  kScalarStep = 1,       // optimizer steps done = LR-schedule position
  kScalarCursor = 2,     // next sample index of the corpus
  kScalarDataSeed = 3,   // the corpus' seed (its RNG state with the cursor)
  kScalarInitSeed = 4,
  kScalarGlobalBatch = 5,
  kScalarSeqLen = 6,
};
inline constexpr int64_t kReferenceStateFormat = 1;

// The state layout of a job on the reference engine.
absl::StatusOr<migration::ModelState> ReferenceModelState(const JobSpec& job);

// What the reference engine calls itself (the engine protocol's Describe).
inline constexpr std::string_view kReferenceEngineName =
    "arachne-engine (reference engine, LibTorch CPU)";

// InvalidArgument naming the field when the reference engine cannot run
// `plan` (TP not dividing heads / kv heads / ffn / vocab, ETP not dividing
// the expert FFN, replicas of a MoE stage with unequal micro-batch counts, a
// micro-batch split that does not add up to the global batch, ...).
absl::Status CheckReferencePlan(const JobSpec& job, const Plan& plan);

struct EngineArgs {
  JobSpec job;
  Plan plan;
  const migration::ModelState* state = nullptr;  // ReferenceModelState(job)
  const migration::PlanLayout* layout = nullptr;
  int plan_rank = 0;  // this rank: an index into layout->gpus()
  int64_t generation = 1;
  std::string store_address;  // the job's TCPStore, host:port
  std::string listen_host = "127.0.0.1";  // where this rank's groups listen
  // A collective or point-to-point transfer waiting longer fails the
  // iteration (Unavailable); the store rendezvous waits at least 60 s.
  absl::Duration timeout = absl::Seconds(60);
  // Fresh weights from job.engine.init_seed; otherwise the caller loads a
  // state (LoadState, or a migration through StateView) before the first
  // iteration.
  bool initialize = true;
  // The engine of the plan before on the same GPU, when a switch builds
  // this one (not initialized): every parameter both hold whole (the same
  // canonical bytes of it) shares that engine's tensors instead of
  // allocating its own, so the bytes a rank keeps are neither copied nor
  // held twice. Safe because training updates tensors in place and only
  // one of the two engines trains again: the old one after an Abort, this
  // one after a Commit, when the old one is gone. A migration never writes
  // a shared tensor: its bytes are all kept, none received.
  Engine* share_with = nullptr;
  // A virtual GPU's speed relative to its CPU rank (compute_pacer.h).
  double virtual_gpu_speed = 1;
};

struct EngineBuildTiming {
  double groups_seconds = 0;  // process groups of the plan
  double build_seconds = 0;   // modules, parameters, optimizer state
};

// Builds the engine of one rank: connects its process groups (a collective
// over the plan's ranks: every rank of the plan must call it) and its
// parameters. Errors: CheckReferencePlan's, Unavailable/DeadlineExceeded
// when peers do not connect.
absl::StatusOr<std::unique_ptr<Engine>> CreateReferenceEngine(
    const EngineArgs& args, EngineBuildTiming* timing = nullptr);

}  // namespace arachne::agent

#endif  // ARACHNE_WORKER_AGENT_ENGINE_REFERENCE_ENGINE_H_
