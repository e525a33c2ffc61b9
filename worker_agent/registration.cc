#include "worker_agent/registration.h"

#include <algorithm>
#include <utility>

#include "absl/random/random.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/time/clock.h"
#include "glog/logging.h"
#include "grpcpp/grpcpp.h"
#include "planner_service/io/input_bounds.h"
#include "rpc/grpc_status.h"

namespace arachne::agent {
namespace {

// Refusals that retrying cannot cure: the controller must be fixed (or the
// agent's flags), so they are logged as errors, not warnings.
bool Permanent(const absl::Status& s) {
  return absl::IsInvalidArgument(s) || absl::IsUnauthenticated(s) ||
         absl::IsPermissionDenied(s);
}

}  // namespace

absl::StatusOr<std::unique_ptr<ControllerRegistration>>
ControllerRegistration::Start(RegistrationConfig config) {
  if (config.controller.find(':') == std::string::npos) {
    return absl::InvalidArgumentError(absl::StrCat(
        "controller: must be host:port, got \"", config.controller, "\""));
  }
  if (config.node.empty()) {
    return absl::InvalidArgumentError("node: required, got none");
  }
  if (config.gpu_type.empty()) {
    return absl::InvalidArgumentError("gpu_type: required, got none");
  }
  if (config.gpus < 1) {
    return absl::InvalidArgumentError(
        absl::StrCat("gpus: must be >= 1, got ", config.gpus));
  }
  if (config.address.find(':') == std::string::npos) {
    return absl::InvalidArgumentError(absl::StrCat(
        "address: must be host:port, got \"", config.address, "\""));
  }
  if (config.initial_backoff <= absl::ZeroDuration() ||
      config.max_backoff < config.initial_backoff) {
    return absl::InvalidArgumentError(
        "initial_backoff, max_backoff: need 0 < initial_backoff <= "
        "max_backoff");
  }
  if (config.incarnation.empty()) {
    // 128 random bits: two agent starts never share one.
    absl::BitGen gen;
    config.incarnation = absl::StrFormat(
        "%016x%016x", absl::Uniform<uint64_t>(gen), absl::Uniform<uint64_t>(gen));
  }
  if (absl::Status s = CheckIncarnation(config.incarnation); !s.ok()) return s;
  absl::StatusOr<std::shared_ptr<grpc::ChannelCredentials>> credentials =
      MakeChannelCredentials(config.tls);
  if (!credentials.ok()) return credentials.status();
  // gRPC's own reconnect back-off grows to minutes while the controller is
  // down; capped here so that a restarted controller hears the heartbeat
  // within a lease, not after gRPC's next reconnect attempt.
  grpc::ChannelArguments args;
  args.SetInt(GRPC_ARG_INITIAL_RECONNECT_BACKOFF_MS, 100);
  args.SetInt(GRPC_ARG_MIN_RECONNECT_BACKOFF_MS, 100);
  args.SetInt(GRPC_ARG_MAX_RECONNECT_BACKOFF_MS, 500);
  auto stub = v1::Controller::NewStub(
      grpc::CreateCustomChannel(config.controller, *credentials, args));
  std::unique_ptr<ControllerRegistration> r(
      new ControllerRegistration(std::move(config), std::move(stub)));
  r->thread_ = std::thread([p = r.get()]() { p->Loop(); });
  return r;
}

ControllerRegistration::ControllerRegistration(
    RegistrationConfig config, std::unique_ptr<v1::Controller::Stub> stub)
    : config_(std::move(config)), stub_(std::move(stub)) {
  state_.incarnation = config_.incarnation;
}

ControllerRegistration::~ControllerRegistration() { Stop(); }

void ControllerRegistration::Stop() {
  {
    absl::MutexLock lock(&mu_);
    stop_ = true;
  }
  if (thread_.joinable()) thread_.join();
}

RegistrationState ControllerRegistration::state() const {
  absl::MutexLock lock(&mu_);
  return state_;
}

bool ControllerRegistration::Sleep(absl::Duration d) {
  absl::MutexLock lock(&mu_);
  auto stopped = [this]() ABSL_SHARED_LOCKS_REQUIRED(mu_) { return stop_; };
  mu_.AwaitWithTimeout(absl::Condition(&stopped), d);
  return !stop_;
}

absl::Status ControllerRegistration::CallRegister() {
  v1::RegisterRequest request;
  request.set_node(config_.node);
  request.set_gpu_type(config_.gpu_type);
  request.set_gpus(config_.gpus);
  request.set_memory_gib(config_.memory_gib);
  request.set_address(config_.address);
  request.set_incarnation(config_.incarnation);
  grpc::ClientContext context;
  context.set_deadline(absl::ToChronoTime(absl::Now() + config_.call_timeout));
  if (!config_.token.empty()) {
    context.AddMetadata("authorization",
                        absl::StrCat("Bearer ", config_.token));
  }
  v1::RegisterResponse response;
  absl::Status s =
      FromGrpcStatus(stub_->Register(&context, request, &response),
                     absl::StrCat("controller ", config_.controller));
  if (!s.ok()) return s;
  // Bound before the controller can send its first command: it plans only
  // after this answer, on its next reconcile tick.
  if (config_.on_registered) config_.on_registered(response.controller_id());
  absl::MutexLock lock(&mu_);
  state_.registered = true;
  state_.lease_s = response.lease_s();
  state_.generation = response.generation();
  state_.controller_id = response.controller_id();
  ++state_.registers;
  return absl::OkStatus();
}

absl::Status ControllerRegistration::CallHeartbeat() {
  v1::HeartbeatRequest request;
  request.set_node(config_.node);
  request.set_incarnation(config_.incarnation);
  grpc::ClientContext context;
  context.set_deadline(absl::ToChronoTime(absl::Now() + config_.call_timeout));
  if (!config_.token.empty()) {
    context.AddMetadata("authorization",
                        absl::StrCat("Bearer ", config_.token));
  }
  v1::HeartbeatResponse response;
  absl::Status s =
      FromGrpcStatus(stub_->Heartbeat(&context, request, &response),
                     absl::StrCat("controller ", config_.controller));
  if (!s.ok()) return s;
  absl::MutexLock lock(&mu_);
  if (response.lease_s() > 0) state_.lease_s = response.lease_s();
  ++state_.heartbeats;
  return absl::OkStatus();
}

void ControllerRegistration::Failed(const absl::Status& s, const char* call) {
  int64_t failures;
  {
    absl::MutexLock lock(&mu_);
    failures = ++state_.failures;
    state_.last_error = std::string(s.message());
  }
  // Every failure of a kind that needs a person; otherwise the first few
  // and then every 10th, so a controller down for an hour does not flood
  // the log.
  if (Permanent(s)) {
    LOG(ERROR) << "node " << config_.node << ": " << call << ": " << s;
  } else if (failures <= 3 || failures % 10 == 0) {
    LOG(WARNING) << "node " << config_.node << ": " << call << " failed ("
                 << failures << " failures so far; training goes on): " << s;
  }
}

void ControllerRegistration::Loop() {
  absl::Duration backoff = config_.initial_backoff;
  auto next_backoff = [&](const absl::Status& s) {
    // AlreadyExists: another process of this node's name holds a live
    // lease (an agent restarted before its old lease ran out): tried again
    // every second at most, to join as soon as that lease runs out.
    const absl::Duration wait =
        Permanent(s)            ? config_.max_backoff
        : absl::IsAlreadyExists(s) ? std::min(backoff, absl::Seconds(1))
                                   : backoff;
    backoff = std::min(backoff * 2, config_.max_backoff);
    return wait;
  };
  bool registered = false;
  // The wait before the next heartbeat when the last one failed (capped by
  // lease/3 like every wait); infinite: none failed.
  absl::Duration retry_wait = absl::InfiniteDuration();
  for (;;) {
    {
      absl::MutexLock lock(&mu_);
      if (stop_) return;
    }
    if (!registered) {
      absl::Status s = CallRegister();
      if (s.ok()) {
        registered = true;
        backoff = config_.initial_backoff;
        const RegistrationState st = state();
        LOG(INFO) << "node " << config_.node << ": registered with controller "
                  << config_.controller << " as incarnation "
                  << config_.incarnation << " (lease " << st.lease_s
                  << " s, generation " << st.generation << ")";
      } else {
        Failed(s, "Register");
        if (!Sleep(next_backoff(s))) return;
        continue;
      }
    }
    // Three heartbeats per lease: one lost call does not cost the lease.
    const double lease_s = std::max(state().lease_s, 0.03);
    if (!Sleep(std::min(retry_wait, absl::Seconds(lease_s / 3)))) return;
    retry_wait = absl::InfiniteDuration();
    absl::Status s = CallHeartbeat();
    if (s.ok()) {
      backoff = config_.initial_backoff;
      continue;
    }
    {
      absl::MutexLock lock(&mu_);
      state_.registered = false;
    }
    if (absl::IsFailedPrecondition(s)) {
      // Drained and released: this node's part in the job is over. It
      // joins again only when the agent is started again.
      LOG(INFO) << "node " << config_.node << ": released by controller "
                << config_.controller << "; no more heartbeats";
      return;
    }
    Failed(s, "Heartbeat");
    if (absl::IsNotFound(s)) {
      // The lease ran out (or the controller lost the node): register
      // again right away.
      registered = false;
      continue;
    }
    // Unreachable or refusing: the lease may still hold, so the heartbeat
    // is tried again after the back-off but never later than a third of
    // the lease (a controller coming back must find the node alive; the
    // back-off only spares it the first rapid retries).
    retry_wait = next_backoff(s);
  }
}

}  // namespace arachne::agent
