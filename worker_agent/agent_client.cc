#include "worker_agent/agent_client.h"

#include <utility>

#include "absl/strings/str_cat.h"
#include "rpc/grpc_status.h"
#include "worker_agent/agent_proto_convert.h"

namespace arachne::agent {
namespace {

class GrpcAgentClient final : public AgentClient {
 public:
  GrpcAgentClient(AgentClientConfig config,
                  std::shared_ptr<grpc::Channel> channel)
      : config_(std::move(config)),
        stub_(v1::Agent::NewStub(std::move(channel))) {}

  absl::StatusOr<v1::PrepareResponse> Prepare(
      const v1::PrepareRequest& request) override {
    grpc::ClientContext context;
    Setup(&context, config_.call_timeout);
    v1::PrepareResponse response;
    if (absl::Status s = FromGrpc(stub_->Prepare(&context, request, &response));
        !s.ok()) {
      return s;
    }
    return response;
  }

  absl::StatusOr<int64_t> Pause(int64_t generation, int64_t at_iteration,
                                absl::Duration timeout) override {
    v1::PauseRequest request;
    request.set_generation(generation);
    request.set_at_iteration(at_iteration);
    request.set_timeout_s(absl::ToDoubleSeconds(timeout));
    grpc::ClientContext context;
    Setup(&context, PhaseDeadline(timeout));
    v1::PauseResponse response;
    if (absl::Status s = FromGrpc(stub_->Pause(&context, request, &response));
        !s.ok()) {
      return s;
    }
    return response.iteration();
  }

  absl::Status Migrate(int64_t generation, int stage, absl::Duration timeout,
                       absl::Duration round_timeout) override {
    v1::MigrateRequest request;
    request.set_generation(generation);
    request.set_stage(stage);
    request.set_timeout_s(absl::ToDoubleSeconds(timeout));
    request.set_round_timeout_s(absl::ToDoubleSeconds(round_timeout));
    grpc::ClientContext context;
    Setup(&context, PhaseDeadline(timeout));
    v1::MigrateResponse response;
    return FromGrpc(stub_->Migrate(&context, request, &response));
  }

  absl::Status Rebuild(int64_t generation, absl::Duration timeout) override {
    v1::RebuildRequest request;
    request.set_generation(generation);
    request.set_timeout_s(absl::ToDoubleSeconds(timeout));
    grpc::ClientContext context;
    Setup(&context, PhaseDeadline(timeout));
    v1::RebuildResponse response;
    return FromGrpc(stub_->Rebuild(&context, request, &response));
  }

  absl::Status Commit(int64_t generation) override {
    v1::CommitRequest request;
    request.set_generation(generation);
    grpc::ClientContext context;
    Setup(&context, config_.call_timeout);
    v1::CommitResponse response;
    return FromGrpc(stub_->Commit(&context, request, &response));
  }

  absl::Status Resume(int64_t generation, int64_t run_until) override {
    v1::ResumeRequest request;
    request.set_generation(generation);
    request.set_run_until(run_until);
    grpc::ClientContext context;
    Setup(&context, config_.call_timeout);
    v1::ResumeResponse response;
    return FromGrpc(stub_->Resume(&context, request, &response));
  }

  absl::Status Abort(int64_t generation) override {
    v1::AbortRequest request;
    request.set_generation(generation);
    grpc::ClientContext context;
    Setup(&context, config_.call_timeout);
    v1::AbortResponse response;
    return FromGrpc(stub_->Abort(&context, request, &response));
  }

  absl::Status SaveCheckpoint(int64_t generation,
                              const std::string& dir) override {
    v1::SaveCheckpointRequest request;
    request.set_generation(generation);
    request.set_dir(dir);
    grpc::ClientContext context;
    Setup(&context, config_.call_timeout);
    v1::SaveCheckpointResponse response;
    return FromGrpc(stub_->SaveCheckpoint(&context, request, &response));
  }

  absl::StatusOr<v1::StatusResponse> StatusMessage(
      int64_t generation) override {
    v1::StatusRequest request;
    request.set_generation(generation);
    grpc::ClientContext context;
    Setup(&context, config_.status_timeout);
    v1::StatusResponse response;
    if (absl::Status s = FromGrpc(stub_->Status(&context, request, &response));
        !s.ok()) {
      return s;
    }
    return response;
  }

  absl::StatusOr<v1::DescribeStateResponse> DescribeStateMessage(
      const v1::DescribeStateRequest& request) override {
    grpc::ClientContext context;
    Setup(&context, config_.call_timeout);
    v1::DescribeStateResponse response;
    if (absl::Status s =
            FromGrpc(stub_->DescribeState(&context, request, &response));
        !s.ok()) {
      return s;
    }
    return response;
  }

  const std::string& address() const override { return config_.address; }

 private:
  // Deadline `timeout` from now, and the token.
  void Setup(grpc::ClientContext* context, absl::Duration timeout) const {
    context->set_deadline(absl::ToChronoTime(absl::Now() + timeout));
    if (!config_.token.empty()) {
      context->AddMetadata("authorization",
                           absl::StrCat("Bearer ", config_.token));
    }
    if (!config_.controller_id.empty()) {
      context->AddMetadata(std::string(kControllerIdMetadata),
                           config_.controller_id);
    }
  }

  absl::Duration PhaseDeadline(absl::Duration timeout) const {
    return (timeout > absl::ZeroDuration() ? timeout : kDefaultPhaseTimeout) +
           config_.phase_deadline_margin;
  }

  absl::Status FromGrpc(const grpc::Status& status) const {
    return FromGrpcStatus(status, absl::StrCat("agent ", config_.address));
  }

  const AgentClientConfig config_;
  const std::unique_ptr<v1::Agent::Stub> stub_;
};

}  // namespace

absl::StatusOr<std::unique_ptr<AgentClient>> AgentClient::Connect(
    const AgentClientConfig& config) {
  if (config.address.empty()) {
    return absl::InvalidArgumentError("address: empty; expected HOST:PORT");
  }
  absl::StatusOr<std::shared_ptr<grpc::ChannelCredentials>> credentials =
      MakeChannelCredentials(config.tls);
  if (!credentials.ok()) return credentials.status();
  return std::unique_ptr<AgentClient>(new GrpcAgentClient(
      config, grpc::CreateChannel(config.address, *credentials)));
}

absl::StatusOr<PrepareResult> AgentClient::Prepare(const PrepareArgs& args,
                                                   const GpuCatalog& catalog) {
  absl::StatusOr<v1::PrepareResponse> response =
      Prepare(PrepareRequestFromArgs(args, catalog));
  if (!response.ok()) return response.status();
  return PrepareResultFromProto(*response);
}

absl::StatusOr<StateDescription> AgentClient::DescribeState(
    const JobSpec& job) {
  v1::DescribeStateRequest request;
  SetJob(job, &request);
  absl::StatusOr<v1::DescribeStateResponse> response =
      DescribeStateMessage(request);
  if (!response.ok()) return response.status();
  absl::StatusOr<migration::ModelState> state =
      ModelStateFromProto(job.model, response->tensors());
  if (!state.ok()) {
    return absl::Status(state.status().code(),
                        absl::StrCat("agent ", address(), " (",
                                     response->engine(), ") described ",
                                     state.status().message()));
  }
  return StateDescription{.engine = response->engine(),
                          .state = *std::move(state)};
}

absl::StatusOr<NodeStatus> AgentClient::Status(int64_t generation) {
  absl::StatusOr<v1::StatusResponse> response = StatusMessage(generation);
  if (!response.ok()) return response.status();
  absl::StatusOr<NodeStatus> status = NodeStatusFromProto(*response);
  if (!status.ok()) {
    return absl::Status(
        status.status().code(),
        absl::StrCat("agent ", address(), ": ", status.status().message()));
  }
  return status;
}

}  // namespace arachne::agent
