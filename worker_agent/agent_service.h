// The gRPC face of one node's training runtime: arachne.v1.Agent
// (proto/arachne/v1/agent.proto) over arachne::agent::NodeRanks
// (node_ranks.h: engine processes or in-process ranks), and the server
// that listens for it (`arachne-agent`, main.cc; tests start it on
// 127.0.0.1:0 and read back port()). An engine process serves the same
// handlers as arachne.v1.Engine (engine/engine_service.h).
//
// The service is thin glue: each RPC checks the bearer token, converts the
// request (agent_proto_convert.h: malformed requests are INVALID_ARGUMENT
// naming the field, before the runtime sees them), calls the one
// NodeRanks method of the same name, and maps its Status to the wire with
// ToGrpcStatus (rpc/grpc_status.h), so the runtime's codes arrive
// unchanged: FAILED_PRECONDITION for a stale generation or a diff with a
// byte no live GPU holds, DEADLINE_EXCEEDED for a phase past its timeout,
// DATA_LOSS, UNAVAILABLE for a peer that vanished, NOT_FOUND, ...
//
// It is a synchronous service: Pause, Migrate and Rebuild block for up to
// their timeout, each on a thread of gRPC's pool, so Status keeps answering
// meanwhile. A phase's timeout is the request's timeout_s (0 = 60 s),
// capped by the call's own deadline so the runtime gives up no later than
// its caller.
#ifndef ARACHNE_WORKER_AGENT_AGENT_SERVICE_H_
#define ARACHNE_WORKER_AGENT_AGENT_SERVICE_H_

#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "arachne/v1/agent.grpc.pb.h"
#include "grpcpp/grpcpp.h"
#include "planner_service/core/model/gpu_catalog.h"
#include "planner_service/core/model/model.h"
#include "rpc/credentials.h"
#include "worker_agent/node_ranks.h"

namespace arachne::agent {

struct AgentServiceConfig {
  // When not empty, every call must carry the metadata `authorization:
  // Bearer <token>` or is answered UNAUTHENTICATED.
  std::string bearer_token;
  // The agent registers with a controller (--controller): commands
  // (everything but Status) are PERMISSION_DENIED until it has registered,
  // and then unless they carry that controller's identity
  // (x-arachne-controller-id, BindController). Without it the agent obeys
  // any caller that passes the token (a driver or test plays controller).
  bool require_controller = false;
  std::string controller_address;  // for messages
  // Every checkpoint path of a request (SaveCheckpoint's dir, Prepare's
  // checkpoint_dir) must lie in this directory (a resolved absolute path,
  // AgentSettings::checkpoint_root), checked by CheckCheckpointDir
  // (agent_config.h) before the runtime sees it; the runtime gets the
  // resolved path. "" = none: such requests are FAILED_PRECONDITION.
  // Unset = no check: an engine process (engine/engine_service.h), whose
  // agent checked the path and sends the resolved one.
  std::optional<std::string> checkpoint_root;
};

class AgentService final : public v1::Agent::Service {
 public:
  // `runtime` must outlive the service. `catalog` resolves GPU types of
  // clusters and plans, `models` the model catalog for model.name: the
  // catalogs the runtime was built with.
  AgentService(NodeRanks* runtime, GpuCatalog catalog,
               std::vector<ModelSpec> models, AgentServiceConfig config);

  grpc::Status Prepare(grpc::ServerContext* context,
                       const v1::PrepareRequest* request,
                       v1::PrepareResponse* response) override;
  grpc::Status Pause(grpc::ServerContext* context,
                     const v1::PauseRequest* request,
                     v1::PauseResponse* response) override;
  grpc::Status Migrate(grpc::ServerContext* context,
                       const v1::MigrateRequest* request,
                       v1::MigrateResponse* response) override;
  grpc::Status Rebuild(grpc::ServerContext* context,
                       const v1::RebuildRequest* request,
                       v1::RebuildResponse* response) override;
  grpc::Status Commit(grpc::ServerContext* context,
                      const v1::CommitRequest* request,
                      v1::CommitResponse* response) override;
  grpc::Status Resume(grpc::ServerContext* context,
                      const v1::ResumeRequest* request,
                      v1::ResumeResponse* response) override;
  grpc::Status Abort(grpc::ServerContext* context,
                     const v1::AbortRequest* request,
                     v1::AbortResponse* response) override;
  grpc::Status Status(grpc::ServerContext* context,
                      const v1::StatusRequest* request,
                      v1::StatusResponse* response) override;
  grpc::Status SaveCheckpoint(grpc::ServerContext* context,
                              const v1::SaveCheckpointRequest* request,
                              v1::SaveCheckpointResponse* response) override;
  grpc::Status DescribeState(grpc::ServerContext* context,
                             const v1::DescribeStateRequest* request,
                             v1::DescribeStateResponse* response) override;

  // The controller this agent registered with: from now on commands must
  // carry `controller_id`. A later Register (the controller restarted with
  // another state directory) rebinds. Thread-safe.
  void BindController(const std::string& controller_id);

 private:
  // PermissionDenied unless the caller may command this agent.
  absl::Status CheckController(const grpc::ServerContext& context,
                               const char* method) const;
  // Authenticates, runs `work` (turning an exception escaping the runtime
  // into INTERNAL rather than a crash), logs the outcome and maps it.
  template <typename Work>
  grpc::Status Run(grpc::ServerContext* context, const char* method,
                   int64_t generation, Work work);

  NodeRanks* const runtime_;
  const GpuCatalog catalog_;
  const std::vector<ModelSpec> models_;
  const AgentServiceConfig config_;
  mutable absl::Mutex bind_mu_;
  std::string controller_id_ ABSL_GUARDED_BY(bind_mu_);
};

struct AgentServerConfig {
  // host:port; port 0 picks a free one. A non-loopback address without TLS
  // logs a warning.
  std::string listen = "127.0.0.1:0";
  ServerTlsConfig tls;
};

// A listening arachne-agent: the Agent service plus grpc.health.v1.Health
// (SERVING until Shutdown).
class AgentServer {
 public:
  // Binds and starts serving `service` (which must outlive the server).
  // Unavailable "listen: cannot bind <address>"; the errors of
  // MakeServerCredentials for TLS files.
  static absl::StatusOr<std::unique_ptr<AgentServer>> Start(
      AgentService* service, const AgentServerConfig& config);
  // Shuts down with no grace if Shutdown was not called.
  ~AgentServer();

  int port() const { return port_; }
  // Health turns NOT_SERVING, new calls are refused, calls in flight get
  // `grace` to finish, then they are cancelled; returns when every handler
  // has returned (a phase call returns by its timeout at the latest).
  // Idempotent; thread-safe.
  void Shutdown(absl::Duration grace);

 private:
  AgentServer() = default;
  std::unique_ptr<grpc::Server> server_;
  int port_ = 0;
  absl::Mutex mu_;
  bool shut_down_ ABSL_GUARDED_BY(mu_) = false;
};

}  // namespace arachne::agent

#endif  // ARACHNE_WORKER_AGENT_AGENT_SERVICE_H_
