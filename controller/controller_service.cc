#include "controller/controller_service.h"

#include <algorithm>
#include <memory>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "glog/logging.h"
#include "grpcpp/health_check_service_interface.h"
#include "planner_service/io/input_bounds.h"
#include "planner_service/io/json_yaml.h"
#include "rpc/grpc_status.h"
#include "rpc/server.h"

namespace arachne::controller {

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

// One unary call over raw bytes: authenticates, reads the request and
// parses it as `Request` (ParseMessageBytes names a field that is not
// UTF-8), runs `work(request, &response)` and writes the response.
template <typename Request, typename Response, typename Work>
grpc::Status RunRaw(grpc::ServerContext* context, const std::string& token,
                    const char* method,
                    grpc::ServerUnaryStreamer<grpc::ByteBuffer,
                                              grpc::ByteBuffer>* stream,
                    Work work) {
  Response response;
  grpc::Status status = Run(context, token, method, [&]() -> absl::Status {
    grpc::ByteBuffer raw;
    if (!stream->Read(&raw)) {
      return absl::InvalidArgumentError("request: none was sent");
    }
    std::vector<grpc::Slice> slices;
    if (!raw.Dump(&slices).ok()) {
      return absl::InvalidArgumentError("request: cannot be read");
    }
    std::string bytes;
    for (const grpc::Slice& slice : slices) {
      bytes.append(reinterpret_cast<const char*>(slice.begin()), slice.size());
    }
    Request request;
    if (absl::Status s = ParseMessageBytes(bytes, &request); !s.ok()) return s;
    return work(request, &response);
  });
  if (!status.ok()) return status;
  const std::string out = response.SerializeAsString();
  grpc::Slice slice(out);
  if (!stream->Write(grpc::ByteBuffer(&slice, 1))) {
    return grpc::Status(grpc::StatusCode::CANCELLED, "the caller went away");
  }
  return grpc::Status::OK;
}

}  // namespace

ControllerService::ControllerService(JobController* controller,
                                     std::string bearer_token,
                                     NodeAuthConfig node_auth)
    : controller_(controller),
      bearer_token_(std::move(bearer_token)),
      node_auth_(std::move(node_auth)) {
  CHECK(controller_ != nullptr);
  ServeRaw("Register", [this](grpc::ServerContext* c, RawStream* s) {
    // Authenticated once the request names its node (AuthorizeNode).
    return RunRaw<v1::RegisterRequest, v1::RegisterResponse>(
        c, "", "Register", s,
        [this, c](const v1::RegisterRequest& r, v1::RegisterResponse* out) {
          if (absl::Status a = AuthorizeNode(*c, r.node()); !a.ok()) return a;
          return Assign(controller_->Register(r), out);
        });
  });
  ServeRaw("Heartbeat", [this](grpc::ServerContext* c, RawStream* s) {
    return RunRaw<v1::HeartbeatRequest, v1::HeartbeatResponse>(
        c, "", "Heartbeat", s,
        [this, c](const v1::HeartbeatRequest& r, v1::HeartbeatResponse* out) {
          if (absl::Status a = AuthorizeNode(*c, r.node()); !a.ok()) return a;
          return Assign(controller_->Heartbeat(r), out);
        });
  });
  ServeRaw("AnnounceJoin", [this](grpc::ServerContext* c, RawStream* s) {
    return RunRaw<v1::AnnounceJoinRequest, v1::AnnounceJoinResponse>(
        c, bearer_token_, "AnnounceJoin", s,
        [this](const v1::AnnounceJoinRequest& r, v1::AnnounceJoinResponse*) {
          return controller_->AnnounceJoin(r);
        });
  });
  ServeRaw("DrainNode", [this](grpc::ServerContext* c, RawStream* s) {
    return RunRaw<v1::DrainNodeRequest, v1::DrainNodeResponse>(
        c, bearer_token_, "DrainNode", s,
        [this](const v1::DrainNodeRequest& r, v1::DrainNodeResponse*) {
          return controller_->DrainNode(r);
        });
  });
  ServeRaw("RequestReplan", [this](grpc::ServerContext* c, RawStream* s) {
    return RunRaw<v1::RequestReplanRequest, v1::RequestReplanResponse>(
        c, bearer_token_, "RequestReplan", s,
        [this](const v1::RequestReplanRequest& r, v1::RequestReplanResponse*) {
          return controller_->RequestReplan(r);
        });
  });
}

absl::Status ControllerService::AuthorizeNode(const grpc::ServerContext& context,
                                              const std::string& node) const {
  const auto own = node_auth_.node_tokens.find(node);
  if (own != node_auth_.node_tokens.end()) {
    if (absl::Status s = CheckBearerToken(context, own->second); !s.ok()) {
      return absl::UnauthenticatedError(
          absl::StrCat(s.message(), "; node ", QuoteForMessage(node),
                       " has a token of its own (--node-tokens-file)"));
    }
  } else if (absl::Status s = CheckBearerToken(context, bearer_token_); !s.ok()) {
    return s;
  }
  using CertName = NodeAuthConfig::CertName;
  if (node_auth_.cert_name == CertName::kNone) return absl::OkStatus();
  const bool cn = node_auth_.cert_name == CertName::kCommonName;
  std::vector<std::string> names;
  if (std::shared_ptr<const grpc::AuthContext> auth = context.auth_context()) {
    for (const grpc::string_ref& v : auth->FindPropertyValues(
             cn ? "x509_common_name" : "x509_subject_alternative_name")) {
      names.emplace_back(v.data(), v.size());
    }
  }
  if (std::find(names.begin(), names.end(), node) != names.end()) {
    return absl::OkStatus();
  }
  std::vector<std::string> quoted;
  for (size_t i = 0; i < names.size() && i < 8; ++i) {
    quoted.push_back(QuoteForMessage(names[i]));
  }
  return absl::PermissionDeniedError(absl::StrCat(
      "node: ", QuoteForMessage(node), " is not the client certificate's ",
      cn ? "common name" : "subject alternative name",
      names.empty() ? " (it has none)"
                    : absl::StrCat(" (", absl::StrJoin(quoted, ", "), ")"),
      "; --agent-identity ", cn ? "cn" : "san"));
}

void ControllerService::ServeRaw(
    const char* name,
    std::function<grpc::Status(grpc::ServerContext*, RawStream*)> handler) {
  // The method's index in the service is its index in controller.proto.
  const google::protobuf::ServiceDescriptor* service =
      v1::RegisterRequest::descriptor()->file()->FindServiceByName(
          "Controller");
  CHECK(service != nullptr);
  const google::protobuf::MethodDescriptor* method =
      service->FindMethodByName(name);
  CHECK(method != nullptr) << "Controller has no method " << name;
  // A "streamed unary" method: still a synchronous handler on the server's
  // threads, one request and one response, but as bytes.
  MarkMethodStreamed(
      method->index(),
      new grpc::internal::StreamedUnaryHandler<grpc::ByteBuffer,
                                               grpc::ByteBuffer>(
          std::move(handler)));
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
