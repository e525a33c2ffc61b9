#include "rpc/server.h"

#include "absl/strings/str_cat.h"
#include "glog/logging.h"
#include "grpcpp/health_check_service_interface.h"
#include "grpcpp/server_builder.h"

namespace arachne {

absl::StatusOr<std::unique_ptr<grpc::Server>> StartServer(
    const std::string& listen, const ServerTlsConfig& tls,
    grpc::Service* service, absl::string_view exposure, int* port) {
  absl::StatusOr<std::shared_ptr<grpc::ServerCredentials>> credentials =
      MakeServerCredentials(tls);
  if (!credentials.ok()) return credentials.status();
  if (!IsLoopbackAddress(listen) && !tls.enabled()) {
    LOG(WARNING) << "listening on " << listen
                 << " without TLS: anyone who can reach it can " << exposure
                 << "; give --tls-cert/--tls-key or bind 127.0.0.1";
  }
  // Process-wide switch; must precede BuildAndStart.
  grpc::EnableDefaultHealthCheckService(true);
  grpc::ServerBuilder builder;
  builder.AddListeningPort(listen, *credentials, port);
  builder.RegisterService(service);
  std::unique_ptr<grpc::Server> server = builder.BuildAndStart();
  if (server == nullptr || *port == 0) {
    return absl::UnavailableError(absl::StrCat("listen: cannot bind ", listen));
  }
  server->GetHealthCheckService()->SetServingStatus(true);
  return server;
}

}  // namespace arachne
