#include "rpc/credentials.h"

#include <fstream>
#include <sstream>

#include "absl/strings/ascii.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"

namespace arachne {

bool IsLoopbackAddress(const std::string& listen) {
  return absl::StartsWith(listen, "127.") ||
         absl::StartsWith(listen, "localhost:") ||
         absl::StartsWith(listen, "[::1]:") ||
         absl::StartsWith(listen, "unix:") ||
         absl::StartsWith(listen, "ipv4:127.");
}

namespace {

// The file's text; with `require_pem`, InvalidArgument unless it holds a
// PEM block (a server refuses early rather than failing every handshake).
absl::StatusOr<std::string> ReadPem(const std::string& path,
                                    absl::string_view field, bool require_pem) {
  std::ifstream in(path, std::ios::binary);
  if (!in) {
    return absl::NotFoundError(
        absl::StrCat(field, ": cannot read \"", path, "\""));
  }
  std::stringstream buffer;
  buffer << in.rdbuf();
  if (require_pem && buffer.str().find("-----BEGIN ") == std::string::npos) {
    return absl::InvalidArgumentError(
        absl::StrCat(field, ": \"", path, "\" is not a PEM file"));
  }
  return buffer.str();
}

// Compares in time independent of where the strings differ, so the answer
// time does not reveal how much of a guessed token was right.
bool ConstantTimeEquals(absl::string_view a, absl::string_view b) {
  if (a.size() != b.size()) return false;
  unsigned char diff = 0;
  for (size_t i = 0; i < a.size(); ++i) {
    diff |= static_cast<unsigned char>(a[i] ^ b[i]);
  }
  return diff == 0;
}

}  // namespace

absl::StatusOr<std::shared_ptr<grpc::ServerCredentials>> MakeServerCredentials(
    const ServerTlsConfig& tls) {
  if (!tls.enabled()) {
    if (!tls.key_file.empty() || !tls.client_ca_file.empty()) {
      return absl::InvalidArgumentError(
          "tls.cert_file: required when tls.key_file or tls.client_ca_file "
          "is set");
    }
    return grpc::InsecureServerCredentials();
  }
  if (tls.key_file.empty()) {
    return absl::InvalidArgumentError(
        "tls.key_file: required with tls.cert_file");
  }
  absl::StatusOr<std::string> cert =
      ReadPem(tls.cert_file, "tls.cert_file", true);
  if (!cert.ok()) return cert.status();
  absl::StatusOr<std::string> key = ReadPem(tls.key_file, "tls.key_file", true);
  if (!key.ok()) return key.status();
  grpc::SslServerCredentialsOptions options;
  options.pem_key_cert_pairs.push_back({*key, *cert});
  if (!tls.client_ca_file.empty()) {
    absl::StatusOr<std::string> ca =
        ReadPem(tls.client_ca_file, "tls.client_ca_file", true);
    if (!ca.ok()) return ca.status();
    options.pem_root_certs = *ca;
    options.client_certificate_request =
        GRPC_SSL_REQUEST_AND_REQUIRE_CLIENT_CERTIFICATE_AND_VERIFY;
  }
  return grpc::SslServerCredentials(options);
}

absl::StatusOr<std::shared_ptr<grpc::ChannelCredentials>>
MakeChannelCredentials(const ClientTlsConfig& tls) {
  if (tls.cert_file.empty() != tls.key_file.empty()) {
    return absl::InvalidArgumentError(
        "tls_cert_file, tls_key_file: give both or neither");
  }
  if (tls.ca_file.empty()) {
    if (!tls.cert_file.empty()) {
      return absl::InvalidArgumentError(
          "tls_ca_file: required with a client certificate");
    }
    return grpc::InsecureChannelCredentials();
  }
  grpc::SslCredentialsOptions options;
  absl::StatusOr<std::string> ca = ReadPem(tls.ca_file, "tls_ca_file", false);
  if (!ca.ok()) return ca.status();
  options.pem_root_certs = *std::move(ca);
  if (!tls.cert_file.empty()) {
    absl::StatusOr<std::string> cert =
        ReadPem(tls.cert_file, "tls_cert_file", false);
    if (!cert.ok()) return cert.status();
    absl::StatusOr<std::string> key =
        ReadPem(tls.key_file, "tls_key_file", false);
    if (!key.ok()) return key.status();
    options.pem_cert_chain = *std::move(cert);
    options.pem_private_key = *std::move(key);
  }
  return grpc::SslCredentials(options);
}

absl::Status CheckBearerToken(const grpc::ServerContextBase& context,
                              absl::string_view token) {
  if (token.empty()) return absl::OkStatus();
  const auto& metadata = context.client_metadata();
  auto it = metadata.find("authorization");
  if (it == metadata.end()) {
    return absl::UnauthenticatedError(
        "authorization: missing; send the metadata \"authorization: Bearer "
        "<token>\"");
  }
  const absl::string_view value(it->second.data(), it->second.size());
  constexpr absl::string_view kScheme = "Bearer ";
  if (!absl::StartsWith(value, kScheme) ||
      !ConstantTimeEquals(value.substr(kScheme.size()), token)) {
    return absl::UnauthenticatedError(
        "authorization: wrong bearer token (expected \"Bearer <token>\")");
  }
  return absl::OkStatus();
}

absl::StatusOr<std::string> ReadBearerTokenFile(const std::string& path,
                                                absl::string_view field) {
  std::ifstream in(path);
  std::stringstream buffer;
  buffer << in.rdbuf();
  if (!in) {
    return absl::NotFoundError(
        absl::StrCat(field, ": cannot read \"", path, "\""));
  }
  std::string token(absl::StripAsciiWhitespace(buffer.str()));
  if (token.empty()) {
    return absl::InvalidArgumentError(absl::StrCat(
        field, ": no token in \"", path, "\" (empty or only whitespace)"));
  }
  return token;
}

}  // namespace arachne
