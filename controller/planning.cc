#include "controller/planning.h"

#include <algorithm>
#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/clock.h"
#include "glog/logging.h"

#include "planner_service/api/planner_handler_impl.h"

namespace arachne::controller {
namespace {

class EmbeddedPlanSource final : public PlanSource {
 public:
  explicit EmbeddedPlanSource(std::unique_ptr<PlannerHandler> handler)
      : handler_(std::move(handler)) {}
  absl::StatusOr<PlanAnswer> Plan(const PlanQuery& q) override {
    return handler_->Plan(q);
  }
  absl::StatusOr<ReplanAnswer> Replan(const ReplanQuery& q) override {
    return handler_->Replan(q);
  }
  std::string name() const override { return "embedded"; }

 private:
  std::unique_ptr<PlannerHandler> handler_;
};

class RemotePlanSource final : public PlanSource {
 public:
  RemotePlanSource(std::string address, std::unique_ptr<PlannerClient> client)
      : address_(std::move(address)), client_(std::move(client)) {}
  absl::StatusOr<PlanAnswer> Plan(const PlanQuery& q) override {
    return client_->Plan(q);
  }
  absl::StatusOr<ReplanAnswer> Replan(const ReplanQuery& q) override {
    return client_->Replan(q);
  }
  std::string name() const override { return address_; }

 private:
  std::string address_;
  std::unique_ptr<PlannerClient> client_;
};

class RetryingPlanSource final : public PlanSource {
 public:
  RetryingPlanSource(std::unique_ptr<PlanSource> remote,
                     std::unique_ptr<PlanSource> fallback,
                     PlannerRetryConfig config)
      : remote_(std::move(remote)),
        fallback_(std::move(fallback)),
        config_(config) {}

  absl::StatusOr<PlanAnswer> Plan(const PlanQuery& q) override {
    return Call<PlanAnswer>(
        "Plan", q.deadline, [&](PlanSource& s, absl::Time deadline) {
          PlanQuery copy = q;
          copy.deadline = deadline;
          return s.Plan(copy);
        });
  }
  absl::StatusOr<ReplanAnswer> Replan(const ReplanQuery& q) override {
    return Call<ReplanAnswer>(
        "Replan", q.plan.deadline, [&](PlanSource& s, absl::Time deadline) {
          ReplanQuery copy = q;
          copy.plan.deadline = deadline;
          return s.Replan(copy);
        });
  }
  std::string name() const override { return remote_->name(); }
  void SetNotify(Notify notify) override {
    absl::MutexLock lock(&mu_);
    notify_ = std::move(notify);
  }

 private:
  void Tell(const std::string& message) {
    Notify notify;
    {
      absl::MutexLock lock(&mu_);
      notify = notify_;
    }
    LOG(WARNING) << message;
    if (notify) notify(message);
  }

  // `call` on the remote with retries, then on the fallback. Each try gets
  // the time the caller allowed one call, from when it starts.
  template <typename Answer, typename Fn>
  absl::StatusOr<Answer> Call(const char* what, absl::Time deadline, Fn call) {
    const absl::Duration allowance =
        std::max(deadline - absl::Now(), absl::Seconds(1));
    absl::Duration wait = config_.backoff;
    absl::Status last;
    for (int attempt = 0; attempt <= config_.retries; ++attempt) {
      absl::StatusOr<Answer> r = call(*remote_, absl::Now() + allowance);
      if (r.ok()) return r;
      if (!absl::IsUnavailable(r.status()) &&
          !absl::IsDeadlineExceeded(r.status())) {
        return r.status();
      }
      last = r.status();
      if (attempt == config_.retries) break;
      Tell(absl::StrCat("planner ", remote_->name(), ": ", what, " try ",
                        attempt + 1, " of ", config_.retries + 1, " failed (",
                        last.message(), "); retrying in ",
                        absl::FormatDuration(wait)));
      absl::SleepFor(wait);
      wait *= 2;
    }
    if (fallback_ == nullptr) {
      return absl::Status(
          last.code(),
          absl::StrCat("planner ", remote_->name(), ": ", what, " failed ",
                       config_.retries + 1, " times, no fallback: ",
                       last.message()));
    }
    Tell(absl::StrCat("planner ", remote_->name(), ": ", what, " failed ",
                      config_.retries + 1,
                      " times; the embedded planner answers instead (",
                      last.message(), ")"));
    return call(*fallback_, absl::Now() + allowance);
  }

  const std::unique_ptr<PlanSource> remote_;
  const std::unique_ptr<PlanSource> fallback_;
  const PlannerRetryConfig config_;
  absl::Mutex mu_;
  Notify notify_ ABSL_GUARDED_BY(mu_);
};

}  // namespace

std::unique_ptr<PlanSource> MakeRetryingPlanSource(
    std::unique_ptr<PlanSource> remote, std::unique_ptr<PlanSource> fallback,
    PlannerRetryConfig config) {
  CHECK(remote != nullptr);
  return std::make_unique<RetryingPlanSource>(std::move(remote),
                                              std::move(fallback), config);
}

absl::StatusOr<std::unique_ptr<PlanSource>> MakeEmbeddedPlanSource(
    const std::string& profiles_dir) {
  PlannerHandlerConfig config;
  config.profiles_dir = profiles_dir;
  absl::StatusOr<std::unique_ptr<PlannerHandlerImpl>> handler =
      PlannerHandlerImpl::Create(config);
  if (!handler.ok()) return handler.status();
  return std::unique_ptr<PlanSource>(
      new EmbeddedPlanSource(*std::move(handler)));
}

absl::StatusOr<std::unique_ptr<PlanSource>> MakeRemotePlanSource(
    const PlannerClientConfig& config) {
  absl::StatusOr<std::unique_ptr<PlannerClient>> client =
      MakeGrpcPlannerClient(config);
  if (!client.ok()) return client.status();
  return std::unique_ptr<PlanSource>(
      new RemotePlanSource(config.address, *std::move(client)));
}

}  // namespace arachne::controller
