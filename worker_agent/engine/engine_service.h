// arachne.v1.Engine (proto/arachne/v1/engine.proto): what one engine
// process serves its node's agent on a Unix socket (docs/engines.md). The
// switch phases are the Agent service's handlers over this process's
// NodeRuntime, which runs the one GPU the process was started for
// (NodeGpus::local_rank), so the checks, codes and messages are the same
// whether a rank runs in the agent or in an engine process. Describe is the
// engine's own: protocol version, device, memory and the job's state
// layout.
#ifndef ARACHNE_WORKER_AGENT_ENGINE_ENGINE_SERVICE_H_
#define ARACHNE_WORKER_AGENT_ENGINE_ENGINE_SERVICE_H_

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "arachne/v1/engine.grpc.pb.h"
#include "grpcpp/grpcpp.h"
#include "planner_service/core/model/gpu_catalog.h"
#include "planner_service/core/model/model.h"
#include "worker_agent/agent_service.h"
#include "worker_agent/engine_launch.h"
#include "worker_agent/node_runtime.h"

namespace arachne::agent {

class EngineService final : public v1::Engine::Service {
 public:
  // `runtime` runs this process's GPU and must outlive the service.
  EngineService(NodeRuntime* runtime, GpuCatalog catalog,
                std::vector<ModelSpec> models);

  grpc::Status Describe(grpc::ServerContext* context,
                        const v1::DescribeRequest* request,
                        v1::DescribeResponse* response) override;
  grpc::Status Prepare(grpc::ServerContext* context,
                       const v1::PrepareRequest* request,
                       v1::PrepareResponse* response) override {
    return phases_.Prepare(context, request, response);
  }
  grpc::Status Pause(grpc::ServerContext* context,
                     const v1::PauseRequest* request,
                     v1::PauseResponse* response) override {
    return phases_.Pause(context, request, response);
  }
  grpc::Status Migrate(grpc::ServerContext* context,
                       const v1::MigrateRequest* request,
                       v1::MigrateResponse* response) override {
    return phases_.Migrate(context, request, response);
  }
  grpc::Status Rebuild(grpc::ServerContext* context,
                       const v1::RebuildRequest* request,
                       v1::RebuildResponse* response) override {
    return phases_.Rebuild(context, request, response);
  }
  grpc::Status Commit(grpc::ServerContext* context,
                      const v1::CommitRequest* request,
                      v1::CommitResponse* response) override {
    return phases_.Commit(context, request, response);
  }
  grpc::Status Resume(grpc::ServerContext* context,
                      const v1::ResumeRequest* request,
                      v1::ResumeResponse* response) override {
    return phases_.Resume(context, request, response);
  }
  grpc::Status Abort(grpc::ServerContext* context,
                     const v1::AbortRequest* request,
                     v1::AbortResponse* response) override {
    return phases_.Abort(context, request, response);
  }
  grpc::Status Status(grpc::ServerContext* context,
                      const v1::StatusRequest* request,
                      v1::StatusResponse* response) override {
    return phases_.Status(context, request, response);
  }
  grpc::Status SaveCheckpoint(grpc::ServerContext* context,
                              const v1::SaveCheckpointRequest* request,
                              v1::SaveCheckpointResponse* response) override {
    return phases_.SaveCheckpoint(context, request, response);
  }

 private:
  NodeRuntime* const runtime_;
  const std::vector<ModelSpec> models_;
  // The phases' handlers; no token (the socket's directory is the agent's)
  // and no controller check (the agent checked its caller).
  AgentService phases_;
};

}  // namespace arachne::agent

#endif  // ARACHNE_WORKER_AGENT_ENGINE_ENGINE_SERVICE_H_
