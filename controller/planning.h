// Where the controller's plans come from: an arachne-planner through
// planner_service/client when the job names one, else the planner library
// in process (PlannerHandlerImpl, the very code arachne-planner answers
// Plan and Replan with: the embedded default). Both answer in the same
// project types (planner_handler.h), so the controller cannot tell them
// apart.
#ifndef ARACHNE_CONTROLLER_PLANNING_H_
#define ARACHNE_CONTROLLER_PLANNING_H_

#include <memory>
#include <string>

#include "absl/status/statusor.h"
#include "planner_service/client/planner_client.h"
#include "planner_service/server/planner_handler.h"

namespace arachne::controller {

class PlanSource {
 public:
  virtual ~PlanSource() = default;
  virtual absl::StatusOr<PlanAnswer> Plan(const PlanQuery& query) = 0;
  virtual absl::StatusOr<ReplanAnswer> Replan(const ReplanQuery& query) = 0;
  // "embedded" or the planner's address, for logs and status.
  virtual std::string name() const = 0;
};

// The planner library in process, on the catalogs of `profiles_dir` ("" =
// built-in data). Errors: the catalogs' (naming the file).
absl::StatusOr<std::unique_ptr<PlanSource>> MakeEmbeddedPlanSource(
    const std::string& profiles_dir);

// An arachne-planner at config.address. Errors: MakeGrpcPlannerClient's.
absl::StatusOr<std::unique_ptr<PlanSource>> MakeRemotePlanSource(
    const PlannerClientConfig& config);

}  // namespace arachne::controller

#endif  // ARACHNE_CONTROLLER_PLANNING_H_
