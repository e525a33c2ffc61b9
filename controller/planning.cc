#include "controller/planning.h"

#include <utility>

#include "planner_service/server/planner_handler_impl.h"

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

}  // namespace

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
