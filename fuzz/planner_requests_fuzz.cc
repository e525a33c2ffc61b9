// The planning service's requests (arachne.v1.Planner: Plan, Evaluate,
// Replan) as the server receives them: the first byte picks the RPC, the
// rest is the request's wire bytes (ParseFromString). A request that parses
// goes through what the service checks before any search: the options
// (ValidatePlanningOptions, Plan and Replan), the model
// (ResolveModelRef, catalog name or hf_config_json), the training
// (ResolveTraining), each cluster (ClusterFromMessage) and each plan
// (PlanProtoToJson, then PlanFromJson on its cluster). Each step is a
// precise InvalidArgument or a value; no planner runs.
#include <cstddef>
#include <cstdint>
#include <string>

#include "arachne/v1/planner.pb.h"
#include "fuzz/fuzz_checks.h"
#include "google/protobuf/stubs/logging.h"
#include "planner_service/api/planner_handler_impl.h"
#include "planner_service/api/proto_convert.h"
#include "planner_service/core/planning_options.h"
#include "planner_service/io/cluster_io.h"
#include "planner_service/io/gpu_catalog_io.h"
#include "planner_service/io/model_io.h"
#include "planner_service/io/plan_io.h"

namespace arachne {
namespace {

const GpuCatalog& Catalog() {
  static const GpuCatalog* const catalog = new GpuCatalog(*LoadGpuCatalog());
  return *catalog;
}

const std::vector<ModelSpec>& Models() {
  static const auto* const models =
      new std::vector<ModelSpec>(*LoadModelCatalog());
  return *models;
}

void ResolveModelAndTraining(const v1::ModelRef& model,
                             const v1::TrainingConfig& training) {
  fuzz::CheckInputError(
      ResolveModelRef(ModelRefFromProto(model), Models()).status(), "model");
  fuzz::CheckInputError(ResolveTraining(TrainingFromProto(training)).status(),
                        "training");
}

// The options as the service checks them (core/planning_options.h).
void CheckOptions(const v1::PlannerOptions& o) {
  fuzz::CheckInputError(ValidatePlanningOptions(PlanningOptionsFromProto(o),
                                                kRequestOptionNames),
                        "options");
}

// The cluster, and the plan on it when both resolve.
void ResolveClusterAndPlan(const v1::Cluster& cluster_message,
                           absl::string_view cluster_field,
                           const v1::Plan* plan_message,
                           absl::string_view plan_field) {
  absl::StatusOr<Cluster> cluster =
      ClusterFromMessage(cluster_message, Catalog(), "", cluster_field);
  fuzz::CheckInputError(cluster.status(), cluster_field);
  if (!cluster.ok() || plan_message == nullptr) return;
  absl::StatusOr<Plan> plan = PlanFromJson(PlanProtoToJson(*plan_message),
                                           *cluster, Catalog(), plan_field);
  fuzz::CheckInputError(plan.status(), plan_field);
}

}  // namespace
}  // namespace arachne

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  using namespace arachne;
  // Protobuf logs every string field that is not UTF-8 before refusing the
  // message: hundreds of MB of log per campaign, and slower fuzzing.
  static const bool quiet = [] {
    google::protobuf::SetLogHandler(
        [](google::protobuf::LogLevel, const char*, int, const std::string&) {});
    return true;
  }();
  (void)quiet;
  if (size == 0) return 0;
  const std::string bytes(reinterpret_cast<const char*>(data) + 1, size - 1);
  switch (data[0] % 3) {
    case 0: {
      v1::PlanRequest request;
      if (!request.ParseFromString(bytes)) return 0;
      CheckOptions(request.options());
      ResolveModelAndTraining(request.model(), request.training());
      ResolveClusterAndPlan(request.cluster(), "cluster", nullptr, "");
      break;
    }
    case 1: {
      v1::EvaluateRequest request;
      if (!request.ParseFromString(bytes)) return 0;
      ResolveModelAndTraining(request.model(), request.training());
      ResolveClusterAndPlan(request.cluster(), "cluster", &request.plan(),
                            "plan");
      break;
    }
    case 2: {
      v1::ReplanRequest request;
      if (!request.ParseFromString(bytes)) return 0;
      CheckOptions(request.options());
      ResolveModelAndTraining(request.model(), request.training());
      ResolveClusterAndPlan(request.new_cluster(), "new_cluster", nullptr, "");
      ResolveClusterAndPlan(request.current_cluster(), "current_cluster",
                            &request.current_plan(), "current_plan");
      break;
    }
  }
  return 0;
}
