// One training rank's part of a job (docs/architecture.md, "Engines").
// An Engine is built for a plan and this rank's position in it,
// runs iterations together with the other ranks of the plan (every rank of
// the plan calls RunIteration for the same iteration), and exposes its whole
// training state in the canonical layout of migration::PlanLayout, so the
// migration library can move it to another plan and any engine can load it.
#ifndef ARACHNE_WORKER_AGENT_ENGINE_ENGINE_H_
#define ARACHNE_WORKER_AGENT_ENGINE_ENGINE_H_

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "migration/core/executor.h"
#include "migration/core/state_layout.h"
#include "migration/core/transport.h"
#include "planner_service/core/model/model.h"

namespace arachne::agent {

// Hyper-parameters of the reference engine (the same for every plan, so an
// iteration's mathematics does not depend on the plan).
struct EngineConfig {
  double learning_rate = 1e-3;
  int warmup_iterations = 4;  // linear warm-up, then lr_schedule
  double adam_beta1 = 0.9;
  double adam_beta2 = 0.95;
  // 1e-6, not the usual 1e-8: Adam's first steps move every weight by about
  // the learning rate whatever its gradient's size, so with 1e-8 the
  // rounding noise of near-zero gradients (which differs between micro-batch
  // sizes) became ±lr steps and plans diverged by 6e-3 in 8 iterations;
  // with 1e-6 they agree within 3e-6 (reference_engine_test).
  double adam_eps = 1e-6;
  double weight_decay = 0.0;
  uint64_t data_seed = 1;   // the synthetic corpus and the initial weights
  uint64_t init_seed = 1;
  // Train on a token file (v1::TokenFile) instead of the synthetic corpus;
  // an engine reads and checks the file itself (the reference engine does
  // not read token files).
  struct TokenFile {
    std::string path;     // absolute, 1..kMaxTokenFilePath bytes
    int token_bytes = 0;  // 2 (uint16) or 4 (uint32)
  };
  std::optional<TokenFile> token_file;
  static constexpr int kMaxTokenFilePath = 4096;
  // After the warm-up: "constant" (learning_rate) or "cosine" (a half-cosine
  // from learning_rate at warmup_iterations to min_learning_rate at
  // decay_iterations, min_learning_rate after). decay_iterations and
  // min_learning_rate are the cosine's only (0 otherwise).
  std::string lr_schedule = "constant";
  int decay_iterations = 0;  // cosine: in (warmup_iterations, kMaxDecay]
  double min_learning_rate = 0.0;  // cosine: in [0, learning_rate]
  static constexpr int kMaxDecayIterations = 1000000000;
  // Clip the gradient to this global L2 norm (0 = off; else in
  // (0, kMaxGradClipNorm]), scaling it by min(1, max / (norm + 1e-6)) as
  // torch.nn.utils.clip_grad_norm_ does.
  double grad_clip_norm = 0.0;
  static constexpr double kMaxGradClipNorm = 1e6;
  absl::Status Validate() const;  // InvalidArgument naming the field
  // The learning rate of optimizer step `step` (1-based: the step the
  // iteration after `step - 1` done ones takes). Both engines compute it so
  // (python/arachne_torch/job.py, learning_rate_at).
  double LearningRateAt(int64_t step) const;
  // The factor the gradient is scaled by when its global L2 norm is `norm`
  // (1 when clipping is off or the norm is within grad_clip_norm).
  double ClipScale(double norm) const;
};

// What a job trains.
struct JobSpec {
  ModelSpec model;
  TrainingConfig training;
  EngineConfig engine;
};

// This rank's place in the plan (migration::GpuRole) and in the world.
struct RankPosition {
  migration::GpuRole role;  // template, replica, stage, TP rank
  int plan_rank = 0;        // index into PlanLayout::gpus()
};

// What a rank says at the end of an iteration. The ranks agree on it in the
// iteration's last collective, so they stop at the same boundary whichever
// of them saw the request first.
struct IterationControl {
  bool stop_requested = false;
};

struct IterationResult {
  int64_t iteration = 0;  // the iteration just finished (1-based)
  bool stop_agreed = false;  // some rank of the plan asked to stop here
  double loss = 0;        // mean loss over the whole global batch
  double seconds = 0;     // wall time of the iteration on this rank
  int64_t tokens = 0;     // tokens of the global batch
};

class Engine {
 public:
  virtual ~Engine() = default;
  // Runs one training iteration of the whole global batch (this rank's part
  // of it); a collective over every rank of the plan.
  virtual absl::StatusOr<IterationResult> RunIteration(
      const IterationControl& control = {}) = 0;
  // Iterations done (the optimizer step count).
  virtual int64_t iteration() const = 0;
  // The holdings of this rank (PlanLayout::holdings(plan_rank)).
  virtual const std::vector<migration::Holding>& holdings() const = 0;
  // Writes the whole state of this rank into `out` in canonical byte order;
  // `out` must hold exactly holdings().
  virtual absl::Status SaveState(migration::ShardSet* out) const = 0;
  // Replaces the state with `in` (canonical, exactly holdings()).
  virtual absl::Status LoadState(const migration::ShardSet& in) = 0;
  // The engine's own state buffers, exactly holdings(), in canonical byte
  // order: a view (ShardSet::View), valid while the engine lives; training
  // updates them in place. A switch reads the old engine's state and writes
  // the new engine's through these views, so neither state is copied
  // (docs/migration.md, "Memory during a switch").
  virtual migration::ShardSet StateView() = 0;
  // Called once a migration has written this engine's state through
  // StateView: checks what arrived (the scalars' format, the job's seeds)
  // and takes it as the engine's state; the errors of LoadState.
  virtual absl::Status StateWritten() = 0;
  // Where the state lives: kHost for CPU engines; a CUDA engine reports
  // kDevice so the NCCL transport takes its buffers without a host copy.
  virtual migration::MemoryKind state_memory() const = 0;
  // Bytes of training state this rank keeps resident.
  virtual int64_t StateBytes() const = 0;
};

}  // namespace arachne::agent

#endif  // ARACHNE_WORKER_AGENT_ENGINE_ENGINE_H_
