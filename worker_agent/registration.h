// An agent's membership in its job (docs/architecture.md, docs/controller.md): the
// agent registers itself with its arachne-controller (node, GPU type and
// count, memory per GPU, the address its Agent service listens on) and then
// renews the lease the controller granted by Heartbeat every lease/3.
//
// Training never depends on the controller being up: this loop runs on its
// own thread beside the ranks, and when the controller cannot be reached it
// retries with exponential back-off (initial_backoff doubled up to
// max_backoff; a failed Heartbeat is retried after at most lease/3, so a
// controller that restarts finds the node's lease renewed in time) while
// the agent goes on training. A Heartbeat answered
// NOT_FOUND (the lease ran out, or the controller forgot the node) is
// followed at once by a new Register; one answered FAILED_PRECONDITION
// (the node was drained and released) ends the loop. A refusal that retrying
// cannot cure (INVALID_ARGUMENT, UNAUTHENTICATED, PERMISSION_DENIED) is logged
// as an error and retried at max_backoff, so an operator's fix on the
// controller's side is picked up without restarting the agent.
#ifndef ARACHNE_WORKER_AGENT_REGISTRATION_H_
#define ARACHNE_WORKER_AGENT_REGISTRATION_H_

#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <thread>

#include "absl/base/thread_annotations.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "arachne/v1/controller.grpc.pb.h"
#include "rpc/credentials.h"

namespace arachne::agent {

struct RegistrationConfig {
  std::string controller;  // host:port of arachne-controller
  std::string token;       // bearer token the controller requires; "" = none
  ClientTlsConfig tls;     // plaintext without tls.ca_file
  // What is registered.
  std::string node;
  std::string gpu_type;  // catalog id
  int gpus = 0;
  double memory_gib = 0;  // per GPU
  std::string address;    // host:port of this agent's Agent service
  // This agent process's identity, sent with every Register and Heartbeat
  // (controller.proto RegisterRequest.incarnation); "" = a random one made
  // at Start, as the agent does: each start is a new incarnation.
  std::string incarnation;
  // Retries while the controller cannot be reached.
  absl::Duration initial_backoff = absl::Milliseconds(200);
  absl::Duration max_backoff = absl::Seconds(10);
  // Deadline of each Register / Heartbeat call.
  absl::Duration call_timeout = absl::Seconds(5);
  // Called (on the loop's thread) after each successful Register with the
  // controller's identity, so the agent obeys that controller only.
  std::function<void(const std::string& controller_id)> on_registered;
};

// What the loop knows now (for logs and tests).
struct RegistrationState {
  bool registered = false;  // the last Register or Heartbeat succeeded
  double lease_s = 0;       // as the controller granted it
  int64_t generation = 0;   // the job's generation at the last Register
  std::string controller_id;  // the controller's identity, last Register
  std::string incarnation;    // what this loop registers as
  int64_t registers = 0;    // successful Register calls
  int64_t heartbeats = 0;   // successful Heartbeat calls
  int64_t failures = 0;     // failed calls of either kind
  std::string last_error;
};

class ControllerRegistration {
 public:
  // Checks the config and starts the loop. InvalidArgument naming the field
  // ("controller: must be host:port, ...", "gpus: ..."); the TLS errors of
  // MakeChannelCredentials (NotFound for a file that cannot be read).
  static absl::StatusOr<std::unique_ptr<ControllerRegistration>> Start(
      RegistrationConfig config);
  ~ControllerRegistration();
  ControllerRegistration(const ControllerRegistration&) = delete;
  ControllerRegistration& operator=(const ControllerRegistration&) = delete;

  // Ends the loop (a call in flight finishes by its deadline). Idempotent.
  // The controller notices the agent gone when its lease runs out.
  void Stop();
  RegistrationState state() const;

 private:
  ControllerRegistration(RegistrationConfig config,
                         std::unique_ptr<v1::Controller::Stub> stub);
  void Loop();
  // Waits up to `d`; false when Stop was called.
  bool Sleep(absl::Duration d);
  absl::Status CallRegister();
  absl::Status CallHeartbeat();
  void Failed(const absl::Status& s, const char* call);

  const RegistrationConfig config_;
  const std::unique_ptr<v1::Controller::Stub> stub_;
  mutable absl::Mutex mu_;
  bool stop_ ABSL_GUARDED_BY(mu_) = false;
  RegistrationState state_ ABSL_GUARDED_BY(mu_);
  std::thread thread_;
};

}  // namespace arachne::agent

#endif  // ARACHNE_WORKER_AGENT_REGISTRATION_H_
