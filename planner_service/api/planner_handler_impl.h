// PlannerHandler over the planner core and io libraries: the same catalogs,
// PlanningContext, planners, ValidatePlan and PlanToJson/PlanFromJson that
// `arachne plan` / `arachne evaluate` use, so both give identical results.
#ifndef ARACHNE_PLANNER_SERVICE_API_PLANNER_HANDLER_IMPL_H_
#define ARACHNE_PLANNER_SERVICE_API_PLANNER_HANDLER_IMPL_H_

#include <memory>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "absl/time/time.h"
#include "planner_service/core/model/cluster.h"
#include "planner_service/core/model/gpu_catalog.h"
#include "planner_service/core/model/model.h"
#include "planner_service/core/model/plan.h"
#include "planner_service/io/planning_context.h"
#include "planner_service/api/planner_handler.h"

namespace arachne {

struct PlannerHandlerConfig {
  std::string profiles_dir;  // "" = the data built into the binary
  // The budget of a request without budget_s that runs a search planner
  // (exact, metis, ...); learned, template-search and the default planner
  // get their 0.9 s latency budget instead (planners.h, DefaultBudget).
  absl::Duration default_budget = absl::Seconds(10);
  // Requests asking for more are capped here (not rejected).
  absl::Duration max_budget = absl::Seconds(60);
};

class PlannerHandlerImpl : public PlannerHandler {
 public:
  // Loads the GPU and model catalogs once; errors name the file.
  static absl::StatusOr<std::unique_ptr<PlannerHandlerImpl>> Create(
      const PlannerHandlerConfig& config);

  absl::StatusOr<PlanAnswer> Plan(const PlanQuery& query) override;
  absl::StatusOr<EvaluateAnswer> Evaluate(const EvaluateQuery& query) override;
  absl::StatusOr<ReplanAnswer> Replan(const ReplanQuery& query) override;
  // A model given as hf_config_json is parsed in Plan / Evaluate / Replan
  // only: its size is the request's, not a cheap check.
  absl::Status CheckPlan(const PlanQuery& query) const override;
  absl::Status CheckEvaluate(const EvaluateQuery& query) const override;
  absl::Status CheckReplan(const ReplanQuery& query) const override;
  absl::StatusOr<std::vector<ModelSpec>> ListModels() override;
  absl::StatusOr<std::vector<GpuType>> ListGpuTypes() override;

 private:
  PlannerHandlerImpl(PlannerHandlerConfig config, GpuCatalog catalog,
                     std::vector<ModelSpec> models)
      : config_(std::move(config)),
        catalog_(std::move(catalog)),
        models_(std::move(models)) {}

  // ValidatePlanningOptions (planning_options.h) of q's options, naming the
  // request fields (options.max_depth, ...).
  static absl::Status CheckPlanOptions(const PlanQuery& q);
  // The model, training and options checks shared by CheckPlan and
  // CheckReplan; the cluster is the caller's.
  absl::Status CheckModelTrainingOptions(const PlanQuery& q) const;
  // Runs q's planner on `ctx` under q's budget, deadline and cancellation;
  // `start` is when the call began (for planning_time_s). Also returns the
  // plan in `plan` when not null.
  absl::StatusOr<PlanAnswer> RunPlanner(const PlanningContext& ctx,
                                        const PlanQuery& q, absl::Time start,
                                        arachne::Plan* plan) const;
  // `field` names the request field in errors ("cluster", "new_cluster").
  absl::StatusOr<Cluster> ResolveCluster(const ClusterSpec& spec,
                                         absl::string_view field) const;
  absl::StatusOr<ModelSpec> ResolveModel(const ModelRef& ref) const;

  // Immutable after Create, so shared by concurrent calls without a lock.
  const PlannerHandlerConfig config_;
  const GpuCatalog catalog_;
  const std::vector<ModelSpec> models_;
};

// Exposed for tests: TrainingConfig from a TrainingSpec (defaults for 0/""),
// InvalidArgument "training.<field>: ..." otherwise.
absl::StatusOr<TrainingConfig> ResolveTraining(const TrainingSpec& spec);

// Exposed for tests: the cost parameters a request's calibration sets over
// the defaults (CorrectionsFromMessage), InvalidArgument
// "calibration.<map>.<GPU>: ..." otherwise.
absl::StatusOr<CostParams> ResolveCostParams(const TrainingSpec& spec,
                                             const GpuCatalog& catalog);

// The model a request names: the Hugging Face config.json text when given
// (named ref.name, or "custom"), else the catalog entry named ref.name
// (case-insensitive). Catalog names only: a service never reads a path on
// its own disk. InvalidArgument "model.hf_config_json: ..." or "model.name:
// unknown model \"x\" (known: ...)". Shared by every service that takes a
// ModelRef (the planner, arachne-agent).
absl::StatusOr<ModelSpec> ResolveModelRef(const ModelRef& ref,
                                          const std::vector<ModelSpec>& models);

}  // namespace arachne

#endif  // ARACHNE_PLANNER_SERVICE_API_PLANNER_HANDLER_IMPL_H_
