// The controller's event log (WatchEvents): membership, decisions, phases,
// iterations, calibration, planner and error events, each with a sequence
// number that goes on across restarts (docs/controller.md, "Persistence").
#ifndef ARACHNE_CONTROLLER_EVENT_LOG_H_
#define ARACHNE_CONTROLLER_EVENT_LOG_H_

#include <cstddef>
#include <cstdint>
#include <deque>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/status/status.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "arachne/v1/controller.pb.h"
#include "controller/state_database.h"

namespace arachne::controller {

// The recent events kept for WatchEvents, with a sequence number each.
// With a state database, every event is written there before a watcher can see
// it, and a restarted controller goes on from the stored ones: a watcher
// resuming with the last sequence it saw misses nothing and gets nothing
// twice (docs/controller.md, "Persistence").
class EventLog {
 public:
  explicit EventLog(size_t capacity = 4096) : capacity_(capacity) {}
  // Reads back the newest `capacity` events `store` kept, numbers the next
  // event after them and keeps every later one there. Before any Add.
  absl::Status Restore(StateDatabase* store);
  void Add(v1::Event event);
  // The events after sequence `after`, waiting up to `wait` for the first.
  std::vector<v1::Event> After(int64_t after, absl::Duration wait) const;

 private:
  const size_t capacity_;
  mutable absl::Mutex mu_;
  std::deque<v1::Event> events_ ABSL_GUARDED_BY(mu_);
  int64_t next_ ABSL_GUARDED_BY(mu_) = 1;
  StateDatabase* store_ ABSL_GUARDED_BY(mu_) = nullptr;
};

}  // namespace arachne::controller

#endif  // ARACHNE_CONTROLLER_EVENT_LOG_H_
