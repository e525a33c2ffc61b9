// Starting a gRPC server the way every Arachne service but the planner's
// does (the planner adds reflection and a probe port): credentials from
// PEM files, a warning for plaintext beyond loopback, the standard health
// service SERVING.
#ifndef ARACHNE_RPC_SERVER_H_
#define ARACHNE_RPC_SERVER_H_

#include <memory>
#include <string>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "grpcpp/server.h"
#include "grpcpp/impl/codegen/service_type.h"
#include "rpc/credentials.h"

namespace arachne {

// Serves `service` on `listen` and sets *port to the bound port. `exposure`
// ends the warning logged for plaintext on a non-loopback address ("anyone
// who can reach it can <exposure>"). Errors: MakeServerCredentials's;
// Unavailable "listen: cannot bind ..." when the address cannot be bound.
absl::StatusOr<std::unique_ptr<grpc::Server>> StartServer(
    const std::string& listen, const ServerTlsConfig& tls,
    grpc::Service* service, absl::string_view exposure, int* port);

}  // namespace arachne

#endif  // ARACHNE_RPC_SERVER_H_
