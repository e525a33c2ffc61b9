// Transport security shared by Arachne's gRPC servers and clients: TLS (or
// mutual TLS) from PEM files, and the bearer token every call of a
// protected service must carry as `authorization: Bearer <token>`.
//
// Errors name the setting and the file: NotFound "<field>: cannot read
// \"<path>\"", InvalidArgument for a file that is not PEM or a setting given
// without its pair.
#ifndef ARACHNE_RPC_CREDENTIALS_H_
#define ARACHNE_RPC_CREDENTIALS_H_

#include <memory>
#include <string>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "grpcpp/security/credentials.h"
#include "grpcpp/security/server_credentials.h"
#include "grpcpp/server_context.h"

namespace arachne {

// TLS on a listening port, from PEM files. Without a cert the port is
// plaintext.
struct ServerTlsConfig {
  std::string cert_file;  // server certificate chain (PEM)
  std::string key_file;   // its private key (PEM)
  // When set: mutual TLS, every client must present a certificate signed by
  // one of these CAs (PEM), or the handshake fails.
  std::string client_ca_file;
  bool enabled() const { return !cert_file.empty(); }
};

// True for addresses only this machine can reach (127.x, localhost, [::1],
// unix sockets).
bool IsLoopbackAddress(const std::string& listen);

// Plaintext without tls.cert_file, else TLS (mutual with client_ca_file).
// Errors name tls.cert_file / tls.key_file / tls.client_ca_file.
absl::StatusOr<std::shared_ptr<grpc::ServerCredentials>> MakeServerCredentials(
    const ServerTlsConfig& tls);

// TLS of a client channel, from PEM files.
struct ClientTlsConfig {
  // TLS when not empty: trust these CA certificates for the server's
  // certificate. Empty: plaintext.
  std::string ca_file;
  // Mutual TLS: this client's certificate chain and key.
  std::string cert_file;
  std::string key_file;
};

// Plaintext without ca_file, else TLS. Errors name the client settings as
// clients spell them: "tls_cert_file, tls_key_file: give both or neither",
// "tls_ca_file: required with a client certificate", NotFound
// "tls_ca_file: cannot read \"<path>\"".
absl::StatusOr<std::shared_ptr<grpc::ChannelCredentials>>
MakeChannelCredentials(const ClientTlsConfig& tls);

// OK when `token` is empty (no token configured); else Unauthenticated
// unless the call's metadata carries `authorization: Bearer <token>`. The
// comparison takes the same time wherever a guess differs.
absl::Status CheckBearerToken(const grpc::ServerContextBase& context,
                              absl::string_view token);

// The bearer token held in the file at `path`, surrounding whitespace
// stripped (a path, never the token itself, keeps the secret out of configs
// and the process list). NotFound "<field>: cannot read \"<path>\"";
// InvalidArgument "<field>: no token in \"<path>\" (empty or only
// whitespace)".
absl::StatusOr<std::string> ReadBearerTokenFile(const std::string& path,
                                                absl::string_view field);

}  // namespace arachne

#endif  // ARACHNE_RPC_CREDENTIALS_H_
