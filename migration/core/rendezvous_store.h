// The rendezvous store: a small key-value interface through which ranks
// publish their addresses or a communicator id under a key and read the
// others'. In a live job it is the job's c10d TCPStore, hosted by the
// controller (worker_agent/job_store.h, ConnectJobStore);
// FileRendezvousStore (a shared directory) serves tests and single-machine
// runs. Not the controller's state database (controller/state_database.h).
#ifndef ARACHNE_MIGRATION_CORE_RENDEZVOUS_STORE_H_
#define ARACHNE_MIGRATION_CORE_RENDEZVOUS_STORE_H_

#include <string>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "absl/time/time.h"

namespace arachne::migration {

class RendezvousStore {
 public:
  virtual ~RendezvousStore() = default;
  // Publishes `value` under `key`, replacing any earlier value. Readers see
  // either the old or the whole new value, never part of it.
  virtual absl::Status Set(absl::string_view key, absl::string_view value) = 0;
  // The value of `key`, waiting up to `timeout` for it to appear;
  // DeadlineExceeded naming the key when it does not.
  virtual absl::StatusOr<std::string> Get(absl::string_view key,
                                          absl::Duration timeout) = 0;
};

// One file per key in a directory every rank can reach (keys may contain
// '/', which is escaped). Set writes a temporary file and renames it, so a
// reader never sees a partial value; Get polls every millisecond.
class FileRendezvousStore : public RendezvousStore {
 public:
  // The directory must exist.
  explicit FileRendezvousStore(std::string dir) : dir_(std::move(dir)) {}
  absl::Status Set(absl::string_view key, absl::string_view value) override;
  absl::StatusOr<std::string> Get(absl::string_view key,
                                  absl::Duration timeout) override;

 private:
  std::string PathOf(absl::string_view key) const;
  std::string dir_;
};

}  // namespace arachne::migration

#endif  // ARACHNE_MIGRATION_CORE_RENDEZVOUS_STORE_H_
