// `arachne-train` (what `arachne train ARGS` execs): trains the policy of
// one model with GRPO on generated compositions (none of bench/scenarios)
// and writes a checkpoint, its weights file, its metadata and the training
// curve. Built only with LibTorch (train_main.cc), so the `arachne` binary
// does not load LibTorch.
#ifndef ARACHNE_PLANNER_SERVICE_POLICY_TRAIN_COMMAND_H_
#define ARACHNE_PLANNER_SERVICE_POLICY_TRAIN_COMMAND_H_

#include <cstdint>
#include <ostream>
#include <string>
#include <vector>

#include "CLI/CLI.hpp"
#include "absl/status/statusor.h"
#include "planner_service/policy/checkpoint_info.h"
#include "planner_service/policy/grpo_trainer.h"

namespace arachne {

struct TrainOptions {
  // The policy of one model: its catalog id. Empty when `models` or
  // `generated_models` is set: then the model-conditioned policy
  // (checkpoint model kGeneralPolicyModel) is trained across those models,
  // and models not listed are held out.
  std::string model;
  std::vector<std::string> models;  // catalog ids (--models)
  int generated_models = 0;         // generated shapes (model_generator.h)
  // Generated training compositions; with several models, composition i
  // trains model i mod (models + generated ones), and a pair whose model
  // needs nearly every GPU of the cluster (model summary memory pressure
  // >= 0.9) is replaced by another composition.
  int compositions = 32;
  int64_t episodes = 4000;
  uint64_t seed = 1;
  // Wall-clock limit (0: none); training stops after the iteration that
  // crosses it.
  double time_limit_s = 0;
  std::string out;        // checkpoint path (*.pt)
  // Start from this checkpoint's weights (same model and profile set)
  // instead of a fresh network; its sizes replace grpo.network.
  std::string init;
  std::string curve;      // training-curve CSV ("": <out>.curve.csv)
  std::string profiles_dir;  // "" = built-in data
  // Scenario suites whose compositions training must never see (empty: the
  // source tree's bench/scenarios); --evaluate plans their compositions.
  std::vector<std::string> exclude_scenarios;
  // GPU types the generator draws from (catalog ids).
  std::vector<std::string> gpu_types = {"A100-40GB", "A100-80GB", "H100-80GB",
                                        "A6000"};
  // Types per training composition, drawn uniformly in [min_types,
  // max_types], each at most the number of gpu_types (1 <= min_types <=
  // max_types <= kEnvDeviceSlots). Above kEnvTypeSlots the state groups
  // types (docs/learned-policy.md, State); the checkpoint records the most
  // types drawn, and the default planner uses a policy only on clusters of
  // at most that many types.
  int min_types = 2;
  int max_types = kLegacyMaxGpuTypes;
  int min_gpus = 8;
  int max_gpus = 512;
  TrainingConfig training;
  GrpoConfig grpo;  // episodes and seed are taken from the fields above

  // Evaluation instead of training (--evaluate CHECKPOINT): the learned
  // planner with this checkpoint against `eval_planners` (each under
  // eval_budget_s) on every composition of the suite's scenarios for
  // `model` (or for any of `models`; a conditioned checkpoint with neither
  // set: every scenario); a table to the output and, when set, a CSV to
  // eval_out. eval_latency_s bounds each learned run (0: 60 s).
  double eval_latency_s = 0;
  std::string evaluate;
  std::vector<std::string> eval_planners = {"random"};
  double eval_budget_s = 5;
  int eval_samples = 256;  // sampled rollouts of the learned planner
  std::string eval_out;

  // Instead of training (--export-weights CHECKPOINT.pt): write the
  // checkpoint's LibTorch-free weights file beside it (ExportPolicyWeights).
  std::string export_weights;
};

struct TrainReport {
  std::vector<GrpoIteration> curve;
  double initial_greedy_reward = 0;  // mean greedy return before training
  double final_greedy_reward = 0;    // and after, over all compositions
  int compositions = 0;
  int excluded = 0;  // suite compositions the generator avoided
  double wall_s = 0;
};

// Trains and writes options.out (+ .json metadata) and the curve CSV;
// progress lines go to `progress`. Errors: NotFound for an unknown model,
// GPU type or missing scenario directory; InvalidArgument for bad options
// (empty out, compositions < 1, ...); the generator's and trainer's errors.
absl::StatusOr<TrainReport> TrainPolicy(const TrainOptions& options,
                                        std::ostream& progress);

// One row of EvaluatePolicy: a suite composition planned by the learned
// planner and by the baselines (throughput in iterations/s; 0: no plan).
struct PolicyEvaluationRow {
  std::string scenario, composition, model;
  int gpus = 0;
  double learned_throughput = 0;
  double learned_wall_s = 0;
  int64_t learned_evaluations = 0;
  std::vector<double> baseline_throughput;  // per options.eval_planners
  std::vector<double> baseline_wall_s;
};

// Evaluation mode (options.evaluate): loads the checkpoint (refused as
// LearnedPlanner's factory would refuse it), plans every suite composition
// of options.model and writes a table to `out`.
absl::StatusOr<std::vector<PolicyEvaluationRow>> EvaluatePolicy(
    const TrainOptions& options, std::ostream& out);

// Adds the training flags to `app` (arachne-train's own).
void AddTrainFlags(CLI::App* app, TrainOptions* options);
// Adds `train` with its flags to `app`; the returned subcommand is parsed
// when `*returned` is true after parsing.
CLI::App* AddTrainCommand(CLI::App* app, TrainOptions* options);
// Runs TrainPolicy and prints the summary; returns the process exit code
// (0 ok, 2 bad input, 1 internal).
int RunTrainCommand(const TrainOptions& options, std::ostream& out,
                    std::ostream& err);

}  // namespace arachne

#endif  // ARACHNE_PLANNER_SERVICE_POLICY_TRAIN_COMMAND_H_
