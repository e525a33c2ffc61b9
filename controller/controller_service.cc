#include "controller/controller_service.h"

#include "absl/strings/str_cat.h"
#include "glog/logging.h"
#include "grpcpp/health_check_service_interface.h"
#include "rpc/grpc_status.h"
#include "rpc/server.h"

namespace arachne::controller {

ControllerService::ControllerService(JobController* controller,
                                     std::string bearer_token)
    : controller_(controller), bearer_token_(std::move(bearer_token)) {
  CHECK(controller_ != nullptr);
}

namespace {

// Authenticates, runs `work` and maps its status; failures are logged with
// the method so an operator sees refused requests.
template <typename Work>
grpc::Status Run(grpc::ServerContext* context, const std::string& token,
                 const char* method, Work work) {
  absl::Status s = CheckBearerToken(*context, token);
  if (s.ok()) s = work();
  if (!s.ok()) {
    LOG(WARNING) << method << " from " << context->peer() << ": "
                 << absl::StatusCodeToString(s.code()) << ": " << s.message();
  }
  return ToGrpcStatus(s);
}

template <typename T>
absl::Status Assign(absl::StatusOr<T> v, T* out) {
  if (!v.ok()) return v.status();
  *out = *std::move(v);
  return absl::OkStatus();
}

}  // namespace

grpc::Status ControllerService::Register(grpc::ServerContext* context,
                                         const v1::RegisterRequest* request,
                                         v1::RegisterResponse* response) {
  return Run(context, bearer_token_, "Register", [&]() {
    return Assign(controller_->Register(*request), response);
  });
}

grpc::Status ControllerService::Heartbeat(grpc::ServerContext* context,
                                          const v1::HeartbeatRequest* request,
                                          v1::HeartbeatResponse* response) {
  return Run(context, bearer_token_, "Heartbeat", [&]() {
    return Assign(controller_->Heartbeat(*request), response);
  });
}

grpc::Status ControllerService::AnnounceJoin(
    grpc::ServerContext* context, const v1::AnnounceJoinRequest* request,
    v1::AnnounceJoinResponse*) {
  return Run(context, bearer_token_, "AnnounceJoin",
             [&]() { return controller_->AnnounceJoin(*request); });
}

grpc::Status ControllerService::DrainNode(grpc::ServerContext* context,
                                          const v1::DrainNodeRequest* request,
                                          v1::DrainNodeResponse*) {
  return Run(context, bearer_token_, "DrainNode",
             [&]() { return controller_->DrainNode(*request); });
}

grpc::Status ControllerService::RequestReplan(
    grpc::ServerContext* context, const v1::RequestReplanRequest* request,
    v1::RequestReplanResponse*) {
  return Run(context, bearer_token_, "RequestReplan",
             [&]() { return controller_->RequestReplan(*request); });
}

grpc::Status ControllerService::GetStatus(grpc::ServerContext* context,
                                          const v1::GetStatusRequest*,
                                          v1::GetStatusResponse* response) {
  return Run(context, bearer_token_, "GetStatus", [&]() {
    return Assign(controller_->GetStatus(), response);
  });
}

grpc::Status ControllerService::WatchEvents(
    grpc::ServerContext* context, const v1::WatchEventsRequest* request,
    grpc::ServerWriter<v1::Event>* writer) {
  return Run(context, bearer_token_, "WatchEvents", [&]() -> absl::Status {
    int64_t after = request->after();
    while (!context->IsCancelled() && !shutting_down_) {
      // Short waits, so a cancelled caller or a shutdown ends the stream
      // within a fraction of a second.
      for (const v1::Event& e :
           controller_->events().After(after, absl::Milliseconds(250))) {
        if (!writer->Write(e)) return absl::OkStatus();  // caller went away
        after = e.sequence();
      }
    }
    return absl::OkStatus();
  });
}

absl::StatusOr<std::unique_ptr<ControllerServer>> ControllerServer::Start(
    ControllerService* service, const ControllerServerConfig& config) {
  CHECK(service != nullptr);
  std::unique_ptr<ControllerServer> s(new ControllerServer());
  s->service_ = service;
  absl::StatusOr<std::unique_ptr<grpc::Server>> server =
      StartServer(config.listen, config.tls, service,
                  "join nodes to this job or drain them", &s->port_);
  if (!server.ok()) return server.status();
  s->server_ = *std::move(server);
  LOG(INFO) << "arachne-controller serving on " << config.listen << " (port "
            << s->port_ << ")";
  return s;
}

ControllerServer::~ControllerServer() { Shutdown(absl::ZeroDuration()); }

void ControllerServer::Shutdown(absl::Duration grace) {
  {
    absl::MutexLock lock(&mu_);
    if (shut_down_) return;
    shut_down_ = true;
  }
  service_->Shutdown();
  server_->GetHealthCheckService()->SetServingStatus(false);
  server_->Shutdown(absl::ToChronoTime(absl::Now() + grace));
  server_->Wait();
}

}  // namespace arachne::controller
