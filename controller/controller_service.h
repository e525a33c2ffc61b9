// The gRPC face of the controller: arachne.v1.Controller
// (proto/arachne/v1/controller.proto) over JobController (controller.h),
// and the server `arachne-controller` listens with. Thin glue: each RPC
// checks the bearer token, calls the one JobController method of the same
// name and maps its Status with ToGrpcStatus (rpc/grpc_status.h), so codes
// arrive unchanged (INVALID_ARGUMENT naming the request field, NOT_FOUND
// for an unknown node, UNAVAILABLE for a node backed off for flapping,
// UNAUTHENTICATED for a missing or wrong token).
//
// WatchEvents streams until the caller cancels or the server shuts down.
#ifndef ARACHNE_CONTROLLER_CONTROLLER_SERVICE_H_
#define ARACHNE_CONTROLLER_CONTROLLER_SERVICE_H_

#include <atomic>
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
  // `controller` must outlive the service.
  ControllerService(JobController* controller, std::string bearer_token);

  grpc::Status Register(grpc::ServerContext* context,
                        const v1::RegisterRequest* request,
                        v1::RegisterResponse* response) override;
  grpc::Status Heartbeat(grpc::ServerContext* context,
                         const v1::HeartbeatRequest* request,
                         v1::HeartbeatResponse* response) override;
  grpc::Status AnnounceJoin(grpc::ServerContext* context,
                            const v1::AnnounceJoinRequest* request,
                            v1::AnnounceJoinResponse* response) override;
  grpc::Status DrainNode(grpc::ServerContext* context,
                         const v1::DrainNodeRequest* request,
                         v1::DrainNodeResponse* response) override;
  grpc::Status RequestReplan(grpc::ServerContext* context,
                             const v1::RequestReplanRequest* request,
                             v1::RequestReplanResponse* response) override;
  grpc::Status GetStatus(grpc::ServerContext* context,
                         const v1::GetStatusRequest* request,
                         v1::GetStatusResponse* response) override;
  grpc::Status WatchEvents(grpc::ServerContext* context,
                           const v1::WatchEventsRequest* request,
                           grpc::ServerWriter<v1::Event>* writer) override;

  // Ends every WatchEvents stream (before the server shuts down).
  void Shutdown() { shutting_down_ = true; }

 private:
  JobController* const controller_;
  const std::string bearer_token_;
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
