#include "planner_service/server/planner_service.h"

#include <chrono>
#include <limits>
#include <utility>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/string_view.h"
#include "glog/logging.h"
#include "grpcpp/support/proto_buffer_reader.h"
#include "planner_service/api/proto_convert.h"
#include "planner_service/core/planning_options.h"
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

// One call's reactor: its stop flag for the planner (set when gRPC cancels
// the call or the shutdown cuts it), and on Answer the response bytes, the
// metrics and the log line with the request id.
class PlannerService::Call : public grpc::ServerUnaryReactor {
 public:
  Call(PlannerService* service, grpc::CallbackServerContext* context,
       const char* method, std::string request_id,
       grpc::ByteBuffer* raw_response)
      : service_(service),
        context_(context),
        method_(method),
        request_id_(std::move(request_id)),
        raw_response_(raw_response),
        deadline_(DeadlineOf(*context)) {}

  // The client went away, its deadline passed, or the server shut down
  // past the grace period: whatever this call answers is not delivered.
  void OnCancel() override {
    grpc_cancelled_.store(true);
    stop_.store(true);
  }
  void OnDone() override { delete this; }

  // The shutdown's grace period ended with this call still admitted.
  void Cut() {
    cut_.store(true);
    stop_.store(true);
  }

  // Finishes the call with `status`, and when it is OK with `response`
  // (null: an empty answer) as the answer's bytes.
  void Answer(absl::Status status, const google::protobuf::Message* response) {
    if (status.ok() && response != nullptr) {
      std::string bytes;
      if (!response->SerializeToString(&bytes)) {
        status = absl::InternalError(absl::StrCat(
            "cannot serialize the ", response->GetTypeName(), " answer"));
      } else {
        grpc::Slice slice(bytes);
        *raw_response_ = grpc::ByteBuffer(&slice, 1);
      }
    }
    const grpc::Status g = ToGrpcStatus(status);
    const absl::Duration latency = absl::Now() - start_;
    if (grpc_cancelled_.load()) {
      // Counted as the client saw it: the answer computed here never left.
      service_->metrics_.Record(method_, grpc::StatusCode::CANCELLED, latency);
      LOG(WARNING) << "[" << request_id_ << "] " << method_ << " cut after "
                   << absl::FormatDuration(latency)
                   << ": the call was cancelled (the client went away, its "
                      "deadline passed or the server shut down) before its "
                      "answer ("
                   << CodeName(g.error_code()) << ") was sent";
    } else {
      service_->metrics_.Record(method_, g.error_code(), latency);
      const char* cut = cut_.load() ? " (cut by the shutdown)" : "";
      if (status.ok()) {
        LOG(INFO) << "[" << request_id_ << "] " << method_ << " OK in "
                  << absl::FormatDuration(latency) << cut;
      } else {
        LOG(WARNING) << "[" << request_id_ << "] " << method_ << " "
                     << CodeName(g.error_code()) << " in "
                     << absl::FormatDuration(latency) << cut << ": "
                     << status.message();
      }
    }
    service_->Forget(this);
    Finish(g);  // last touch: the reactor may be deleted after this
  }

  const std::atomic<bool>* stop() const { return &stop_; }
  bool stopped() const { return stop_.load(); }
  bool cut() const { return cut_.load(); }
  absl::Time deadline() const { return deadline_; }
  const std::string& request_id() const { return request_id_; }
  grpc::CallbackServerContext* context() const { return context_; }

 private:
  PlannerService* const service_;
  grpc::CallbackServerContext* const context_;
  const std::string method_;
  const std::string request_id_;
  grpc::ByteBuffer* const raw_response_;
  const absl::Time deadline_;
  const absl::Time start_ = absl::Now();
  std::atomic<bool> stop_{false}, grpc_cancelled_{false}, cut_{false};
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

void PlannerService::Forget(Call* call) {
  absl::MutexLock lock(&calls_mu_);
  admitted_.erase(call);
}

void PlannerService::BeginDrain() { draining_.store(true); }

bool PlannerService::WaitIdle(absl::Time deadline) {
  absl::MutexLock lock(&calls_mu_);
  return calls_mu_.AwaitWithDeadline(
      absl::Condition(
          +[](absl::flat_hash_set<Call*>* calls) { return calls->empty(); },
          &admitted_),
      deadline);
}

void PlannerService::CutAdmitted() {
  absl::MutexLock lock(&calls_mu_);
  LOG(WARNING) << "grace period over: cutting " << admitted_.size()
               << " calls (queued ones answer UNAVAILABLE, running searches "
                  "answer with their best plan so far)";
  for (Call* call : admitted_) call->Cut();
}

namespace {

// The request's bytes as `message`; InvalidArgument naming the message type
// when they are not one (garbage, truncated, a string that is not UTF-8:
// proto3 strings must be).
absl::Status ParseRequest(const grpc::ByteBuffer& raw,
                          google::protobuf::Message* message) {
  grpc::ByteBuffer copy(raw);  // the reader consumes it; slices are shared
  grpc::ProtoBufferReader reader(&copy);
  if (!message->ParseFromZeroCopyStream(&reader)) {
    return absl::InvalidArgumentError(absl::StrCat(
        "request: not a valid ", message->GetTypeName(),
        " (truncated or garbled bytes, or a string field that is not "
        "UTF-8)"));
  }
  return absl::OkStatus();
}

}  // namespace

PlannerService::Call* PlannerService::Begin(
    grpc::CallbackServerContext* context, const char* method,
    const grpc::ByteBuffer* raw_request, google::protobuf::Message* request,
    grpc::ByteBuffer* raw_response, absl::Status* ready) {
  std::string id = absl::StrCat("req-", next_request_id_.fetch_add(1));
  LOG(INFO) << "[" << id << "] " << method << " from " << context->peer();
  Call* call = new Call(this, context, method, std::move(id), raw_response);
  *ready = Authenticate(*context);
  if (ready->ok() && draining_.load()) {
    *ready = absl::UnavailableError(
        "server shutting down: new calls are refused; retry on another "
        "replica");
  }
  if (ready->ok()) *ready = ParseRequest(*raw_request, request);
  if (!ready->ok()) call->Answer(*ready, nullptr);
  return call;
}

absl::Status PlannerService::Authenticate(
    const grpc::CallbackServerContext& context) const {
  return CheckBearerToken(context, config_.bearer_token);
}

void PlannerService::Enqueue(
    Call* call, std::shared_ptr<google::protobuf::Message> response,
    std::function<absl::Status(Call& call)> work) {
  if (!TryAdmit()) {
    call->Answer(absl::ResourceExhaustedError(absl::StrCat(
                     "server busy: ", config_.max_in_flight,
                     " Plan/Evaluate/Replan calls in flight; retry later")),
                 nullptr);
    return;
  }
  {
    absl::MutexLock lock(&calls_mu_);
    admitted_.insert(call);
  }
  pool_.Submit(
      [this, call, response = std::move(response), work = std::move(work)] {
        absl::Status status;
        if (call->cut()) {
          status = absl::UnavailableError(
              "server shutting down: the grace period ended before this call "
              "ran; retry on another replica");
        } else if (call->stopped()) {
          status = absl::CancelledError("cancelled while queued");
        } else {
          status = work(*call);
        }
        // Free the slot before answering, so a client that sends its next call
        // as soon as this one returns is admitted.
        Release();
        call->Answer(status, response.get());
      });
}

namespace {

// The handler's query for a Plan or Replan request (the cluster is set by
// the caller: Replan's is new_cluster). The objective's raw value is kept
// so that one no enum names is rejected, not read as THROUGHPUT.
PlanQuery PlanQueryFromProto(const v1::ModelRef& model,
                             const v1::TrainingConfig& training,
                             const v1::Calibration& calibration,
                             const v1::PlannerOptions& o) {
  PlanQuery q;
  q.model = ModelRefFromProto(model);
  q.training = TrainingFromProto(training);
  q.training.calibration = calibration;
  q.planner = o.planner();
  q.budget_s = o.budget_s();
  q.max_evaluations = o.max_evaluations();
  q.seed = o.seed();
  q.max_depth = o.max_depth();
  q.max_templates = o.max_templates();
  q.policy_rollouts = o.has_policy_rollouts() ? o.policy_rollouts() : -1;
  q.objective = static_cast<PlannerObjective>(o.objective());
  return q;
}

absl::Status FillPlanResponse(const PlanAnswer& a, v1::PlanResponse* response) {
  if (absl::Status s = PlanJsonToProto(a.plan, response->mutable_plan(),
                                       response->mutable_prediction());
      !s.ok()) {
    return s;
  }
  response->set_planner(a.planner);
  response->set_planner_fallback_reason(a.planner_fallback_reason);
  response->set_planning_time_s(a.planning_time_s);
  response->set_evaluations(a.evaluations);
  response->set_exhaustive(a.exhaustive);
  response->set_stopped_early(a.stopped_early);
  return absl::OkStatus();
}

// The options exactly as the message gives them (an explicit
// policy_rollouts of -1 included), checked by the validation the CLI uses.
absl::Status CheckOptionsMessage(const v1::PlannerOptions& o) {
  return ValidatePlanningOptions(PlanningOptionsFromProto(o),
                                 kRequestOptionNames);
}

}  // namespace

grpc::ServerUnaryReactor* PlannerService::Plan(
    grpc::CallbackServerContext* context, const grpc::ByteBuffer* raw_request,
    grpc::ByteBuffer* raw_response) {
  v1::PlanRequest request;
  absl::Status ready;
  Call* call =
      Begin(context, "Plan", raw_request, &request, raw_response, &ready);
  if (!ready.ok()) return call;
  auto q = std::make_shared<PlanQuery>(PlanQueryFromProto(
      request.model(), request.training(), request.calibration(),
      request.options()));
  q->cluster = std::move(*request.mutable_cluster());
  if (absl::Status s = CheckOptionsMessage(request.options()); !s.ok()) {
    call->Answer(s, nullptr);
    return call;
  }
  if (absl::Status s = handler_->CheckPlan(*q); !s.ok()) {
    call->Answer(s, nullptr);
    return call;
  }
  auto response = std::make_shared<v1::PlanResponse>();
  Enqueue(call, response, [this, q, response](Call& call) {
    q->deadline = call.deadline();
    q->cancelled = call.stop();
    q->request_id = call.request_id();
    absl::StatusOr<PlanAnswer> a = handler_->Plan(*q);
    if (!a.ok()) return a.status();
    return FillPlanResponse(*a, response.get());
  });
  return call;
}

grpc::ServerUnaryReactor* PlannerService::Replan(
    grpc::CallbackServerContext* context, const grpc::ByteBuffer* raw_request,
    grpc::ByteBuffer* raw_response) {
  auto request = std::make_shared<v1::ReplanRequest>();
  absl::Status ready;
  Call* call = Begin(context, "Replan", raw_request, request.get(),
                     raw_response, &ready);
  if (!ready.ok()) return call;
  auto q = std::make_shared<ReplanQuery>();
  q->plan = PlanQueryFromProto(request->model(), request->training(),
                               request->calibration(), request->options());
  q->plan.cluster = request->new_cluster();
  q->current_cluster = request->current_cluster();
  if (absl::Status s = CheckOptionsMessage(request->options()); !s.ok()) {
    call->Answer(s, nullptr);
    return call;
  }
  if (absl::Status s = handler_->CheckReplan(*q); !s.ok()) {
    call->Answer(s, nullptr);
    return call;
  }
  auto response = std::make_shared<v1::ReplanResponse>();
  Enqueue(call, response, [this, q, request, response](Call& call) {
    q->plan.deadline = call.deadline();
    q->plan.cancelled = call.stop();
    q->plan.request_id = call.request_id();
    q->current_plan = PlanProtoToJson(request->current_plan());
    absl::StatusOr<ReplanAnswer> a = handler_->Replan(*q);
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
  return call;
}

grpc::ServerUnaryReactor* PlannerService::Evaluate(
    grpc::CallbackServerContext* context, const grpc::ByteBuffer* raw_request,
    grpc::ByteBuffer* raw_response) {
  auto request = std::make_shared<v1::EvaluateRequest>();
  absl::Status ready;
  Call* call = Begin(context, "Evaluate", raw_request, request.get(),
                     raw_response, &ready);
  if (!ready.ok()) return call;
  auto q = std::make_shared<EvaluateQuery>();
  q->model = ModelRefFromProto(request->model());
  q->training = TrainingFromProto(request->training());
  q->training.calibration = request->calibration();
  q->cluster = request->cluster();
  if (absl::Status s = handler_->CheckEvaluate(*q); !s.ok()) {
    call->Answer(s, nullptr);
    return call;
  }
  auto response = std::make_shared<v1::EvaluateResponse>();
  Enqueue(call, response, [this, q, request, response](Call& call) {
    q->plan = PlanProtoToJson(request->plan());
    q->request_id = call.request_id();
    absl::StatusOr<EvaluateAnswer> a = handler_->Evaluate(*q);
    if (!a.ok()) return a.status();
    return PlanJsonToProto(a->plan, response->mutable_plan(),
                           response->mutable_prediction());
  });
  return call;
}

grpc::ServerUnaryReactor* PlannerService::ListModels(
    grpc::CallbackServerContext* context, const grpc::ByteBuffer* raw_request,
    grpc::ByteBuffer* raw_response) {
  v1::ListModelsRequest request;
  absl::Status ready;
  Call* call =
      Begin(context, "ListModels", raw_request, &request, raw_response, &ready);
  if (!ready.ok()) return call;
  v1::ListModelsResponse response;
  absl::StatusOr<std::vector<ModelSpec>> models = handler_->ListModels();
  if (models.ok()) {
    for (const ModelSpec& m : *models) *response.add_models() = ModelToProto(m);
  }
  call->Answer(models.status(), &response);
  return call;
}

grpc::ServerUnaryReactor* PlannerService::ListGpuTypes(
    grpc::CallbackServerContext* context, const grpc::ByteBuffer* raw_request,
    grpc::ByteBuffer* raw_response) {
  v1::ListGpuTypesRequest request;
  absl::Status ready;
  Call* call = Begin(context, "ListGpuTypes", raw_request, &request,
                     raw_response, &ready);
  if (!ready.ok()) return call;
  v1::ListGpuTypesResponse response;
  absl::StatusOr<std::vector<GpuType>> types = handler_->ListGpuTypes();
  if (types.ok()) {
    for (const GpuType& t : *types)
      *response.add_gpu_types() = GpuTypeToProto(t);
  }
  call->Answer(types.status(), &response);
  return call;
}

grpc::ServerUnaryReactor* PlannerService::GetStats(
    grpc::CallbackServerContext* context, const grpc::ByteBuffer* raw_request,
    grpc::ByteBuffer* raw_response) {
  v1::GetStatsRequest request;
  absl::Status ready;
  Call* call =
      Begin(context, "GetStats", raw_request, &request, raw_response, &ready);
  if (!ready.ok()) return call;
  v1::GetStatsResponse response;
  metrics_.Fill(&response);
  response.set_in_flight(in_flight_.load());
  response.set_uptime_s(absl::ToDoubleSeconds(absl::Now() - started_));
  call->Answer(absl::OkStatus(), &response);
  return call;
}

}  // namespace arachne
