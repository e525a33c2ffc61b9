// Where the controller's plans come from: an arachne-planner through
// planner_service/client when the job names one, else the planner library
// in process (PlannerHandlerImpl, the very code arachne-planner answers
// Plan and Replan with: the embedded default). Both answer in the same
// project types (planner_handler.h), so the controller cannot tell them
// apart.
#ifndef ARACHNE_CONTROLLER_PLANNING_H_
#define ARACHNE_CONTROLLER_PLANNING_H_

#include <functional>
#include <memory>
#include <string>

#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "planner_service/client/planner_client.h"
#include "planner_service/api/planner_handler.h"

namespace arachne::controller {

class PlanSource {
 public:
  virtual ~PlanSource() = default;
  virtual absl::StatusOr<PlanAnswer> Plan(const PlanQuery& query) = 0;
  virtual absl::StatusOr<ReplanAnswer> Replan(const ReplanQuery& query) = 0;
  // "embedded" or the planner's address, for logs and status.
  virtual std::string name() const = 0;
  // Where a source that retries reports each retry and fallback (the
  // controller turns them into "planner" events). Default: ignored.
  using Notify = std::function<void(const std::string&)>;
  virtual void SetNotify(Notify notify) { (void)notify; }
};

// How a remote planner that does not answer is handled.
struct PlannerRetryConfig {
  // A call answered UNAVAILABLE or DEADLINE_EXCEEDED (the planner is down
  // or too slow: nothing about the request) is tried again this many times,
  // waiting `backoff` first, doubled before each further try.
  int retries = 3;
  absl::Duration backoff = absl::Milliseconds(500);
};

// `remote` with retries; after the last failed try `fallback` (the embedded
// planner; null: none) answers instead, so a planner outage never leaves
// the job without a plan. Every other error (no feasible plan, a bad
// request) is returned as it is: the fallback would answer the same. Each
// call starts with the remote again, so a planner that comes back is used.
std::unique_ptr<PlanSource> MakeRetryingPlanSource(
    std::unique_ptr<PlanSource> remote, std::unique_ptr<PlanSource> fallback,
    PlannerRetryConfig config);

// The planner library in process, on the catalogs of `profiles_dir` ("" =
// built-in data). Errors: the catalogs' (naming the file).
absl::StatusOr<std::unique_ptr<PlanSource>> MakeEmbeddedPlanSource(
    const std::string& profiles_dir);

// An arachne-planner at config.address. Errors: MakeGrpcPlannerClient's.
absl::StatusOr<std::unique_ptr<PlanSource>> MakeRemotePlanSource(
    const PlannerClientConfig& config);

}  // namespace arachne::controller

#endif  // ARACHNE_CONTROLLER_PLANNING_H_
