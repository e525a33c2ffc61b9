// The service's default planner: a Plan or Replan request without
// options.planner runs "learned" where a policy serves the model (the
// shipped profiles/policies/llama3-8b.pt), else "template-search" with
// PlanResponse.planner_fallback_reason naming the model; named planners
// run as before; `arachne plan --server` prints the same line; the default
// budget is the learned planners' 0.9 s.
#include <unistd.h>

#include <cstdlib>
#include <filesystem>
#include <memory>
#include <string>
#include <vector>

#include "absl/strings/str_split.h"
#include "absl/time/clock.h"
#include "absl/time/time.h"
#include "arachne/v1/planner.grpc.pb.h"
#include "gmock/gmock.h"
#include "grpcpp/grpcpp.h"
#include "gtest/gtest.h"
#include "planner_service/core/learned/learned_planner.h"
#include "planner_service/policy/torch_policy.h"
#include "test/cli/cli_runner.h"
#include "test/policy/registered_policies.h"
#include "test/server/loopback_server.h"

namespace arachne {
namespace {

using ::arachne::testing::Cli;
using ::arachne::testing::CliRun;
using ::testing::HasSubstr;
using ::testing::StartsWith;

void AddNode(v1::Cluster* c, const std::string& name, const std::string& gpu,
             int gpus) {
  v1::Node* n = c->add_nodes();
  n->set_name(name);
  n->set_gpu(gpu);
  n->set_gpus(gpus);
}

v1::Cluster H100AndA100(int a100_nodes = 1) {
  v1::Cluster c;
  AddNode(&c, "h0", "H100-80GB", 8);
  for (int i = 0; i < a100_nodes; ++i)
    AddNode(&c, "a" + std::to_string(i), "A100-40GB", 4);
  return c;
}

// No planner named, no budget: the defaults under test.
v1::PlanRequest DefaultRequest(const v1::Cluster& cluster) {
  v1::PlanRequest r;
  r.mutable_model()->set_name("llama3-8b");
  *r.mutable_cluster() = cluster;
  return r;
}

std::string Example(const std::string& name) {
  return std::string(ARACHNE_SOURCE_DIR) + "/examples/" + name;
}

class DefaultPlannerServiceTest : public ::testing::Test {
 protected:
  static void SetUpTestSuite() { suite_.Start(1, 4); }
  static void TearDownTestSuite() { suite_.Stop(); }
  // As the binary registers it at start-up.
  void RegisterWithEmptyPoliciesDir() {
    policies_.RegisterWithEmptyPoliciesDir();
  }

  grpc::Status Plan(const v1::PlanRequest& r, v1::PlanResponse* response) {
    grpc::ClientContext ctx;
    ctx.set_deadline(absl::ToChronoTime(absl::Now() + absl::Seconds(60)));
    return stub_->Plan(&ctx, r, response);
  }

  std::unique_ptr<v1::Planner::Stub> stub_ = v1::Planner::NewStub(suite_.channel());
  testing::RegisteredPolicies policies_;
  static testing::SuiteServer suite_;
};
testing::SuiteServer DefaultPlannerServiceTest::suite_;

TEST_F(DefaultPlannerServiceTest, LearnedWhereAPolicyServesTheModel) {
  v1::PlanResponse response;
  grpc::Status s = Plan(DefaultRequest(H100AndA100()), &response);
  ASSERT_TRUE(s.ok()) << s.error_message();
  EXPECT_EQ(response.planner(), "learned");
  EXPECT_EQ(response.planner_fallback_reason(), "");
  EXPECT_GT(response.prediction().throughput_iters_per_s(), 0);
}

TEST_F(DefaultPlannerServiceTest, EmptyPoliciesDirFallsBackWithTheReason) {
  RegisterWithEmptyPoliciesDir();
  v1::PlanResponse response;
  grpc::Status s = Plan(DefaultRequest(H100AndA100()), &response);
  ASSERT_TRUE(s.ok()) << s.error_message();
  EXPECT_EQ(response.planner(), "template-search");
  EXPECT_THAT(
      response.planner_fallback_reason(),
      StartsWith("no learned policy serves model \"llama3-8b\": " +
                 (policies_.empty_dir() / "llama3-8b.weights").string() + " does not exist"));
  EXPECT_EQ(response.planner_fallback_reason().find('\n'), std::string::npos);
}

TEST_F(DefaultPlannerServiceTest, NoFactoryFallsBackSayingSo) {
  RegisterLearnedPolicyFactory(nullptr);
  v1::PlanResponse response;
  grpc::Status s = Plan(DefaultRequest(H100AndA100()), &response);
  ASSERT_TRUE(s.ok()) << s.error_message();
  EXPECT_EQ(response.planner(), "template-search");
  EXPECT_EQ(response.planner_fallback_reason(),
            "no learned policy serves model \"llama3-8b\": this build has no "
            "LibTorch policy");
}

TEST_F(DefaultPlannerServiceTest, NamedPlannersRunAsBefore) {
  v1::PlanRequest r = DefaultRequest(H100AndA100());
  r.mutable_options()->set_planner("exact");
  r.mutable_options()->set_max_evaluations(50);
  v1::PlanResponse response;
  grpc::Status s = Plan(r, &response);
  ASSERT_TRUE(s.ok()) << s.error_message();
  EXPECT_EQ(response.planner(), "exact");
  EXPECT_EQ(response.planner_fallback_reason(), "");
  // Named learned without a policy: the error points to template-search.
  RegisterWithEmptyPoliciesDir();
  r.mutable_options()->set_planner("learned");
  r.mutable_options()->set_max_evaluations(0);
  grpc::ClientContext ctx;
  s = stub_->Plan(&ctx, r, &response);
  EXPECT_EQ(s.error_code(), grpc::StatusCode::FAILED_PRECONDITION);
  EXPECT_THAT(s.error_message(),
              HasSubstr("no policy for model \"llama3-8b\""));
  EXPECT_THAT(s.error_message(),
              HasSubstr("plan with --planner template-search instead"));
}

TEST_F(DefaultPlannerServiceTest, ReplanSaysWhichPlannerRanAndWhy) {
  const v1::Cluster current = H100AndA100(1);
  const v1::Cluster grown = H100AndA100(2);
  v1::PlanResponse planned;
  {
    v1::PlanRequest r = DefaultRequest(current);
    r.mutable_options()->set_planner("exact");
    r.mutable_options()->set_max_evaluations(40);
    grpc::Status s = Plan(r, &planned);
    ASSERT_TRUE(s.ok()) << s.error_message();
  }
  for (bool learned : {true, false}) {
    if (!learned) RegisterWithEmptyPoliciesDir();
    v1::ReplanRequest r;
    r.mutable_model()->set_name("llama3-8b");
    *r.mutable_current_cluster() = current;
    *r.mutable_current_plan() = planned.plan();
    *r.mutable_new_cluster() = grown;
    v1::ReplanResponse response;
    grpc::ClientContext ctx;
    ctx.set_deadline(absl::ToChronoTime(absl::Now() + absl::Seconds(60)));
    grpc::Status s = stub_->Replan(&ctx, r, &response);
    ASSERT_TRUE(s.ok()) << s.error_message();
    if (learned) {
      EXPECT_EQ(response.new_plan().planner(), "learned");
      EXPECT_EQ(response.new_plan().planner_fallback_reason(), "");
    } else {
      EXPECT_EQ(response.new_plan().planner(), "template-search");
      EXPECT_THAT(response.new_plan().planner_fallback_reason(),
                  StartsWith("no learned policy serves model \"llama3-8b\": "));
    }
  }
}

// The server's default budget for the default planner is 0.9 s, not its
// --default-budget-s (10 s here): on the paper's 512 GPUs the learned
// planner searches until the budget ends.
TEST_F(DefaultPlannerServiceTest, DefaultStaysUnderItsLatencyBudget) {
  for (bool learned : {true, false}) {
    if (!learned) RegisterWithEmptyPoliciesDir();
    v1::PlanRequest r;
    r.mutable_model()->set_name("llama3-8b");
    // examples/paper-512.yaml: 128 A100-40GB + 128 A6000 + 256 H100-80GB
    // in 4-GPU nodes.
    r.mutable_cluster()->set_inter_node_gbps(100);
    for (const auto& [gpu, count] :
         {std::pair<const char*, int>{"A100-40GB", 32},
          {"A6000", 32},
          {"H100-80GB", 64}}) {
      v1::NodeGroup* g = r.mutable_cluster()->add_node_groups();
      g->set_gpu(gpu);
      g->set_gpus_per_node(4);
      g->set_count(count);
    }
    v1::PlanResponse response;
    grpc::Status s = Plan(r, &response);
    ASSERT_TRUE(s.ok()) << s.error_message();
    EXPECT_EQ(response.planner(), learned ? "learned" : "template-search");
    EXPECT_LT(response.planning_time_s(), 1.0) << response.planner();
  }
}

// `arachne plan --server` prints the line the server's answer carries.
TEST_F(DefaultPlannerServiceTest, RemoteCliPrintsTheSameLine) {
  const std::vector<std::string> args = {"plan",
                                         "--model",
                                         "llama3-8b",
                                         "--cluster",
                                         Example("small-8.yaml"),
                                         "--server",
                                         suite_.address()};
  CliRun learned = Cli(args);
  ASSERT_EQ(learned.code, 0) << learned.err;
  EXPECT_THAT(learned.out, StartsWith("planner: learned\n"));

  RegisterWithEmptyPoliciesDir();
  CliRun remote = Cli(args);
  ASSERT_EQ(remote.code, 0) << remote.err;
  const std::vector<std::string> lines =
      absl::StrSplit(remote.out, '\n', absl::SkipEmpty());
  EXPECT_THAT(
      lines.front(),
      StartsWith("planner: template-search (no learned policy serves "
                 "model \"llama3-8b\": " +
                 (policies_.empty_dir() / "llama3-8b.weights").string() + " does not exist"));
  EXPECT_THAT(lines.back(), StartsWith("planner template-search: "));
  // In process, with the same factory: the same line.
  std::vector<std::string> local_args(args.begin(), args.end() - 2);
  CliRun local = Cli(local_args);
  ASSERT_EQ(local.code, 0) << local.err;
  EXPECT_EQ(std::vector<std::string>(
                absl::StrSplit(local.out, '\n', absl::SkipEmpty()))
                .front(),
            lines.front());
}

}  // namespace
}  // namespace arachne
