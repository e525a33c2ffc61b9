#include "planner_service/client/planner_client.h"

#include <utility>

#include "absl/strings/str_cat.h"
#include "arachne/v1/planner.grpc.pb.h"
#include "grpcpp/grpcpp.h"
#include "planner_service/api/proto_convert.h"
#include "rpc/credentials.h"
#include "rpc/grpc_status.h"

namespace arachne {
namespace {

v1::PlannerOptions OptionsToProto(const PlanQuery& q) {
  v1::PlannerOptions o;
  o.set_planner(q.planner);
  o.set_budget_s(q.budget_s);
  o.set_max_evaluations(q.max_evaluations);
  o.set_seed(q.seed);
  o.set_max_depth(q.max_depth);
  o.set_max_templates(q.max_templates);
  if (q.policy_rollouts != -1) o.set_policy_rollouts(q.policy_rollouts);
  o.set_objective(q.objective == PlannerObjective::kUsdPerToken
                      ? v1::PlannerOptions::USD_PER_TOKEN
                      : v1::PlannerOptions::THROUGHPUT);
  return o;
}

PlanAnswer PlanAnswerFromProto(const v1::PlanResponse& response) {
  PlanAnswer answer;
  answer.plan = PlanProtoToCliJson(response.plan(), response.prediction());
  answer.planner = response.planner();
  answer.planner_fallback_reason = response.planner_fallback_reason();
  answer.planning_time_s = response.planning_time_s();
  answer.evaluations = response.evaluations();
  answer.exhaustive = response.exhaustive();
  answer.stopped_early = response.stopped_early();
  // As PlannerHandlerImpl adds them, so the JSON reads the same.
  answer.plan["planner"] = answer.planner;
  if (!answer.planner_fallback_reason.empty())
    answer.plan["planner_fallback_reason"] = answer.planner_fallback_reason;
  answer.plan["planning_time_s"] = answer.planning_time_s;
  answer.plan["evaluations"] = answer.evaluations;
  answer.plan["exhaustive"] = answer.exhaustive;
  return answer;
}

class GrpcPlannerClient final : public PlannerClient {
 public:
  GrpcPlannerClient(PlannerClientConfig config,
                    std::shared_ptr<grpc::Channel> channel)
      : config_(std::move(config)),
        stub_(v1::Planner::NewStub(std::move(channel))) {}

  absl::StatusOr<PlanAnswer> Plan(const PlanQuery& q) override {
    v1::PlanRequest request;
    *request.mutable_model() = ModelRefToProto(q.model);
    *request.mutable_training() = TrainingToProto(q.training);
    *request.mutable_calibration() = q.training.calibration;
    *request.mutable_cluster() = q.cluster;
    *request.mutable_options() = OptionsToProto(q);
    grpc::ClientContext ctx;
    Prepare(&ctx, q.deadline);
    v1::PlanResponse response;
    if (absl::Status s = FromGrpc(stub_->Plan(&ctx, request, &response));
        !s.ok()) {
      return s;
    }
    return PlanAnswerFromProto(response);
  }

  absl::StatusOr<ReplanAnswer> Replan(const ReplanQuery& q) override {
    v1::ReplanRequest request;
    *request.mutable_model() = ModelRefToProto(q.plan.model);
    *request.mutable_training() = TrainingToProto(q.plan.training);
    *request.mutable_calibration() = q.plan.training.calibration;
    *request.mutable_current_cluster() = q.current_cluster;
    *request.mutable_new_cluster() = q.plan.cluster;
    *request.mutable_options() = OptionsToProto(q.plan);
    if (absl::Status s = PlanJsonToProto(
            q.current_plan, request.mutable_current_plan(), nullptr);
        !s.ok()) {
      return absl::InvalidArgumentError(absl::StrCat(
          "current_plan: not in the plan JSON format: ", s.message()));
    }
    grpc::ClientContext ctx;
    Prepare(&ctx, q.plan.deadline);
    v1::ReplanResponse response;
    if (absl::Status s = FromGrpc(stub_->Replan(&ctx, request, &response));
        !s.ok()) {
      return s;
    }
    ReplanAnswer answer;
    answer.new_plan = PlanAnswerFromProto(response.new_plan());
    const v1::CurrentPlanOnNewCluster& current = response.current();
    answer.current.feasible = current.feasible();
    answer.current.reason = current.reason();
    if (current.feasible()) {
      answer.current.plan =
          PlanProtoToCliJson(current.plan(), current.prediction());
    }
    const v1::MigrationEstimate& m = response.migration();
    answer.migration.available = m.available();
    answer.migration.reason = m.reason();
    answer.migration.bytes_moved = m.bytes_moved();
    answer.migration.bytes_kept = m.bytes_kept();
    answer.migration.naive_bytes = m.naive_bytes();
    answer.migration.makespan_s = m.makespan_s();
    answer.migration.lower_bound_s = m.lower_bound_s();
    answer.migration.transfers = m.transfers();
    return answer;
  }

  absl::StatusOr<EvaluateAnswer> Evaluate(const EvaluateQuery& q) override {
    v1::EvaluateRequest request;
    *request.mutable_model() = ModelRefToProto(q.model);
    *request.mutable_training() = TrainingToProto(q.training);
    *request.mutable_calibration() = q.training.calibration;
    *request.mutable_cluster() = q.cluster;
    if (absl::Status s =
            PlanJsonToProto(q.plan, request.mutable_plan(), nullptr);
        !s.ok()) {
      return absl::InvalidArgumentError(
          absl::StrCat("plan: not in the plan JSON format: ", s.message()));
    }
    grpc::ClientContext ctx;
    Prepare(&ctx, absl::InfiniteFuture());
    v1::EvaluateResponse response;
    if (absl::Status s = FromGrpc(stub_->Evaluate(&ctx, request, &response));
        !s.ok()) {
      return s;
    }
    EvaluateAnswer answer;
    answer.plan = PlanProtoToCliJson(response.plan(), response.prediction());
    return answer;
  }

 private:
  void Prepare(grpc::ClientContext* ctx, absl::Time deadline) const {
    if (deadline == absl::InfiniteFuture()) {
      deadline = absl::Now() + config_.default_timeout;
    }
    ctx->set_deadline(absl::ToChronoTime(deadline));
    if (!config_.token.empty()) {
      ctx->AddMetadata("authorization", absl::StrCat("Bearer ", config_.token));
    }
  }

  absl::Status FromGrpc(const grpc::Status& s) const {
    return FromGrpcStatus(s, absl::StrCat("server ", config_.address));
  }

  const PlannerClientConfig config_;
  const std::unique_ptr<v1::Planner::Stub> stub_;
};

absl::StatusOr<double> Number(const nlohmann::json& j, const char* key,
                              absl::string_view where) {
  auto it = j.find(key);
  if (it == j.end() || !it->is_number()) {
    return absl::InvalidArgumentError(
        absl::StrCat(where, key, ": missing or not a number"));
  }
  return it->get<double>();
}

}  // namespace

absl::StatusOr<std::unique_ptr<PlannerClient>> MakeGrpcPlannerClient(
    const PlannerClientConfig& config) {
  if (config.address.empty()) {
    return absl::InvalidArgumentError("address: empty; expected HOST:PORT");
  }
  absl::StatusOr<std::shared_ptr<grpc::ChannelCredentials>> credentials =
      MakeChannelCredentials({.ca_file = config.tls_ca_file,
                              .cert_file = config.tls_cert_file,
                              .key_file = config.tls_key_file});
  if (!credentials.ok()) return credentials.status();
  return std::make_unique<GrpcPlannerClient>(
      config, grpc::CreateChannel(config.address, *credentials));
}

absl::StatusOr<Prediction> PredictionFromPlanJson(const nlohmann::json& plan) {
  if (!plan.is_object()) {
    return absl::InvalidArgumentError("plan: not a JSON object");
  }
  Prediction p;
  struct Field {
    const char* key;
    double* value;
  };
  for (const Field& f :
       {Field{"iteration_time_s", &p.iteration_time_s},
        Field{"throughput_iters_per_s", &p.throughput_iters_per_s},
        Field{"tokens_per_s", &p.tokens_per_s}, Field{"mfu", &p.mfu},
        Field{"usd_per_hour", &p.usd_per_hour},
        Field{"max_memory_gib", &p.max_memory_gib}}) {
    absl::StatusOr<double> v = Number(plan, f.key, "plan.");
    if (!v.ok()) return v.status();
    *f.value = *v;
  }
  auto breakdown = plan.find("breakdown");
  if (breakdown == plan.end() || !breakdown->is_object()) {
    return absl::InvalidArgumentError("plan.breakdown: missing");
  }
  TimeBreakdown& b = p.breakdown;
  for (const Field& f :
       {Field{"compute_s", &b.compute_s}, Field{"tp_comm_s", &b.tp_comm_s},
        Field{"p2p_s", &b.p2p_s}, Field{"bubble_s", &b.bubble_s},
        Field{"dp_sync_s", &b.dp_sync_s},
        Field{"all_to_all_s", &b.all_to_all_s},
        Field{"optimizer_s", &b.optimizer_s}}) {
    absl::StatusOr<double> v = Number(*breakdown, f.key, "plan.breakdown.");
    if (!v.ok()) return v.status();
    *f.value = *v;
  }
  auto templates = plan.find("templates");
  if (templates == plan.end() || !templates->is_array()) {
    return absl::InvalidArgumentError("plan.templates: missing");
  }
  for (size_t t = 0; t < templates->size(); ++t) {
    std::vector<StageMemory>& stages = p.stage_memory.emplace_back();
    const nlohmann::json& tj = (*templates)[t];
    if (!tj.contains("stages") || !tj["stages"].is_array()) continue;
    for (size_t s = 0; s < tj["stages"].size(); ++s) {
      StageMemory m;
      absl::StatusOr<double> v =
          Number(tj["stages"][s], "memory_gib",
                 absl::StrCat("plan.templates[", t, "].stages[", s, "]."));
      if (!v.ok()) return v.status();
      m.weights_gib = *v;
      stages.push_back(m);
    }
  }
  return p;
}

}  // namespace arachne
