#include "planner_service/server/planner_service.h"

#include <chrono>
#include <limits>
#include <utility>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/string_view.h"
#include "glog/logging.h"
#include "planner_service/api/proto_convert.h"
#include "rpc/credentials.h"

namespace arachne {

namespace {

std::string CodeName(grpc::StatusCode code) {
  return absl::StatusCodeToString(static_cast<absl::StatusCode>(code));
}

absl::Time DeadlineOf(const grpc::CallbackServerContext& context) {
  const auto deadline = context.deadline();
  // gRPC reports "no deadline" as the far future.
  if (deadline >= std::chrono::system_clock::time_point::max() -
                      std::chrono::hours(24 * 365)) {
    return absl::InfiniteFuture();
  }
  return absl::FromChrono(deadline);
}

}  // namespace

// ---- WorkerPool ----

WorkerPool::WorkerPool(int threads) {
  CHECK_GT(threads, 0);
  for (int i = 0; i < threads; ++i) threads_.emplace_back([this] { Loop(); });
}

WorkerPool::~WorkerPool() {
  {
    absl::MutexLock lock(&mu_);
    stopping_ = true;
  }
  for (std::thread& t : threads_) t.join();
}

void WorkerPool::Submit(std::function<void()> task) {
  absl::MutexLock lock(&mu_);
  CHECK(!stopping_) << "Submit after the pool stopped";
  tasks_.push_back(std::move(task));
}

void WorkerPool::Loop() {
  while (true) {
    std::function<void()> task;
    {
      absl::MutexLock lock(&mu_);
      mu_.Await(absl::Condition(
          +[](WorkerPool* p) ABSL_EXCLUSIVE_LOCKS_REQUIRED(p->mu_) {
            return p->stopping_ || !p->tasks_.empty();
          },
          this));
      if (tasks_.empty()) return;  // stopping, nothing left
      task = std::move(tasks_.front());
      tasks_.pop_front();
    }
    task();
  }
}

// ---- RpcMetrics ----

RpcMetrics::RpcMetrics()
    : bucket_upper_s_(
          {0.001, 0.005, 0.01, 0.05, 0.1, 0.5, 1, 5, 10, 60, 1e300}) {}

void RpcMetrics::Record(const std::string& method, grpc::StatusCode code,
                        absl::Duration latency) {
  const double s = absl::ToDoubleSeconds(latency);
  absl::MutexLock lock(&mu_);
  Method& m = methods_[method];
  if (m.bucket_counts.empty())
    m.bucket_counts.assign(bucket_upper_s_.size(), 0);
  ++m.requests;
  ++m.codes[CodeName(code)];
  m.total_latency_s += s;
  for (size_t i = 0; i < bucket_upper_s_.size(); ++i) {
    if (s <= bucket_upper_s_[i]) {
      ++m.bucket_counts[i];
      break;
    }
  }
}

void RpcMetrics::Fill(v1::GetStatsResponse* response) const {
  absl::MutexLock lock(&mu_);
  for (const auto& [name, m] : methods_) {
    v1::RpcStats* r = response->add_rpcs();
    r->set_method(name);
    r->set_requests(m.requests);
    for (const auto& [code, n] : m.codes) (*r->mutable_codes())[code] = n;
    for (double b : bucket_upper_s_) r->add_bucket_upper_s(b);
    for (int64_t c : m.bucket_counts) r->add_bucket_counts(c);
    r->set_total_latency_s(m.total_latency_s);
  }
}

std::string RpcMetrics::Summary() const {
  absl::MutexLock lock(&mu_);
  std::string out;
  for (const auto& [name, m] : methods_) {
    absl::StrAppendFormat(&out, "%s: %d requests, mean %.3f s;", name,
                          m.requests,
                          m.requests ? m.total_latency_s / m.requests : 0.0);
    for (const auto& [code, n] : m.codes)
      absl::StrAppend(&out, " ", code, "=", n);
    out += "\n";
  }
  return out;
}

// ---- Calls ----

// One call's reactor: records cancellation for the planner, and on Finish
// the metrics and the log line with the request id.
class PlannerService::Call : public grpc::ServerUnaryReactor {
 public:
  Call(PlannerService* service, grpc::CallbackServerContext* context,
       const char* method, std::string request_id)
      : service_(service),
        context_(context),
        method_(method),
        request_id_(std::move(request_id)),
        deadline_(DeadlineOf(*context)) {}

  void OnCancel() override { cancelled_.store(true); }
  void OnDone() override { delete this; }

  void Answer(const absl::Status& status) {
    const grpc::Status g = ToGrpcStatus(status);
    const absl::Duration latency = absl::Now() - start_;
    service_->metrics_.Record(method_, g.error_code(), latency);
    if (status.ok()) {
      LOG(INFO) << "[" << request_id_ << "] " << method_ << " OK in "
                << absl::FormatDuration(latency);
    } else {
      LOG(WARNING) << "[" << request_id_ << "] " << method_ << " "
                   << CodeName(g.error_code()) << " in "
                   << absl::FormatDuration(latency) << ": " << status.message();
    }
    Finish(g);  // last touch: the reactor may be deleted after this
  }

  const std::atomic<bool>* cancelled() const { return &cancelled_; }
  absl::Time deadline() const { return deadline_; }
  const std::string& request_id() const { return request_id_; }
  grpc::CallbackServerContext* context() const { return context_; }

 private:
  PlannerService* const service_;
  grpc::CallbackServerContext* const context_;
  const std::string method_;
  const std::string request_id_;
  const absl::Time deadline_;
  const absl::Time start_ = absl::Now();
  std::atomic<bool> cancelled_{false};
};

PlannerService::PlannerService(PlannerHandler* handler,
                               PlannerServiceConfig config)
    : handler_(handler), config_(config), pool_(config.workers) {
  CHECK(handler_ != nullptr);
  CHECK_GE(config_.max_in_flight, 1);
}

PlannerService::~PlannerService() = default;

bool PlannerService::TryAdmit() {
  int n = in_flight_.load();
  while (n < config_.max_in_flight) {
    if (in_flight_.compare_exchange_weak(n, n + 1)) return true;
  }
  return false;
}

void PlannerService::Release() { in_flight_.fetch_sub(1); }

PlannerService::Call* PlannerService::Begin(
    grpc::CallbackServerContext* context, const char* method) {
  std::string id = absl::StrCat("req-", next_request_id_.fetch_add(1));
  LOG(INFO) << "[" << id << "] " << method << " from " << context->peer();
  return new Call(this, context, method, std::move(id));
}

absl::Status PlannerService::Authenticate(
    const grpc::CallbackServerContext& context) const {
  return CheckBearerToken(context, config_.bearer_token);
}

grpc::ServerUnaryReactor* PlannerService::RunOnPool(
    grpc::CallbackServerContext* context, const char* method,
    std::function<absl::Status(Call& call)> work) {
  Call* call = Begin(context, method);
  if (absl::Status auth = Authenticate(*context); !auth.ok()) {
    call->Answer(auth);
    return call;
  }
  if (!TryAdmit()) {
    call->Answer(absl::ResourceExhaustedError(
        absl::StrCat("server busy: ", config_.max_in_flight,
                     " Plan/Evaluate/Replan calls in flight; retry later")));
    return call;
  }
  pool_.Submit([this, call, work = std::move(work)] {
    absl::Status status = call->cancelled()->load()
                              ? absl::CancelledError("cancelled while queued")
                              : work(*call);
    // Free the slot before answering, so a client that sends its next call
    // as soon as this one returns is admitted.
    Release();
    call->Answer(status);
  });
  return call;
}

namespace {

// The handler's query for a Plan or Replan request (the cluster is set by
// the caller: Replan's is new_cluster).
PlanQuery PlanQueryFromProto(const v1::ModelRef& model,
                             const v1::TrainingConfig& training,
                             const v1::PlannerOptions& o) {
  PlanQuery q;
  q.model = ModelRefFromProto(model);
  q.training = TrainingFromProto(training);
  q.planner = o.planner();
  q.budget_s = o.budget_s();
  q.max_evaluations = o.max_evaluations();
  q.seed = o.seed();
  q.max_depth = o.max_depth();
  q.max_templates = o.max_templates();
  q.policy_rollouts = o.has_policy_rollouts() ? o.policy_rollouts() : -1;
  q.objective = o.objective() == v1::PlannerOptions::USD_PER_TOKEN
                    ? PlannerObjective::kUsdPerToken
                    : PlannerObjective::kThroughput;
  return q;
}

absl::Status FillPlanResponse(const PlanAnswer& a, v1::PlanResponse* response) {
  if (absl::Status s = PlanJsonToProto(a.plan, response->mutable_plan(),
                                       response->mutable_prediction());
      !s.ok()) {
    return s;
  }
  response->set_planner(a.planner);
  response->set_planning_time_s(a.planning_time_s);
  response->set_evaluations(a.evaluations);
  response->set_exhaustive(a.exhaustive);
  response->set_stopped_early(a.stopped_early);
  return absl::OkStatus();
}

}  // namespace

grpc::ServerUnaryReactor* PlannerService::Plan(
    grpc::CallbackServerContext* context, const v1::PlanRequest* request,
    v1::PlanResponse* response) {
  return RunOnPool(context, "Plan", [this, request, response](Call& call) {
    PlanQuery q = PlanQueryFromProto(request->model(), request->training(),
                                     request->options());
    q.cluster = request->cluster();
    q.deadline = call.deadline();
    q.cancelled = call.cancelled();
    q.request_id = call.request_id();
    absl::StatusOr<PlanAnswer> a = handler_->Plan(q);
    if (!a.ok()) return a.status();
    return FillPlanResponse(*a, response);
  });
}

grpc::ServerUnaryReactor* PlannerService::Replan(
    grpc::CallbackServerContext* context, const v1::ReplanRequest* request,
    v1::ReplanResponse* response) {
  return RunOnPool(context, "Replan", [this, request, response](Call& call) {
    ReplanQuery q;
    q.plan = PlanQueryFromProto(request->model(), request->training(),
                                request->options());
    q.plan.cluster = request->new_cluster();
    q.plan.deadline = call.deadline();
    q.plan.cancelled = call.cancelled();
    q.plan.request_id = call.request_id();
    q.current_cluster = request->current_cluster();
    q.current_plan = PlanProtoToJson(request->current_plan());
    absl::StatusOr<ReplanAnswer> a = handler_->Replan(q);
    if (!a.ok()) return a.status();
    if (absl::Status s =
            FillPlanResponse(a->new_plan, response->mutable_new_plan());
        !s.ok()) {
      return s;
    }
    v1::CurrentPlanOnNewCluster* current = response->mutable_current();
    current->set_feasible(a->current.feasible);
    current->set_reason(a->current.reason);
    if (a->current.feasible) {
      if (absl::Status s =
              PlanJsonToProto(a->current.plan, current->mutable_plan(),
                              current->mutable_prediction());
          !s.ok()) {
        return s;
      }
    }
    v1::MigrationEstimate* m = response->mutable_migration();
    m->set_available(a->migration.available);
    m->set_reason(a->migration.reason);
    m->set_bytes_moved(a->migration.bytes_moved);
    m->set_bytes_kept(a->migration.bytes_kept);
    m->set_naive_bytes(a->migration.naive_bytes);
    m->set_makespan_s(a->migration.makespan_s);
    m->set_lower_bound_s(a->migration.lower_bound_s);
    m->set_transfers(a->migration.transfers);
    return absl::OkStatus();
  });
}

grpc::ServerUnaryReactor* PlannerService::Evaluate(
    grpc::CallbackServerContext* context, const v1::EvaluateRequest* request,
    v1::EvaluateResponse* response) {
  return RunOnPool(context, "Evaluate", [this, request, response](Call& call) {
    EvaluateQuery q;
    q.model = ModelRefFromProto(request->model());
    q.training = TrainingFromProto(request->training());
    q.cluster = request->cluster();
    q.plan = PlanProtoToJson(request->plan());
    q.request_id = call.request_id();
    absl::StatusOr<EvaluateAnswer> a = handler_->Evaluate(q);
    if (!a.ok()) return a.status();
    return PlanJsonToProto(a->plan, response->mutable_plan(),
                           response->mutable_prediction());
  });
}

grpc::ServerUnaryReactor* PlannerService::ListModels(
    grpc::CallbackServerContext* context, const v1::ListModelsRequest*,
    v1::ListModelsResponse* response) {
  Call* call = Begin(context, "ListModels");
  if (absl::Status auth = Authenticate(*context); !auth.ok()) {
    call->Answer(auth);
    return call;
  }
  absl::StatusOr<std::vector<ModelSpec>> models = handler_->ListModels();
  if (models.ok()) {
    for (const ModelSpec& m : *models)
      *response->add_models() = ModelToProto(m);
  }
  call->Answer(models.status());
  return call;
}

grpc::ServerUnaryReactor* PlannerService::ListGpuTypes(
    grpc::CallbackServerContext* context, const v1::ListGpuTypesRequest*,
    v1::ListGpuTypesResponse* response) {
  Call* call = Begin(context, "ListGpuTypes");
  if (absl::Status auth = Authenticate(*context); !auth.ok()) {
    call->Answer(auth);
    return call;
  }
  absl::StatusOr<std::vector<GpuType>> types = handler_->ListGpuTypes();
  if (types.ok()) {
    for (const GpuType& t : *types)
      *response->add_gpu_types() = GpuTypeToProto(t);
  }
  call->Answer(types.status());
  return call;
}

grpc::ServerUnaryReactor* PlannerService::GetStats(
    grpc::CallbackServerContext* context, const v1::GetStatsRequest*,
    v1::GetStatsResponse* response) {
  Call* call = Begin(context, "GetStats");
  if (absl::Status auth = Authenticate(*context); !auth.ok()) {
    call->Answer(auth);
    return call;
  }
  metrics_.Fill(response);
  response->set_in_flight(in_flight_.load());
  response->set_uptime_s(absl::ToDoubleSeconds(absl::Now() - started_));
  call->Answer(absl::OkStatus());
  return call;
}

}  // namespace arachne
