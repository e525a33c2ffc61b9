#include "worker_agent/engine/engine_service.h"

#include <unistd.h>

#include <fstream>
#include <string>
#include <utility>

#include "absl/strings/str_cat.h"
#include "glog/logging.h"
#include "rpc/grpc_status.h"
#include "worker_agent/agent_proto_convert.h"
#include "worker_agent/engine/reference_engine.h"
#include "worker_agent/process_memory.h"

namespace arachne::agent {
namespace {

}  // namespace

EngineService::EngineService(NodeRuntime* runtime, GpuCatalog catalog,
                             std::vector<ModelSpec> models)
    : runtime_(runtime),
      models_(models),
      phases_(runtime, std::move(catalog), std::move(models), {}) {}

grpc::Status EngineService::Describe(grpc::ServerContext*,
                                     const v1::DescribeRequest* request,
                                     v1::DescribeResponse* response) {
  absl::Status status = [&]() -> absl::Status {
    if (request->protocol_version() != kEngineProtocolVersion) {
      return absl::FailedPreconditionError(absl::StrCat(
          "protocol_version: the caller speaks engine protocol version ",
          request->protocol_version(), ", this engine (arachne-engine) speaks ",
          kEngineProtocolVersion));
    }
    const NodeGpus& gpus = runtime_->gpus();
    response->set_protocol_version(kEngineProtocolVersion);
    response->set_engine(std::string(kReferenceEngineName));
    response->set_node(gpus.node);
    response->set_local_rank(gpus.local_rank);
    response->set_node_gpus(gpus.count);
    // The reference engine computes on the CPU (a virtual GPU) in this
    // build; its memory is the process's and the machine's.
    response->set_device("cpu");
    response->set_memory_used_bytes(ResidentBytes());
    response->set_memory_free_bytes(AvailableBytes());
    response->set_pid(getpid());
    const bool has_job = !request->model().name().empty() ||
                         !request->model().hf_config_json().empty() ||
                         request->has_model_spec();
    if (!has_job) return absl::OkStatus();
    absl::StatusOr<JobSpec> job = JobSpecFromProto(
        request->model(),
        request->has_model_spec() ? &request->model_spec() : nullptr,
        request->training(), request->engine(), models_);
    if (!job.ok()) return job.status();
    absl::StatusOr<StateDescription> described = runtime_->DescribeState(*job);
    if (!described.ok()) return described.status();
    ModelStateToProto(described->state, response->mutable_tensors());
    return absl::OkStatus();
  }();
  if (!status.ok()) {
    LOG(WARNING) << "Describe: " << status;
    response->Clear();
  }
  return ToGrpcStatus(status);
}

}  // namespace arachne::agent
