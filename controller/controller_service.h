// The gRPC face of the controller: arachne.v1.Controller
// (proto/arachne/v1/controller.proto) over JobController (controller.h),
// and the server `arachne-controller` listens with. Thin glue: each RPC
// checks the bearer token, calls the one JobController method of the same
// name and maps its Status with ToGrpcStatus (rpc/grpc_status.h), so codes
// arrive unchanged (INVALID_ARGUMENT naming the request field, NOT_FOUND
// for an unknown node, UNAVAILABLE for a node backed off for flapping,
// UNAUTHENTICATED for a missing or wrong token).
//
// The unary RPCs whose requests carry strings (Register, Heartbeat,
// AnnounceJoin, DrainNode, RequestReplan) take their request as bytes and
// parse it with ParseMessageBytes (planner_service/io/input_bounds.h), so a
// string field that is not UTF-8 is INVALID_ARGUMENT naming the field, not
// the INTERNAL with an empty message that gRPC's own parser answers.
//
// WatchEvents streams until the caller cancels or the server shuts down.
#ifndef ARACHNE_CONTROLLER_CONTROLLER_SERVICE_H_
#define ARACHNE_CONTROLLER_CONTROLLER_SERVICE_H_

#include <atomic>
#include <functional>
#include <memory>
#include <string>

#include "absl/base/thread_annotations.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "arachne/v1/controller.grpc.pb.h"
#include "controller/controller.h"
#include "grpcpp/grpcpp.h"
#include "rpc/credentials.h"

namespace arachne::controller {

class ControllerService final : public v1::Controller::Service {
 public:
  // `controller` must outlive the service. Callers send `bearer_token`
  // ("" = none); in Register and Heartbeat `node_auth` says who may speak
  // for a node.
  ControllerService(JobController* controller, std::string bearer_token,
                    NodeAuthConfig node_auth = {});

  grpc::Status GetStatus(grpc::ServerContext* context,
                         const v1::GetStatusRequest* request,
                         v1::GetStatusResponse* response) override;
  grpc::Status WatchEvents(grpc::ServerContext* context,
                           const v1::WatchEventsRequest* request,
                           grpc::ServerWriter<v1::Event>* writer) override;

  // Ends every WatchEvents stream (before the server shuts down).
  void Shutdown() { shutting_down_ = true; }

 private:
  using RawStream = grpc::ServerUnaryStreamer<grpc::ByteBuffer, grpc::ByteBuffer>;
  // Serves method `name` of the service with `handler` over raw bytes.
  void ServeRaw(const char* name,
                std::function<grpc::Status(grpc::ServerContext*, RawStream*)>
                    handler);

  // Register and Heartbeat for `node`: its own token if it has one, else
  // the shared one (Unauthenticated); with --agent-identity, the client
  // certificate must name it (PermissionDenied).
  absl::Status AuthorizeNode(const grpc::ServerContext& context,
                             const std::string& node) const;

  JobController* const controller_;
  const std::string bearer_token_;
  const NodeAuthConfig node_auth_;
  std::atomic<bool> shutting_down_{false};
};

struct ControllerServerConfig {
  std::string listen = "127.0.0.1:0";
  ServerTlsConfig tls;
};

// The Controller service plus grpc.health.v1.Health (SERVING until
// Shutdown).
class ControllerServer {
 public:
  // Unavailable "listen: cannot bind <address>"; MakeServerCredentials'
  // errors for TLS files.
  static absl::StatusOr<std::unique_ptr<ControllerServer>> Start(
      ControllerService* service, const ControllerServerConfig& config);
  ~ControllerServer();
  int port() const { return port_; }
  // Idempotent; calls in flight get `grace`, then they are cancelled.
  void Shutdown(absl::Duration grace);

 private:
  ControllerServer() = default;
  ControllerService* service_ = nullptr;
  std::unique_ptr<grpc::Server> server_;
  int port_ = 0;
  absl::Mutex mu_;
  bool shut_down_ ABSL_GUARDED_BY(mu_) = false;
};

}  // namespace arachne::controller

#endif  // ARACHNE_CONTROLLER_CONTROLLER_SERVICE_H_
