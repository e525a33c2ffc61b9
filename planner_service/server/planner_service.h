// The gRPC glue of the planning service: converts arachne.v1 messages to the
// handler's project types and back, maps absl::Status to grpc::Status in one
// function (ToGrpcStatus), and adds what belongs to the RPC layer only:
// deadlines and cancellation, bounded concurrency, request ids in the logs,
// per-RPC counters and latency histograms (GetStats).
//
// Plan, Evaluate and Replan run on a fixed pool of worker threads, never on
// gRPC's callback threads; at most `max_in_flight` of them are admitted at once
// (queued or running), further ones answer RESOURCE_EXHAUSTED at once, so
// memory stays bounded under any load. A request is parsed, authenticated
// and checked (PlannerHandler::CheckPlan & co.) before it is admitted, so
// an invalid one is answered at once and never holds a slot.
//
// Every method takes its request as bytes (gRPC's raw callback methods)
// and parses them here: a request that does not parse (garbage, truncated,
// a string field that is not UTF-8) is answered INVALID_ARGUMENT, logged
// and counted like any other call. gRPC's own parsing would answer it
// before any of that.
#ifndef ARACHNE_PLANNER_SERVICE_SERVER_PLANNER_SERVICE_H_
#define ARACHNE_PLANNER_SERVICE_SERVER_PLANNER_SERVICE_H_

#include <atomic>
#include <cstdint>
#include <deque>
#include <functional>
#include <map>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/container/flat_hash_set.h"
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

// arachne.v1.Planner with every method taking and answering bytes.
using RawPlannerService = v1::Planner::WithRawCallbackMethod_Plan<
    v1::Planner::WithRawCallbackMethod_Evaluate<
        v1::Planner::WithRawCallbackMethod_ListModels<
            v1::Planner::WithRawCallbackMethod_ListGpuTypes<
                v1::Planner::WithRawCallbackMethod_Replan<
                    v1::Planner::WithRawCallbackMethod_GetStats<
                        v1::Planner::Service>>>>>>;

class PlannerService final : public RawPlannerService {
 public:
  // `handler` must outlive the service.
  PlannerService(PlannerHandler* handler, PlannerServiceConfig config);
  // Runs the queued calls to completion and joins the workers; destroy only
  // after the grpc::Server has shut down.
  ~PlannerService() override;

  grpc::ServerUnaryReactor* Plan(grpc::CallbackServerContext* context,
                                 const grpc::ByteBuffer* request,
                                 grpc::ByteBuffer* response) override;
  grpc::ServerUnaryReactor* Evaluate(grpc::CallbackServerContext* context,
                                     const grpc::ByteBuffer* request,
                                     grpc::ByteBuffer* response) override;
  grpc::ServerUnaryReactor* Replan(grpc::CallbackServerContext* context,
                                   const grpc::ByteBuffer* request,
                                   grpc::ByteBuffer* response) override;
  grpc::ServerUnaryReactor* ListModels(grpc::CallbackServerContext* context,
                                       const grpc::ByteBuffer* request,
                                       grpc::ByteBuffer* response) override;
  grpc::ServerUnaryReactor* ListGpuTypes(grpc::CallbackServerContext* context,
                                         const grpc::ByteBuffer* request,
                                         grpc::ByteBuffer* response) override;
  grpc::ServerUnaryReactor* GetStats(grpc::CallbackServerContext* context,
                                     const grpc::ByteBuffer* request,
                                     grpc::ByteBuffer* response) override;

  const RpcMetrics& metrics() const { return metrics_; }

  // Shutdown, in the order PlannerServer::Shutdown calls them. After
  // BeginDrain every new call answers UNAVAILABLE ("shutting down") while
  // the admitted ones go on; WaitIdle waits until none is left (true) or
  // `deadline` passes (false); CutAdmitted stops the admitted calls: queued
  // ones answer UNAVAILABLE, running searches stop and answer with the best
  // plan so far, and each is logged as cut by the shutdown.
  void BeginDrain();
  bool WaitIdle(absl::Time deadline);
  void CutAdmitted();

 private:
  class Call;
  // Admits a heavy call under max_in_flight; false when full.
  bool TryAdmit();
  void Release();
  // What every call does before its work: the log line, the token, the
  // shutdown check, parsing the bytes into `request`. Returns the call
  // (answered already when `*ready` is not OK).
  Call* Begin(grpc::CallbackServerContext* context, const char* method,
              const grpc::ByteBuffer* raw_request,
              google::protobuf::Message* request,
              grpc::ByteBuffer* raw_response, absl::Status* ready);
  // Admits `call` and runs `work` on the pool, answering with its status and
  // `response`; RESOURCE_EXHAUSTED at once when max_in_flight calls are in.
  void Enqueue(Call* call, std::shared_ptr<google::protobuf::Message> response,
               std::function<absl::Status(Call& call)> work);
  // A call that answered leaves the set CutAdmitted stops.
  void Forget(Call* call);
  // OK without a configured token, else Unauthenticated unless the call
  // carries `authorization: Bearer <token>`.
  absl::Status Authenticate(const grpc::CallbackServerContext& context) const;

  PlannerHandler* const handler_;
  const PlannerServiceConfig config_;
  const absl::Time started_ = absl::Now();
  std::atomic<int> in_flight_{0};
  std::atomic<bool> draining_{false};
  std::atomic<int64_t> next_request_id_{1};
  RpcMetrics metrics_;
  // Admitted calls that have not answered yet.
  absl::Mutex calls_mu_;
  absl::flat_hash_set<Call*> admitted_ ABSL_GUARDED_BY(calls_mu_);
  WorkerPool pool_;  // last: joined first on destruction
};

}  // namespace arachne

#endif  // ARACHNE_PLANNER_SERVICE_SERVER_PLANNER_SERVICE_H_
