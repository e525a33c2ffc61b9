#include "planner_service/server/planner_server.h"

#include <fstream>
#include <sstream>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "glog/logging.h"
#include "grpcpp/ext/proto_server_reflection_plugin.h"
#include "grpcpp/health_check_service_interface.h"
#include "grpcpp/impl/server_builder_option.h"

namespace arachne {

bool IsLoopbackAddress(const std::string& listen) {
  return absl::StartsWith(listen, "127.") ||
         absl::StartsWith(listen, "localhost:") ||
         absl::StartsWith(listen, "[::1]:") ||
         absl::StartsWith(listen, "unix:") ||
         absl::StartsWith(listen, "ipv4:127.");
}

namespace {

absl::StatusOr<std::string> ReadPem(const std::string& path,
                                    absl::string_view field) {
  std::ifstream in(path, std::ios::binary);
  if (!in) {
    return absl::NotFoundError(
        absl::StrCat(field, ": cannot read \"", path, "\""));
  }
  std::stringstream buffer;
  buffer << in.rdbuf();
  if (buffer.str().find("-----BEGIN ") == std::string::npos) {
    return absl::InvalidArgumentError(
        absl::StrCat(field, ": \"", path, "\" is not a PEM file"));
  }
  return buffer.str();
}

// Plaintext, or TLS (optionally mutual) from the config's PEM files.
absl::StatusOr<std::shared_ptr<grpc::ServerCredentials>> MakeCredentials(
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
  absl::StatusOr<std::string> cert = ReadPem(tls.cert_file, "tls.cert_file");
  if (!cert.ok()) return cert.status();
  absl::StatusOr<std::string> key = ReadPem(tls.key_file, "tls.key_file");
  if (!key.ok()) return key.status();
  grpc::SslServerCredentialsOptions options;
  options.pem_key_cert_pairs.push_back({*key, *cert});
  if (!tls.client_ca_file.empty()) {
    absl::StatusOr<std::string> ca =
        ReadPem(tls.client_ca_file, "tls.client_ca_file");
    if (!ca.ok()) return ca.status();
    options.pem_root_certs = *ca;
    options.client_certificate_request =
        GRPC_SSL_REQUEST_AND_REQUIRE_CLIENT_CERTIFICATE_AND_VERIFY;
  }
  return grpc::SslServerCredentials(options);
}

// Removes every builder plugin from one ServerBuilder. Plugins are
// registered process-wide (InitProtoReflectionServerBuilderPlugin), so
// without this the health-only server would also serve reflection; health
// itself is not a plugin and stays.
class NoPluginsOption : public grpc::ServerBuilderOption {
 public:
  void UpdateArguments(grpc::ChannelArguments* /*args*/) override {}
  void UpdatePlugins(
      std::vector<std::unique_ptr<grpc::ServerBuilderPlugin>>* plugins)
      override {
    plugins->clear();
  }
};

// Every method of the health port but health's own: UNIMPLEMENTED, saying
// where the rest is served. Besides the message, gRPC 1.51 refuses to build
// a callback server with no method of its own (the default health service
// is added only at start), and this handler is one.
class HealthPortOtherMethods : public grpc::CallbackGenericService {
 public:
  grpc::ServerGenericBidiReactor* CreateReactor(
      grpc::GenericCallbackServerContext* context) override {
    class Reactor : public grpc::ServerGenericBidiReactor {
     public:
      explicit Reactor(const std::string& method) {
        Finish(grpc::Status(
            grpc::StatusCode::UNIMPLEMENTED,
            absl::StrCat(method,
                         ": this port (health_listen) serves only "
                         "grpc.health.v1.Health; call the main port (listen)")));
      }
      void OnDone() override { delete this; }
    };
    return new Reactor(context->method());
  }
};

}  // namespace

absl::StatusOr<std::unique_ptr<PlannerServer>> PlannerServer::Start(
    PlannerHandler* handler, const PlannerServerConfig& config) {
  if (config.service.workers < 1) {
    return absl::InvalidArgumentError(
        absl::StrCat("workers: must be >= 1, got ", config.service.workers));
  }
  if (config.service.max_in_flight < config.service.workers) {
    return absl::InvalidArgumentError(absl::StrCat(
        "max_in_flight: must be >= workers (", config.service.workers,
        "), got ", config.service.max_in_flight));
  }
  absl::StatusOr<std::shared_ptr<grpc::ServerCredentials>> credentials =
      MakeCredentials(config.tls);
  if (!credentials.ok()) return credentials.status();
  if (!IsLoopbackAddress(config.listen) && !config.tls.enabled()) {
    LOG(WARNING) << "listening on " << config.listen
                 << " without TLS: anyone who can reach it can use the "
                    "planner"
                 << (config.service.bearer_token.empty()
                         ? ""
                         : " and read the bearer token off the wire")
                 << "; give --tls-cert/--tls-key, bind 127.0.0.1 or put it "
                    "behind a TLS proxy";
  }
  // Process-wide switches; must precede BuildAndStart.
  grpc::EnableDefaultHealthCheckService(true);
  grpc::reflection::InitProtoReflectionServerBuilderPlugin();

  std::unique_ptr<PlannerServer> s(new PlannerServer());
  s->service_ = std::make_unique<PlannerService>(handler, config.service);
  grpc::ServerBuilder builder;
  builder.AddListeningPort(config.listen, *credentials, &s->port_);
  builder.RegisterService(s->service_.get());
  s->server_ = builder.BuildAndStart();
  if (s->server_ == nullptr || s->port_ == 0) {
    return absl::UnavailableError(
        absl::StrCat("listen: cannot bind ", config.listen));
  }
  if (!config.health_listen.empty()) {
    // A server of its own, plaintext whatever `tls` says: the Planner
    // service is not registered there, so its calls answer UNIMPLEMENTED.
    grpc::ServerBuilder health_builder;
    health_builder.AddListeningPort(config.health_listen,
                                    grpc::InsecureServerCredentials(),
                                    &s->health_port_);
    health_builder.SetOption(std::make_unique<NoPluginsOption>());
    s->health_unimplemented_ = std::make_unique<HealthPortOtherMethods>();
    health_builder.RegisterCallbackGenericService(
        s->health_unimplemented_.get());
    s->health_server_ = health_builder.BuildAndStart();
    if (s->health_server_ == nullptr || s->health_port_ == 0) {
      return absl::UnavailableError(
          absl::StrCat("health_listen: cannot bind ", config.health_listen));
    }
    s->health_server_->GetHealthCheckService()->SetServingStatus(true);
    LOG(INFO) << "health only (grpc.health.v1.Health), plaintext, on "
              << config.health_listen << " (port " << s->health_port_ << ")";
  }
  s->server_->GetHealthCheckService()->SetServingStatus(true);
  LOG(INFO) << "arachne-planner serving on " << config.listen << " (port "
            << s->port_ << "), "
            << (config.tls.enabled()
                    ? (config.tls.client_ca_file.empty() ? "TLS" : "mutual TLS")
                    : "plaintext")
            << (config.service.bearer_token.empty() ? "" : ", bearer token")
            << ", " << config.service.workers << " workers, "
            << config.service.max_in_flight << " in flight at most";
  return s;
}

PlannerServer::~PlannerServer() { Shutdown(absl::ZeroDuration()); }

void PlannerServer::Shutdown(absl::Duration grace) {
  {
    absl::MutexLock lock(&mu_);
    if (shut_down_) return;
    shut_down_ = true;
  }
  LOG(INFO) << "shutting down, grace " << absl::FormatDuration(grace);
  server_->GetHealthCheckService()->SetServingStatus(false);
  if (health_server_ != nullptr) {
    health_server_->GetHealthCheckService()->SetServingStatus(false);
  }
  server_->Shutdown(absl::ToChronoTime(absl::Now() + grace));
  // Probes keep getting NOT_SERVING (not connection refused) until the
  // calls in flight are done; then the health port closes too (its open
  // Watch streams are cancelled at once).
  if (health_server_ != nullptr) {
    health_server_->Shutdown(absl::ToChronoTime(absl::Now()));
  }
  LOG(INFO) << "stats at shutdown:\n" << service_->metrics().Summary();
}

void PlannerServer::Wait() {
  server_->Wait();
  if (health_server_ != nullptr) health_server_->Wait();
}

}  // namespace arachne
