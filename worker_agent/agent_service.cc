#include "worker_agent/agent_service.h"

#include <chrono>
#include <cmath>
#include <cstring>
#include <exception>
#include <filesystem>
#include <string>
#include <string_view>
#include <utility>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "glog/logging.h"
#include "grpcpp/health_check_service_interface.h"
#include "rpc/grpc_status.h"
#include "rpc/server.h"
#include "worker_agent/agent_config.h"
#include "worker_agent/agent_proto_convert.h"
#include "worker_agent/controller_identity.h"

namespace arachne::agent {
namespace {

// The request's phase timeout, capped by the time left to the call's
// deadline: the runtime must not keep a phase going after its caller gave
// up on the answer.
absl::StatusOr<absl::Duration> PhaseTimeout(const grpc::ServerContext& context,
                                            double timeout_s) {
  absl::StatusOr<absl::Duration> timeout =
      PhaseTimeoutFromProto(timeout_s, "timeout_s");
  if (!timeout.ok()) return timeout.status();
  const auto deadline = context.deadline();
  // gRPC reports "no deadline" as the far future.
  if (deadline >= std::chrono::system_clock::time_point::max() -
                      std::chrono::hours(24 * 365)) {
    return timeout;
  }
  const absl::Duration left = absl::FromChrono(deadline) - absl::Now();
  if (left <= absl::ZeroDuration()) {
    return absl::DeadlineExceededError(
        "the call's deadline passed before the phase could start");
  }
  return std::min(*timeout, left);
}

}  // namespace

AgentService::AgentService(NodeRanks* runtime, GpuCatalog catalog,
                           std::vector<ModelSpec> models,
                           AgentServiceConfig config)
    : runtime_(runtime),
      catalog_(std::move(catalog)),
      models_(std::move(models)),
      config_(std::move(config)) {
  CHECK(runtime_ != nullptr);
}

template <typename Work>
grpc::Status AgentService::Run(grpc::ServerContext* context, const char* method,
                               int64_t generation, Work work) {
  const absl::Time start = absl::Now();
  absl::Status status = CheckBearerToken(*context, config_.bearer_token);
  if (status.ok() && std::string_view(method) != "Status") {
    status = CheckController(*context, method);
  }
  if (status.ok()) {
    // The runtime reports failures as Status; an exception escaping it
    // (LibTorch throws) must still not take the agent and its other ranks
    // down.
    try {
      status = work();
    } catch (const std::exception& e) {
      status = absl::InternalError(
          absl::StrCat(method, ": unexpected exception: ", e.what()));
    } catch (...) {
      status =
          absl::InternalError(absl::StrCat(method, ": unexpected exception"));
    }
  }
  const absl::Duration took = absl::Now() - start;
  if (status.ok()) {
    // Status is polled (the controller every 100 ms, a supervisor each
    // second): its successes would drown the log.
    const int level = std::string_view(method) == "Status" ? 1 : 0;
    VLOG(level) << method << "(g" << generation << ") from " << context->peer()
                << " OK in " << absl::FormatDuration(took);
  } else {
    LOG(WARNING) << method << "(g" << generation << ") from " << context->peer()
                 << " " << absl::StatusCodeToString(status.code()) << " in "
                 << absl::FormatDuration(took) << ": " << status.message();
  }
  return ToGrpcStatus(status);
}

void AgentService::BindController(const std::string& controller_id) {
  absl::MutexLock lock(&bind_mu_);
  if (controller_id_ != controller_id) {
    LOG(INFO) << "commands are accepted from controller "
              << config_.controller_address << " (id " << controller_id
              << ") only";
  }
  controller_id_ = controller_id;
}

absl::Status AgentService::CheckController(const grpc::ServerContext& context,
                                           const char* method) const {
  if (!config_.require_controller) return absl::OkStatus();
  std::string bound;
  {
    absl::MutexLock lock(&bind_mu_);
    bound = controller_id_;
  }
  if (bound.empty()) {
    return absl::PermissionDeniedError(absl::StrCat(
        method, ": this agent takes commands from its controller ",
        config_.controller_address,
        " only, and has not registered with it yet"));
  }
  const auto& metadata = context.client_metadata();
  auto it = metadata.find(grpc::string_ref(kControllerIdMetadata.data(),
                                           kControllerIdMetadata.size()));
  const std::string given =
      it == metadata.end() ? std::string()
                           : std::string(it->second.data(),
                                         std::min<size_t>(it->second.size(), 64));
  if (given == bound) return absl::OkStatus();
  return absl::PermissionDeniedError(absl::StrCat(
      method, ": this agent takes commands from its controller ",
      config_.controller_address, " (id ", bound, ") only; the call from ",
      context.peer(),
      given.empty() ? std::string(" carries no controller id")
                    : absl::StrCat(" carries controller id \"", given, "\"")));
}

grpc::Status AgentService::Prepare(grpc::ServerContext* context,
                                   const v1::PrepareRequest* request,
                                   v1::PrepareResponse* response) {
  return Run(context, "Prepare", request->generation(), [&]() -> absl::Status {
    absl::StatusOr<PrepareArgs> args =
        PrepareArgsFromProto(*request, catalog_, models_);
    if (!args.ok()) return args.status();
    if (!args->checkpoint_dir.empty() && config_.checkpoint_root.has_value()) {
      absl::StatusOr<std::string> dir = CheckCheckpointDir(
          *config_.checkpoint_root, "checkpoint_dir", args->checkpoint_dir);
      if (!dir.ok()) return dir.status();
      args->checkpoint_dir = *std::move(dir);
    }
    if (absl::Status s = args->job.engine.Validate(); !s.ok()) {
      return absl::Status(s.code(), absl::StrCat("engine: ", s.message()));
    }
    absl::StatusOr<PrepareResult> result = runtime_->Prepare(*args);
    if (!result.ok()) return result.status();
    *response = PrepareResultToProto(*result);
    return absl::OkStatus();
  });
}

grpc::Status AgentService::Pause(grpc::ServerContext* context,
                                 const v1::PauseRequest* request,
                                 v1::PauseResponse* response) {
  return Run(context, "Pause", request->generation(), [&]() -> absl::Status {
    if (absl::Status s = CheckGeneration(request->generation()); !s.ok()) {
      return s;
    }
    if (request->at_iteration() < 0) {
      return absl::InvalidArgumentError(
          absl::StrCat("at_iteration: must be an integer >= 0, got ",
                       request->at_iteration()));
    }
    absl::StatusOr<absl::Duration> timeout =
        PhaseTimeout(*context, request->timeout_s());
    if (!timeout.ok()) return timeout.status();
    absl::StatusOr<int64_t> stopped = runtime_->Pause(
        request->generation(), request->at_iteration(), *timeout);
    if (!stopped.ok()) return stopped.status();
    response->set_iteration(*stopped);
    return absl::OkStatus();
  });
}

grpc::Status AgentService::Migrate(grpc::ServerContext* context,
                                   const v1::MigrateRequest* request,
                                   v1::MigrateResponse*) {
  return Run(context, "Migrate", request->generation(), [&]() -> absl::Status {
    if (request->stage() != 1 && request->stage() != 2) {
      return absl::InvalidArgumentError(
          absl::StrCat("stage: must be 1 or 2, got ", request->stage()));
    }
    const double round_s = request->round_timeout_s();
    if (!std::isfinite(round_s) || round_s < 0) {
      return absl::InvalidArgumentError(absl::StrCat(
          "round_timeout_s: must be >= 0 seconds (0 = the phase timeout), "
          "got ", round_s));
    }
    if (absl::Status s = CheckGeneration(request->generation()); !s.ok()) {
      return s;
    }
    absl::StatusOr<absl::Duration> timeout =
        PhaseTimeout(*context, request->timeout_s());
    if (!timeout.ok()) return timeout.status();
    const absl::Duration round =
        round_s == 0 ? *timeout : std::min(*timeout, absl::Seconds(round_s));
    return runtime_->Migrate(request->generation(), request->stage(), *timeout,
                             round);
  });
}

grpc::Status AgentService::Rebuild(grpc::ServerContext* context,
                                   const v1::RebuildRequest* request,
                                   v1::RebuildResponse*) {
  return Run(context, "Rebuild", request->generation(), [&]() -> absl::Status {
    if (absl::Status s = CheckGeneration(request->generation()); !s.ok()) {
      return s;
    }
    absl::StatusOr<absl::Duration> timeout =
        PhaseTimeout(*context, request->timeout_s());
    if (!timeout.ok()) return timeout.status();
    return runtime_->Rebuild(request->generation(), *timeout);
  });
}

grpc::Status AgentService::Commit(grpc::ServerContext* context,
                                  const v1::CommitRequest* request,
                                  v1::CommitResponse*) {
  return Run(context, "Commit", request->generation(), [&]() -> absl::Status {
    if (absl::Status s = CheckGeneration(request->generation()); !s.ok()) {
      return s;
    }
    return runtime_->Commit(request->generation());
  });
}

grpc::Status AgentService::Resume(grpc::ServerContext* context,
                                  const v1::ResumeRequest* request,
                                  v1::ResumeResponse*) {
  return Run(context, "Resume", request->generation(), [&]() -> absl::Status {
    if (absl::Status s = CheckGeneration(request->generation()); !s.ok()) {
      return s;
    }
    if (request->run_until() < 0) {
      return absl::InvalidArgumentError(absl::StrCat(
          "run_until: must be an integer >= 0 (0 = until paused), got ",
          request->run_until()));
    }
    return runtime_->Resume(request->generation(), request->run_until());
  });
}

grpc::Status AgentService::Abort(grpc::ServerContext* context,
                                 const v1::AbortRequest* request,
                                 v1::AbortResponse*) {
  return Run(context, "Abort", request->generation(), [&]() -> absl::Status {
    if (absl::Status s = CheckGeneration(request->generation()); !s.ok()) {
      return s;
    }
    return runtime_->Abort(request->generation());
  });
}

grpc::Status AgentService::Status(grpc::ServerContext* context,
                                  const v1::StatusRequest* request,
                                  v1::StatusResponse* response) {
  return Run(context, "Status", request->generation(), [&]() -> absl::Status {
    const std::string& failpoint = runtime_->gpus().failpoint;
    if (absl::StartsWith(failpoint, kHangStatusWhile)) {
      const std::string path = failpoint.substr(strlen(kHangStatusWhile));
      bool hung = false;
      while (std::filesystem::exists(path) && !context->IsCancelled()) {
        hung = true;
        absl::SleepFor(absl::Milliseconds(50));
      }
      if (hung) {
        return absl::UnavailableError(
            absl::StrCat("failpoint ", failpoint, ": Status hung"));
      }
    }
    *response =
        NodeStatusToProto(runtime_->Status(), runtime_->gpus(), catalog_);
    return absl::OkStatus();
  });
}

grpc::Status AgentService::SaveCheckpoint(
    grpc::ServerContext* context, const v1::SaveCheckpointRequest* request,
    v1::SaveCheckpointResponse*) {
  return Run(
      context, "SaveCheckpoint", request->generation(), [&]() -> absl::Status {
        if (absl::Status s = CheckGeneration(request->generation()); !s.ok()) {
          return s;
        }
        if (request->dir().empty()) {
          return absl::InvalidArgumentError("dir: required, got none");
        }
        if (!config_.checkpoint_root.has_value()) {
          return runtime_->SaveCheckpoint(request->generation(),
                                          request->dir());
        }
        absl::StatusOr<std::string> dir = CheckCheckpointDir(
            *config_.checkpoint_root, "dir", request->dir());
        if (!dir.ok()) return dir.status();
        return runtime_->SaveCheckpoint(request->generation(), *dir);
      });
}

grpc::Status AgentService::DescribeState(
    grpc::ServerContext* context, const v1::DescribeStateRequest* request,
    v1::DescribeStateResponse* response) {
  return Run(context, "DescribeState", 0, [&]() -> absl::Status {
    absl::StatusOr<JobSpec> job = JobSpecFromProto(
        request->model(),
        request->has_model_spec() ? &request->model_spec() : nullptr,
        request->training(), request->engine(), models_);
    if (!job.ok()) return job.status();
    absl::StatusOr<StateDescription> described = runtime_->DescribeState(*job);
    if (!described.ok()) return described.status();
    response->set_engine(described->engine);
    ModelStateToProto(described->state, response->mutable_tensors());
    return absl::OkStatus();
  });
}

// ---- AgentServer ----

absl::StatusOr<std::unique_ptr<AgentServer>> AgentServer::Start(
    AgentService* service, const AgentServerConfig& config) {
  CHECK(service != nullptr);
  std::unique_ptr<AgentServer> s(new AgentServer());
  absl::StatusOr<std::unique_ptr<grpc::Server>> server =
      StartServer(config.listen, config.tls, service,
                  "drive this node's training", &s->port_);
  if (!server.ok()) return server.status();
  s->server_ = *std::move(server);
  LOG(INFO) << "arachne-agent serving on " << config.listen << " (port "
            << s->port_ << "), "
            << (config.tls.enabled()
                    ? (config.tls.client_ca_file.empty() ? "TLS" : "mutual TLS")
                    : "plaintext");
  return s;
}

AgentServer::~AgentServer() { Shutdown(absl::ZeroDuration()); }

void AgentServer::Shutdown(absl::Duration grace) {
  {
    absl::MutexLock lock(&mu_);
    if (shut_down_) return;
    shut_down_ = true;
  }
  LOG(INFO) << "shutting down, grace " << absl::FormatDuration(grace);
  server_->GetHealthCheckService()->SetServingStatus(false);
  server_->Shutdown(absl::ToChronoTime(absl::Now() + grace));
  server_->Wait();
}

}  // namespace arachne::agent
