// The gRPC glue of the planning service: converts arachne.v1 messages to the
// handler's project types and back, maps absl::Status to grpc::Status in one
// function (ToGrpcStatus), and adds what belongs to the RPC layer only:
// deadlines and cancellation, bounded concurrency, request ids in the logs,
// per-RPC counters and latency histograms (GetStats).
//
// Plan, Evaluate and Replan run on a fixed pool of worker threads, never on
// gRPC's callback threads; at most `max_in_flight` of them are admitted at once
// (queued or running), further ones answer RESOURCE_EXHAUSTED at once, so
// memory stays bounded under any load.
#ifndef ARACHNE_PLANNER_SERVICE_SERVER_PLANNER_SERVICE_H_
#define ARACHNE_PLANNER_SERVICE_SERVER_PLANNER_SERVICE_H_

#include <atomic>
#include <cstdint>
#include <deque>
#include <functional>
#include <map>
#include <string>
#include <thread>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/status/status.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "arachne/v1/planner.grpc.pb.h"
#include "grpcpp/grpcpp.h"
#include "planner_service/api/planner_handler.h"
#include "rpc/grpc_status.h"  // ToGrpcStatus, the one mapping to the wire

namespace arachne {

struct PlannerServiceConfig {
  int workers = 4;         // threads running Plan / Evaluate / Replan
  int max_in_flight = 16;  // admitted Plan/Evaluate/Replan calls (>= workers)
  // When not empty, every arachne.v1.Planner call must carry the metadata
  // `authorization: Bearer <token>` or is answered UNAUTHENTICATED. Health
  // and reflection stay open: Kubernetes probes cannot send metadata.
  std::string bearer_token;
};

// A fixed set of threads draining a FIFO of tasks. Destruction runs the
// tasks already queued, then joins.
class WorkerPool {
 public:
  explicit WorkerPool(int threads);
  ~WorkerPool();
  void Submit(std::function<void()> task);

 private:
  void Loop();
  absl::Mutex mu_;
  std::deque<std::function<void()>> tasks_ ABSL_GUARDED_BY(mu_);
  bool stopping_ ABSL_GUARDED_BY(mu_) = false;
  std::vector<std::thread> threads_;
};

// Counters and latency histograms per RPC method.
class RpcMetrics {
 public:
  RpcMetrics();
  void Record(const std::string& method, grpc::StatusCode code,
              absl::Duration latency);
  void Fill(v1::GetStatsResponse* response) const;
  // One line per method, for the log at shutdown.
  std::string Summary() const;

 private:
  struct Method {
    int64_t requests = 0;
    std::map<std::string, int64_t> codes;
    std::vector<int64_t> bucket_counts;
    double total_latency_s = 0;
  };
  const std::vector<double> bucket_upper_s_;
  mutable absl::Mutex mu_;
  std::map<std::string, Method> methods_ ABSL_GUARDED_BY(mu_);
};

class PlannerService final : public v1::Planner::CallbackService {
 public:
  // `handler` must outlive the service.
  PlannerService(PlannerHandler* handler, PlannerServiceConfig config);
  // Runs the queued calls to completion and joins the workers; destroy only
  // after the grpc::Server has shut down.
  ~PlannerService() override;

  grpc::ServerUnaryReactor* Plan(grpc::CallbackServerContext* context,
                                 const v1::PlanRequest* request,
                                 v1::PlanResponse* response) override;
  grpc::ServerUnaryReactor* Evaluate(grpc::CallbackServerContext* context,
                                     const v1::EvaluateRequest* request,
                                     v1::EvaluateResponse* response) override;
  grpc::ServerUnaryReactor* Replan(grpc::CallbackServerContext* context,
                                   const v1::ReplanRequest* request,
                                   v1::ReplanResponse* response) override;
  grpc::ServerUnaryReactor* ListModels(
      grpc::CallbackServerContext* context,
      const v1::ListModelsRequest* request,
      v1::ListModelsResponse* response) override;
  grpc::ServerUnaryReactor* ListGpuTypes(
      grpc::CallbackServerContext* context,
      const v1::ListGpuTypesRequest* request,
      v1::ListGpuTypesResponse* response) override;
  grpc::ServerUnaryReactor* GetStats(grpc::CallbackServerContext* context,
                                     const v1::GetStatsRequest* request,
                                     v1::GetStatsResponse* response) override;

  const RpcMetrics& metrics() const { return metrics_; }

 private:
  class Call;
  // Admits a heavy call under max_in_flight; false when full.
  bool TryAdmit();
  void Release();
  // Runs `work` on the pool when admitted, else answers RESOURCE_EXHAUSTED.
  grpc::ServerUnaryReactor* RunOnPool(
      grpc::CallbackServerContext* context, const char* method,
      std::function<absl::Status(Call& call)> work);
  Call* Begin(grpc::CallbackServerContext* context, const char* method);
  // OK without a configured token, else Unauthenticated unless the call
  // carries `authorization: Bearer <token>`.
  absl::Status Authenticate(const grpc::CallbackServerContext& context) const;

  PlannerHandler* const handler_;
  const PlannerServiceConfig config_;
  const absl::Time started_ = absl::Now();
  std::atomic<int> in_flight_{0};
  std::atomic<int64_t> next_request_id_{1};
  RpcMetrics metrics_;
  WorkerPool pool_;  // last: joined first on destruction
};

}  // namespace arachne

#endif  // ARACHNE_PLANNER_SERVICE_SERVER_PLANNER_SERVICE_H_
