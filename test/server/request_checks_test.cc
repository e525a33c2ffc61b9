// What the service does with requests it cannot or must not serve, on a
// real server on 127.0.0.1:0: bytes that do not parse, options out of range
// (the checks the CLI makes on its flags), invalid requests while the queue
// is full (answered at once, never admitted), and the shutdown's grace
// period (health NOT_SERVING on the main port, new calls refused, calls
// left at its end cut and answered, counted as what the client got).
#include <cmath>
#include <functional>
#include <limits>
#include <map>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/synchronization/mutex.h"
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
#include "planner_service/api/planner_handler_impl.h"
#include "planner_service/server/planner_server.h"
#include "test/server/blocking_handler.h"
#include "test/server/loopback_server.h"

namespace arachne {
namespace {

using ::arachne::testing::BlockingHandler;
using ::grpc::health::v1::Health;
using ::grpc::health::v1::HealthCheckResponse;
using ::testing::HasSubstr;

v1::PlanRequest SmallPlanRequest() {
  v1::PlanRequest r;
  r.mutable_model()->set_name("llama3-8b");
  v1::Node* n = r.mutable_cluster()->add_nodes();
  n->set_name("h0");
  n->set_gpu("H100-80GB");
  n->set_gpus(8);
  r.mutable_options()->set_max_evaluations(20);
  return r;
}

std::shared_ptr<grpc::Channel> Channel(int port) {
  return grpc::CreateChannel(absl::StrCat("127.0.0.1:", port),
                             grpc::InsecureChannelCredentials());
}

// One call of `method` with `bytes` as the request, as a client with a
// broken encoder would send it.
grpc::Status RawCall(const std::shared_ptr<grpc::Channel>& channel,
                     const std::string& method, const std::string& bytes) {
  grpc::GenericStub stub(channel);
  grpc::ClientContext ctx;
  ctx.set_deadline(absl::ToChronoTime(absl::Now() + absl::Seconds(10)));
  grpc::Slice slice(bytes);
  grpc::ByteBuffer request(&slice, 1), response;
  absl::Notification done;
  grpc::Status status;
  stub.UnaryCall(&ctx, method, grpc::StubOptions(), &request, &response,
                 [&](grpc::Status s) {
                   status = std::move(s);
                   done.Notify();
                 });
  done.WaitForNotification();
  return status;
}

std::map<std::string, int64_t> CodesOf(const v1::GetStatsResponse& stats,
                                       const std::string& method) {
  std::map<std::string, int64_t> codes;
  for (const v1::RpcStats& r : stats.rpcs()) {
    if (r.method() != method) continue;
    for (const auto& [code, n] : r.codes()) codes[code] = n;
  }
  return codes;
}

TEST(RequestChecksTest, BytesThatDoNotParseAreInvalidArgumentAndCounted) {
  testing::LoopbackServer server({.workers = 1, .max_in_flight = 2});
  auto channel = Channel(server.port());
  std::string valid;
  ASSERT_TRUE(SmallPlanRequest().SerializeToString(&valid));
  const std::string cases[] = {
      std::string("\xff\xff\xff\xff", 4),  // no message at all
      valid.substr(0, 3),                  // truncated inside `model`
      // model { name: "\xff" }: a proto3 string must be UTF-8.
      std::string("\x0a\x03\x0a\x01\xff", 5),
  };
  for (const std::string& bytes : cases) {
    grpc::Status s = RawCall(channel, "/arachne.v1.Planner/Plan", bytes);
    EXPECT_EQ(s.error_code(), grpc::StatusCode::INVALID_ARGUMENT)
        << s.error_message();
    EXPECT_THAT(s.error_message(),
                HasSubstr("request: not a valid arachne.v1.PlanRequest"));
  }
  grpc::Status evaluate =
      RawCall(channel, "/arachne.v1.Planner/Evaluate", cases[0]);
  EXPECT_EQ(evaluate.error_code(), grpc::StatusCode::INVALID_ARGUMENT);
  EXPECT_THAT(evaluate.error_message(),
              HasSubstr("request: not a valid arachne.v1.EvaluateRequest"));

  grpc::ClientContext ctx;
  v1::GetStatsResponse stats;
  ASSERT_TRUE(v1::Planner::NewStub(channel)->GetStats(&ctx, {}, &stats).ok());
  EXPECT_EQ(CodesOf(stats, "Plan")["INVALID_ARGUMENT"], 3);
  EXPECT_EQ(CodesOf(stats, "Evaluate")["INVALID_ARGUMENT"], 1);
}

struct OptionsCase {
  std::string what;
  std::function<void(v1::PlannerOptions*)> set;
  std::string message;
};

// The same validation as `arachne plan`'s flags (planning_options.h), in
// the request's field names.
TEST(RequestChecksTest, OptionsOutOfRangeNameTheFieldAndValue) {
  testing::LoopbackServer server({.workers = 1, .max_in_flight = 2});
  auto stub = v1::Planner::NewStub(Channel(server.port()));
  const OptionsCase cases[] = {
      {"budget NaN",
       [](v1::PlannerOptions* o) {
         o->set_budget_s(std::numeric_limits<double>::quiet_NaN());
       },
       "options.budget_s: must be seconds in (0, 86400] (or 0 for the "
       "default), got nan"},
      {"budget inf",
       [](v1::PlannerOptions* o) {
         o->set_budget_s(std::numeric_limits<double>::infinity());
       },
       "options.budget_s: must be seconds in (0, 86400] (or 0 for the "
       "default), got inf"},
      {"budget negative", [](v1::PlannerOptions* o) { o->set_budget_s(-1); },
       "options.budget_s: must be seconds in (0, 86400] (or 0 for the "
       "default), got -1"},
      {"objective 99",
       [](v1::PlannerOptions* o) {
         o->set_objective(static_cast<v1::PlannerOptions::Objective>(99));
       },
       "options.objective: must be THROUGHPUT (0) or USD_PER_TOKEN (1), got "
       "99"},
      {"objective -5",
       [](v1::PlannerOptions* o) {
         o->set_objective(static_cast<v1::PlannerOptions::Objective>(-5));
       },
       "options.objective: must be THROUGHPUT (0) or USD_PER_TOKEN (1), got "
       "-5"},
      {"rollouts -1",
       [](v1::PlannerOptions* o) {
         o->set_planner("learned");
         o->set_policy_rollouts(-1);
       },
       "options.policy_rollouts: must be in 0..1048576, got -1"},
      {"max_evaluations -1",
       [](v1::PlannerOptions* o) { o->set_max_evaluations(-1); },
       "options.max_evaluations: must be >= 0 (0: no limit), got -1"},
      {"max_depth 65", [](v1::PlannerOptions* o) { o->set_max_depth(65); },
       "options.max_depth: must be in 1..64 (or 0 for the default), got 65"},
      {"max_templates 17",
       [](v1::PlannerOptions* o) { o->set_max_templates(17); },
       "options.max_templates: must be in 1..16 (or 0 for the default), got "
       "17"},
  };
  for (const OptionsCase& c : cases) {
    v1::PlanRequest r = SmallPlanRequest();
    c.set(r.mutable_options());
    grpc::ClientContext ctx;
    v1::PlanResponse response;
    grpc::Status s = stub->Plan(&ctx, r, &response);
    EXPECT_EQ(s.error_code(), grpc::StatusCode::INVALID_ARGUMENT) << c.what;
    EXPECT_EQ(s.error_message(), c.message) << c.what;
  }
}

// The cluster is read by the cluster files' reader: an infinite NIC speed
// is refused as a file's would be.
TEST(RequestChecksTest, InfiniteInterNodeBandwidthNamesTheField) {
  testing::LoopbackServer server({.workers = 1, .max_in_flight = 2});
  auto stub = v1::Planner::NewStub(Channel(server.port()));
  v1::PlanRequest r = SmallPlanRequest();
  r.mutable_cluster()->set_inter_node_gbps(
      std::numeric_limits<double>::infinity());
  grpc::ClientContext ctx;
  v1::PlanResponse response;
  grpc::Status s = stub->Plan(&ctx, r, &response);
  EXPECT_EQ(s.error_code(), grpc::StatusCode::INVALID_ARGUMENT);
  EXPECT_THAT(s.error_message(), HasSubstr("cluster.inter_node_gbps: must be "
                                           "a finite number > 0, got inf"));
}

// A handler whose Plan blocks (so the one slot stays taken) but whose cheap
// checks are the real handler's.
class BlockingWithRealChecks : public BlockingHandler {
 public:
  BlockingWithRealChecks() {
    auto impl = PlannerHandlerImpl::Create({});
    CHECK(impl.ok()) << impl.status();
    real_ = *std::move(impl);
  }
  absl::Status CheckPlan(const PlanQuery& q) const override {
    return real_->CheckPlan(q);
  }

 private:
  std::unique_ptr<PlannerHandlerImpl> real_;
};

std::unique_ptr<PlannerServer> Start(PlannerHandler* handler, int workers,
                                     int max_in_flight) {
  PlannerServerConfig config;
  config.listen = "127.0.0.1:0";
  config.service.workers = workers;
  config.service.max_in_flight = max_in_flight;
  auto server = PlannerServer::Start(handler, config);
  CHECK(server.ok()) << server.status();
  return *std::move(server);
}

TEST(RequestChecksTest, InvalidRequestsAreRejectedBeforeAdmission) {
  BlockingWithRealChecks handler;
  std::unique_ptr<PlannerServer> server = Start(&handler, 1, 1);
  auto stub = v1::Planner::NewStub(Channel(server->port()));
  // The only slot, taken by a valid call that blocks.
  grpc::ClientContext first_ctx;
  v1::PlanRequest first = SmallPlanRequest();
  v1::PlanResponse first_response;
  absl::Notification first_done;
  stub->async()->Plan(&first_ctx, &first, &first_response,
                      [&](grpc::Status) { first_done.Notify(); });
  ASSERT_TRUE(
      handler.entered_.WaitForNotificationWithTimeout(absl::Seconds(10)));

  // Invalid ones are answered for what they are, not RESOURCE_EXHAUSTED.
  v1::PlanRequest bad_depth = SmallPlanRequest();
  bad_depth.mutable_options()->set_max_depth(1000000);
  v1::PlanRequest bad_gpu = SmallPlanRequest();
  bad_gpu.mutable_cluster()->mutable_nodes(0)->set_gpu("X9000");
  v1::PlanRequest bad_model = SmallPlanRequest();
  bad_model.mutable_model()->set_name("llama9");
  for (const auto& [request, message] :
       {std::pair<v1::PlanRequest, std::string>{bad_depth,
                                                "options.max_depth: must be in "
                                                "1..64"},
        {bad_gpu, "cluster.nodes[0].gpu: unknown GPU type"},
        {bad_model, "model.name: unknown model \"llama9\""}}) {
    grpc::ClientContext ctx;
    v1::PlanResponse response;
    const absl::Time start = absl::Now();
    grpc::Status s = stub->Plan(&ctx, request, &response);
    EXPECT_EQ(s.error_code(), grpc::StatusCode::INVALID_ARGUMENT)
        << s.error_message();
    EXPECT_THAT(s.error_message(), HasSubstr(message));
    EXPECT_LT(absl::Now() - start, absl::Seconds(2));
  }
  // A valid one still finds the queue full.
  grpc::ClientContext ctx;
  v1::PlanResponse response;
  EXPECT_EQ(stub->Plan(&ctx, SmallPlanRequest(), &response).error_code(),
            grpc::StatusCode::RESOURCE_EXHAUSTED);
  handler.release_.Notify();
  first_done.WaitForNotification();
  server->Shutdown(absl::Seconds(1));
}

// A plan of 200,000 stages for a 32-layer model is refused by its counts
// before any of it is read (it took 17 s and 763 MB).
TEST(RequestChecksTest, PlanWithMoreStagesThanLayersIsRejectedFast) {
  auto handler = PlannerHandlerImpl::Create({});
  ASSERT_TRUE(handler.ok()) << handler.status();
  EvaluateQuery q;
  q.model.name = "llama3-8b";
  q.cluster = SmallPlanRequest().cluster();
  nlohmann::json stage = {{"gpu_type", "H100-80GB"}, {"tp", 1}};
  nlohmann::json placement = {{"node", "h0"}, {"gpus", {0}}};
  nlohmann::json stages = nlohmann::json::array();
  nlohmann::json row = nlohmann::json::array();
  for (int s = 0; s < 200000; ++s) {
    stage["layers"] = {s, s + 1};
    stages.push_back(stage);
    row.push_back(placement);
  }
  q.plan = {{"templates",
             {{{"replicas", 1},
               {"micro_batch_size", 1},
               {"total_micro_batches", 2048},
               {"stages", std::move(stages)},
               {"placement", {{{"stages", std::move(row)}}}}}}}};
  const absl::Time start = absl::Now();
  absl::StatusOr<EvaluateAnswer> a = (*handler)->Evaluate(q);
  EXPECT_LT(absl::Now() - start, absl::Seconds(1));
  EXPECT_EQ(a.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(a.status().message(),
              HasSubstr("plan: templates[0].stages: 200000 stages for a "
                        "model of 32 layers"));
}

// A request's config.json goes through the file readers' limits, and a
// syntax error or a number beyond a double names its position.
TEST(RequestChecksTest, HfConfigTextErrorsNameTheirPosition) {
  auto handler = PlannerHandlerImpl::Create({});
  ASSERT_TRUE(handler.ok()) << handler.status();
  PlanQuery q;
  q.cluster = SmallPlanRequest().cluster();
  q.model.hf_config_json = R"({"hidden_size": 1e999})";
  absl::StatusOr<PlanAnswer> a = (*handler)->Plan(q);
  EXPECT_EQ(a.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(a.status().message(), HasSubstr("model.hf_config_json:1:"));
  q.model.hf_config_json = std::string(70000, '[') + std::string(70000, ']');
  a = (*handler)->Plan(q);
  EXPECT_EQ(a.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(a.status().message(), HasSubstr("model.hf_config_json"));
  EXPECT_THAT(a.status().message(), HasSubstr("64"));
}

grpc::Status Check(const std::shared_ptr<grpc::Channel>& channel,
                   HealthCheckResponse* response) {
  grpc::ClientContext ctx;
  ctx.set_deadline(absl::ToChronoTime(absl::Now() + absl::Seconds(5)));
  return Health::NewStub(channel)->Check(&ctx, {}, response);
}

TEST(ShutdownGraceTest, MainPortAnswersNotServingAndRefusesNewCalls) {
  BlockingHandler handler;
  std::unique_ptr<PlannerServer> server = Start(&handler, 1, 1);
  auto channel = Channel(server->port());
  auto stub = v1::Planner::NewStub(channel);
  grpc::ClientContext plan_ctx;
  v1::PlanRequest request;
  v1::PlanResponse plan;
  absl::Notification plan_done;
  grpc::Status plan_status;
  stub->async()->Plan(&plan_ctx, &request, &plan, [&](grpc::Status s) {
    plan_status = s;
    plan_done.Notify();
  });
  ASSERT_TRUE(
      handler.entered_.WaitForNotificationWithTimeout(absl::Seconds(10)));

  std::thread shutdown([&] { server->Shutdown(absl::Seconds(60)); });
  HealthCheckResponse response;
  grpc::Status s;
  const absl::Time give_up = absl::Now() + absl::Seconds(10);
  do {
    s = Check(channel, &response);
  } while (s.ok() && response.status() == HealthCheckResponse::SERVING &&
           absl::Now() < give_up);
  // NOT_SERVING as documented, not a refused call (UNAVAILABLE).
  ASSERT_TRUE(s.ok()) << s.error_code() << ": " << s.error_message();
  EXPECT_EQ(response.status(), HealthCheckResponse::NOT_SERVING);
  grpc::ClientContext late_ctx;
  v1::PlanResponse late;
  grpc::Status refused = stub->Plan(&late_ctx, SmallPlanRequest(), &late);
  EXPECT_EQ(refused.error_code(), grpc::StatusCode::UNAVAILABLE);
  EXPECT_THAT(refused.error_message(), HasSubstr("server shutting down"));
  EXPECT_FALSE(plan_done.HasBeenNotified());

  handler.release_.Notify();
  shutdown.join();
  ASSERT_TRUE(plan_done.WaitForNotificationWithTimeout(absl::Seconds(10)));
  // The call in flight finished within the grace and got its own answer.
  EXPECT_EQ(plan_status.error_code(), grpc::StatusCode::UNAVAILABLE);
  EXPECT_EQ(plan_status.error_message(), "released");
}

// The log lines written while it is installed.
class LogLines : public google::LogSink {
 public:
  LogLines() { google::AddLogSink(this); }
  ~LogLines() override { google::RemoveLogSink(this); }
  void send(google::LogSeverity /*severity*/, const char* /*full_filename*/,
            const char* /*base_filename*/, int /*line*/,
            const google::LogMessageTime& /*time*/, const char* message,
            size_t message_len) override {
    absl::MutexLock lock(&mu_);
    lines_.emplace_back(message, message_len);
  }
  std::vector<std::string> lines() {
    absl::MutexLock lock(&mu_);
    return lines_;
  }

 private:
  absl::Mutex mu_;
  std::vector<std::string> lines_ ABSL_GUARDED_BY(mu_);
};

// At the end of the grace period the running call is cut (its search sees
// the cancellation and answers), the queued one answers UNAVAILABLE; both
// reach the client and are counted as what it got, none as OK.
TEST(ShutdownGraceTest, CallsCutAtTheEndOfTheGraceAnswerAndAreCountedSo) {
  BlockingHandler handler;
  std::unique_ptr<PlannerServer> server = Start(&handler, 1, 2);
  auto stub = v1::Planner::NewStub(Channel(server->port()));
  grpc::ClientContext running_ctx, queued_ctx;
  v1::PlanRequest request;
  v1::PlanResponse running_response, queued_response;
  absl::Notification running_done, queued_done;
  grpc::Status running_status, queued_status;
  stub->async()->Plan(&running_ctx, &request, &running_response,
                      [&](grpc::Status s) {
                        running_status = s;
                        running_done.Notify();
                      });
  ASSERT_TRUE(
      handler.entered_.WaitForNotificationWithTimeout(absl::Seconds(10)));
  stub->async()->Plan(&queued_ctx, &request, &queued_response,
                      [&](grpc::Status s) {
                        queued_status = s;
                        queued_done.Notify();
                      });
  // The queued call is admitted (in_flight 2) before the shutdown starts.
  const absl::Time give_up = absl::Now() + absl::Seconds(10);
  while (absl::Now() < give_up) {
    v1::GetStatsResponse stats;
    grpc::ClientContext ctx;
    ASSERT_TRUE(stub->GetStats(&ctx, {}, &stats).ok());
    if (stats.in_flight() == 2) break;
    absl::SleepFor(absl::Milliseconds(5));
  }

  LogLines log;
  server->Shutdown(absl::Milliseconds(200));
  ASSERT_TRUE(running_done.WaitForNotificationWithTimeout(absl::Seconds(10)));
  ASSERT_TRUE(queued_done.WaitForNotificationWithTimeout(absl::Seconds(10)));
  EXPECT_TRUE(handler.saw_cancel_.HasBeenNotified());
  EXPECT_EQ(running_status.error_code(), grpc::StatusCode::CANCELLED);
  EXPECT_EQ(running_status.error_message(), "search cancelled");
  EXPECT_EQ(queued_status.error_code(), grpc::StatusCode::UNAVAILABLE);
  EXPECT_THAT(queued_status.error_message(),
              HasSubstr("the grace period ended before this call ran"));

  v1::GetStatsResponse stats;
  server->service().metrics().Fill(&stats);
  std::map<std::string, int64_t> codes = CodesOf(stats, "Plan");
  EXPECT_EQ(codes["CANCELLED"], 1);
  EXPECT_EQ(codes["UNAVAILABLE"], 1);
  EXPECT_EQ(codes.count("OK"), 0u);
  // The log says what each client got, and that the shutdown cut it.
  int cut_lines = 0;
  for (const std::string& line : log.lines()) {
    EXPECT_THAT(line, ::testing::Not(HasSubstr("Plan OK")));
    if (absl::StrContains(line, "(cut by the shutdown)")) ++cut_lines;
  }
  EXPECT_EQ(cut_lines, 2);
}

// The real planner cut by the shutdown answers with the best plan so far,
// and the client receives it.
TEST(ShutdownGraceTest, SearchCutByTheShutdownDeliversItsBestPlan) {
  auto impl = PlannerHandlerImpl::Create({});
  ASSERT_TRUE(impl.ok()) << impl.status();
  std::unique_ptr<PlannerServer> server = Start(impl->get(), 1, 1);
  auto stub = v1::Planner::NewStub(Channel(server->port()));
  v1::PlanRequest r;
  r.mutable_model()->set_name("llama3-8b");
  for (const char* gpu : {"H100-80GB", "A100-40GB", "L40S"}) {
    for (int i = 0; i < 4; ++i) {
      v1::Node* n = r.mutable_cluster()->add_nodes();
      n->set_name(absl::StrCat(gpu, "-", i));
      n->set_gpu(gpu);
      n->set_gpus(8);
    }
  }
  // The exact planner searches its whole budget here (exhaustive takes far
  // longer); the learned default can converge inside 300 ms.
  r.mutable_options()->set_planner("exact");
  r.mutable_options()->set_budget_s(30);
  grpc::ClientContext ctx;
  v1::PlanResponse response;
  absl::Notification done;
  grpc::Status status;
  stub->async()->Plan(&ctx, &r, &response, [&](grpc::Status s) {
    status = s;
    done.Notify();
  });
  // Let the search find a first plan (~10 ms alone), then shut down.
  absl::SleepFor(absl::Milliseconds(300));
  server->Shutdown(absl::Milliseconds(100));
  ASSERT_TRUE(done.WaitForNotificationWithTimeout(absl::Seconds(10)));
  ASSERT_TRUE(status.ok()) << status.error_code() << ": "
                           << status.error_message();
  EXPECT_TRUE(response.stopped_early());
  EXPECT_GT(response.plan().templates_size(), 0);
}

}  // namespace
}  // namespace arachne
