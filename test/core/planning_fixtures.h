// What several planner tests share: a clock that advances per read (so a
// wall-clock budget ends at a deterministic point) and the planning context
// of a catalog model on a cluster file of examples/.
#ifndef ARACHNE_TEST_CORE_PLANNING_FIXTURES_H_
#define ARACHNE_TEST_CORE_PLANNING_FIXTURES_H_

#include <memory>
#include <string>

#include "absl/time/time.h"
#include "glog/logging.h"
#include "planner_service/core/planners/planner.h"
#include "planner_service/io/planning_context.h"

namespace arachne::testing {

// Advances 100 us each time it is read: a run's own reads (one per rollout
// and per refinement step) make its time, and its stats.wall_s.
class TickingClock : public Clock {
 public:
  absl::Time Now() const override {
    now_ += absl::Microseconds(100);
    return now_;
  }

 private:
  mutable absl::Time now_ = absl::UnixEpoch();
};

// `model` (a catalog id) on examples/`example`, default training.
inline std::unique_ptr<PlanningContext> ExampleContext(
    const std::string& model, const std::string& example) {
  PlanningRequest request;
  request.model = model;
  request.cluster_file =
      std::string(ARACHNE_SOURCE_DIR) + "/examples/" + example;
  absl::StatusOr<std::unique_ptr<PlanningContext>> ctx =
      PlanningContext::Create(request);
  CHECK(ctx.ok()) << ctx.status();
  return *std::move(ctx);
}

}  // namespace arachne::testing

#endif  // ARACHNE_TEST_CORE_PLANNING_FIXTURES_H_
