#include "planner_service/server/planner_server.h"

#include "absl/strings/match.h"
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
      MakeServerCredentials(config.tls);
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
