// The planning service's handler interface, in the project's own types: no
// gRPC here, so the implementation is testable without a server and the RPC
// glue (planner_service/server/planner_service.h) only converts messages.
//
// Inputs are read by the same code that reads files, so the service and the
// CLI cannot drift apart: a cluster is the schema's Cluster message, which
// the handler resolves with ClusterFromMessage (cluster_io.h) like a cluster
// file; plans cross this interface as plan files (plan_io.h,
// docs/formats.md), the one serialization `arachne plan` and `arachne
// evaluate` use.
#ifndef ARACHNE_PLANNER_SERVICE_API_PLANNER_HANDLER_H_
#define ARACHNE_PLANNER_SERVICE_API_PLANNER_HANDLER_H_

#include <atomic>
#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "arachne/v1/planner.pb.h"
#include "nlohmann/json.hpp"
#include "planner_service/core/model/gpu_catalog.h"
#include "planner_service/core/model/model.h"
#include "planner_service/core/planners/planner.h"

namespace arachne {

// A cluster as a client names it (GPU types by name, nodes and node
// groups): the message a cluster file is read into.
using ClusterSpec = v1::Cluster;

// A catalog model by name, or a Hugging Face config.json text named `name`.
struct ModelRef {
  std::string name;
  std::string hf_config_json;
};

// Training settings as a client gives them: 0 / "" take the defaults of
// TrainingConfig.
struct TrainingSpec {
  int seq_len = 0;
  int global_batch = 0;
  std::string precision;
  std::string recompute;
  bool distributed_optimizer = false;
  // The framework as the client gives it (absent = megatron-core); resolved
  // with FrameworkFromMessage (framework_io.h).
  v1::Framework framework;
  // Measured-run corrections of the cost model (the request's calibration;
  // ResolveCostParams): empty = none.
  v1::Calibration calibration;
};

struct PlanQuery {
  ModelRef model;
  TrainingSpec training;
  ClusterSpec cluster;
  // "" = the default planner: learned where a policy serves the model,
  // else template-search (planners.h, ChooseDefaultPlanner).
  std::string planner;
  // 0 = the handler's default: 0.9 s for learned, template-search and the
  // default planner, PlannerHandlerConfig::default_budget for the others
  // (planners.h, DefaultBudget).
  double budget_s = 0;
  int64_t max_evaluations = 0;
  uint64_t seed = 0;      // 0 = 1
  int max_depth = 0;      // 0 = 16
  int max_templates = 0;  // 0 = 3
  PlannerObjective objective = PlannerObjective::kThroughput;
  // Learned planner only: sampled rollouts after the greedy one; -1 = its
  // default.
  int policy_rollouts = -1;
  // When the caller stops waiting: the search budget is capped so that the
  // answer (the best plan so far) is ready before it.
  absl::Time deadline = absl::InfiniteFuture();
  // Set by another thread when the caller goes away; stops the search. May
  // be null; must outlive the call.
  const std::atomic<bool>* cancelled = nullptr;
  std::string request_id;  // for logs
};

struct PlanAnswer {
  // The plan and its prediction in the CLI's plan JSON format.
  nlohmann::json plan;
  std::string planner;
  // Set only when the query named no planner and the default fell back to
  // template-search: one line, `no learned policy serves model "M": <why>`.
  std::string planner_fallback_reason;
  double planning_time_s = 0;
  int64_t evaluations = 0;
  bool exhaustive = false;
  bool stopped_early = false;  // by the deadline or a cancellation
};

struct EvaluateQuery {
  ModelRef model;
  TrainingSpec training;
  ClusterSpec cluster;
  nlohmann::json plan;  // the CLI's plan JSON (only `templates` is read)
  std::string request_id;
};

struct EvaluateAnswer {
  nlohmann::json plan;  // the plan with its prediction, CLI plan JSON
};

// Replan after a membership change. The current plan's placement names nodes
// of `current_cluster`; it is carried to the new cluster (`plan.cluster`) by
// node name, since a join or leave renumbers nodes but keeps their names.
struct ReplanQuery {
  // Model, training, planner options, deadline and cancellation for the new
  // plan, whose cluster (`plan.cluster`) is the new cluster.
  PlanQuery plan;
  ClusterSpec current_cluster;
  nlohmann::json current_plan;  // the CLI's plan JSON (only `templates`)
};

// The current plan on the new cluster: the controller keeps it only when
// feasible.
struct CurrentPlanVerdict {
  bool feasible = false;
  // When not feasible: which node left or changed, or why validation failed.
  std::string reason;
  nlohmann::json plan;  // when feasible: CLI plan JSON with its prediction
};

// Cost of moving the training state from the current plan to the new one
// (migration/core diff + schedule).
struct MigrationCost {
  bool available = false;
  std::string reason;  // when not available (e.g. a range has no holder)
  int64_t bytes_moved = 0;
  int64_t bytes_kept = 0;
  int64_t naive_bytes = 0;
  double makespan_s = 0;
  double lower_bound_s = 0;
  int transfers = 0;
};

struct ReplanAnswer {
  PlanAnswer new_plan;
  CurrentPlanVerdict current;
  MigrationCost migration;
};

// Thread-safe: every method may be called concurrently.
class PlannerHandler {
 public:
  virtual ~PlannerHandler() = default;

  // Best plan for the query. InvalidArgument naming the field for bad input
  // ("cluster.nodes[2].gpu: unknown GPU type \"X\" ..."), FailedPrecondition
  // saying why when the model fits on no plan (or, for the USD_PER_TOKEN
  // objective, when a GPU type of the cluster has no price),
  // DeadlineExceeded when the budget, the deadline or a cancellation came
  // before any plan was found, ResourceExhausted when max_evaluations did.
  virtual absl::StatusOr<PlanAnswer> Plan(const PlanQuery& query) = 0;

  // Prediction of the query's plan. InvalidArgument naming the field for a
  // malformed plan or one that references absent nodes or GPUs;
  // FailedPrecondition for a well-formed plan that does not fit.
  virtual absl::StatusOr<EvaluateAnswer> Evaluate(
      const EvaluateQuery& query) = 0;

  // New plan on the new cluster, the current plan re-priced there and the
  // migration cost between them. Errors as Plan for the new plan and the
  // request's fields ("new_cluster.nodes[1].gpu: ...", "current_cluster...",
  // InvalidArgument "current_plan: ..." for a malformed current plan or one
  // on nodes absent from current_cluster). That the current plan does not
  // fit the new cluster, or that no migration exists, is an answer
  // (`current.reason`, `migration.reason`), not an error.
  virtual absl::StatusOr<ReplanAnswer> Replan(const ReplanQuery& query) = 0;

  // The checks of Plan, Evaluate and Replan that need no search and no
  // planning context: the options, the training settings, a catalog model's
  // name, the clusters. Cheap (microseconds for any request that fits in a
  // message), so the service makes them before it admits a call to its
  // queue: an invalid request never waits for, nor takes, a slot of valid
  // work. The methods above make them again; errors are theirs. OK by
  // default (a handler without cheap checks).
  virtual absl::Status CheckPlan(const PlanQuery& /*query*/) const {
    return absl::OkStatus();
  }
  virtual absl::Status CheckEvaluate(const EvaluateQuery& /*query*/) const {
    return absl::OkStatus();
  }
  virtual absl::Status CheckReplan(const ReplanQuery& /*query*/) const {
    return absl::OkStatus();
  }

  virtual absl::StatusOr<std::vector<ModelSpec>> ListModels() = 0;
  virtual absl::StatusOr<std::vector<GpuType>> ListGpuTypes() = 0;
};

}  // namespace arachne

#endif  // ARACHNE_PLANNER_SERVICE_API_PLANNER_HANDLER_H_
