// The gRPC PlannerClient against a real arachne-planner on 127.0.0.1:0: its
// answers equal what the handler answers in process (the plan JSON passes
// the wire unchanged, doubles included), server errors keep their code, and
// PredictionFromPlanJson reads back the prediction of an answer.
#include "planner_service/client/planner_client.h"

#include <memory>
#include <string>

#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "absl/time/time.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "nlohmann/json.hpp"
#include "planner_service/api/planner_handler_impl.h"
#include "test/server/loopback_server.h"
#include "planner_service/server/planner_server.h"

namespace arachne {
namespace {

using ::testing::HasSubstr;

void AddNode(ClusterSpec* cluster, const std::string& name,
             const std::string& gpu, int gpus) {
  v1::Node* node = cluster->add_nodes();
  node->set_name(name);
  node->set_gpu(gpu);
  node->set_gpus(gpus);
}

ClusterSpec TwoH100Nodes() {
  ClusterSpec cluster;
  AddNode(&cluster, "h0", "H100-80GB", 8);
  AddNode(&cluster, "h1", "H100", 8);
  return cluster;
}

PlanQuery SmallQuery() {
  PlanQuery q;
  q.model.name = "llama3-8b";
  q.training.global_batch = 512;
  q.cluster = TwoH100Nodes();
  q.planner = "exact";
  q.max_evaluations = 40;
  return q;
}

// What an in-process answer has and a remote one cannot: the timing, and
// PlanToJson's echo of the model and training config.
nlohmann::json Comparable(nlohmann::json j) {
  j.erase("planning_time_s");
  j.erase("model");
  j.erase("training");
  return j;
}

class PlannerClientTest : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    server_ = new testing::LoopbackServer({.workers = 2, .max_in_flight = 4});
  }
  static void TearDownTestSuite() {
    delete server_;
  }

  static std::string Address() {
    return server_->address();
  }

  std::unique_ptr<PlannerClient> Client() {
    PlannerClientConfig config;
    config.address = Address();
    config.default_timeout = absl::Seconds(20);
    auto client = MakeGrpcPlannerClient(config);
    EXPECT_TRUE(client.ok()) << client.status();
    return *std::move(client);
  }

  static testing::LoopbackServer* server_;
};
testing::LoopbackServer* PlannerClientTest::server_ = nullptr;

TEST_F(PlannerClientTest, PlanAndEvaluateEqualTheHandlersAnswers) {
  auto remote = Client()->Plan(SmallQuery());
  ASSERT_TRUE(remote.ok()) << remote.status();
  auto local = server_->handler().Plan(SmallQuery());
  ASSERT_TRUE(local.ok()) << local.status();
  EXPECT_EQ(Comparable(remote->plan), Comparable(local->plan));
  EXPECT_EQ(remote->planner, "exact");
  EXPECT_EQ(remote->evaluations, local->evaluations);

  EvaluateQuery eq;
  eq.model.name = "llama3-8b";
  eq.training.global_batch = 512;
  eq.cluster = TwoH100Nodes();
  eq.plan = remote->plan;
  auto remote_eval = Client()->Evaluate(eq);
  ASSERT_TRUE(remote_eval.ok()) << remote_eval.status();
  auto local_eval = server_->handler().Evaluate(eq);
  ASSERT_TRUE(local_eval.ok()) << local_eval.status();
  EXPECT_EQ(Comparable(remote_eval->plan), Comparable(local_eval->plan));
}

TEST_F(PlannerClientTest, ReplanEqualsTheHandlersAnswer) {
  auto planned = server_->handler().Plan(SmallQuery());
  ASSERT_TRUE(planned.ok()) << planned.status();
  ReplanQuery q;
  q.plan = SmallQuery();
  AddNode(&q.plan.cluster, "h2", "H100-80GB", 8);  // a join
  q.current_cluster = TwoH100Nodes();
  q.current_plan = planned->plan;
  auto remote = Client()->Replan(q);
  ASSERT_TRUE(remote.ok()) << remote.status();
  auto local = server_->handler().Replan(q);
  ASSERT_TRUE(local.ok()) << local.status();
  EXPECT_EQ(Comparable(remote->new_plan.plan),
            Comparable(local->new_plan.plan));
  ASSERT_TRUE(remote->current.feasible) << remote->current.reason;
  EXPECT_EQ(Comparable(remote->current.plan), Comparable(local->current.plan));
  EXPECT_EQ(remote->migration.available, local->migration.available);
  EXPECT_EQ(remote->migration.bytes_moved, local->migration.bytes_moved);
  EXPECT_EQ(remote->migration.bytes_kept, local->migration.bytes_kept);
  EXPECT_EQ(remote->migration.transfers, local->migration.transfers);
  EXPECT_DOUBLE_EQ(remote->migration.makespan_s, local->migration.makespan_s);
}

TEST_F(PlannerClientTest, ServerErrorsKeepCodeAndNameTheServer) {
  PlanQuery q = SmallQuery();
  q.cluster.mutable_nodes(1)->set_gpu("X");
  auto answer = Client()->Plan(q);
  EXPECT_EQ(answer.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(answer.status().message(),
              HasSubstr(absl::StrCat("server ", Address(),
                                     ": cluster.nodes[1].gpu: unknown GPU "
                                     "type \"X\"")));
}

TEST_F(PlannerClientTest, BadConfigNamesTheField) {
  PlannerClientConfig config;
  EXPECT_EQ(MakeGrpcPlannerClient(config).status().code(),
            absl::StatusCode::kInvalidArgument);
  config.address = Address();
  config.tls_cert_file = "/c.pem";
  auto c = MakeGrpcPlannerClient(config);
  EXPECT_EQ(c.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(c.status().message(), HasSubstr("tls_cert_file, tls_key_file"));
  config.tls_key_file = "/c.key";
  c = MakeGrpcPlannerClient(config);
  EXPECT_EQ(c.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(c.status().message(), HasSubstr("tls_ca_file: required"));
}

TEST_F(PlannerClientTest, PredictionFromPlanJsonReadsAnAnswer) {
  auto answer = server_->handler().Plan(SmallQuery());
  ASSERT_TRUE(answer.ok()) << answer.status();
  auto p = PredictionFromPlanJson(answer->plan);
  ASSERT_TRUE(p.ok()) << p.status();
  EXPECT_EQ(p->iteration_time_s,
            answer->plan["iteration_time_s"].get<double>());
  EXPECT_EQ(p->breakdown.bubble_s,
            answer->plan["breakdown"]["bubble_s"].get<double>());
  ASSERT_EQ(p->stage_memory.size(), answer->plan["templates"].size());
  EXPECT_EQ(
      p->stage_memory[0][0].total_gib(),
      answer->plan["templates"][0]["stages"][0]["memory_gib"].get<double>());

  nlohmann::json broken = answer->plan;
  broken.erase("mfu");
  EXPECT_EQ(PredictionFromPlanJson(broken).status().message(),
            "plan.mfu: missing or not a number");
  broken = answer->plan;
  const size_t last = answer->plan["templates"][0]["stages"].size() - 1;
  broken["templates"][0]["stages"][last].erase("memory_gib");
  EXPECT_EQ(PredictionFromPlanJson(broken).status().message(),
            absl::StrCat("plan.templates[0].stages[", last,
                         "].memory_gib: missing or not a number"));
}

}  // namespace
}  // namespace arachne
