#include "planner_service/server/planner_server.h"

#include <openssl/bio.h>
#include <openssl/err.h>
#include <openssl/evp.h>
#include <openssl/pem.h>
#include <openssl/x509.h>

#include <algorithm>
#include <filesystem>
#include <memory>

#include "absl/strings/ascii.h"
#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "glog/logging.h"
#include "grpcpp/ext/proto_server_reflection_plugin.h"
#include "grpcpp/health_check_service_interface.h"
#include "grpcpp/impl/server_builder_option.h"

namespace arachne {

namespace {

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

// After the grace period: how long cut calls get to answer (a search stops
// within milliseconds; Replan's migration estimate cannot be interrupted),
// then how long answers already given get to be sent.
constexpr absl::Duration kCutAnswerTime = absl::Seconds(5);
constexpr absl::Duration kSendTime = absl::Seconds(1);

// Longest address quoted back in an error; a longer one is described by its
// length (no address is that long).
constexpr size_t kMaxQuotedAddress = 256;

// The passphrase callback for PEM_read_*: none. OpenSSL's default prompts on
// the terminal, which a server must never do.
int NoPassphrase(char* /*buf*/, int /*size*/, int /*rwflag*/, void* /*u*/) {
  return 0;
}

}  // namespace

absl::Status CheckListenAddress(absl::string_view address) {
  if (address.size() > kMaxQuotedAddress) {
    return absl::InvalidArgumentError(absl::StrCat(
        "must be HOST:PORT or unix:PATH, got ", address.size(), " characters"));
  }
  auto invalid = [address](absl::string_view why) {
    return absl::InvalidArgumentError(
        absl::StrCat(why, ", got \"", address, "\""));
  };
  if (absl::StartsWith(address, "unix-abstract:")) {
    if (address.size() == absl::string_view("unix-abstract:").size()) {
      return invalid("unix-abstract: needs a socket name");
    }
    return absl::OkStatus();
  }
  if (absl::StartsWith(address, "unix:")) {
    absl::string_view path = address.substr(5);
    // unix:///run/x.sock is the URI spelling of unix:/run/x.sock.
    if (absl::StartsWith(path, "//")) path.remove_prefix(2);
    if (path.empty()) return invalid("unix: needs a socket path");
    const std::filesystem::path folder =
        std::filesystem::path(std::string(path)).parent_path();
    std::error_code ec;
    if (!folder.empty() && !std::filesystem::is_directory(folder, ec)) {
      return invalid(absl::StrCat("the folder \"", folder.string(),
                                  "\" of the unix socket does not exist"));
    }
    return absl::OkStatus();
  }
  const size_t colon = address.rfind(':');
  if (colon == absl::string_view::npos) {
    return invalid(
        "must be HOST:PORT (e.g. 127.0.0.1:50051; port 0 picks a free one) "
        "or unix:PATH");
  }
  const absl::string_view host = address.substr(0, colon);
  const absl::string_view port = address.substr(colon + 1);
  if (host.empty()) {
    return invalid(
        "missing host before the port (0.0.0.0 or [::] listens "
        "on every interface)");
  }
  if (absl::StrContains(host, ':') &&
      !(absl::StartsWith(host, "[") && absl::EndsWith(host, "]"))) {
    return invalid("an IPv6 host is written in brackets ([::1]:50051)");
  }
  if (port.empty()) {
    return invalid("missing port after ':' (0..65535; 0 picks a free one)");
  }
  int value = 0;
  const bool digits = std::all_of(port.begin(), port.end(), [](char c) {
    return absl::ascii_isdigit(static_cast<unsigned char>(c));
  });
  if (!digits || port.size() > 5 || !absl::SimpleAtoi(port, &value) ||
      value > 65535) {
    return invalid(
        "the port must be a number in 0..65535 (0 picks a free "
        "one)");
  }
  return absl::OkStatus();
}

absl::Status CheckTlsKeyMatchesCertificate(const std::string& cert_file,
                                           const std::string& key_file) {
  // OpenSSL keeps errors in a per-thread queue; leave it empty for gRPC.
  struct ClearErrors {
    ~ClearErrors() { ERR_clear_error(); }
  } clear_errors;
  std::unique_ptr<BIO, decltype(&BIO_free)> cert_in(
      BIO_new_file(cert_file.c_str(), "r"), BIO_free);
  if (cert_in == nullptr) {
    return absl::NotFoundError(
        absl::StrCat("tls_cert: cannot read \"", cert_file, "\""));
  }
  std::unique_ptr<X509, decltype(&X509_free)> cert(
      PEM_read_bio_X509(cert_in.get(), nullptr, NoPassphrase, nullptr),
      X509_free);
  if (cert == nullptr) {
    return absl::InvalidArgumentError(
        absl::StrCat("tls_cert: \"", cert_file, "\" holds no PEM certificate"));
  }
  std::unique_ptr<BIO, decltype(&BIO_free)> key_in(
      BIO_new_file(key_file.c_str(), "r"), BIO_free);
  if (key_in == nullptr) {
    return absl::NotFoundError(
        absl::StrCat("tls_key: cannot read \"", key_file, "\""));
  }
  std::unique_ptr<EVP_PKEY, decltype(&EVP_PKEY_free)> key(
      PEM_read_bio_PrivateKey(key_in.get(), nullptr, NoPassphrase, nullptr),
      EVP_PKEY_free);
  if (key == nullptr) {
    return absl::InvalidArgumentError(absl::StrCat(
        "tls_key: \"", key_file,
        "\" holds no PEM private key (or one behind a passphrase, which a "
        "server cannot type)"));
  }
  if (X509_check_private_key(cert.get(), key.get()) != 1) {
    return absl::InvalidArgumentError(absl::StrCat(
        "tls_key: the private key in \"", key_file,
        "\" does not match the certificate in \"", cert_file, "\" (tls_cert)"));
  }
  return absl::OkStatus();
}

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
  if (absl::Status s = CheckListenAddress(config.listen); !s.ok()) {
    return absl::InvalidArgumentError(absl::StrCat("listen: ", s.message()));
  }
  if (!config.health_listen.empty()) {
    if (absl::Status s = CheckListenAddress(config.health_listen); !s.ok()) {
      return absl::InvalidArgumentError(
          absl::StrCat("health_listen: ", s.message()));
    }
  }
  absl::StatusOr<std::shared_ptr<grpc::ServerCredentials>> credentials =
      MakeServerCredentials(config.tls);
  if (!credentials.ok()) return credentials.status();
  if (config.tls.enabled()) {
    if (absl::Status s = CheckTlsKeyMatchesCertificate(config.tls.cert_file,
                                                       config.tls.key_file);
        !s.ok()) {
      return s;
    }
  }
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
    return absl::UnavailableError(absl::StrCat(
        "listen: cannot bind ", config.listen,
        " (in use, not an address of this machine, or a name that does not "
        "resolve; gRPC's log line above says which)"));
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
  // Start failed before the main server ran (an address that cannot be
  // bound): nothing serves, nothing to drain.
  if (server_ == nullptr) return;
  LOG(INFO) << "shutting down, grace " << absl::FormatDuration(grace);
  server_->GetHealthCheckService()->SetServingStatus(false);
  if (health_server_ != nullptr) {
    health_server_->GetHealthCheckService()->SetServingStatus(false);
  }
  // The grace period is the service's, not gRPC's: gRPC's Shutdown refuses
  // every new call at once, health checks included (UNAVAILABLE where
  // probes must read NOT_SERVING), and at its deadline cancels the calls
  // on the wire, so a search stopped then answers into a closed call. Here
  // the port stays open: health answers NOT_SERVING, new Planner calls
  // UNAVAILABLE, admitted calls finish; after the grace they are cut and
  // still answer (best plan so far, or UNAVAILABLE when still queued).
  service_->BeginDrain();
  if (!service_->WaitIdle(absl::Now() + grace)) {
    service_->CutAdmitted();
    if (!service_->WaitIdle(absl::Now() + kCutAnswerTime)) {
      LOG(WARNING) << "calls still running "
                   << absl::FormatDuration(kCutAnswerTime)
                   << " after they were cut; the server cancels them";
    }
  }
  // Every admitted call has answered (or overran kCutAnswerTime): what is
  // left is sending, for which gRPC gets a moment before it cancels.
  server_->Shutdown(absl::ToChronoTime(absl::Now() + kSendTime));
  // Probes keep getting NOT_SERVING (not connection refused) until the
  // calls in flight are done; then the health port closes too (its open
  // Watch streams are cancelled at once).
  if (health_server_ != nullptr) {
    health_server_->Shutdown(absl::ToChronoTime(absl::Now()));
  }
  LOG(INFO) << "stats at shutdown:\n" << service_->metrics().Summary();
}

void PlannerServer::Wait() {
  if (server_ == nullptr) return;
  server_->Wait();
  if (health_server_ != nullptr) health_server_->Wait();
}

}  // namespace arachne
