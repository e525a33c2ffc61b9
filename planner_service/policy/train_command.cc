#include "planner_service/policy/train_command.h"

#include <chrono>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <memory>
#include <set>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "planner_service/core/planners/composition_generator.h"
#include "planner_service/core/learned/construction_env.h"
#include "planner_service/core/model/model_generator.h"
#include "planner_service/io/data_files.h"
#include "planner_service/io/gpu_catalog_io.h"
#include "planner_service/io/model_io.h"
#include "planner_service/io/planning_context.h"
#include "planner_service/io/python_plots.h"
#include "planner_service/io/scenario_io.h"
#include "planner_service/core/learned/learned_planner.h"
#include "planner_service/core/planners.h"
#include "planner_service/policy/checkpoint.h"

#ifndef ARACHNE_SOURCE_SCENARIOS_DIR
#define ARACHNE_SOURCE_SCENARIOS_DIR "bench/scenarios"
#endif

namespace arachne {
namespace {

std::string CurvePath(const TrainOptions& o) {
  if (!o.curve.empty()) return o.curve;
  std::filesystem::path p(o.out);
  p.replace_extension(".curve.csv");
  return p.string();
}

// The PNG drawn next to the curve CSV: <curve>.png without ".csv".
std::string CurvePlotPath(const std::string& curve_csv) {
  std::filesystem::path p(curve_csv);
  p.replace_extension(".png");
  return p.string();
}


// The evaluation suite: what --evaluate plans and what training never sees
// (--exclude-scenarios, default the source tree's bench/scenarios).
absl::StatusOr<std::vector<Scenario>> LoadSuite(const TrainOptions& o,
                                                const GpuCatalog& catalog) {
  const std::vector<std::string> dirs =
      o.exclude_scenarios.empty()
          ? std::vector<std::string>{ARACHNE_SOURCE_SCENARIOS_DIR}
          : o.exclude_scenarios;
  std::vector<Scenario> suite;
  for (const std::string& dir : dirs) {
    absl::StatusOr<std::vector<Scenario>> one =
        LoadScenarioSuite(dir, {}, catalog, o.profiles_dir);
    if (!one.ok()) return one.status();
    for (Scenario& s : *one) suite.push_back(std::move(s));
  }
  return suite;
}

// Draws the training curve with bench/plot_training_curve.py. A missing
// script or matplotlib (PythonWithMatplotlib) is a note, never an error: the
// CSV holds the curve and the note says how to draw it later.
void PlotTrainingCurve(const std::string& curve_csv, std::ostream& progress) {
  const std::string script =
      (std::filesystem::path(ARACHNE_SOURCE_SCENARIOS_DIR).parent_path() /
       "plot_training_curve.py")
          .string();
  const std::string png = CurvePlotPath(curve_csv);
  const std::string args =
      absl::StrCat(ShellQuote(script), " ", ShellQuote(curve_csv), " --out ",
                   ShellQuote(png));
  std::error_code ec;
  if (!std::filesystem::is_regular_file(script, ec)) {
    progress << "train: curve plot skipped: " << script
             << " not found; the curve is in " << curve_csv << "\n";
    return;
  }
  const std::string python = PythonWithMatplotlib();
  if (python.empty()) {
    progress << "train: curve plot skipped: no python3 with matplotlib "
                "(install python3-matplotlib); the curve is in "
             << curve_csv << "; draw it later with: python3 " << args << "\n";
    return;
  }
  // The script's own message (what it wrote, or why it failed) goes to
  // stderr.
  const std::string command = absl::StrCat(python, " ", args);
  if (const int rc = std::system(command.c_str()); rc != 0) {
    progress << "train: curve plot failed (exit status " << rc
             << "); the curve is in " << curve_csv
             << "; retry with: " << command << "\n";
  }
}

std::string Bar(double fraction) {
  const int filled = static_cast<int>(std::clamp(fraction, 0.0, 1.0) * 20);
  return std::string(filled, '#') + std::string(20 - filled, '.');
}

// The loaded network as the planner core's PolicyModel.
class BorrowedPolicy : public PolicyModel {
 public:
  explicit BorrowedPolicy(PolicyNetwork* network) : network_(network) {}
  void ActionProbabilities(const ConstructionEnv& env,
                           absl::Span<float> probabilities) override {
    network_->ActionProbabilities(env, probabilities, scratch_);
  }

 private:
  PolicyScratch scratch_;  // one planning run's inference buffers
  PolicyNetwork* network_;
};

}  // namespace

absl::StatusOr<std::vector<PolicyEvaluationRow>> EvaluatePolicy(
    const TrainOptions& o, std::ostream& out) {
  absl::StatusOr<GpuCatalog> catalog = LoadGpuCatalog(o.profiles_dir);
  if (!catalog.ok()) return catalog.status();
  absl::StatusOr<LoadedPolicy> policy = LoadPolicyCheckpoint(o.evaluate);
  if (!policy.ok()) return policy.status();
  absl::StatusOr<std::string> calibration =
      ReadDataFile("calibration.json", o.profiles_dir);
  if (!calibration.ok()) return calibration.status();
  const bool conditioned = policy->info.network.model_conditioned;
  if (absl::Status fits = CheckCheckpointFits(
          policy->info, conditioned ? kGeneralPolicyModel : o.model,
          ProfileSetFingerprint(*catalog, policy->info.profile_name,
                                *calibration),
          o.evaluate);
      !fits.ok())
    return fits;
  // The scenarios planned: those of `models`, else of `model`, else (a
  // conditioned policy) all.
  std::set<std::string> eval_models(o.models.begin(), o.models.end());
  if (eval_models.empty() && !o.model.empty()) eval_models.insert(o.model);
  if (eval_models.empty() && !conditioned) {
    return absl::InvalidArgumentError(
        "train --evaluate: --model or --models must name the models to plan");
  }
  absl::StatusOr<std::vector<Scenario>> suite = LoadSuite(o, *catalog);
  if (!suite.ok()) return suite.status();
  PolicyNetwork* network = policy->network.get();
  LearnedPlanner learned(
      {.sampled_rollouts = o.eval_samples,
       .latency_budget = absl::Seconds(
           o.eval_latency_s > 0 ? o.eval_latency_s : 60.0)},
      [network](const CostModel&)
          -> absl::StatusOr<std::unique_ptr<PolicyModel>> {
        return std::unique_ptr<PolicyModel>(
            std::make_unique<BorrowedPolicy>(network));
      });
  std::vector<std::unique_ptr<Planner>> baselines;
  for (const std::string& name : o.eval_planners) {
    absl::StatusOr<std::unique_ptr<Planner>> p = MakePlanner(name);
    if (!p.ok()) return p.status();
    baselines.push_back(*std::move(p));
  }
  out << absl::StrFormat("%-22s %-14s %-26s %5s %12s %9s %7s", "scenario",
                         "model", "composition", "GPUs", "learned it/s",
                         "learned s", "evals");
  for (const std::string& name : o.eval_planners)
    out << absl::StrFormat(" %12s %7s", name + " it/s", "ratio");
  out << "\n";
  std::vector<PolicyEvaluationRow> rows;
  for (const Scenario& scenario : *suite) {
    if (!eval_models.empty() && !eval_models.contains(scenario.model_spec.name))
      continue;
    for (const Composition& composition : scenario.compositions) {
      absl::StatusOr<std::unique_ptr<PlanningContext>> ctx =
          PlanningContext::Create(*catalog, scenario.model_spec,
                                  scenario.training, composition.cluster,
                                  o.profiles_dir);
      if (!ctx.ok()) return ctx.status();
      PolicyEvaluationRow row;
      row.scenario = scenario.name;
      row.model = scenario.model_spec.name;
      row.composition = composition.label;
      row.gpus = composition.cluster.total_gpus();
      PlannerOptions options;
      options.seed = o.seed;
      absl::StatusOr<PlanResult> r =
          learned.Run((*ctx)->cost_model(), options);
      if (r.ok()) {
        row.learned_throughput = 1.0 / r->prediction.iteration_time_s;
        row.learned_wall_s = r->stats.wall_s;
        row.learned_evaluations = r->stats.evaluations;
      }
      out << absl::StrFormat("%-22s %-14s %-26s %5d %12.4f %9.3f %7d",
                             row.scenario, row.model, row.composition, row.gpus,
                             row.learned_throughput, row.learned_wall_s,
                             row.learned_evaluations);
      for (auto& baseline : baselines) {
        PlannerOptions b = options;
        b.budget = absl::Seconds(o.eval_budget_s);
        absl::StatusOr<PlanResult> br = baseline->Run((*ctx)->cost_model(), b);
        const double thr =
            br.ok() ? 1.0 / br->prediction.iteration_time_s : 0.0;
        row.baseline_throughput.push_back(thr);
        row.baseline_wall_s.push_back(br.ok() ? br->stats.wall_s : 0.0);
        out << absl::StrFormat(" %12.4f %7.3f", thr,
                               thr > 0 ? row.learned_throughput / thr : 0.0);
      }
      out << "\n";
      out.flush();
      rows.push_back(std::move(row));
    }
  }
  // Against the best baseline of each composition: the bar is
  // "at least the best baseline, ties within 0.5%".
  int at_bar = 0, compared = 0;
  double log_sum = 0;
  for (const PolicyEvaluationRow& row : rows) {
    double best = 0;
    for (double t : row.baseline_throughput) best = std::max(best, t);
    if (best <= 0) continue;
    ++compared;
    const double ratio = row.learned_throughput / best;
    if (ratio >= 0.995) ++at_bar;
    log_sum += std::log(std::max(ratio, 1e-9));
  }
  if (compared > 0) {
    out << absl::StrFormat(
        "against the best baseline: %d of %d compositions at least 0.995, "
        "geomean %.4f\n",
        at_bar, compared, std::exp(log_sum / compared));
  }
  if (!o.eval_out.empty()) {
    std::ofstream csv(o.eval_out);
    csv << "scenario,model,composition,gpus,learned_throughput,learned_wall_s,"
           "learned_evaluations";
    for (const std::string& name : o.eval_planners)
      csv << "," << name << "_throughput," << name << "_wall_s";
    csv << "\n";
    for (const PolicyEvaluationRow& row : rows) {
      csv << absl::StrFormat("%s,%s,\"%s\",%d,%.6f,%.4f,%d", row.scenario,
                             row.model, row.composition, row.gpus,
                             row.learned_throughput,
                             row.learned_wall_s, row.learned_evaluations);
      for (size_t i = 0; i < row.baseline_throughput.size(); ++i)
        csv << absl::StrFormat(",%.6f,%.4f", row.baseline_throughput[i],
                               row.baseline_wall_s[i]);
      csv << "\n";
    }
    if (!csv.good()) {
      return absl::InternalError(
          absl::StrCat("train --evaluate: cannot write ", o.eval_out));
    }
  }
  return rows;
}

absl::StatusOr<TrainReport> TrainPolicy(const TrainOptions& o,
                                        std::ostream& progress) {
  const auto start = std::chrono::steady_clock::now();
  if (o.out.empty())
    return absl::InvalidArgumentError("train: --out must name a file");
  if (o.compositions < 1) {
    return absl::InvalidArgumentError(
        absl::StrCat("train: --compositions must be >= 1, got ",
                     o.compositions));
  }
  absl::StatusOr<GpuCatalog> catalog = LoadGpuCatalog(o.profiles_dir);
  if (!catalog.ok()) return catalog.status();
  absl::StatusOr<std::vector<ModelSpec>> catalog_models =
      LoadModelCatalog(o.profiles_dir);
  if (!catalog_models.ok()) return catalog_models.status();
  auto find_model = [&](const std::string& name) -> const ModelSpec* {
    for (const ModelSpec& m : *catalog_models)
      if (m.name == name) return &m;
    return nullptr;
  };
  // The models trained on: one (a per-model policy), or several and
  // generated shapes (the model-conditioned policy).
  const bool conditioned = !o.models.empty() || o.generated_models > 0;
  if (conditioned && !o.model.empty()) {
    return absl::InvalidArgumentError(absl::StrCat(
        "train: --model \"", o.model,
        "\" trains one model's policy; --models / --generated-models train "
        "the model-conditioned one: give one or the other"));
  }
  if (!conditioned && o.model.empty()) {
    return absl::InvalidArgumentError(
        "train: --model, --models or --generated-models must be given");
  }
  if (o.generated_models < 0) {
    return absl::InvalidArgumentError(absl::StrCat(
        "train: --generated-models must be >= 0, got ", o.generated_models));
  }
  std::vector<ModelSpec> train_models;
  for (const std::string& name :
       conditioned ? o.models : std::vector<std::string>{o.model}) {
    const ModelSpec* m = find_model(name);
    if (m == nullptr) {
      return absl::NotFoundError(absl::StrCat(
          "train: ", conditioned ? "--models" : "--model", ": unknown model \"",
          name, "\" (arachne models lists them)"));
    }
    train_models.push_back(*m);
  }
  if (o.generated_models > 0) {
    absl::StatusOr<std::vector<ModelSpec>> generated =
        GenerateModelShapes({}, o.generated_models, o.seed);
    if (!generated.ok()) return generated.status();
    for (ModelSpec& m : *generated) train_models.push_back(std::move(m));
  }
  const ModelSpec* model = &train_models.front();
  const std::string policy_model =
      conditioned ? std::string(kGeneralPolicyModel) : model->name;
  CompositionGeneratorConfig gen_config;
  for (const std::string& id : o.gpu_types) {
    absl::StatusOr<int> t = catalog->IndexOf(id);
    if (!t.ok()) return t.status();
    gen_config.gpu_types.push_back(*t);
  }
  if (o.max_types < 1 || o.max_types > kEnvDeviceSlots) {
    return absl::InvalidArgumentError(
        absl::StrCat("train: --max-types must be in [1, ", kEnvDeviceSlots,
                     "] (the device head's slots), got ", o.max_types));
  }
  if (o.min_types < 1 || o.min_types > o.max_types) {
    return absl::InvalidArgumentError(
        absl::StrCat("train: --min-types must be in [1, --max-types = ",
                     o.max_types, "], got ", o.min_types));
  }
  // At most the types given: --gpu-types A,B trains on pairs whatever the
  // range says.
  const int type_choices = static_cast<int>(gen_config.gpu_types.size());
  gen_config.min_types = std::min(o.min_types, type_choices);
  gen_config.max_types = std::min(o.max_types, type_choices);
  gen_config.min_gpus = o.min_gpus;
  gen_config.max_gpus = o.max_gpus;

  // Every composition of the evaluation suite, whatever its model, stays
  // unseen.
  std::vector<Cluster> excluded;
  absl::StatusOr<std::vector<Scenario>> suite = LoadSuite(o, *catalog);
  if (!suite.ok()) return suite.status();
  for (const Scenario& s : *suite)
    for (const Composition& c : s.compositions) excluded.push_back(c.cluster);

  absl::StatusOr<CompositionGenerator> generator =
      CompositionGenerator::Create(*catalog, gen_config, excluded);
  if (!generator.ok()) return generator.status();
  // Case i: composition i with model i mod |models|. A pair whose model
  // needs nearly every GPU of its cluster teaches little (most episodes
  // find no plan), so the model gets the next composition instead; more
  // compositions are drawn when a pair runs out of them.
  std::vector<std::unique_ptr<PlanningContext>> contexts;
  std::vector<const CostModel*> cost_models;
  std::vector<std::string> case_models;
  int skipped = 0;
  {
    int drawn = o.compositions;
    absl::StatusOr<std::vector<Cluster>> clusters =
        generator->Generate(drawn, o.seed);
    if (!clusters.ok()) return clusters.status();
    size_t next = 0;
    for (int i = 0; i < o.compositions; ++i) {
      const ModelSpec& m = train_models[i % train_models.size()];
      for (int attempt = 0;; ++attempt) {
        if (next == clusters->size()) {
          // Fresh compositions from a derived seed (never the suite's).
          absl::StatusOr<std::vector<Cluster>> more = generator->Generate(
              o.compositions, o.seed + 7919 * (drawn / o.compositions));
          if (!more.ok()) return more.status();
          drawn += o.compositions;
          for (Cluster& c : *more) clusters->push_back(std::move(c));
        }
        if (attempt > 4 * o.compositions) {
          return absl::FailedPreconditionError(absl::StrCat(
              "train: model ", m.name, " needs nearly every GPU of every "
              "generated composition; raise --max-gpus"));
        }
        const Cluster& cluster = (*clusters)[next++];
        absl::StatusOr<std::unique_ptr<PlanningContext>> ctx =
            PlanningContext::Create(*catalog, m, o.training, cluster,
                                    o.profiles_dir);
        if (!ctx.ok()) return ctx.status();
        if (conditioned) {
          absl::StatusOr<ConstructionEnv> env =
              ConstructionEnv::Create((*ctx)->cost_model(), o.grpo.env);
          if (!env.ok() ||
              env->ModelSummary()[env_model_feature::kMemoryPressure] >= 0.9) {
            ++skipped;
            continue;
          }
        }
        cost_models.push_back(&(*ctx)->cost_model());
        contexts.push_back(*std::move(ctx));
        case_models.push_back(m.name);
        break;
      }
    }
  }
  GrpoConfig grpo = o.grpo;
  grpo.episodes = o.episodes;
  grpo.seed = o.seed;
  absl::StatusOr<std::string> calibration =
      ReadDataFile("calibration.json", o.profiles_dir);
  if (!calibration.ok()) return calibration.status();
  if (conditioned) grpo.network.model_conditioned = true;
  const std::string profile_name =
      conditioned ? std::string(kGeneralPolicyProfiles)
                  : (model->profile_name.empty() ? model->name
                                                 : model->profile_name);
  const std::string fingerprint =
      ProfileSetFingerprint(*catalog, profile_name, *calibration);
  std::unique_ptr<PolicyNetwork> init;
  if (!o.init.empty()) {
    absl::StatusOr<LoadedPolicy> loaded = LoadPolicyCheckpoint(o.init);
    if (!loaded.ok()) return loaded.status();
    // A warm start may come from another profile set: retraining a policy
    // after a recalibration starts from its old weights. Format and model
    // must still match; the new checkpoint gets this set's fingerprint.
    if (absl::Status fits =
            CheckCheckpointFits(loaded->info, policy_model,
                                loaded->info.profile_fingerprint, o.init);
        !fits.ok())
      return fits;
    if (loaded->info.profile_fingerprint != fingerprint)
      progress << o.init << ": trained on profile fingerprint "
                << loaded->info.profile_fingerprint
                << "; continuing on these profiles (" << fingerprint
                << ")\n";
    grpo.network = loaded->info.network;
    init = std::move(loaded->network);
  }
  absl::StatusOr<std::unique_ptr<GrpoTrainer>> trainer =
      GrpoTrainer::Create(grpo, cost_models);
  if (!trainer.ok()) return trainer.status();
  if (init != nullptr) (*trainer)->network().CopyFrom(*init);

  TrainReport report;
  report.compositions = static_cast<int>(cost_models.size());
  report.excluded = static_cast<int>(excluded.size());
  report.initial_greedy_reward = (*trainer)->GreedyReward();
  progress << absl::StrFormat(
      "train %s: %d compositions (%d suite compositions excluded), %d "
      "episodes, greedy reward before %.4f\n",
      policy_model, report.compositions, report.excluded, o.episodes,
      report.initial_greedy_reward);
  if (conditioned) {
    progress << absl::StrFormat(
        "  %d models (%d from the catalog: %s; %d generated); %d pairs "
        "replaced as memory-bound\n",
        train_models.size(), o.models.size(), absl::StrJoin(o.models, ", "),
        o.generated_models, skipped);
  }
  auto elapsed = [&] {
    return std::chrono::duration<double>(std::chrono::steady_clock::now() -
                                         start)
        .count();
  };
  double last_print = -1;
  report.curve = (*trainer)->Train(
      [&](const GrpoIteration& it) {
        const double now = elapsed();
        if (now - last_print < 2 && it.episodes < o.episodes) return;
        last_print = now;
        const double fraction = static_cast<double>(it.episodes) / o.episodes;
        double left = fraction > 0 ? now / fraction - now : 0;
        if (o.time_limit_s > 0) left = std::min(left, o.time_limit_s - now);
        progress << absl::StrFormat(
            "[%s] episodes %d/%d  mean %.4f  best %.4f  greedy %.4f  %.0fs "
            "elapsed, ~%.0fs left\n",
            Bar(fraction), it.episodes, o.episodes, it.mean_reward,
            it.best_reward, it.greedy_reward, now, std::max(left, 0.0));
        progress.flush();
      },
      [&] { return o.time_limit_s <= 0 || elapsed() < o.time_limit_s; });
  report.final_greedy_reward = (*trainer)->GreedyReward();
  report.wall_s = elapsed();

  PolicyCheckpointInfo info;
  info.model = policy_model;
  info.profile_name = profile_name;
  info.profile_fingerprint = fingerprint;
  info.training.episodes = (*trainer)->episodes();
  info.training.compositions = report.compositions;
  info.training.seed = o.seed;
  info.training.max_gpu_types = gen_config.max_types;
  if (conditioned) {
    info.training.models = o.models;
    info.training.generated_models = o.generated_models;
  }
  info.training.wall_s = report.wall_s;
  info.training.final_mean_reward =
      report.curve.empty() ? 0 : report.curve.back().mean_reward;
  info.training.best_reward = (*trainer)->best_reward();
  if (absl::Status s = SavePolicyCheckpoint((*trainer)->network(), info, o.out);
      !s.ok())
    return s;
  std::ofstream csv(CurvePath(o));
  csv << "iteration,episodes,elapsed_s,mean_reward,best_reward,greedy_reward,"
         "forced_probability,loss\n";
  for (const GrpoIteration& it : report.curve) {
    csv << absl::StrFormat("%d,%d,%.3f,%.6f,%.6f,%.6f,%.4f,%.6f\n",
                           it.iteration, it.episodes, it.elapsed_s,
                           it.mean_reward, it.best_reward, it.greedy_reward,
                           it.forced_probability, it.loss);
  }
  csv.close();
  if (!csv.good()) {
    return absl::InternalError(
        absl::StrCat("train: cannot write ", CurvePath(o)));
  }
  PlotTrainingCurve(CurvePath(o), progress);
  return report;
}

CLI::App* AddTrainCommand(CLI::App* app, TrainOptions* o) {
  CLI::App* train = app->add_subcommand(
      "train", "train a model's learned policy (GRPO, docs/learned-policy.md)");
  AddTrainFlags(train, o);
  return train;
}

void AddTrainFlags(CLI::App* train, TrainOptions* o) {
  train->add_option("--model", o->model,
                    "model catalog id (one model's policy)");
  train->add_option("--models", o->models,
                    "catalog ids: train the model-conditioned policy on them "
                    "(the others are held out)")
      ->delimiter(',');
  train->add_option("--generated-models", o->generated_models,
                    "generated model shapes the conditioned policy also "
                    "trains on")
      ->capture_default_str();
  train->add_option("--eval-latency", o->eval_latency_s,
                    "wall-clock limit of each learned run in --evaluate, "
                    "seconds (0: 60)")
      ->capture_default_str();
  train->add_option("--compositions", o->compositions,
                    "generated training compositions")
      ->capture_default_str();
  train->add_option("--episodes", o->episodes, "rollouts to train on")
      ->capture_default_str();
  train->add_option("--seed", o->seed, "seed")->capture_default_str();
  train->add_option("--time-limit", o->time_limit_s,
                    "stop after this many seconds (0: none)")
      ->capture_default_str();
  train->add_option("--out", o->out, "checkpoint file (.pt)");
  train->add_option("--init", o->init,
                    "start from this checkpoint's weights");
  train->add_option("--forced-depth-start", o->grpo.forced_depth_start,
                    "forced-depth probability at the start (decays to 0.25)")
      ->capture_default_str();
  train->add_option("--curve", o->curve,
                    "training-curve CSV (default: <out>.curve.csv)");
  train->add_option("--profiles-dir", o->profiles_dir,
                    "override profiles/ data");
  train->add_option("--exclude-scenarios", o->exclude_scenarios,
                    "scenario suites kept out of training, comma-separated "
                    "(default: bench/scenarios); --evaluate plans them")
      ->delimiter(',');
  train->add_option("--gpu-types", o->gpu_types,
                    "GPU types to draw compositions from")
      ->delimiter(',')
      ->capture_default_str();
  train->add_option("--min-types", o->min_types,
                    "fewest GPU types in a training composition (at most "
                    "the --gpu-types given)")
      ->capture_default_str();
  train->add_option("--max-types", o->max_types,
                    "most GPU types in a training composition (at most the "
                    "--gpu-types given; 1-16)")
      ->capture_default_str();
  train->add_option("--min-gpus", o->min_gpus, "smallest training cluster")
      ->capture_default_str();
  train->add_option("--max-gpus", o->max_gpus, "largest training cluster")
      ->capture_default_str();
  train->add_option("--group-size", o->grpo.group_size, "rollouts per group")
      ->capture_default_str();
  train->add_option("--evaluate", o->evaluate,
                    "instead of training: plan the suite's compositions of "
                    "--model with this checkpoint and compare");
  train->add_option("--eval-planners", o->eval_planners,
                    "baselines for --evaluate")
      ->delimiter(',')
      ->capture_default_str();
  train->add_option("--eval-budget", o->eval_budget_s,
                    "budget per baseline run in --evaluate, seconds")
      ->capture_default_str();
  train->add_option("--eval-samples", o->eval_samples,
                    "sampled rollouts of the learned planner in --evaluate")
      ->capture_default_str();
  train->add_option("--eval-out", o->eval_out, "CSV of --evaluate");
  train->add_option("--export-weights", o->export_weights,
                    "instead of training: write this checkpoint's (.pt) "
                    "LibTorch-free weights file (.weights) beside it");
}

int RunTrainCommand(const TrainOptions& options, std::ostream& out,
                    std::ostream& err) {
  auto fail = [&err](const absl::Status& s) {
    err << "error: " << s.message() << "\n";
    switch (s.code()) {
      case absl::StatusCode::kInvalidArgument:
      case absl::StatusCode::kNotFound:
      case absl::StatusCode::kFailedPrecondition:
        return 2;
      default:
        return 1;
    }
  };
  if (!options.export_weights.empty()) {
    absl::StatusOr<std::string> path =
        ExportPolicyWeights(options.export_weights);
    if (!path.ok()) return fail(path.status());
    out << "wrote " << *path << "\n";
    return 0;
  }
  if (!options.evaluate.empty()) {
    absl::StatusOr<std::vector<PolicyEvaluationRow>> rows =
        EvaluatePolicy(options, out);
    return rows.ok() ? 0 : fail(rows.status());
  }
  absl::StatusOr<TrainReport> report = TrainPolicy(options, out);
  if (!report.ok()) {
    err << "error: " << report.status().message() << "\n";
    switch (report.status().code()) {
      case absl::StatusCode::kInvalidArgument:
      case absl::StatusCode::kNotFound:
      case absl::StatusCode::kFailedPrecondition:
        return 2;
      default:
        return 1;
    }
  }
  std::error_code ec;
  const std::string plot = CurvePlotPath(CurvePath(options));
  out << absl::StrFormat(
      "trained %s in %.0f s: greedy reward %.4f -> %.4f over %d "
      "compositions; wrote %s and %s%s\n",
      options.model.empty() ? std::string(kGeneralPolicyModel) : options.model, report->wall_s, report->initial_greedy_reward,
      report->final_greedy_reward, report->compositions, options.out,
      CurvePath(options),
      std::filesystem::is_regular_file(plot, ec) ? " (plot: " + plot + ")"
                                                 : "");
  return 0;
}

}  // namespace arachne
