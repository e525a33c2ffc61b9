#include "planner_service/cli/cli.h"

#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <cmath>
#include <filesystem>
#include <fstream>
#include <memory>
#include <optional>
#include <sstream>
#include <string>
#include <vector>

#include "CLI/CLI.hpp"
#include "absl/status/status.h"
#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/time/clock.h"
#include "bench/harness/bench_runner.h"
#include "controller_client/controller_client.h"
#include "nlohmann/json.hpp"
#include "planner_service/cli/calibrate_command.h"
#include "planner_service/cli/controller_status_text.h"
#include "planner_service/cli/plan_svg.h"
#include "planner_service/cli/plan_table.h"
#include "planner_service/client/planner_client.h"
#include "planner_service/core/cost/cost_model.h"
#include "planner_service/core/cost/plan_validation.h"
#include "planner_service/core/planners.h"
#include "planner_service/core/planning_options.h"
#include "planner_service/core/cost/profile_synthesizer.h"
#include "planner_service/core/planners/search_tracker.h"
#include "planner_service/io/cluster_io.h"
#include "planner_service/io/data_files.h"
#include "planner_service/io/framework_io.h"
#include "planner_service/io/gpu_catalog_io.h"
#include "planner_service/io/model_io.h"
#include "planner_service/io/plan_io.h"
#include "planner_service/io/planning_context.h"
#include "planner_service/io/profile_io.h"

namespace arachne {
namespace {

// Longest sequence `profile show` prices (1 Mi tokens).
constexpr int kMaxProfileSeq = 1 << 20;

// Options shared by plan and evaluate.
struct InputFlags {
  std::string model;
  std::string cluster;
  int seq = 2048;
  int global_batch = 2048;
  std::string precision = "bf16";
  std::string recompute = "none";
  bool distributed_optimizer = false;
  std::string framework;  // "": megatron-core
  std::vector<std::string> framework_set;  // FIELD=VALUE, applied in order
  std::string profiles_dir;
  std::string format = "table";
  std::string svg;  // also write a diagram of the plan here
  std::string calibration;  // run calibration file (arachne calibrate --out)
  // evaluate: what the plan was measured at (0: not given).
  double measured_iteration_s = 0;
  double measured_peak_gib = 0;
};

// A measured quantity: a finite number > 0. CLI11's PositiveNumber lets
// "nan" through (and the measurement was then silently ignored) and words
// its error as a range up to DBL_MAX written out in full.
CLI::Validator PositiveMeasurement() {
  return CLI::Validator(
      [](std::string& text) -> std::string {
        double v = 0;
        if (absl::SimpleAtod(text, &v) && std::isfinite(v) && v > 0) {
          return "";
        }
        return absl::StrCat("must be a finite number > 0, got \"", text,
                            "\"");
      },
      "NUMBER > 0");
}

void AddInputFlags(CLI::App* cmd, InputFlags* f) {
  cmd->add_option("--model", f->model,
                  "catalog model id (arachne models) or path to a Hugging "
                  "Face config.json")
      ->required();
  cmd->add_option("--cluster", f->cluster, "cluster spec file (YAML or JSON)")
      ->required();
  cmd->add_option("--seq", f->seq, "sequence length in tokens");
  cmd->add_option("--global-batch", f->global_batch,
                  "global batch in sequences");
  cmd->add_option("--precision", f->precision, "bf16 or fp16");
  cmd->add_option("--recompute", f->recompute,
                  "activation recomputation: none, selective or full");
  cmd->add_flag("--distributed-optimizer", f->distributed_optimizer,
                "shard optimizer state over data-parallel replicas");
  cmd->add_option("--framework", f->framework,
                  "training framework preset: megatron-core (default), "
                  "megatron-deepspeed, deepspeed-zero1, fsdp or "
                  "arachne-reference (docs/cost-model.md#frameworks)");
  cmd->add_option("--framework-set", f->framework_set,
                  "override one field of the framework preset, FIELD=VALUE "
                  "(e.g. attention=flash); repeatable")
      ->allow_extra_args(false);  // one FIELD=VALUE per --framework-set
  cmd->add_option("--profiles-dir", f->profiles_dir,
                  "directory overriding the built-in profiles/ data");
  cmd->add_option("--format", f->format, "table or json");
  cmd->add_option("--svg", f->svg, "also write an SVG diagram of the plan");
  cmd->add_option("--calibration", f->calibration,
                  "apply a run calibration (arachne calibrate --out; "
                  "docs/measured-runs.md)");
}

// --server and its credentials, for plan and evaluate.
struct RemoteFlags {
  std::string server;  // HOST:PORT of arachne-planner; "" = in process
  std::string token;
  std::string tls_ca;
};

void AddRemoteFlags(CLI::App* cmd, RemoteFlags* f) {
  cmd->add_option("--server", f->server,
                  "HOST:PORT of a running arachne-planner: send the request "
                  "there instead of planning in process (the cluster and "
                  "model files are read here)");
  cmd->add_option("--token", f->token,
                  "bearer token for --server (sent as 'authorization: Bearer "
                  "<token>')");
  cmd->add_option("--tls-ca", f->tls_ca,
                  "CA certificate (PEM) to verify --server's TLS certificate; "
                  "without it the connection is plaintext");
}

// The budget of a search planner when --budget is not given; learned,
// template-search and the default planner take their latency budget
// (planners.h, DefaultBudget).
constexpr absl::Duration kCliSearchBudget = absl::Seconds(60);

int Fail(std::ostream& err, const absl::Status& s) {
  return FailCommand(err, s);
}

// A planning error: a search that a limit stopped before it found any plan
// (DeadlineExceeded: the budget; ResourceExhausted: --max-evaluations, or a
// busy --server) exits kExitSearchStopped, since more budget or a retry
// may find one; the rest as Fail.
int FailSearch(std::ostream& err, const absl::Status& s) {
  if (s.code() == absl::StatusCode::kDeadlineExceeded ||
      s.code() == absl::StatusCode::kResourceExhausted) {
    err << "error: " << s.message() << "\n";
    return kExitSearchStopped;
  }
  return Fail(err, s);
}

absl::Status CheckFormat(const std::string& format) {
  if (format == "table" || format == "json") return absl::OkStatus();
  return absl::InvalidArgumentError(
      absl::StrCat("--format: expected table or json, got \"", format, "\""));
}

// --framework's preset (megatron-core without it).
absl::StatusOr<FrameworkConfig> FrameworkPresetFromFlags(const InputFlags& f) {
  if (f.framework.empty()) return FrameworkConfig{};
  absl::StatusOr<FrameworkPreset> preset = ParseFrameworkPreset(f.framework);
  if (!preset.ok()) {
    return absl::InvalidArgumentError(
        absl::StrCat("--", preset.status().message()));
  }
  return FrameworkPresetConfig(*preset);
}

// Each --framework-set on `framework`, in the order given.
absl::Status ApplyFrameworkSets(const InputFlags& f,
                                FrameworkConfig* framework) {
  for (const std::string& set : f.framework_set) {
    const size_t eq = set.find('=');
    if (eq == std::string::npos) {
      return absl::InvalidArgumentError(absl::StrCat(
          "--framework-set: expected FIELD=VALUE, got \"", set, "\""));
    }
    if (absl::Status s = SetFrameworkField(*framework, set.substr(0, eq),
                                           set.substr(eq + 1));
        !s.ok()) {
      return absl::InvalidArgumentError(
          absl::StrCat("--framework-set: ", s.message()));
    }
  }
  return absl::OkStatus();
}

absl::StatusOr<std::unique_ptr<PlanningContext>> LoadContext(
    const InputFlags& f) {
  if (absl::Status s = CheckFormat(f.format); !s.ok()) return s;
  PlanningRequest req;
  req.model = f.model;
  req.cluster_file = f.cluster;
  req.profiles_dir = f.profiles_dir;
  req.training.seq_len = f.seq;
  req.training.global_batch = f.global_batch;
  absl::StatusOr<Precision> precision = ParsePrecision(f.precision);
  if (!precision.ok()) return precision.status();
  req.training.precision = *precision;
  absl::StatusOr<Recompute> recompute = ParseRecompute(f.recompute);
  if (!recompute.ok()) return recompute.status();
  req.training.recompute = *recompute;
  req.training.distributed_optimizer = f.distributed_optimizer;
  // The preset, then the calibration's fields, then each --framework-set:
  // an explicit flag wins over the calibration.
  absl::StatusOr<FrameworkConfig> framework = FrameworkPresetFromFlags(f);
  if (!framework.ok()) return framework.status();
  req.training.framework = *std::move(framework);
  if (!f.calibration.empty()) {
    absl::StatusOr<RunCorrections> c =
        LoadCalibrationFlag(f.calibration, f.profiles_dir);
    if (!c.ok()) return c.status();
    ApplyCorrections(*c, &req.training, &req.cost_params);
  }
  if (absl::Status s = ApplyFrameworkSets(f, &req.training.framework);
      !s.ok()) {
    return s;
  }
  return PlanningContext::Create(req);
}

absl::StatusOr<std::unique_ptr<PlannerClient>> ConnectRemote(
    const RemoteFlags& remote) {
  PlannerClientConfig config;
  config.address = remote.server;
  config.token = remote.token;
  config.tls_ca_file = remote.tls_ca;
  absl::StatusOr<std::unique_ptr<PlannerClient>> client =
      MakeGrpcPlannerClient(config);
  if (!client.ok()) {
    return absl::Status(client.status().code(),
                        absl::StrCat("--server: ", client.status().message()));
  }
  return client;
}

// The request fields as the service takes them, from what was loaded here:
// the cluster as resolved from --cluster, the model by catalog name or as
// the text of the --model config.json.
absl::Status FillRemoteInputs(const InputFlags& f, const PlanningContext& ctx,
                              ModelRef* model, TrainingSpec* training,
                              ClusterSpec* cluster) {
  std::error_code ec;
  if (std::filesystem::is_regular_file(f.model, ec)) {
    // Within the readers' size limit, as every file the CLI reads.
    absl::StatusOr<std::string> text = ReadFileToString(f.model);
    if (!text.ok()) {
      return absl::Status(text.status().code(),
                          absl::StrCat("--model: ", text.status().message()));
    }
    model->name = ctx.model().name;
    model->hf_config_json = *std::move(text);
  } else {
    model->name = f.model;
  }
  training->seq_len = ctx.training().seq_len;
  training->global_batch = ctx.training().global_batch;
  training->precision = std::string(PrecisionName(ctx.training().precision));
  training->recompute = std::string(RecomputeName(ctx.training().recompute));
  training->distributed_optimizer = ctx.training().distributed_optimizer;
  training->framework = FrameworkToMessage(ctx.training().framework);
  // --calibration: its framework fields are in the framework above, its
  // scales travel as the request's calibration.
  const CostParams& params = ctx.cost_model().params();
  RunCorrections scales;
  scales.compute_scale = params.compute_scale;
  scales.attention_scale = params.attention_scale;
  scales.tp_comm_scale = params.tp_comm_scale;
  training->calibration = CorrectionsToMessage(scales);
  *cluster = ClusterToMessage(ctx.cluster(), ctx.catalog());
  return absl::OkStatus();
}

// Which planner a plan run got when the user named none.
struct DefaultPlannerNote {
  bool chosen = false;          // no --planner: the default was chosen
  std::string fallback_reason;  // "" for learned
};

absl::Status PrintPlan(std::ostream& out, const InputFlags& f,
                       const PlanningContext& ctx, const Plan& plan,
                       const Prediction& prediction, const std::string& planner,
                       double planning_time_s, const PlannerStats* stats,
                       const DefaultPlannerNote& note = {}) {
  if (!f.svg.empty()) {
    std::ofstream svg(f.svg);
    svg << RenderPlanSvg(plan, prediction, ctx.cost_model());
    if (!svg) {
      return absl::PermissionDeniedError(
          absl::StrCat("--svg: cannot write ", f.svg));
    }
  }
  if (f.format == "json") {
    nlohmann::json j = PlanToJson(plan, prediction, ctx.cluster(),
                                  ctx.catalog(), ctx.model(), ctx.training());
    j["planner"] = planner;
    if (!note.fallback_reason.empty())
      j["planner_fallback_reason"] = note.fallback_reason;
    j["planning_time_s"] = planning_time_s;
    if (stats) {
      j["evaluations"] = stats->evaluations;
      j["exhaustive"] = stats->exhaustive;
    }
    // $ per million tokens, what --objective usd_per_token minimises; null
    // when a GPU type of the plan has no price (its usd_per_hour counts 0).
    bool priced = true;
    for (const Template& t : plan.templates)
      for (const Stage& st : t.stages)
        priced = priced && ctx.catalog().type(st.gpu_type).usd_per_hour > 0;
    if (priced && prediction.tokens_per_s > 0) {
      j["usd_per_mtoken"] =
          UsdPerToken(prediction.usd_per_hour, prediction.tokens_per_s) * 1e6;
    } else {
      j["usd_per_mtoken"] = nullptr;
    }
    out << j.dump(2) << "\n";
    return absl::OkStatus();
  }
  // The default's choice first, in one line: what ran and, when it fell
  // back, why.
  if (note.chosen) {
    out << DefaultPlannerLine(planner, note.fallback_reason) << "\n";
  }
  out << RenderPlanTable(plan, prediction, ctx.cost_model());
  // What the prediction assumed of the software, beside the planner line.
  out << "\nframework: " << FrameworkSummary(ctx.training().framework);
  out << absl::StrFormat("\nplanner %s: %.2f s", planner, planning_time_s);
  if (stats) {
    out << absl::StrFormat(", %d plan evaluations%s", stats->evaluations,
                           stats->exhaustive ? ", exhaustive" : "");
  }
  out << "\n";
  return absl::OkStatus();
}

// A plan JSON answered by the service, printed as the in-process path
// prints its own: the plan is read back against the local cluster and its
// prediction is the server's.
absl::Status PrintRemotePlan(std::ostream& out, const InputFlags& f,
                             const PlanningContext& ctx,
                             const nlohmann::json& answer,
                             const std::string& planner, double planning_time_s,
                             const PlannerStats* stats,
                             const DefaultPlannerNote& note = {}) {
  absl::StatusOr<Plan> plan =
      PlanFromJson(answer, ctx.cluster(), ctx.catalog(), "server answer");
  if (!plan.ok()) return plan.status();
  absl::StatusOr<Prediction> prediction = PredictionFromPlanJson(answer);
  if (!prediction.ok()) return prediction.status();
  return PrintPlan(out, f, ctx, *plan, *prediction, planner, planning_time_s,
                   stats, note);
}

// `budget_s` 0: the server's default for the planner (planners.h,
// DefaultBudget).
int RunPlanRemote(const InputFlags& f, const RemoteFlags& remote,
                  const PlanningContext& ctx, const std::string& planner_name,
                  PlannerObjective objective, double budget_s, int max_depth,
                  int max_templates, int64_t max_evaluations, int rollouts,
                  std::ostream& out, std::ostream& err) {
  absl::StatusOr<std::unique_ptr<PlannerClient>> client = ConnectRemote(remote);
  if (!client.ok()) return Fail(err, client.status());
  PlanQuery q;
  if (absl::Status s =
          FillRemoteInputs(f, ctx, &q.model, &q.training, &q.cluster);
      !s.ok()) {
    return Fail(err, s);
  }
  q.planner = planner_name;
  q.objective = objective;
  q.policy_rollouts = rollouts;
  q.budget_s = budget_s;
  q.max_depth = max_depth;
  q.max_templates = max_templates;
  q.max_evaluations = max_evaluations;
  // The search gets its budget; the margin covers queueing and transfer.
  q.deadline = absl::Now() +
               (budget_s > 0 ? absl::Seconds(budget_s)
                             : DefaultBudget(planner_name, kCliSearchBudget)) +
               absl::Seconds(30);
  absl::StatusOr<PlanAnswer> answer = (*client)->Plan(q);
  if (!answer.ok()) return FailSearch(err, answer.status());
  PlannerStats stats;
  stats.evaluations = answer->evaluations;
  stats.exhaustive = answer->exhaustive;
  // The server chose the default planner when none was named.
  const DefaultPlannerNote note{planner_name.empty(),
                                answer->planner_fallback_reason};
  if (absl::Status s =
          PrintRemotePlan(out, f, ctx, answer->plan, answer->planner,
                          answer->planning_time_s, &stats, note);
      !s.ok()) {
    return Fail(err, s);
  }
  return kExitOk;
}

// `planner_name` "": the default planner (ChooseDefaultPlanner).
int RunPlan(const InputFlags& f, const RemoteFlags& remote,
            const std::string& planner_name, const std::string& objective_name,
            std::optional<double> budget_given, int max_depth,
            int max_templates, int64_t max_evaluations,
            std::optional<int> rollouts, std::ostream& out, std::ostream& err) {
  const double budget_s = budget_given.value_or(
      absl::ToDoubleSeconds(DefaultBudget(planner_name, kCliSearchBudget)));
  absl::StatusOr<PlannerObjective> objective =
      ParsePlannerObjective(objective_name);
  if (!objective.ok()) {
    return Fail(err, absl::InvalidArgumentError(absl::StrCat(
                         "--objective: unknown value \"", objective_name,
                         "\"; expected throughput or usd_per_token")));
  }
  // The checks the service makes on a request's options, in flag names.
  PlanningOptionsInput options_given;
  options_given.planner = planner_name;
  options_given.budget_s = budget_s;
  options_given.max_evaluations = max_evaluations;
  options_given.max_depth = max_depth;
  options_given.max_templates = max_templates;
  options_given.objective = static_cast<int64_t>(*objective);
  if (rollouts.has_value()) options_given.policy_rollouts = *rollouts;
  if (absl::Status s = ValidatePlanningOptions(options_given, kCliOptionNames);
      !s.ok()) {
    return Fail(err, s);
  }
  const int rollouts_or_default = rollouts.value_or(-1);
  absl::StatusOr<std::unique_ptr<Planner>> planner;
  if (!planner_name.empty()) {
    planner = MakePlanner(planner_name);
    if (!planner.ok()) return Fail(err, planner.status());
  }
  const absl::Time start = absl::Now();
  auto ctx = LoadContext(f);
  if (!ctx.ok()) return Fail(err, ctx.status());
  // Without --budget the learned planners' 0.9 s counts from the start of
  // the call, so that the whole call stays under a second.
  const bool whole_call_budget =
      !budget_given.has_value() && IsLatencyBudgeted(planner_name);
  if (!remote.server.empty()) {
    // 0 leaves that budget to the server, which counts it alike.
    return RunPlanRemote(f, remote, **ctx, planner_name, *objective,
                         whole_call_budget ? 0 : budget_s, max_depth,
                         max_templates, max_evaluations, rollouts_or_default,
                         out, err);
  }
  PlannerOptions options;
  options.budget = absl::Seconds(budget_s);
  options.max_depth = max_depth;
  options.max_templates = max_templates;
  options.max_evaluations = max_evaluations;
  options.objective = *objective;
  options.policy_rollouts = rollouts_or_default;
  DefaultPlannerNote note;
  if (planner_name.empty()) {
    DefaultPlannerChoice choice = ChooseDefaultPlanner((*ctx)->cost_model());
    planner = std::move(choice.planner);
    note = {true, std::move(choice.fallback_reason)};
  }
  if (whole_call_budget) {
    options.budget =
        std::max(options.budget - (absl::Now() - start), absl::ZeroDuration());
  }
  absl::StatusOr<PlanResult> result = (*planner)->Run((*ctx)->cost_model(), options);
  if (!result.ok()) return FailSearch(err, result.status());
  const double elapsed = absl::ToDoubleSeconds(absl::Now() - start);
  if (absl::Status s =
          PrintPlan(out, f, **ctx, result->plan, result->prediction,
                    result->planner, elapsed, &result->stats, note);
      !s.ok()) {
    return Fail(err, s);
  }
  return kExitOk;
}

int RunEvaluate(const InputFlags& f, const RemoteFlags& remote,
                const std::string& plan_file, std::ostream& out,
                std::ostream& err) {
  const absl::Time start = absl::Now();
  auto ctx = LoadContext(f);
  if (!ctx.ok()) return Fail(err, ctx.status());
  absl::StatusOr<Plan> plan =
      LoadPlanFile(plan_file, (*ctx)->cluster(), (*ctx)->catalog());
  if (!plan.ok()) return Fail(err, plan.status());
  if (!remote.server.empty()) {
    absl::StatusOr<std::unique_ptr<PlannerClient>> client =
        ConnectRemote(remote);
    if (!client.ok()) return Fail(err, client.status());
    EvaluateQuery q;
    if (absl::Status s =
            FillRemoteInputs(f, **ctx, &q.model, &q.training, &q.cluster);
        !s.ok()) {
      return Fail(err, s);
    }
    // The plan as read here, in the plan JSON the service reads.
    q.plan = PlanToJson(*plan, Prediction{}, (*ctx)->cluster(),
                        (*ctx)->catalog(), (*ctx)->model(), (*ctx)->training());
    absl::StatusOr<EvaluateAnswer> answer = (*client)->Evaluate(q);
    if (!answer.ok()) return Fail(err, answer.status());
    if (absl::Status s = PrintRemotePlan(
            out, f, **ctx, answer->plan, "evaluate",
            absl::ToDoubleSeconds(absl::Now() - start), nullptr);
        !s.ok()) {
      return Fail(err, s);
    }
    return kExitOk;
  }
  if (absl::Status s = ValidatePlan(*plan, (*ctx)->cost_model()); !s.ok()) {
    return Fail(err, absl::Status(s.code(), absl::StrCat(plan_file, ": plan rejected: ",
                                                          s.message())));
  }
  absl::StatusOr<Prediction> p = (*ctx)->cost_model().Predict(*plan);
  if (!p.ok()) return Fail(err, p.status());
  if (absl::Status s = PrintPlan(out, f, **ctx, *plan, *p, "evaluate",
                                 absl::ToDoubleSeconds(absl::Now() - start),
                                 nullptr);
      !s.ok()) {
    return Fail(err, s);
  }
  // Against a measurement (--measured-*): on stderr in json format, so the
  // plan JSON on stdout stays one document.
  std::ostream& m = f.format == "json" ? err : out;
  if (f.measured_iteration_s > 0) {
    m << absl::StrFormat(
        "measured iteration: %.4g s, predicted %.4g s, error %s\n",
        f.measured_iteration_s, p->iteration_time_s,
        RelativeError(p->iteration_time_s, f.measured_iteration_s));
  }
  if (f.measured_peak_gib > 0) {
    m << absl::StrFormat(
        "measured peak memory: %.4g GiB per GPU, predicted %.4g GiB (max "
        "over stages), error %s\n",
        f.measured_peak_gib, p->max_memory_gib,
        RelativeError(p->max_memory_gib, f.measured_peak_gib));
  }
  return kExitOk;
}

int RunProfileShow(const std::string& model_name, const std::string& gpu_name,
                   int tp, int mbs, int seq, const std::string& kind_name,
                   const std::string& profiles_dir, const std::string& format,
                   std::ostream& out, std::ostream& err) {
  if (absl::Status s = CheckFormat(format); !s.ok()) return Fail(err, s);
  auto catalog = LoadGpuCatalog(profiles_dir);
  if (!catalog.ok()) return Fail(err, catalog.status());
  auto model = ResolveModel(model_name, profiles_dir);
  if (!model.ok()) return Fail(err, model.status());
  auto type = catalog->IndexOf(gpu_name);
  if (!type.ok()) return Fail(err, type.status());
  LayerKind kind = model->is_moe() ? LayerKind::kMoeAttention : LayerKind::kDense;
  if (!kind_name.empty()) {
    auto k = ParseLayerKind(kind_name);
    if (!k.ok()) return Fail(err, k.status());
    kind = *k;
  }
  // The ranges plans use (TP degrees and micro-batch sizes the cost model
  // prices); beyond them the figures would be extrapolations nobody plans
  // with, and large values overflow the byte counts.
  if (Log2Exact(tp) < 0 || Log2Exact(tp) > kMaxTpLog2) {
    return Fail(err, absl::InvalidArgumentError(
                         absl::StrCat("--tp: must be a power of two in 1..",
                                      1 << kMaxTpLog2, ", got ", tp)));
  }
  if (mbs < 1 || mbs > (1 << kMaxMbsLog2)) {
    return Fail(err,
                absl::InvalidArgumentError(absl::StrCat(
                    "--mbs: must be in 1..", 1 << kMaxMbsLog2, ", got ", mbs)));
  }
  if (seq < 1 || seq > kMaxProfileSeq) {
    return Fail(err,
                absl::InvalidArgumentError(absl::StrCat(
                    "--seq: must be in 1..", kMaxProfileSeq, ", got ", seq)));
  }
  ProfileStore store;
  if (absl::Status s = LoadProfileFiles(profiles_dir, *catalog, &store); !s.ok())
    return Fail(err, s);
  const GpuType& gpu = catalog->type(*type);
  const std::string profile_model =
      model->profile_name.empty() ? model->name : model->profile_name;
  ProfileKey key{profile_model, kind, gpu.id, tp, mbs, seq};
  const ProfileEntry* entry = store.Find(key);
  ProfileEntry synthesized;
  if (entry == nullptr) {
    auto calibration = LoadCalibration(profiles_dir);
    if (!calibration.ok()) return Fail(err, calibration.status());
    auto e = ProfileSynthesizer(calibration->For(gpu))
                 .Synthesize(*model, kind, gpu, tp, mbs, seq);
    if (!e.ok()) return Fail(err, e.status());
    synthesized = *e;
    entry = &synthesized;
  }
  if (format == "json") {
    nlohmann::json j = {{"model", model->name},
                        {"layer_kind", std::string(LayerKindName(kind))},
                        {"gpu", gpu.id},
                        {"tp", tp},
                        {"mbs", mbs},
                        {"seq", seq},
                        {"fwd_ms", entry->fwd_ms},
                        {"bwd_ms", entry->bwd_ms},
                        {"tp_comm_ms", entry->tp_comm_ms},
                        {"activation_bytes", entry->activation_bytes},
                        {"param_count", entry->param_count},
                        {"source", std::string(ProfileSourceName(entry->source))}};
    out << j.dump(2) << "\n";
  } else {
    out << absl::StrFormat(
        "%s %s layer on %s, tp %d, micro-batch %d, seq %d (%s)\n"
        "  fwd_ms            %.4f\n  bwd_ms            %.4f\n"
        "  tp_comm_ms        %.4f\n  activation_bytes  %d\n"
        "  param_count       %d\n",
        model->name, LayerKindName(kind), gpu.id, tp, mbs, seq,
        ProfileSourceName(entry->source), entry->fwd_ms, entry->bwd_ms,
        entry->tp_comm_ms, entry->activation_bytes, entry->param_count);
  }
  return kExitOk;
}

int RunModels(const std::string& profiles_dir, const std::string& format,
              std::ostream& out, std::ostream& err) {
  if (absl::Status s = CheckFormat(format); !s.ok()) return Fail(err, s);
  auto models = LoadModelCatalog(profiles_dir);
  if (!models.ok()) return Fail(err, models.status());
  if (format == "json") {
    nlohmann::json j = nlohmann::json::array();
    for (const ModelSpec& m : *models) {
      nlohmann::json e = ModelToJson(m);
      e["total_params"] = m.TotalParams();
      j.push_back(e);
    }
    out << j.dump(2) << "\n";
    return kExitOk;
  }
  out << absl::StrFormat("%-16s %-24s %7s %6s %6s %8s %9s  %s\n", "model",
                         "architecture", "params", "layers", "hidden", "heads",
                         "vocab", "experts");
  for (const ModelSpec& m : *models) {
    out << absl::StrFormat(
        "%-16s %-24s %6.1fB %6d %6d %4d/%-3d %9d  %s\n", m.name,
        m.architecture, m.TotalParams() / 1e9, m.num_layers, m.hidden,
        m.num_heads, m.num_kv_heads, m.vocab,
        m.is_moe() ? absl::StrFormat("%d top-%d", m.moe.num_experts, m.moe.top_k)
                   : "-");
  }
  return kExitOk;
}

int RunGpus(const std::string& profiles_dir, const std::string& format,
            std::ostream& out, std::ostream& err) {
  if (absl::Status s = CheckFormat(format); !s.ok()) return Fail(err, s);
  auto catalog = LoadGpuCatalog(profiles_dir);
  if (!catalog.ok()) return Fail(err, catalog.status());
  if (format == "json") {
    nlohmann::json j = nlohmann::json::array();
    for (const GpuType& t : catalog->types()) j.push_back(GpuTypeToJson(t));
    out << j.dump(2) << "\n";
    return kExitOk;
  }
  out << absl::StrFormat("%-13s %9s %7s %8s %9s %-8s %5s %6s\n", "gpu",
                         "bf16 TF/s", "mem GiB", "HBM GB/s", "link GB/s",
                         "link", "/node", "$/h");
  for (const GpuType& t : catalog->types()) {
    out << absl::StrFormat("%-13s %9.1f %7.0f %8.0f %9.0f %-8s %5d %6.2f\n",
                           t.id, t.peak_bf16_tflops, t.memory_gib, t.hbm_gbps,
                           t.intra_node_gbps, t.intra_node_link,
                           t.default_gpus_per_node, t.usd_per_hour);
  }
  return kExitOk;
}

// --controller and its credentials, for status, watch, drain and replan.
struct ControllerFlags {
  std::string controller;  // HOST:PORT of arachne-controller
  std::string token_file;
  std::string tls_ca, tls_cert, tls_key;
};

void AddControllerFlags(CLI::App* cmd, ControllerFlags* f) {
  cmd->add_option("--controller", f->controller,
                  "HOST:PORT of a running arachne-controller")
      ->required();
  cmd->add_option("--token-file", f->token_file,
                  "file holding the bearer token the controller requires "
                  "(sent as 'authorization: Bearer <token>')");
  cmd->add_option("--tls-ca", f->tls_ca,
                  "CA certificate (PEM) to verify the controller's TLS "
                  "certificate; without it the connection is plaintext");
  cmd->add_option("--tls-cert", f->tls_cert,
                  "client certificate (PEM) for mutual TLS");
  cmd->add_option("--tls-key", f->tls_key, "key (PEM) of --tls-cert");
}

// The client library names its settings (address, token_file, ...); the
// user typed flags, so errors name those.
absl::Status NameFlag(const absl::Status& s) {
  static constexpr std::pair<absl::string_view, absl::string_view> kFlags[] = {
      {"address: ", "--controller: "},
      {"token_file: ", "--token-file: "},
      {"tls_ca_file: ", "--tls-ca: "},
      {"tls_cert_file, tls_key_file: ", "--tls-cert, --tls-key: "},
      {"tls_cert_file: ", "--tls-cert: "},
      {"tls_key_file: ", "--tls-key: "}};
  for (const auto& [field, flag] : kFlags) {
    if (absl::StartsWith(s.message(), field)) {
      return absl::Status(
          s.code(), absl::StrCat(flag, s.message().substr(field.size())));
    }
  }
  return s;
}

absl::StatusOr<std::unique_ptr<ControllerClient>> ConnectController(
    const ControllerFlags& f) {
  ControllerClientConfig config;
  config.address = f.controller;
  config.token_file = f.token_file;
  config.tls_ca_file = f.tls_ca;
  config.tls_cert_file = f.tls_cert;
  config.tls_key_file = f.tls_key;
  absl::StatusOr<std::unique_ptr<ControllerClient>> client =
      MakeGrpcControllerClient(config);
  if (!client.ok()) return NameFlag(client.status());
  return client;
}

// Errors of a controller call: exit 2 for what the user can fix by what
// they typed (a wrong node, a missing token), 1 for a controller that
// cannot be reached or failed.
int FailController(std::ostream& err, const absl::Status& s) {
  if (s.code() == absl::StatusCode::kUnauthenticated) {
    err << "error: " << s.message() << "\n";
    return kExitBadInput;
  }
  return Fail(err, s);
}

int RunStatusCommand(const ControllerFlags& f, const std::string& format,
              std::ostream& out, std::ostream& err) {
  if (absl::Status s = CheckFormat(format); !s.ok()) return Fail(err, s);
  absl::StatusOr<std::unique_ptr<ControllerClient>> client =
      ConnectController(f);
  if (!client.ok()) return Fail(err, client.status());
  absl::StatusOr<v1::GetStatusResponse> status = (*client)->GetStatus();
  if (!status.ok()) return FailController(err, status.status());
  if (format == "json") {
    out << ControllerStatusJson(*status) << "\n";
  } else {
    out << RenderControllerStatus(*status, f.controller, absl::LocalTimeZone());
  }
  return kExitOk;
}

int RunWatch(const ControllerFlags& f, int64_t after, int64_t max_events,
             const std::string& format, std::ostream& out, std::ostream& err) {
  if (absl::Status s = CheckFormat(format); !s.ok()) return Fail(err, s);
  if (after < 0) {
    return Fail(err, absl::InvalidArgumentError(
                         absl::StrCat("--after: must be >= 0, got ", after)));
  }
  if (max_events < 0) {
    return Fail(err, absl::InvalidArgumentError(absl::StrCat(
                         "--max-events: must be >= 0, got ", max_events)));
  }
  absl::StatusOr<std::unique_ptr<ControllerClient>> client =
      ConnectController(f);
  if (!client.ok()) return Fail(err, client.status());
  // The stream does not say when it is up; a status call first turns a
  // wrong address or token into an error at once rather than a silent wait.
  if (absl::StatusOr<v1::GetStatusResponse> status = (*client)->GetStatus();
      !status.ok()) {
    return FailController(err, status.status());
  }
  int64_t seen = 0;
  const absl::TimeZone zone = absl::LocalTimeZone();
  absl::Status s = (*client)->WatchEvents(after, [&](const v1::Event& e) {
    out << (format == "json" ? EventJson(e) : RenderEvent(e, zone)) << "\n";
    out.flush();  // one line per event, as it happens, also into a pipe
    return max_events == 0 || ++seen < max_events;
  });
  if (!s.ok()) return FailController(err, s);
  return kExitOk;
}

int RunDrain(const ControllerFlags& f, const std::string& node,
             double deadline_s, std::ostream& out, std::ostream& err) {
  if (!(deadline_s > 0) || !std::isfinite(deadline_s)) {
    return Fail(err, absl::InvalidArgumentError(absl::StrCat(
                         "--deadline-s: must be > 0 seconds, got ", deadline_s)));
  }
  absl::StatusOr<std::unique_ptr<ControllerClient>> client =
      ConnectController(f);
  if (!client.ok()) return Fail(err, client.status());
  if (absl::Status s = (*client)->DrainNode(node, deadline_s); !s.ok()) {
    return FailController(err, s);
  }
  out << absl::StrFormat(
      "draining %s: its state moves off within %.0f s (follow with arachne "
      "watch --controller %s)\n",
      node, deadline_s, f.controller);
  return kExitOk;
}

int RunReplan(const ControllerFlags& f, const std::string& reason,
              std::ostream& out, std::ostream& err) {
  absl::StatusOr<std::unique_ptr<ControllerClient>> client =
      ConnectController(f);
  if (!client.ok()) return Fail(err, client.status());
  if (absl::Status s = (*client)->RequestReplan(reason); !s.ok()) {
    return FailController(err, s);
  }
  out << "replan requested\n";
  return kExitOk;
}

// Flags of `arachne bench` beyond BenchOptions.
struct BenchFlags {
  BenchOptions options;
  std::string out_dir = "bench-results";
  std::string plot_script;  // "": plot_results.py next to the suite dir
  bool no_plots = false;
};

int RunBenchCommand(const BenchFlags& f, std::ostream& out,
                    std::ostream& err) {
  BenchOptions options = f.options;
  options.partial_csv =
      (std::filesystem::path(f.out_dir) / "results.partial.csv").string();
  absl::StatusOr<BenchResults> results = RunBench(options, err);
  if (!results.ok()) return Fail(err, results.status());
  if (absl::Status s = WriteBenchOutputs(*results, f.out_dir); !s.ok()) {
    return Fail(err, s);
  }
  std::error_code ec;
  std::filesystem::remove(options.partial_csv, ec);
  int ok = 0, no_plan = 0, errors = 0;
  for (const BenchRun& run : results->runs) {
    if (run.status == RunStatus::kOk) ++ok;
    if (run.status == RunStatus::kNoPlan) ++no_plan;
    if (run.status == RunStatus::kError) ++errors;
  }
  if (errors > 0) {
    err << "bench: " << errors
        << " runs failed with an error (a planner bug or an invalid plan); "
           "see the status and message columns of results.csv\n";
  }
  bool plotted = false;
  if (f.no_plots) {
    err << "bench: plots skipped (--no-plots); draw them with: python3 "
           "bench/plot_results.py "
        << f.out_dir << "\n";
  } else {
    std::string script = f.plot_script;
    if (script.empty()) {
      script = (std::filesystem::path(f.options.suite_dir) / ".." /
                "plot_results.py")
                   .lexically_normal()
                   .string();
    }
    plotted = DrawPlots(script, f.out_dir, err);
  }
  out << absl::StrFormat(
      "bench: %d runs (%d ok, %d no plan, %d error) in %.1f s; wrote %s "
      "(results.csv, results.md%s)\n",
      results->runs.size(), ok, no_plan, errors, results->wall_s, f.out_dir,
      plotted ? ", plots" : "");
  return kExitOk;
}

// `arachne train ARGS` and `arachne profile measure ARGS`: training and
// timing layers need LibTorch, which this binary does not load, so they
// exec `arachne-train ARGS` / `arachne-profile ARGS` from the running
// binary's directory (built beside it in LibTorch builds). `first_arg` is
// the index of the first argument passed on. Returns only on error.
int ExecBeside(const std::string& tool, const std::string& command,
               int first_arg, int argc, const char* const* argv,
               std::ostream& out, std::ostream& err) {
  std::error_code ec;
  const std::filesystem::path self =
      std::filesystem::read_symlink("/proc/self/exe", ec);
  if (ec) {
    err << "error: arachne " << command
        << ": cannot find this binary's directory (/proc/self/exe: "
        << ec.message() << ")\n";
    return kExitInternal;
  }
  const std::string path = (self.parent_path() / tool).string();
  if (access(path.c_str(), X_OK) != 0) {
    err << "error: arachne " << command << " runs " << path << ", which "
        << (errno == ENOENT ? "does not exist" : std::strerror(errno))
        << " (" << tool << " is built only with LibTorch: "
           "cmake --build build --target " << tool << ")\n";
    return kExitBadInput;
  }
  std::vector<char*> args;
  args.push_back(const_cast<char*>(path.c_str()));
  for (int i = first_arg; i < argc; ++i)
    args.push_back(const_cast<char*>(argv[i]));
  args.push_back(nullptr);
  out.flush();
  err.flush();
  execv(path.c_str(), args.data());
  err << "error: arachne " << command << ": cannot run " << path << ": "
      << std::strerror(errno) << "\n";
  return kExitInternal;
}

}  // namespace

int FailCommand(std::ostream& err, const absl::Status& s) {
  err << "error: " << s.message() << "\n";
  switch (s.code()) {
    case absl::StatusCode::kInvalidArgument:
    case absl::StatusCode::kNotFound:
    case absl::StatusCode::kFailedPrecondition:
    case absl::StatusCode::kOutOfRange:
    case absl::StatusCode::kAlreadyExists:
    case absl::StatusCode::kPermissionDenied:
      return kExitBadInput;
    default:
      return kExitInternal;
  }
}

int RunCli(int argc, const char* const* argv, std::ostream& out,
           std::ostream& err) {
  if (argc >= 2 && std::string(argv[1]) == "train") {
    return ExecBeside("arachne-train", "train", 2, argc, argv, out, err);
  }
  if (argc >= 3 && std::string(argv[1]) == "profile" &&
      std::string(argv[2]) == "measure") {
    return ExecBeside("arachne-profile", "profile measure", 3, argc, argv, out,
                      err);
  }
  CLI::App app{"arachne: parallelism plans for heterogeneous GPU clusters"};
  app.require_subcommand(1);

  InputFlags plan_flags;
  std::string planner;  // "": the default planner
  std::string objective = "throughput";
  double budget_s = 0;  // read only when --budget is given
  int max_depth = 16, max_templates = 3;
  int64_t max_evaluations = 0;
  int rollouts = -1;
  CLI::App* plan = app.add_subcommand("plan", "plan a model on a cluster");
  AddInputFlags(plan, &plan_flags);
  RemoteFlags plan_remote;
  AddRemoteFlags(plan, &plan_remote);
  plan->add_option("--planner", planner,
                   "exact, amp, espresso, hexiscale, metis, sailor, random, "
                   "learned or template-search (the learned planner's search "
                   "with a uniform policy; docs/planners.md); default: "
                   "learned where a policy serves the model, else "
                   "template-search");
  plan->add_option("--objective", objective,
                   "throughput (default) or usd_per_token: what the best plan "
                   "maximises / minimises (docs/planners.md#objectives)");
  CLI::Option* budget_option = plan->add_option(
      "--budget", budget_s,
      "search budget in seconds (default: 0.9 for learned, template-search "
      "and the default planner, 60 for the others)");
  plan->add_option("--max-depth", max_depth, "deepest pipeline (Dmax)");
  plan->add_option("--max-templates", max_templates, "most templates per plan");
  plan->add_option("--max-evaluations", max_evaluations,
                   "stop after this many plan evaluations (0: no limit)");
  CLI::Option* rollouts_option =
      plan->add_option("--rollouts", rollouts,
                       "learned and the default planner: sampled rollouts "
                       "after the greedy one (default 256); its latency "
                       "budget is --budget, at most 0.9 s");

  InputFlags eval_flags;
  std::string plan_file;
  CLI::App* evaluate =
      app.add_subcommand("evaluate", "price a plan file, or say why it is invalid");
  AddInputFlags(evaluate, &eval_flags);
  RemoteFlags eval_remote;
  AddRemoteFlags(evaluate, &eval_remote);
  evaluate->add_option("--plan", plan_file, "plan JSON (as plan --format json)")
      ->required();
  evaluate->add_option("--measured-iteration-s", eval_flags.measured_iteration_s,
                       "measured iteration time: print the prediction's "
                       "relative error against it")
      ->check(PositiveMeasurement());
  evaluate->add_option("--measured-peak-gib", eval_flags.measured_peak_gib,
                       "measured peak memory per GPU (GiB): print the "
                       "prediction's relative error against it")
      ->check(PositiveMeasurement());

  CLI::App* profile = app.add_subcommand("profile", "profile entries");
  profile->require_subcommand(1);
  std::string p_model, p_gpu, p_kind, p_format = "table", profiles_dir;
  int p_tp = 1, p_mbs = 1, p_seq = 2048;
  CLI::App* show = profile->add_subcommand("show", "one layer's profile entry");
  show->add_option("--model", p_model, "model id or config.json")->required();
  show->add_option("--gpu", p_gpu, "GPU type (arachne gpus)")->required();
  show->add_option("--tp", p_tp, "tensor-parallel degree");
  show->add_option("--mbs", p_mbs, "micro-batch size");
  show->add_option("--seq", p_seq, "sequence length");
  show->add_option("--kind", p_kind,
                   "dense, moe_attention, moe_experts, embedding, lm_head");
  show->add_option("--format", p_format, "table or json");
  show->add_option("--profiles-dir", profiles_dir, "override profiles/ data");
  std::string measured_csv, json_out, md_out;
  CLI::App* calibrate = profile->add_subcommand(
      "calibrate", "fit the synthesizer to measured layer latencies");
  calibrate->add_option("--measured", measured_csv,
                        "Cephalo-format CSV of measured layer times")
      ->required();
  calibrate->add_option("--out", json_out, "write calibration.json here");
  calibrate->add_option("--report", md_out, "write the markdown report here");
  // Listed for --help only: RunCli execs arachne-profile first (ExecBeside).
  profile
      ->add_subcommand("measure",
                       "time a model's layers on this machine and write "
                       "measured profile entries: runs the arachne-profile "
                       "beside this binary, built with LibTorch; `arachne "
                       "profile measure --help`, docs/profiler.md")
      ->allow_extras();

  std::string list_format = "table";
  CLI::App* models = app.add_subcommand("models", "list the model catalog");
  models->add_option("--format", list_format, "table or json");
  models->add_option("--profiles-dir", profiles_dir, "override profiles/ data");
  CLI::App* gpus = app.add_subcommand("gpus", "list the GPU catalog");
  gpus->add_option("--format", list_format, "table or json");
  gpus->add_option("--profiles-dir", profiles_dir, "override profiles/ data");

  CalibrateFlags run_calibrate_flags;
  CLI::App* run_calibrate = AddCalibrateCommand(app, &run_calibrate_flags);

  BenchFlags bench_flags;
  CLI::App* bench = app.add_subcommand(
      "bench", "run planners over the evaluation suite (bench/scenarios)");
  bench->add_option("--suite", bench_flags.options.suite_dir,
                    "directory of scenario files")
      ->required();
  bench->add_option("--scenarios", bench_flags.options.scenario_patterns,
                    "scenario names or globs, comma-separated (default: all)")
      ->delimiter(',');
  bench->add_option("--planners", bench_flags.options.planners,
                    "planners, comma-separated (default: all registered)")
      ->delimiter(',');
  bench->add_option("--budget", bench_flags.options.budget_s,
                    "search budget per planner run, seconds")
      ->capture_default_str();
  bench->add_option("--max-evaluations", bench_flags.options.max_evaluations,
                    "stop each run after this many plan evaluations (0: no "
                    "limit; search_curve scenarios set their own)")
      ->capture_default_str();
  bench->add_option("--jobs", bench_flags.options.jobs,
                    "planner runs in parallel (0: one per hardware thread)")
      ->capture_default_str();
  bench->add_option("--max-depth", bench_flags.options.max_depth,
                    "deepest pipeline (Dmax)")
      ->capture_default_str();
  bench->add_option("--max-templates", bench_flags.options.max_templates,
                    "most templates per plan")
      ->capture_default_str();
  bench->add_option("--seed", bench_flags.options.seed, "planner seed")
      ->capture_default_str();
  bench->add_option("--profiles-dir", bench_flags.options.profiles_dir,
                    "override profiles/ data");
  bench->add_option("--out", bench_flags.out_dir, "output directory")
      ->capture_default_str();
  bench->add_option("--plot-script", bench_flags.plot_script,
                    "plotting script (default: plot_results.py beside the "
                    "suite directory)");
  bench->add_flag("--no-plots", bench_flags.no_plots,
                  "write the CSV and Markdown results only");
  std::string bench_calibration;
  bench->add_option("--calibration", bench_calibration,
                    "apply a run calibration (arachne calibrate --out) to "
                    "every scenario");

  // The live job: a running arachne-controller (docs/cli.md#the-live-job).
  ControllerFlags status_flags;
  std::string status_format = "table";
  CLI::App* status = app.add_subcommand(
      "status", "a controller's job: members, plan, progress, decisions");
  AddControllerFlags(status, &status_flags);
  status->add_option("--format", status_format, "table or json");

  ControllerFlags watch_flags;
  std::string watch_format = "table";
  int64_t watch_after = 0, watch_max_events = 0;
  CLI::App* watch = app.add_subcommand(
      "watch", "a controller's events, one line each, until interrupted");
  AddControllerFlags(watch, &watch_flags);
  watch->add_option("--format", watch_format,
                    "table (readable lines) or json (one object per line)");
  watch->add_option("--after", watch_after,
                    "only events after this sequence number (0: from the "
                    "oldest the controller kept)");
  watch->add_option("--max-events", watch_max_events,
                    "exit after this many events (0: until interrupted or "
                    "the controller ends the stream)");

  ControllerFlags drain_flags;
  std::string drain_node;
  double drain_deadline_s = 120;
  CLI::App* drain = app.add_subcommand(
      "drain", "gracefully remove a node from a controller's job");
  AddControllerFlags(drain, &drain_flags);
  drain->add_option("--node", drain_node, "the node to drain")->required();
  drain->add_option("--deadline-s", drain_deadline_s,
                    "seconds until the node goes away (e.g. a preemption "
                    "notice)")
      ->capture_default_str();

  ControllerFlags replan_flags;
  std::string replan_reason = "requested by arachne replan";
  CLI::App* replan =
      app.add_subcommand("replan", "ask a controller to replan now");
  AddControllerFlags(replan, &replan_flags);
  replan->add_option("--reason", replan_reason, "for the decision log")
      ->capture_default_str();

  // Listed for --help only: RunCli execs arachne-train first (ExecBeside).
  app.add_subcommand("train",
                     "train a model's learned policy (GRPO): runs the "
                     "arachne-train beside this binary, built with LibTorch; "
                     "`arachne train --help`")
      ->allow_extras();

  try {
    app.parse(argc, argv);
  } catch (const CLI::CallForHelp& e) {
    out << app.help();
    return kExitOk;
  } catch (const CLI::ParseError& e) {
    if (e.get_exit_code() == 0) {
      // --help on a subcommand.
      std::ostringstream help;
      app.exit(e, help, help);
      out << help.str();
      return kExitOk;
    }
    err << "error: " << e.what() << "\n";
    return kExitBadInput;
  }
  // A --profiles-dir that is not a directory must not fall back to the
  // built-in data file by file without a word.
  for (const std::string* dir :
       {&plan_flags.profiles_dir, &eval_flags.profiles_dir, &profiles_dir,
        &bench_flags.options.profiles_dir}) {
    if (absl::Status s = CheckProfilesDir(*dir, "--profiles-dir"); !s.ok()) {
      return Fail(err, s);
    }
  }
  if (*plan) {
    return RunPlan(plan_flags, plan_remote, planner, objective,
                   budget_option->count() > 0 ? std::optional<double>(budget_s)
                                              : std::nullopt,
                   max_depth, max_templates, max_evaluations,
                   rollouts_option->count() > 0 ? std::optional<int>(rollouts)
                                                : std::nullopt,
                   out, err);
  }
  if (*evaluate) {
    return RunEvaluate(eval_flags, eval_remote, plan_file, out, err);
  }
  if (*show) {
    return RunProfileShow(p_model, p_gpu, p_tp, p_mbs, p_seq, p_kind,
                          profiles_dir, p_format, out, err);
  }
  if (*calibrate) {
    auto catalog = LoadGpuCatalog(profiles_dir);
    if (!catalog.ok()) return Fail(err, catalog.status());
    auto report = CalibrateFiles(measured_csv, *catalog, json_out, md_out);
    if (!report.ok()) return Fail(err, report.status());
    out << "calibrated; wrote" << (json_out.empty() ? "" : " " + json_out)
        << (md_out.empty() ? "" : " " + md_out) << "\n";
    return kExitOk;
  }
  if (*status) return RunStatusCommand(status_flags, status_format, out, err);
  if (*watch) {
    return RunWatch(watch_flags, watch_after, watch_max_events, watch_format,
                    out, err);
  }
  if (*drain) {
    return RunDrain(drain_flags, drain_node, drain_deadline_s, out, err);
  }
  if (*replan) return RunReplan(replan_flags, replan_reason, out, err);
  if (*bench) {
    if (!bench_calibration.empty()) {
      absl::StatusOr<RunCorrections> c = LoadCalibrationFlag(
          bench_calibration, bench_flags.options.profiles_dir);
      if (!c.ok()) return Fail(err, c.status());
      bench_flags.options.calibration = *std::move(c);
    }
    return RunBenchCommand(bench_flags, out, err);
  }
  if (*run_calibrate) {
    return RunCalibrateCommand(run_calibrate_flags, out, err);
  }
  if (*models) return RunModels(profiles_dir, list_format, out, err);
  if (*gpus) return RunGpus(profiles_dir, list_format, out, err);
  return kExitInternal;
}

}  // namespace arachne
