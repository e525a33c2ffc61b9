#include "controller/event_log.h"

#include <string>
#include <utility>

#include "absl/strings/str_cat.h"
#include "glog/logging.h"

namespace arachne::controller {

absl::Status EventLog::Restore(StateDatabase* store) {
  absl::StatusOr<std::vector<StateDatabase::StoredEvent>> stored =
      store->RecentEvents(static_cast<int64_t>(capacity_));
  if (!stored.ok()) return stored.status();
  absl::MutexLock lock(&mu_);
  CHECK(events_.empty() && next_ == 1) << "EventLog::Restore after Add";
  for (const StateDatabase::StoredEvent& e : *stored) {
    v1::Event event;
    if (!event.ParseFromString(e.event) || event.sequence() != e.sequence) {
      return absl::DataLossError(absl::StrCat(
          store->path(), ": event ", e.sequence, " is not an arachne.v1.Event"));
    }
    events_.push_back(std::move(event));
    next_ = e.sequence + 1;
  }
  store_ = store;
  return absl::OkStatus();
}

void EventLog::Add(v1::Event event) {
  absl::MutexLock lock(&mu_);
  event.set_sequence(next_++);
  if (store_ != nullptr) {
    // Written before any watcher sees it. Should the write fail, the event
    // is still served live; a restart then numbers on from the last stored.
    if (absl::Status s = store_->AppendEvent(
            event.sequence(), event.SerializeAsString(),
            static_cast<int64_t>(capacity_));
        !s.ok()) {
      LOG_EVERY_N(ERROR, 100) << "event " << event.sequence()
                              << " not persisted: " << s;
    }
  }
  events_.push_back(std::move(event));
  while (events_.size() > capacity_) events_.pop_front();
}

std::vector<v1::Event> EventLog::After(int64_t after,
                                       absl::Duration wait) const {
  absl::MutexLock lock(&mu_);
  auto ready = [&]() ABSL_SHARED_LOCKS_REQUIRED(mu_) {
    return next_ - 1 > after;
  };
  mu_.AwaitWithTimeout(absl::Condition(&ready), wait);
  std::vector<v1::Event> out;
  for (const v1::Event& e : events_) {
    if (e.sequence() > after) out.push_back(e);
  }
  return out;
}

}  // namespace arachne::controller
