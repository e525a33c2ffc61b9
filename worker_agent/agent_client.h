// A client of a running `arachne-agent` (arachne.v1.Agent), for tests and
// the controller: one method per RPC, in the runtime's types
// (node_runtime.h) or as the proto messages. The agent's status codes and
// messages pass through unchanged (the message prefixed "agent <address>:
// "), e.g. FAILED_PRECONDITION for a stale generation, INVALID_ARGUMENT
// naming a request field, UNAUTHENTICATED for a missing or wrong token,
// UNAVAILABLE when the agent cannot be reached.
//
// Thread-safe: calls may run concurrently (Status while Pause blocks).
#ifndef ARACHNE_WORKER_AGENT_AGENT_CLIENT_H_
#define ARACHNE_WORKER_AGENT_AGENT_CLIENT_H_

#include <cstdint>
#include <memory>
#include <string>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "arachne/v1/agent.grpc.pb.h"
#include "grpcpp/grpcpp.h"
#include "planner_service/core/model/gpu_catalog.h"
#include "rpc/credentials.h"
#include "worker_agent/controller_identity.h"
#include "worker_agent/node_ranks.h"

namespace arachne::agent {

struct AgentClientConfig {
  std::string address;  // host:port of arachne-agent
  // Sent as `authorization: Bearer <token>` on every call when not empty.
  std::string token;
  ClientTlsConfig tls;  // plaintext without tls.ca_file
  // Sent as `x-arachne-controller-id` when not empty: the controller's
  // identity, which an agent registered with that controller requires.
  std::string controller_id;
  // Deadline of the calls without a phase timeout (Prepare, Commit, Resume,
  // Abort, Status, SaveCheckpoint).
  absl::Duration call_timeout = absl::Minutes(5);
  // Deadline of Status calls: Status answers from what the agent knows, so
  // a longer wait means the agent is stopped or gone (the controller polls
  // with less than a lease: docs/controller.md).
  absl::Duration status_timeout = absl::Seconds(10);
  // Pause, Migrate and Rebuild wait for their phase timeout plus this, so
  // the agent's own DEADLINE_EXCEEDED (naming the phase) comes back rather
  // than the client's.
  absl::Duration phase_deadline_margin = absl::Seconds(10);
};

// The interface, so that the controller's tests can substitute a fake;
// Connect gives the gRPC implementation.
class AgentClient {
 public:
  // One channel to config.address. InvalidArgument for an empty address or
  // a TLS file without its pair, NotFound for a TLS file that cannot be
  // read. Connecting is lazy: an unreachable agent shows up as Unavailable
  // on the first call.
  static absl::StatusOr<std::unique_ptr<AgentClient>> Connect(
      const AgentClientConfig& config);

  virtual ~AgentClient() = default;

  virtual absl::StatusOr<v1::PrepareResponse> Prepare(
      const v1::PrepareRequest& request) = 0;
  // `args` sent with PrepareRequestFromArgs (GPU types by catalog id).
  absl::StatusOr<PrepareResult> Prepare(const PrepareArgs& args,
                                        const GpuCatalog& catalog);
  // A zero timeout is the agent's default (60 s). Pause answers the
  // iteration the ranks stopped after.
  virtual absl::StatusOr<int64_t> Pause(int64_t generation,
                                        int64_t at_iteration,
                                        absl::Duration timeout) = 0;
  // `round_timeout`: each transfer round's; zero = the phase timeout.
  virtual absl::Status Migrate(
      int64_t generation, int stage, absl::Duration timeout,
      absl::Duration round_timeout = absl::ZeroDuration()) = 0;
  virtual absl::Status Rebuild(int64_t generation, absl::Duration timeout) = 0;
  virtual absl::Status Commit(int64_t generation) = 0;
  // run_until 0: until paused.
  virtual absl::Status Resume(int64_t generation, int64_t run_until) = 0;
  virtual absl::Status Abort(int64_t generation) = 0;
  virtual absl::Status SaveCheckpoint(int64_t generation,
                                      const std::string& dir) = 0;
  // `generation` is the caller's view, only logged by the agent.
  virtual absl::StatusOr<v1::StatusResponse> StatusMessage(
      int64_t generation) = 0;
  // StatusMessage in the runtime's types.
  absl::StatusOr<NodeStatus> Status(int64_t generation = 0);

  // The job's training state as the node's engine describes it.
  virtual absl::StatusOr<v1::DescribeStateResponse> DescribeStateMessage(
      const v1::DescribeStateRequest& request) = 0;
  // DescribeStateMessage for `job`, read back and checked
  // (ModelStateFromProto; an error names the agent).
  absl::StatusOr<StateDescription> DescribeState(const JobSpec& job);

  // host:port the client talks to, for messages.
  virtual const std::string& address() const = 0;
};

}  // namespace arachne::agent

#endif  // ARACHNE_WORKER_AGENT_AGENT_CLIENT_H_
