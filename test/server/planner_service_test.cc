// Integration tests of arachne-planner: a real server on 127.0.0.1:0 and
// real gRPC stubs. The handler-level fake (at the end) makes admission
// control and cancellation deterministic without timing-dependent searches.
#include <chrono>
#include <memory>
#include <utility>
#include <string>
#include <thread>

#include "absl/synchronization/notification.h"
#include "absl/time/clock.h"
#include "absl/time/time.h"
#include "arachne/v1/planner.grpc.pb.h"
#include "glog/logging.h"
#include "gmock/gmock.h"
#include "grpc/health/v1/health.grpc.pb.h"
#include "grpcpp/generic/generic_stub.h"
#include "grpcpp/grpcpp.h"
#include "gtest/gtest.h"
#include "planner_service/core/cost/plan_validation.h"
#include "planner_service/core/planners.h"
#include "planner_service/io/cluster_io.h"
#include "planner_service/io/gpu_catalog_io.h"
#include "planner_service/io/model_io.h"
#include "planner_service/io/plan_io.h"
#include "planner_service/io/planning_context.h"
#include "planner_service/api/planner_handler_impl.h"
#include "test/core/uniform_policy.h"
#include "test/server/blocking_handler.h"
#include "test/server/loopback_server.h"
#include "planner_service/server/planner_server.h"
#include "planner_service/api/proto_convert.h"

namespace arachne {
namespace {

using ::testing::HasSubstr;

v1::Cluster SmallCluster() {
  v1::Cluster c;
  v1::Node* h = c.add_nodes();
  h->set_name("h0");
  h->set_gpu("H100-80GB");
  h->set_gpus(8);
  v1::Node* a = c.add_nodes();
  a->set_name("a0");
  a->set_gpu("A100-40GB");
  a->set_gpus(4);
  return c;
}

v1::PlanRequest SmallPlanRequest() {
  v1::PlanRequest r;
  r.mutable_model()->set_name("llama3-8b");
  *r.mutable_cluster() = SmallCluster();
  r.mutable_options()->set_planner("exact");
  r.mutable_options()->set_max_evaluations(50);
  return r;
}

std::chrono::system_clock::time_point In(absl::Duration d) {
  return absl::ToChronoTime(absl::Now() + d);
}

class PlannerServiceTest : public ::testing::Test {
 protected:
  static void SetUpTestSuite() { suite_.Start(2, 8); }
  static void TearDownTestSuite() { suite_.Stop(); }

  // The status of one Plan call on a fresh context (for the error cases).
  grpc::Status PlanStatus(const v1::PlanRequest& request) {
    v1::PlanResponse response;
    grpc::ClientContext ctx;
    return stub_->Plan(&ctx, request, &response);
  }

  std::unique_ptr<v1::Planner::Stub> stub_ = v1::Planner::NewStub(suite_.channel());
  grpc::ClientContext ctx_;

  static testing::SuiteServer suite_;
};
testing::SuiteServer PlannerServiceTest::suite_;

// The prediction the service returns is the in-process cost model's for the
// same plan, and the in-process planner finds the same plan.
TEST_F(PlannerServiceTest, PlanMatchesInProcessCostModelAndPlanner) {
  v1::PlanResponse response;
  grpc::Status s = stub_->Plan(&ctx_, SmallPlanRequest(), &response);
  ASSERT_TRUE(s.ok()) << s.error_message();
  EXPECT_EQ(response.planner(), "exact");
  EXPECT_EQ(response.evaluations(), 54);
  EXPECT_FALSE(response.stopped_early());
  ASSERT_GT(response.plan().templates_size(), 0);
  EXPECT_EQ(response.prediction().stage_memory_size(),
            response.plan().templates(0).stages_size());

  auto catalog = LoadGpuCatalog();
  ASSERT_TRUE(catalog.ok());
  auto model = ResolveModel("llama3-8b");
  ASSERT_TRUE(model.ok());
  auto cluster = Cluster::Create(
      {{"h0", *catalog->IndexOf("H100-80GB"), 8, kDefaultInterNodeGbps},
       {"a0", *catalog->IndexOf("A100-40GB"), 4, kDefaultInterNodeGbps}},
      *catalog);
  ASSERT_TRUE(cluster.ok()) << cluster.status();
  auto ctx =
      PlanningContext::Create(*catalog, *model, TrainingConfig{}, *cluster, "");
  ASSERT_TRUE(ctx.ok()) << ctx.status();
  auto plan = PlanFromJson(PlanProtoToJson(response.plan()), (*ctx)->cluster(),
                           (*ctx)->catalog());
  ASSERT_TRUE(plan.ok()) << plan.status();
  ASSERT_TRUE(ValidatePlan(*plan, (*ctx)->cost_model()).ok());
  auto predicted = (*ctx)->cost_model().Predict(*plan);
  ASSERT_TRUE(predicted.ok()) << predicted.status();
  EXPECT_DOUBLE_EQ(response.prediction().iteration_time_s(),
                   predicted->iteration_time_s);
  EXPECT_DOUBLE_EQ(response.prediction().max_memory_gib(),
                   predicted->max_memory_gib);

  auto planner = MakePlanner("exact");
  ASSERT_TRUE(planner.ok());
  PlannerOptions options;
  options.max_evaluations = 50;
  auto local = (*planner)->Run((*ctx)->cost_model(), options);
  ASSERT_TRUE(local.ok()) << local.status();
  EXPECT_DOUBLE_EQ(local->prediction.iteration_time_s,
                   response.prediction().iteration_time_s());
}

TEST_F(PlannerServiceTest, EvaluateRepricesAPlannedPlan) {
  v1::PlanResponse planned;
  {
    grpc::ClientContext ctx;
    ASSERT_TRUE(stub_->Plan(&ctx, SmallPlanRequest(), &planned).ok());
  }
  v1::EvaluateRequest request;
  request.mutable_model()->set_name("llama3-8b");
  *request.mutable_cluster() = SmallCluster();
  *request.mutable_plan() = planned.plan();
  v1::EvaluateResponse response;
  grpc::Status s = stub_->Evaluate(&ctx_, request, &response);
  ASSERT_TRUE(s.ok()) << s.error_message();
  EXPECT_DOUBLE_EQ(response.prediction().iteration_time_s(),
                   planned.prediction().iteration_time_s());
  EXPECT_EQ(response.plan().unused_gpus(), planned.plan().unused_gpus());
}

// A request's calibration is applied: Evaluate prices the plan with the
// compute scales (exactly as the in-process cost model with the same
// CostParams), Plan searches with them, and bad entries name the field.
TEST_F(PlannerServiceTest, TheRequestsCalibrationPricesThePlan) {
  v1::PlanResponse planned;
  {
    grpc::ClientContext ctx;
    ASSERT_TRUE(stub_->Plan(&ctx, SmallPlanRequest(), &planned).ok());
  }
  v1::EvaluateRequest request;
  request.mutable_model()->set_name("llama3-8b");
  *request.mutable_cluster() = SmallCluster();
  *request.mutable_plan() = planned.plan();
  (*request.mutable_calibration()->mutable_compute_scale())["H100"] = 1.5;
  (*request.mutable_calibration()->mutable_compute_scale())["A100-40GB"] = 1.5;
  v1::EvaluateResponse response;
  {
    grpc::ClientContext ctx;
    grpc::Status s = stub_->Evaluate(&ctx, request, &response);
    ASSERT_TRUE(s.ok()) << s.error_message();
  }
  auto catalog = LoadGpuCatalog();
  ASSERT_TRUE(catalog.ok());
  auto model = ResolveModel("llama3-8b");
  ASSERT_TRUE(model.ok());
  auto cluster = ClusterFromMessage(SmallCluster(), *catalog, "");
  ASSERT_TRUE(cluster.ok()) << cluster.status();
  CostParams params;
  params.compute_scale = {{"H100-80GB", 1.5}, {"A100-40GB", 1.5}};
  auto ctx = PlanningContext::Create(*catalog, *model, TrainingConfig{},
                                     *cluster, "", params);
  ASSERT_TRUE(ctx.ok()) << ctx.status();
  auto plan = PlanFromJson(PlanProtoToJson(planned.plan()), (*ctx)->cluster(),
                           (*ctx)->catalog());
  ASSERT_TRUE(plan.ok()) << plan.status();
  auto predicted = (*ctx)->cost_model().Predict(*plan);
  ASSERT_TRUE(predicted.ok()) << predicted.status();
  EXPECT_DOUBLE_EQ(response.prediction().iteration_time_s(),
                   predicted->iteration_time_s);
  EXPECT_GT(response.prediction().iteration_time_s(),
            1.2 * planned.prediction().iteration_time_s());

  // Plan with the same calibration: its own prediction is a calibrated one.
  v1::PlanRequest plan_request = SmallPlanRequest();
  *plan_request.mutable_calibration() = request.calibration();
  v1::PlanResponse calibrated;
  {
    grpc::ClientContext c;
    ASSERT_TRUE(stub_->Plan(&c, plan_request, &calibrated).ok());
  }
  EXPECT_GT(calibrated.prediction().iteration_time_s(),
            1.2 * planned.prediction().iteration_time_s());

  (*plan_request.mutable_calibration()->mutable_compute_scale())["B999"] = 1;
  grpc::Status bad = PlanStatus(plan_request);
  EXPECT_EQ(bad.error_code(), grpc::StatusCode::INVALID_ARGUMENT);
  EXPECT_THAT(bad.error_message(),
              HasSubstr("calibration.compute_scale.B999: unknown GPU type"));
  plan_request.mutable_calibration()->mutable_compute_scale()->erase("B999");
  (*plan_request.mutable_calibration()->mutable_tp_comm_scale())["H100-80GB"] =
      0;
  bad = PlanStatus(plan_request);
  EXPECT_EQ(bad.error_code(), grpc::StatusCode::INVALID_ARGUMENT);
  EXPECT_THAT(bad.error_message(),
              HasSubstr("calibration.tp_comm_scale.H100-80GB: must be a factor "
                        "in [0.01, 100], got 0"));
}

TEST_F(PlannerServiceTest, EvaluateRejectsAPlanOnAnAbsentNode) {
  v1::PlanResponse planned;
  {
    grpc::ClientContext ctx;
    ASSERT_TRUE(stub_->Plan(&ctx, SmallPlanRequest(), &planned).ok());
  }
  v1::EvaluateRequest request;
  request.mutable_model()->set_name("llama3-8b");
  *request.mutable_cluster() = SmallCluster();
  *request.mutable_plan() = planned.plan();
  request.mutable_plan()
      ->mutable_templates(0)
      ->mutable_placement(0)
      ->mutable_stages(0)
      ->set_node("gone-7");
  v1::EvaluateResponse response;
  grpc::Status s = stub_->Evaluate(&ctx_, request, &response);
  EXPECT_EQ(s.error_code(), grpc::StatusCode::INVALID_ARGUMENT);
  EXPECT_THAT(s.error_message(),
              HasSubstr("templates[0].placement[0].stages[0].node: unknown node"));
  EXPECT_THAT(s.error_message(), HasSubstr("gone-7"));
}

TEST_F(PlannerServiceTest, ListsModelsAndGpuTypes) {
  v1::ListModelsResponse models;
  ASSERT_TRUE(stub_->ListModels(&ctx_, {}, &models).ok());
  bool found = false;
  for (const v1::Model& m : models.models()) {
    if (m.name() == "llama3-8b") {
      found = true;
      EXPECT_EQ(m.num_layers(), 32);
      EXPECT_EQ(m.hidden(), 4096);
    }
  }
  EXPECT_TRUE(found);

  grpc::ClientContext ctx;
  v1::ListGpuTypesResponse gpus;
  ASSERT_TRUE(stub_->ListGpuTypes(&ctx, {}, &gpus).ok());
  found = false;
  for (const v1::GpuType& g : gpus.gpu_types()) {
    if (g.id() == "H100-80GB") {
      found = true;
      EXPECT_EQ(g.memory_gib(), 80);
    }
  }
  EXPECT_TRUE(found);
}

TEST_F(PlannerServiceTest, HealthIsServing) {
  auto health = grpc::health::v1::Health::NewStub(suite_.channel());
  grpc::health::v1::HealthCheckResponse response;
  grpc::Status s = health->Check(&ctx_, {}, &response);
  ASSERT_TRUE(s.ok()) << s.error_message();
  EXPECT_EQ(response.status(), grpc::health::v1::HealthCheckResponse::SERVING);
}

// Server reflection lists the Planner service. Debian's gRPC ships no
// generated reflection client (and linking a second copy of its messages
// would clash with the server's), so this speaks the wire format directly:
// a ServerReflectionRequest with list_services = "" (field 7) is the two
// bytes 0x3A 0x00, and the answer must contain the service's full name.
TEST_F(PlannerServiceTest, ReflectionListsThePlannerService) {
  grpc::GenericStub stub(suite_.channel());
  grpc::CompletionQueue cq;
  ctx_.set_deadline(In(absl::Seconds(10)));
  auto call = stub.PrepareCall(
      &ctx_, "/grpc.reflection.v1alpha.ServerReflection/ServerReflectionInfo",
      &cq);
  void* tag;
  bool ok;
  auto next = [&](intptr_t want) {
    ASSERT_TRUE(cq.Next(&tag, &ok));
    ASSERT_EQ(reinterpret_cast<intptr_t>(tag), want);
  };
  call->StartCall(reinterpret_cast<void*>(1));
  next(1);
  ASSERT_TRUE(ok);
  const char request[] = {0x3A, 0x00};
  grpc::Slice slice(request, sizeof(request));
  grpc::ByteBuffer out(&slice, 1);
  call->Write(out, reinterpret_cast<void*>(2));
  next(2);
  ASSERT_TRUE(ok);
  grpc::ByteBuffer in;
  call->Read(&in, reinterpret_cast<void*>(3));
  next(3);
  ASSERT_TRUE(ok);
  call->WritesDone(reinterpret_cast<void*>(4));
  next(4);
  grpc::Status status;
  call->Finish(&status, reinterpret_cast<void*>(5));
  next(5);
  EXPECT_TRUE(status.ok()) << status.error_message();
  grpc::Slice answer;
  ASSERT_TRUE(in.DumpToSingleSlice(&answer).ok());
  const std::string bytes(reinterpret_cast<const char*>(answer.begin()),
                          answer.size());
  EXPECT_THAT(bytes, HasSubstr("arachne.v1.Planner"));
  EXPECT_THAT(bytes, HasSubstr("grpc.health.v1.Health"));
  cq.Shutdown();
  while (cq.Next(&tag, &ok)) {
  }
}

TEST_F(PlannerServiceTest, UnknownGpuTypeNamesTheField) {
  v1::PlanRequest r = SmallPlanRequest();
  r.mutable_cluster()->mutable_nodes(1)->set_gpu("X");
  v1::PlanResponse response;
  grpc::Status s = stub_->Plan(&ctx_, r, &response);
  EXPECT_EQ(s.error_code(), grpc::StatusCode::INVALID_ARGUMENT);
  EXPECT_THAT(s.error_message(),
              HasSubstr("cluster.nodes[1].gpu: unknown GPU type \"X\""));
}

TEST_F(PlannerServiceTest, BadCountsAndEmptyClusterNameTheField) {
  {
    v1::PlanRequest r = SmallPlanRequest();
    r.mutable_cluster()->mutable_nodes(0)->set_gpus(0);
    grpc::Status s = PlanStatus(r);
    EXPECT_EQ(s.error_code(), grpc::StatusCode::INVALID_ARGUMENT);
    EXPECT_THAT(s.error_message(),
                HasSubstr("cluster.nodes[0].gpus: must be an integer > 0, got 0"));
  }
  {
    v1::PlanRequest r = SmallPlanRequest();
    r.mutable_cluster()->clear_nodes();
    grpc::Status s = PlanStatus(r);
    EXPECT_EQ(s.error_code(), grpc::StatusCode::INVALID_ARGUMENT);
    EXPECT_THAT(s.error_message(),
                HasSubstr("cluster: cluster has no nodes: give `nodes` and/or `node_groups`"));
  }
  {
    v1::PlanRequest r = SmallPlanRequest();
    r.mutable_options()->set_max_depth(65);
    grpc::Status s = PlanStatus(r);
    EXPECT_EQ(s.error_code(), grpc::StatusCode::INVALID_ARGUMENT);
    EXPECT_THAT(s.error_message(),
                HasSubstr("options.max_depth: must be in 1..64"));
  }
  {
    v1::PlanRequest r = SmallPlanRequest();
    r.mutable_training()->set_seq_len(-1);
    grpc::Status s = PlanStatus(r);
    EXPECT_EQ(s.error_code(), grpc::StatusCode::INVALID_ARGUMENT);
    EXPECT_THAT(s.error_message(), HasSubstr("training.seq_len"));
  }
}

TEST_F(PlannerServiceTest, UnknownModelAndPlannerNameTheField) {
  {
    v1::PlanRequest r = SmallPlanRequest();
    r.mutable_model()->set_name("llama9");
    grpc::Status s = PlanStatus(r);
    EXPECT_EQ(s.error_code(), grpc::StatusCode::INVALID_ARGUMENT);
    EXPECT_THAT(s.error_message(),
                HasSubstr("model.name: unknown model \"llama9\""));
  }
  {
    v1::PlanRequest r = SmallPlanRequest();
    r.mutable_options()->set_planner("oracle");
    grpc::Status s = PlanStatus(r);
    EXPECT_EQ(s.error_code(), grpc::StatusCode::INVALID_ARGUMENT);
    EXPECT_THAT(s.error_message(), HasSubstr("options.planner"));
    EXPECT_THAT(s.error_message(), HasSubstr("oracle"));
  }
}

TEST_F(PlannerServiceTest, ServesTheLearnedPlanner) {
  // Without a registered policy (a build without LibTorch): the fallback
  // message, not a crash.
  RegisterLearnedPolicyFactory(nullptr);
  v1::PlanRequest r = SmallPlanRequest();
  r.mutable_options()->set_planner("learned");
  r.mutable_options()->set_max_evaluations(0);
  {
    grpc::Status s = PlanStatus(r);
    EXPECT_EQ(s.error_code(), grpc::StatusCode::FAILED_PRECONDITION);
    EXPECT_THAT(s.error_message(),
                HasSubstr("--planner template-search instead"));
  }
  RegisterLearnedPolicyFactory(
      [](const CostModel&) -> absl::StatusOr<std::unique_ptr<PolicyModel>> {
        return std::unique_ptr<PolicyModel>(
            std::make_unique<testing::UniformPolicy>());
      });
  r.mutable_options()->set_policy_rollouts(8);
  v1::PlanResponse response;
  grpc::Status s = stub_->Plan(&ctx_, r, &response);
  RegisterLearnedPolicyFactory(nullptr);
  ASSERT_TRUE(s.ok()) << s.error_message();
  EXPECT_EQ(response.planner(), "learned");
  EXPECT_GT(response.prediction().throughput_iters_per_s(), 0);
  EXPECT_GT(response.evaluations(), 0);
}

TEST_F(PlannerServiceTest, PolicyRolloutsAreCheckedAndLearnedOnly) {
  v1::PlanRequest r = SmallPlanRequest();  // planner exact
  r.mutable_options()->set_policy_rollouts(8);
  {
    grpc::Status s = PlanStatus(r);
    EXPECT_EQ(s.error_code(), grpc::StatusCode::INVALID_ARGUMENT);
    EXPECT_THAT(s.error_message(),
                HasSubstr("options.policy_rollouts: only for planner "
                          "\"learned\", not \"exact\""));
  }
  r.mutable_options()->set_planner("learned");
  r.mutable_options()->set_policy_rollouts(-5);
  v1::PlanResponse response;
  grpc::Status s = stub_->Plan(&ctx_, r, &response);
  EXPECT_EQ(s.error_code(), grpc::StatusCode::INVALID_ARGUMENT);
  EXPECT_THAT(s.error_message(),
              HasSubstr("options.policy_rollouts: must be in 0..1048576, "
                        "got -5"));
}

TEST_F(PlannerServiceTest, UsdPerTokenPlansForDollarsPerToken) {
  v1::PlanRequest r = SmallPlanRequest();
  // Both searches complete (12 GPUs), so each finds its objective's best.
  r.mutable_options()->set_max_evaluations(0);
  r.mutable_options()->set_budget_s(30);
  v1::PlanResponse fastest;
  {
    grpc::ClientContext ctx;
    ASSERT_TRUE(stub_->Plan(&ctx, r, &fastest).ok());
  }
  r.mutable_options()->set_objective(v1::PlannerOptions::USD_PER_TOKEN);
  v1::PlanResponse cheapest;
  grpc::Status s = stub_->Plan(&ctx_, r, &cheapest);
  ASSERT_TRUE(s.ok()) << s.error_message();
  auto usd_per_token = [](const v1::Prediction& p) {
    return p.usd_per_hour() / (p.tokens_per_s() * 3600);
  };
  EXPECT_LE(usd_per_token(cheapest.prediction()),
            usd_per_token(fastest.prediction()));
  EXPECT_GE(fastest.prediction().throughput_iters_per_s(),
            cheapest.prediction().throughput_iters_per_s());
}

TEST_F(PlannerServiceTest, ModelThatFitsNowhereIsFailedPrecondition) {
  v1::PlanRequest r;
  r.mutable_model()->set_name("gpt3-175b");
  v1::Node* n = r.mutable_cluster()->add_nodes();
  n->set_name("s0");
  n->set_gpu("A5000");
  n->set_gpus(1);
  v1::PlanResponse response;
  grpc::Status s = stub_->Plan(&ctx_, r, &response);
  EXPECT_EQ(s.error_code(), grpc::StatusCode::FAILED_PRECONDITION);
  EXPECT_THAT(s.error_message(), HasSubstr("no plan fits gpt3-175b"));
  EXPECT_THAT(s.error_message(), HasSubstr("one layer needs"));
}

TEST_F(PlannerServiceTest, TooManyGpusPerNodeIsRejected) {
  v1::PlanRequest r = SmallPlanRequest();
  r.mutable_cluster()->mutable_nodes(0)->set_gpus(2000000000);
  v1::PlanResponse response;
  grpc::Status s = stub_->Plan(&ctx_, r, &response);
  EXPECT_EQ(s.error_code(), grpc::StatusCode::INVALID_ARGUMENT);
  EXPECT_THAT(
      s.error_message(),
      HasSubstr("cluster.nodes[0].gpus: must be an integer <= 64, got 2000000000"));
}

TEST_F(PlannerServiceTest, GetStatsCountsCallsByCode) {
  {
    grpc::ClientContext ctx;
    v1::ListModelsResponse models;
    ASSERT_TRUE(stub_->ListModels(&ctx, {}, &models).ok());
  }
  v1::GetStatsResponse stats;
  ASSERT_TRUE(stub_->GetStats(&ctx_, {}, &stats).ok());
  bool found = false;
  for (const v1::RpcStats& r : stats.rpcs()) {
    if (r.method() != "ListModels") continue;
    found = true;
    EXPECT_GE(r.requests(), 1);
    EXPECT_GE(r.codes().at("OK"), 1);
    int64_t total = 0;
    for (int64_t c : r.bucket_counts()) total += c;
    EXPECT_EQ(total, r.requests());
  }
  EXPECT_TRUE(found);
}

using ::arachne::testing::BlockingHandler;

std::unique_ptr<PlannerServer> StartWithOneSlot(PlannerHandler* handler) {
  PlannerServerConfig config;
  config.listen = "127.0.0.1:0";
  config.service.workers = 1;
  config.service.max_in_flight = 1;
  auto server = PlannerServer::Start(handler, config);
  CHECK(server.ok()) << server.status();
  return *std::move(server);
}

TEST(PlannerServiceLimitsTest, FullServerAnswersResourceExhausted) {
  BlockingHandler handler;
  std::unique_ptr<PlannerServer> server = StartWithOneSlot(&handler);
  auto stub = v1::Planner::NewStub(
      grpc::CreateChannel(absl::StrCat("127.0.0.1:", server->port()),
                          grpc::InsecureChannelCredentials()));
  grpc::ClientContext first_ctx;
  v1::PlanResponse first_response;
  absl::Notification first_done;
  grpc::Status first_status;
  stub->async()->Plan(&first_ctx, new v1::PlanRequest(), &first_response,
                      [&](grpc::Status s) {
                        first_status = s;
                        first_done.Notify();
                      });
  handler.entered_.WaitForNotification();

  grpc::ClientContext ctx;
  v1::PlanResponse response;
  grpc::Status s = stub->Plan(&ctx, v1::PlanRequest(), &response);
  EXPECT_EQ(s.error_code(), grpc::StatusCode::RESOURCE_EXHAUSTED);
  EXPECT_THAT(s.error_message(), HasSubstr("server busy"));

  handler.release_.Notify();
  first_done.WaitForNotification();
  EXPECT_EQ(first_status.error_code(), grpc::StatusCode::UNAVAILABLE);
  EXPECT_EQ(first_status.error_message(), "released");
  server->Shutdown(absl::Seconds(1));
}

TEST(PlannerServiceLimitsTest, ClientCancellationReachesTheSearch) {
  BlockingHandler handler;
  std::unique_ptr<PlannerServer> server = StartWithOneSlot(&handler);
  auto stub = v1::Planner::NewStub(
      grpc::CreateChannel(absl::StrCat("127.0.0.1:", server->port()),
                          grpc::InsecureChannelCredentials()));
  grpc::ClientContext ctx;
  v1::PlanRequest request;
  v1::PlanResponse response;
  absl::Notification done;
  grpc::Status status;
  stub->async()->Plan(&ctx, &request, &response, [&](grpc::Status s) {
    status = s;
    done.Notify();
  });
  handler.entered_.WaitForNotification();
  ctx.TryCancel();
  handler.saw_cancel_.WaitForNotification();
  done.WaitForNotification();
  EXPECT_EQ(status.error_code(), grpc::StatusCode::CANCELLED);
  server->Shutdown(absl::Seconds(1));
}

// Shutdown with a call in flight: the call gets the grace period, is then
// cancelled (its search sees it) and Shutdown returns.
TEST(PlannerServiceLimitsTest, ShutdownCancelsCallsAfterGrace) {
  BlockingHandler handler;
  std::unique_ptr<PlannerServer> server = StartWithOneSlot(&handler);
  auto stub = v1::Planner::NewStub(
      grpc::CreateChannel(absl::StrCat("127.0.0.1:", server->port()),
                          grpc::InsecureChannelCredentials()));
  grpc::ClientContext ctx;
  v1::PlanRequest request;
  v1::PlanResponse response;
  absl::Notification done;
  grpc::Status status;
  stub->async()->Plan(&ctx, &request, &response, [&](grpc::Status s) {
    status = s;
    done.Notify();
  });
  handler.entered_.WaitForNotification();
  server->Shutdown(absl::Milliseconds(100));
  EXPECT_TRUE(handler.saw_cancel_.HasBeenNotified());
  done.WaitForNotification();
  EXPECT_NE(status.error_code(), grpc::StatusCode::OK);
}

}  // namespace
}  // namespace arachne
