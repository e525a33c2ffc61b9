// A PlannerHandler whose Plan blocks until released or cancelled, so that
// service tests control exactly how many calls are in flight (admission,
// cancellation, shutdown with calls in flight).
#ifndef ARACHNE_TEST_SERVER_BLOCKING_HANDLER_H_
#define ARACHNE_TEST_SERVER_BLOCKING_HANDLER_H_

#include <vector>

#include "absl/synchronization/notification.h"
#include "absl/time/clock.h"
#include "absl/time/time.h"
#include "planner_service/api/planner_handler.h"

namespace arachne::testing {

class BlockingHandler : public PlannerHandler {
 public:
  absl::StatusOr<PlanAnswer> Plan(const PlanQuery& q) override {
    entered_.Notify();
    while (!release_.HasBeenNotified()) {
      if (q.cancelled != nullptr && q.cancelled->load()) {
        saw_cancel_.Notify();
        return absl::CancelledError("search cancelled");
      }
      absl::SleepFor(absl::Milliseconds(1));
    }
    return absl::UnavailableError("released");
  }
  absl::StatusOr<EvaluateAnswer> Evaluate(const EvaluateQuery&) override {
    return absl::UnimplementedError("fake");
  }
  absl::StatusOr<ReplanAnswer> Replan(const ReplanQuery&) override {
    return absl::UnimplementedError("fake");
  }
  absl::StatusOr<std::vector<ModelSpec>> ListModels() override {
    return std::vector<ModelSpec>{};
  }
  absl::StatusOr<std::vector<GpuType>> ListGpuTypes() override {
    return std::vector<GpuType>{};
  }
  // Plan was entered; the test lets it return; Plan saw the cancellation.
  absl::Notification entered_, release_, saw_cancel_;
};

}  // namespace arachne::testing

#endif  // ARACHNE_TEST_SERVER_BLOCKING_HANDLER_H_
