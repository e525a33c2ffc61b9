#include "planner_service/server/planner_server.h"

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "glog/logging.h"
#include "grpcpp/ext/proto_server_reflection_plugin.h"
#include "grpcpp/health_check_service_interface.h"

namespace arachne {

bool IsLoopbackAddress(const std::string& listen) {
  return absl::StartsWith(listen, "127.") ||
         absl::StartsWith(listen, "localhost:") ||
         absl::StartsWith(listen, "[::1]:") ||
         absl::StartsWith(listen, "unix:") ||
         absl::StartsWith(listen, "ipv4:127.");
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
  if (!IsLoopbackAddress(config.listen)) {
    LOG(WARNING) << "listening on " << config.listen
                 << " without TLS: anyone who can reach it can use the "
                    "planner; bind 127.0.0.1 or put it behind a TLS proxy";
  }
  // Process-wide switches; must precede BuildAndStart.
  grpc::EnableDefaultHealthCheckService(true);
  grpc::reflection::InitProtoReflectionServerBuilderPlugin();

  std::unique_ptr<PlannerServer> s(new PlannerServer());
  s->service_ = std::make_unique<PlannerService>(handler, config.service);
  grpc::ServerBuilder builder;
  builder.AddListeningPort(config.listen, grpc::InsecureServerCredentials(),
                           &s->port_);
  builder.RegisterService(s->service_.get());
  s->server_ = builder.BuildAndStart();
  if (s->server_ == nullptr || s->port_ == 0) {
    return absl::UnavailableError(
        absl::StrCat("listen: cannot bind ", config.listen));
  }
  s->server_->GetHealthCheckService()->SetServingStatus(true);
  LOG(INFO) << "arachne-planner serving on " << config.listen << " (port "
            << s->port_ << "), " << config.service.workers << " workers, "
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
  server_->Shutdown(absl::ToChronoTime(absl::Now() + grace));
  LOG(INFO) << "stats at shutdown:\n" << service_->metrics().Summary();
}

void PlannerServer::Wait() { server_->Wait(); }

}  // namespace arachne
