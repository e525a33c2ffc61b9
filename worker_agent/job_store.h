// The job's rendezvous store: c10d's TCPStore, the store every process group
// of a job (and the Gloo migration transport) meets through. The controller
// (or a test driver standing in for it) hosts the server; every rank
// connects a client under the generation's prefix "arachne/g<N>".
// The header keeps LibTorch out of its includers.
#ifndef ARACHNE_WORKER_AGENT_JOB_STORE_H_
#define ARACHNE_WORKER_AGENT_JOB_STORE_H_

#include <cstdint>
#include <memory>
#include <string>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "absl/time/time.h"
#include "migration/core/rendezvous_store.h"

namespace arachne::agent {

// A TCPStore server on `host`, port `port` (0: pick one).
class JobStoreServer {
 public:
  static absl::StatusOr<std::unique_ptr<JobStoreServer>> Start(
      const std::string& host, int port);
  ~JobStoreServer();
  int port() const { return port_; }
  std::string address() const;  // "host:port"

 private:
  JobStoreServer() = default;
  struct Impl;
  std::unique_ptr<Impl> impl_;
  std::string host_;
  int port_ = 0;
};

// "host:port" split; InvalidArgument naming `field` and the value.
absl::Status ParseStoreAddress(absl::string_view address,
                               absl::string_view field, std::string* host,
                               int* port);

// The store prefix of generation `generation`: "arachne/g<N>".
std::string GenerationPrefix(int64_t generation);

// A client of the TCPStore at `address` seen through `prefix` as a
// migration::RendezvousStore (what the Gloo migration transport rendezvous
// through).
// Unavailable naming the address when it cannot connect within `timeout`.
absl::StatusOr<std::unique_ptr<migration::RendezvousStore>> ConnectJobStore(
    const std::string& address, const std::string& prefix,
    absl::Duration timeout);

}  // namespace arachne::agent

#endif  // ARACHNE_WORKER_AGENT_JOB_STORE_H_
