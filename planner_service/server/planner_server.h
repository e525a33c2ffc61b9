// A running `arachne-planner`: the Planner service plus the standard
// grpc.health.v1 health service and server reflection, on one listening
// address; optionally a second, plaintext listener serving health only (for
// probes that cannot speak TLS). Used by main.cc and by the integration
// tests (listen on 127.0.0.1:0 and read back port() / health_port()).
#ifndef ARACHNE_PLANNER_SERVICE_SERVER_PLANNER_SERVER_H_
#define ARACHNE_PLANNER_SERVICE_SERVER_PLANNER_SERVER_H_

#include <memory>
#include <string>

#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "grpcpp/generic/async_generic_service.h"
#include "grpcpp/grpcpp.h"
#include "planner_service/api/planner_handler.h"
#include "planner_service/server/planner_service.h"
#include "rpc/credentials.h"  // ServerTlsConfig, IsLoopbackAddress

namespace arachne {

struct PlannerServerConfig {
  // host:port; port 0 picks a free one. A non-loopback address without TLS
  // logs a warning.
  std::string listen = "127.0.0.1:50051";
  // When not empty: host:port of a second listener, always plaintext, that
  // serves only grpc.health.v1.Health (no Planner service, no reflection, no
  // token), reporting the same status as `listen`. Kubernetes' gRPC probes
  // cannot speak TLS, so with TLS on `listen` they probe this port. Port 0
  // picks a free one.
  std::string health_listen;
  ServerTlsConfig tls;
  // Bearer token (service.bearer_token) and workers are in `service`.
  PlannerServiceConfig service;
};

class PlannerServer {
 public:
  // Binds and starts serving; health reports SERVING. Unavailable when an
  // address cannot be bound (naming listen or health_listen), InvalidArgument for a bad config (naming the
  // field), NotFound for a TLS file that cannot be read (naming the file).
  static absl::StatusOr<std::unique_ptr<PlannerServer>> Start(
      PlannerHandler* handler, const PlannerServerConfig& config);
  // Shuts down (with no grace) if Shutdown was not called.
  ~PlannerServer();

  int port() const { return port_; }
  // The bound health-only port; 0 without health_listen.
  int health_port() const { return health_port_; }
  // Health turns NOT_SERVING (on both ports), new calls are refused, calls
  // in flight get `grace` to finish; then they are cancelled (their
  // searches stop and answer with the best plan so far). The health port
  // keeps answering NOT_SERVING meanwhile and closes last. Returns when all
  // have answered. Idempotent; thread-safe.
  void Shutdown(absl::Duration grace);
  // Blocks until Shutdown has completed.
  void Wait();
  const PlannerService& service() const { return *service_; }

 private:
  PlannerServer() = default;
  std::unique_ptr<PlannerService> service_;
  std::unique_ptr<grpc::Server> server_;
  int port_ = 0;
  // Answers UNIMPLEMENTED on the health port; declared before
  // health_server_, which must be destroyed first.
  std::unique_ptr<grpc::CallbackGenericService> health_unimplemented_;
  std::unique_ptr<grpc::Server> health_server_;  // null without health_listen
  int health_port_ = 0;
  absl::Mutex mu_;
  bool shut_down_ ABSL_GUARDED_BY(mu_) = false;
};

}  // namespace arachne

#endif  // ARACHNE_PLANNER_SERVICE_SERVER_PLANNER_SERVER_H_
