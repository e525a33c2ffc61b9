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
#include "absl/strings/string_view.h"
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

// OK for an address the server can listen on: HOST:PORT, where HOST is a
// name, an IPv4 address or a bracketed IPv6 address ("[::]") and PORT a
// number in 0..65535 (0 picks a free port), or unix:PATH (a socket in a
// folder that exists) or unix-abstract:NAME. InvalidArgument saying what
// is wrong with `address` otherwise (no field name: callers add theirs).
// gRPC itself reads "127.0.0.1:99999" as some other port and "127.0.0.1:"
// as port 443, hence the check before it sees the address.
absl::Status CheckListenAddress(absl::string_view address);

// OK when the private key in `key_file` belongs to the first certificate of
// `cert_file` (both PEM); InvalidArgument "tls_key: ..." naming both files
// otherwise. gRPC would only fail to create the listener, saying nothing.
absl::Status CheckTlsKeyMatchesCertificate(const std::string& cert_file,
                                           const std::string& key_file);

class PlannerServer {
 public:
  // Binds and starts serving; health reports SERVING. InvalidArgument for a
  // bad config or address (naming the field: listen, health_listen,
  // tls_key), NotFound for a TLS file that cannot be read (naming the
  // file), Unavailable when a well-formed address cannot be bound (in use,
  // not this machine's), naming listen or health_listen.
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
