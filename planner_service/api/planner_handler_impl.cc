#include "planner_service/api/planner_handler_impl.h"

#include <algorithm>
#include <utility>

#include "absl/container/flat_hash_map.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "glog/logging.h"
#include "migration/core/diff.h"
#include "migration/core/schedule.h"
#include "migration/core/state_layout.h"
#include "planner_service/core/model/cluster.h"
#include "planner_service/core/cost/plan_validation.h"
#include "planner_service/core/planners/planner.h"
#include "planner_service/core/planners.h"
#include "planner_service/core/planning_options.h"
#include "planner_service/io/cluster_io.h"
#include "planner_service/io/framework_io.h"
#include "planner_service/io/gpu_catalog_io.h"
#include "planner_service/io/model_io.h"
#include "planner_service/io/plan_io.h"
#include "planner_service/io/planning_context.h"
#include "planner_service/io/run_corrections_io.h"

namespace arachne {
namespace {

// Keeps the code, puts `prefix` (a field path) before the message.
absl::Status Prefixed(const absl::Status& s, absl::string_view prefix) {
  return absl::Status(s.code(), absl::StrCat(prefix, ": ", s.message()));
}

// Time kept back from the caller's deadline to serialize and send the answer.
constexpr absl::Duration kDeadlineReserve = absl::Milliseconds(20);
// Share of the time to a Replan's deadline its search may use; the rest is
// for re-pricing the current plan and the migration estimate.
constexpr double kReplanSearchShare = 0.75;

// A plan's counts against what the model and cluster allow, before the plan
// is read: a stage holds at least one layer and a replica's stage at least
// one GPU, so a template with more stages than the model has layers, or
// more stage placements than the cluster has GPUs, is refused in time
// proportional to the number of templates, not to what it lists.
absl::Status CheckPlanCounts(const nlohmann::json& plan, const ModelSpec& model,
                             const Cluster& cluster, absl::string_view field) {
  if (!plan.is_object() || !plan.contains("templates") ||
      !plan["templates"].is_array()) {
    return absl::OkStatus();  // the plan reader says what is wrong
  }
  const nlohmann::json& templates = plan["templates"];
  for (size_t t = 0; t < templates.size(); ++t) {
    const nlohmann::json& tmpl = templates[t];
    if (!tmpl.is_object()) continue;
    const std::string where = absl::StrCat(field, ": templates[", t, "]");
    size_t stages = 0;
    if (tmpl.contains("stages") && tmpl["stages"].is_array()) {
      stages = tmpl["stages"].size();
      if (stages > static_cast<size_t>(model.num_layers)) {
        return absl::InvalidArgumentError(absl::StrCat(
            where, ".stages: ", stages, " stages for a model of ",
            model.num_layers, " layers (a stage holds at least one)"));
      }
    }
    if (tmpl.contains("placement") && tmpl["placement"].is_array()) {
      const size_t rows = tmpl["placement"].size();
      if (rows * std::max<size_t>(stages, 1) >
          static_cast<size_t>(cluster.total_gpus())) {
        return absl::InvalidArgumentError(
            absl::StrCat(where, ".placement: ", rows, " replicas of ", stages,
                         " stages need more GPUs than the cluster's ",
                         cluster.total_gpus()));
      }
    }
  }
  return absl::OkStatus();
}

}  // namespace

absl::StatusOr<TrainingConfig> ResolveTraining(const TrainingSpec& spec) {
  // The message's own reader, so requests, job files and plan files check
  // a training config alike.
  v1::TrainingConfig message;
  message.set_seq_len(spec.seq_len);
  message.set_global_batch(spec.global_batch);
  message.set_precision(spec.precision);
  message.set_recompute(spec.recompute);
  message.set_distributed_optimizer(spec.distributed_optimizer);
  *message.mutable_framework() = spec.framework;
  return TrainingFromMessage(message, "", "training");
}

absl::StatusOr<CostParams> ResolveCostParams(const TrainingSpec& spec,
                                             const GpuCatalog& catalog) {
  absl::StatusOr<RunCorrections> corrections =
      CorrectionsFromMessage(spec.calibration, catalog, "calibration");
  if (!corrections.ok()) return corrections.status();
  CostParams params;
  TrainingConfig framework_untouched;  // the scales only: no framework field
  ApplyCorrections(*corrections, &framework_untouched, &params);
  return params;
}

absl::StatusOr<ModelSpec> ResolveModelRef(
    const ModelRef& ref, const std::vector<ModelSpec>& models) {
  if (!ref.hf_config_json.empty()) {
    // The request's text through the readers' limits (size, depth, UTF-8,
    // numbers that fit a double), with the position of a syntax error.
    const std::string name = ref.name.empty() ? "custom" : ref.name;
    absl::StatusOr<ModelSpec> m = ModelFromHfConfigText(
        ref.hf_config_json, name, "model.hf_config_json");
    if (!m.ok()) {
      return absl::InvalidArgumentError(m.status().message());
    }
    return m;
  }
  // Catalog names only: unlike the CLI's --model, the service never reads a
  // path on the server's disk.
  for (const ModelSpec& m : models) {
    if (absl::EqualsIgnoreCase(m.name, ref.name)) return m;
  }
  std::vector<std::string> names;
  for (const ModelSpec& m : models) names.push_back(m.name);
  return absl::InvalidArgumentError(absl::StrCat(
      "model.name: unknown model \"", ref.name, "\" (known: ",
      absl::StrJoin(names, ", "), "; or give model.hf_config_json)"));
}

absl::StatusOr<std::unique_ptr<PlannerHandlerImpl>> PlannerHandlerImpl::Create(
    const PlannerHandlerConfig& config) {
  if (config.default_budget <= absl::ZeroDuration() ||
      config.max_budget < config.default_budget) {
    return absl::InvalidArgumentError(
        absl::StrCat("budgets: need 0 < default (",
                     absl::FormatDuration(config.default_budget), ") <= max (",
                     absl::FormatDuration(config.max_budget), ")"));
  }
  if (absl::Status s = CheckProfilesDir(config.profiles_dir, "profiles_dir");
      !s.ok()) {
    return s;
  }
  absl::StatusOr<GpuCatalog> catalog = LoadGpuCatalog(config.profiles_dir);
  if (!catalog.ok()) return catalog.status();
  absl::StatusOr<std::vector<ModelSpec>> models =
      LoadModelCatalog(config.profiles_dir);
  if (!models.ok()) return models.status();
  return std::unique_ptr<PlannerHandlerImpl>(
      new PlannerHandlerImpl(config, *std::move(catalog), *std::move(models)));
}

absl::StatusOr<Cluster> PlannerHandlerImpl::ResolveCluster(
    const ClusterSpec& spec, absl::string_view field_name) const {
  // The reader of cluster files, so a request and a file mean the same.
  return ClusterFromMessage(spec, catalog_, "", field_name);
}

absl::StatusOr<ModelSpec> PlannerHandlerImpl::ResolveModel(
    const ModelRef& ref) const {
  return ResolveModelRef(ref, models_);
}

absl::Status PlannerHandlerImpl::CheckPlanOptions(const PlanQuery& q) {
  PlanningOptionsInput o;
  o.planner = q.planner;
  o.budget_s = q.budget_s;
  o.max_evaluations = q.max_evaluations;
  o.max_depth = q.max_depth;
  o.max_templates = q.max_templates;
  o.objective = static_cast<int64_t>(q.objective);
  // -1 is PlanQuery's "not given"; the RPC glue checks the message itself
  // first (PlannerOptionsInputFromProto), where an explicit -1 is caught.
  if (q.policy_rollouts != -1) o.policy_rollouts = q.policy_rollouts;
  return ValidatePlanningOptions(o, kRequestOptionNames);
}

absl::Status PlannerHandlerImpl::CheckModelTrainingOptions(
    const PlanQuery& q) const {
  if (absl::Status s = CheckPlanOptions(q); !s.ok()) return s;
  if (q.model.hf_config_json.empty()) {
    if (absl::StatusOr<ModelSpec> m = ResolveModel(q.model); !m.ok()) {
      return m.status();
    }
  }
  if (absl::Status s = ResolveTraining(q.training).status(); !s.ok()) return s;
  return ResolveCostParams(q.training, catalog_).status();
}

absl::Status PlannerHandlerImpl::CheckPlan(const PlanQuery& q) const {
  if (absl::Status s = CheckModelTrainingOptions(q); !s.ok()) return s;
  return ResolveCluster(q.cluster, "cluster").status();
}

absl::Status PlannerHandlerImpl::CheckEvaluate(const EvaluateQuery& q) const {
  if (q.model.hf_config_json.empty()) {
    if (absl::StatusOr<ModelSpec> m = ResolveModel(q.model); !m.ok()) {
      return m.status();
    }
  }
  if (absl::Status s = ResolveTraining(q.training).status(); !s.ok()) return s;
  if (absl::Status s = ResolveCostParams(q.training, catalog_).status();
      !s.ok()) {
    return s;
  }
  return ResolveCluster(q.cluster, "cluster").status();
}

absl::Status PlannerHandlerImpl::CheckReplan(const ReplanQuery& q) const {
  if (absl::Status s = CheckModelTrainingOptions(q.plan); !s.ok()) return s;
  if (absl::Status s =
          ResolveCluster(q.current_cluster, "current_cluster").status();
      !s.ok()) {
    return s;
  }
  return ResolveCluster(q.plan.cluster, "new_cluster").status();
}

absl::StatusOr<PlanAnswer> PlannerHandlerImpl::Plan(const PlanQuery& q) {
  const absl::Time start = absl::Now();
  if (absl::Status s = CheckPlanOptions(q); !s.ok()) return s;
  absl::StatusOr<ModelSpec> model = ResolveModel(q.model);
  if (!model.ok()) return model.status();
  absl::StatusOr<TrainingConfig> training = ResolveTraining(q.training);
  if (!training.ok()) return training.status();
  absl::StatusOr<CostParams> params = ResolveCostParams(q.training, catalog_);
  if (!params.ok()) return params.status();
  absl::StatusOr<Cluster> cluster = ResolveCluster(q.cluster, "cluster");
  if (!cluster.ok()) return cluster.status();
  absl::StatusOr<std::unique_ptr<PlanningContext>> ctx =
      PlanningContext::Create(catalog_, *model, *training, *cluster,
                              config_.profiles_dir, *params);
  if (!ctx.ok()) return ctx.status();
  return RunPlanner(**ctx, q, start, /*plan=*/nullptr);
}

absl::StatusOr<PlanAnswer> PlannerHandlerImpl::RunPlanner(
    const PlanningContext& ctx, const PlanQuery& q, absl::Time start,
    arachne::Plan* plan) const {
  // No planner named: learned where a policy serves the model, else
  // template-search, with the reason.
  absl::StatusOr<std::unique_ptr<Planner>> planner;
  std::string fallback_reason;
  if (q.planner.empty()) {
    DefaultPlannerChoice choice = ChooseDefaultPlanner(ctx.cost_model());
    planner = std::move(choice.planner);
    fallback_reason = std::move(choice.fallback_reason);
  } else {
    planner = MakePlanner(q.planner);
  }
  if (!planner.ok()) {
    return absl::InvalidArgumentError(
        absl::StrCat("options.planner: ", planner.status().message()));
  }
  PlannerOptions options;
  absl::Duration budget =
      q.budget_s > 0 ? absl::Seconds(q.budget_s)
                     : DefaultBudget(q.planner, config_.default_budget);
  // The learned planners' default budget counts from the start of the
  // call, model, cluster and policy loading included.
  if (q.budget_s <= 0 && IsLatencyBudgeted(q.planner)) {
    budget = std::max(budget - (absl::Now() - start), absl::ZeroDuration());
  }
  budget = std::min(budget, config_.max_budget);
  bool budget_from_deadline = false;
  if (q.deadline != absl::InfiniteFuture()) {
    const absl::Duration left = q.deadline - absl::Now() - kDeadlineReserve;
    if (left <= absl::ZeroDuration()) {
      return absl::DeadlineExceededError(
          "deadline reached before the search could start");
    }
    if (left < budget) {
      budget = left;
      budget_from_deadline = true;
    }
  }
  options.budget = budget;
  options.max_evaluations = q.max_evaluations;
  options.objective = q.objective;
  options.policy_rollouts = q.policy_rollouts;
  if (q.seed != 0) options.seed = q.seed;
  if (q.max_depth > 0) options.max_depth = q.max_depth;
  if (q.max_templates > 0) options.max_templates = q.max_templates;
  options.cancelled = q.cancelled;

  absl::StatusOr<PlanResult> result =
      (*planner)->Run(ctx.cost_model(), options);
  const bool cancelled = q.cancelled != nullptr && q.cancelled->load();
  const bool out_of_time =
      budget_from_deadline && absl::Now() - start >= budget;
  if (!result.ok()) {
    // No plan yet when the caller stopped waiting: that is the deadline's
    // doing, not a model that cannot fit.
    if (cancelled || (out_of_time && result.status().code() !=
                                         absl::StatusCode::kInvalidArgument)) {
      return absl::DeadlineExceededError(absl::StrCat(
          "the deadline or a cancellation stopped the search before any plan "
          "was found (",
          result.status().message(), ")"));
    }
    return result.status();
  }
  PlanAnswer answer;
  answer.plan = PlanToJson(result->plan, result->prediction, ctx.cluster(),
                           ctx.catalog(), ctx.model(), ctx.training());
  answer.planner = result->planner;
  answer.planner_fallback_reason = std::move(fallback_reason);
  answer.evaluations = result->stats.evaluations;
  answer.exhaustive = result->stats.exhaustive;
  answer.stopped_early =
      result->stats.cancelled || (out_of_time && !result->stats.exhaustive);
  answer.planning_time_s = absl::ToDoubleSeconds(absl::Now() - start);
  answer.plan["planner"] = answer.planner;
  if (!answer.planner_fallback_reason.empty())
    answer.plan["planner_fallback_reason"] = answer.planner_fallback_reason;
  answer.plan["planning_time_s"] = answer.planning_time_s;
  answer.plan["evaluations"] = answer.evaluations;
  answer.plan["exhaustive"] = answer.exhaustive;
  if (plan != nullptr) *plan = std::move(result->plan);
  return answer;
}

absl::StatusOr<EvaluateAnswer> PlannerHandlerImpl::Evaluate(
    const EvaluateQuery& q) {
  absl::StatusOr<ModelSpec> model = ResolveModel(q.model);
  if (!model.ok()) return model.status();
  absl::StatusOr<TrainingConfig> training = ResolveTraining(q.training);
  if (!training.ok()) return training.status();
  absl::StatusOr<CostParams> params = ResolveCostParams(q.training, catalog_);
  if (!params.ok()) return params.status();
  absl::StatusOr<Cluster> cluster = ResolveCluster(q.cluster, "cluster");
  if (!cluster.ok()) return cluster.status();
  absl::StatusOr<std::unique_ptr<PlanningContext>> ctx =
      PlanningContext::Create(catalog_, *model, *training, *cluster,
                              config_.profiles_dir, *params);
  if (!ctx.ok()) return ctx.status();
  if (absl::Status s = CheckPlanCounts(q.plan, *model, *cluster, "plan");
      !s.ok()) {
    return s;
  }
  absl::StatusOr<arachne::Plan> plan =
      PlanFromJson(q.plan, (*ctx)->cluster(), (*ctx)->catalog(), "plan");
  if (!plan.ok()) return plan.status();
  if (absl::Status s = ValidatePlan(*plan, (*ctx)->cost_model()); !s.ok()) {
    return Prefixed(s, "plan");
  }
  absl::StatusOr<Prediction> p = (*ctx)->cost_model().Predict(*plan);
  if (!p.ok()) return p.status();
  EvaluateAnswer answer;
  answer.plan = PlanToJson(*plan, *p, (*ctx)->cluster(), (*ctx)->catalog(),
                           (*ctx)->model(), (*ctx)->training());
  return answer;
}

namespace {

// The current plan (node indices of `from`) with its node indices in `to`,
// matched by node name; or why it cannot run there: a node it uses left,
// changed GPU type or has too few GPUs now.
absl::StatusOr<arachne::Plan> CarryPlanByNodeName(const arachne::Plan& plan,
                                                  const Cluster& from,
                                                  const Cluster& to,
                                                  const GpuCatalog& catalog) {
  absl::flat_hash_map<std::string, int> index_in_to;
  for (int i = 0; i < to.num_nodes(); ++i) index_in_to[to.node(i).name] = i;
  arachne::Plan carried = plan;
  for (size_t t = 0; t < carried.templates.size(); ++t) {
    Template& tmpl = carried.templates[t];
    for (int r = 0; r < tmpl.replicas; ++r) {
      for (int st = 0; st < tmpl.depth(); ++st) {
        StagePlacement& p = tmpl.placement[r * tmpl.depth() + st];
        const Node& old_node = from.node(p.node);
        const std::string where =
            absl::StrCat("templates[", t, "].placement[", r, "].stages[", st, "]");
        auto it = index_in_to.find(old_node.name);
        if (it == index_in_to.end()) {
          return absl::FailedPreconditionError(absl::StrCat(
              "node \"", old_node.name,
              "\" left the cluster; the current plan uses it (", where, ")"));
        }
        const Node& new_node = to.node(it->second);
        if (new_node.gpu_type != old_node.gpu_type) {
          return absl::FailedPreconditionError(absl::StrCat(
              "node \"", old_node.name, "\" is now ",
              catalog.type(new_node.gpu_type).id, ", was ",
              catalog.type(old_node.gpu_type).id, " (", where, ")"));
        }
        for (int g : p.gpus) {
          if (g >= new_node.num_gpus) {
            return absl::FailedPreconditionError(absl::StrCat(
                "node \"", old_node.name, "\" has ", new_node.num_gpus,
                " GPUs now; the current plan uses its GPU ", g, " (", where,
                ")"));
          }
        }
        p.node = it->second;
      }
    }
  }
  return carried;
}

}  // namespace

absl::StatusOr<ReplanAnswer> PlannerHandlerImpl::Replan(const ReplanQuery& q) {
  const absl::Time start = absl::Now();
  if (absl::Status s = CheckPlanOptions(q.plan); !s.ok()) return s;
  absl::StatusOr<ModelSpec> model = ResolveModel(q.plan.model);
  if (!model.ok()) return model.status();
  absl::StatusOr<TrainingConfig> training = ResolveTraining(q.plan.training);
  if (!training.ok()) return training.status();
  absl::StatusOr<CostParams> params =
      ResolveCostParams(q.plan.training, catalog_);
  if (!params.ok()) return params.status();
  absl::StatusOr<Cluster> current_cluster =
      ResolveCluster(q.current_cluster, "current_cluster");
  if (!current_cluster.ok()) return current_cluster.status();
  absl::StatusOr<Cluster> new_cluster =
      ResolveCluster(q.plan.cluster, "new_cluster");
  if (!new_cluster.ok()) return new_cluster.status();
  if (absl::Status s = CheckPlanCounts(q.current_plan, *model, *current_cluster,
                                       "current_plan");
      !s.ok()) {
    return s;
  }
  absl::StatusOr<arachne::Plan> current_plan =
      PlanFromJson(q.current_plan, *current_cluster, catalog_, "current_plan");
  if (!current_plan.ok()) return current_plan.status();
  // The state layout checks what PlanFromJson leaves to validation: GPU
  // indices on their node, no GPU used twice, every pipeline covering the
  // model. A current plan that fails it is malformed (it cannot be what
  // runs), unlike one that no longer fits, which Replan answers.
  absl::StatusOr<migration::ModelState> state =
      migration::ModelState::Create(*model);
  if (state.ok()) {
    absl::StatusOr<migration::PlanLayout> layout =
        migration::PlanLayout::Create(*state, *current_plan, *current_cluster);
    if (!layout.ok()) {
      return absl::InvalidArgumentError(
          absl::StrCat("current_plan: ", layout.status().message()));
    }
  }
  absl::StatusOr<std::unique_ptr<PlanningContext>> ctx =
      PlanningContext::Create(catalog_, *model, *training, *new_cluster,
                              config_.profiles_dir, *params);
  if (!ctx.ok()) return ctx.status();

  ReplanAnswer answer;
  arachne::Plan new_plan;
  // The search may use only part of the time to the caller's deadline: the
  // migration estimate after it cannot be interrupted (0.25 s for LLaMA-3-8B
  // on 512 + 64 GPUs).
  PlanQuery search = q.plan;
  if (search.deadline != absl::InfiniteFuture()) {
    const absl::Time now = absl::Now();
    search.deadline = now + (search.deadline - now) * kReplanSearchShare;
  }
  absl::StatusOr<PlanAnswer> planned =
      RunPlanner(**ctx, search, start, &new_plan);
  if (!planned.ok()) return planned.status();
  answer.new_plan = *std::move(planned);

  // The current plan on the new cluster: carried by node name, then the same
  // validation and pricing as Evaluate.
  absl::StatusOr<arachne::Plan> carried = CarryPlanByNodeName(
      *current_plan, *current_cluster, (*ctx)->cluster(), catalog_);
  if (!carried.ok()) {
    answer.current.reason = std::string(carried.status().message());
  } else if (absl::Status s = ValidatePlan(*carried, (*ctx)->cost_model());
             !s.ok()) {
    answer.current.reason = std::string(s.message());
  } else if (absl::StatusOr<Prediction> p =
                 (*ctx)->cost_model().Predict(*carried);
             !p.ok()) {
    answer.current.reason = std::string(p.status().message());
  } else {
    answer.current.feasible = true;
    answer.current.plan =
        PlanToJson(*carried, *p, (*ctx)->cluster(), (*ctx)->catalog(),
                   (*ctx)->model(), (*ctx)->training());
  }

  // State that moves from the current plan (on the current cluster) to the
  // new plan; GPUs that left hold nothing.
  if (absl::Now() >= q.plan.deadline ||
      (q.plan.cancelled != nullptr && q.plan.cancelled->load())) {
    answer.migration.reason =
        "the deadline or a cancellation came before the migration estimate";
    return answer;
  }
  if (!state.ok()) {
    answer.migration.reason = std::string(state.status().message());
    return answer;
  }
  const migration::MigrationWorld world((*ctx)->cluster(), catalog_);
  absl::StatusOr<migration::StateDiff> diff =
      migration::ComputeDiff(*state, *current_plan, *current_cluster, new_plan,
                             (*ctx)->cluster(), world);
  if (!diff.ok()) {
    answer.migration.reason = std::string(diff.status().message());
    return answer;
  }
  const migration::MigrationSchedule schedule =
      migration::BuildSchedule(*diff, world);
  MigrationCost& m = answer.migration;
  m.available = true;
  m.bytes_moved = diff->bytes_moved;
  m.bytes_kept = diff->bytes_kept;
  m.naive_bytes = diff->naive_bytes;
  m.makespan_s = schedule.makespan_s;
  m.lower_bound_s = schedule.lower_bound_s;
  for (const auto* stage : {&schedule.stage1, &schedule.stage2}) {
    for (const migration::Round& round : *stage) {
      m.transfers += static_cast<int>(round.transfers.size());
    }
  }
  return answer;
}

absl::StatusOr<std::vector<ModelSpec>> PlannerHandlerImpl::ListModels() {
  return models_;
}

absl::StatusOr<std::vector<GpuType>> PlannerHandlerImpl::ListGpuTypes() {
  return catalog_.types();
}

}  // namespace arachne
