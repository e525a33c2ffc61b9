// The plaintext health-only port (PlannerServerConfig::health_listen): a
// real server with TLS on its main port and health on 127.0.0.1:0, probed
// the way Kubernetes' gRPC probes do (plaintext Health/Check, service "").
// The fixture of loopback_server.h serves plaintext only, so the server is
// started here; certificates come from the `openssl` command (the tests skip
// where it is missing, like security_test).
#include <cstdlib>
#include <unistd.h>

#include <filesystem>
#include <fstream>
#include <memory>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/synchronization/notification.h"
#include "absl/time/clock.h"
#include "absl/time/time.h"
#include "arachne/v1/planner.grpc.pb.h"
#include "gmock/gmock.h"
#include "grpc/health/v1/health.grpc.pb.h"
#include "grpcpp/generic/generic_stub.h"
#include "grpcpp/grpcpp.h"
#include "gtest/gtest.h"
#include "planner_service/api/planner_handler.h"
#include "planner_service/server/planner_server.h"
#include "test/server/blocking_handler.h"

namespace arachne {
namespace {

using ::grpc::health::v1::Health;
using ::grpc::health::v1::HealthCheckResponse;
using ::testing::HasSubstr;

std::string ReadFile(const std::string& path) {
  std::ifstream in(path);
  std::stringstream s;
  s << in.rdbuf();
  return s.str();
}

using ::arachne::testing::BlockingHandler;

class HealthPortTest : public ::testing::Test {
 protected:
  void SetUp() override {
    // Per test and process: ctest runs each case as its own process.
    dir_ = (std::filesystem::path(::testing::TempDir()) /
            absl::StrCat("arachne_health_port_", ::getpid()))
               .string();
    std::filesystem::create_directories(dir_);
    const std::string cmd = absl::StrCat(
        "openssl req -x509 -newkey rsa:2048 -nodes -days 1 -subj /CN=localhost",
        " -addext subjectAltName=DNS:localhost,IP:127.0.0.1 -keyout ", dir_,
        "/server.key -out ", dir_, "/server.pem > /dev/null 2>&1");
    have_certs_ = std::system(cmd.c_str()) == 0;
  }
  void TearDown() override { std::filesystem::remove_all(dir_); }

  // TLS on the main port, a bearer token, health on 127.0.0.1:0.
  std::unique_ptr<PlannerServer> Start(PlannerHandler* handler) {
    PlannerServerConfig config;
    config.listen = "127.0.0.1:0";
    config.health_listen = "127.0.0.1:0";
    config.tls.cert_file = dir_ + "/server.pem";
    config.tls.key_file = dir_ + "/server.key";
    config.service.workers = 1;
    config.service.max_in_flight = 1;
    config.service.bearer_token = "probe-has-no-token";
    auto server = PlannerServer::Start(handler, config);
    EXPECT_TRUE(server.ok()) << server.status();
    return server.ok() ? *std::move(server) : nullptr;
  }

  static std::shared_ptr<grpc::Channel> Plaintext(int port) {
    return grpc::CreateChannel(absl::StrCat("127.0.0.1:", port),
                               grpc::InsecureChannelCredentials());
  }
  std::shared_ptr<grpc::Channel> Tls(int port) const {
    grpc::SslCredentialsOptions options;
    options.pem_root_certs = ReadFile(dir_ + "/server.pem");
    return grpc::CreateChannel(absl::StrCat("localhost:", port),
                               grpc::SslCredentials(options));
  }

  // Health/Check with service "" (what a Kubernetes grpc probe sends).
  static grpc::Status Check(const std::shared_ptr<grpc::Channel>& channel,
                            HealthCheckResponse* response) {
    grpc::ClientContext ctx;
    ctx.set_deadline(absl::ToChronoTime(absl::Now() + absl::Seconds(5)));
    return Health::NewStub(channel)->Check(&ctx, {}, response);
  }

  std::string dir_;
  bool have_certs_ = false;
  BlockingHandler handler_;
};

TEST_F(HealthPortTest, PlaintextCheckOnTheHealthPortIsServing) {
  if (!have_certs_) GTEST_SKIP() << "no openssl command to make certificates";
  std::unique_ptr<PlannerServer> server = Start(&handler_);
  ASSERT_NE(server, nullptr);
  ASSERT_GT(server->health_port(), 0);
  EXPECT_NE(server->health_port(), server->port());

  HealthCheckResponse response;
  grpc::Status s = Check(Plaintext(server->health_port()), &response);
  ASSERT_TRUE(s.ok()) << s.error_code() << ": " << s.error_message();
  EXPECT_EQ(response.status(), HealthCheckResponse::SERVING);

  // The main port stays TLS-only: a plaintext probe there cannot connect.
  grpc::Status plain_main = Check(Plaintext(server->port()), &response);
  EXPECT_EQ(plain_main.error_code(), grpc::StatusCode::UNAVAILABLE);
  // ... while a TLS client gets the same SERVING there.
  response.Clear();
  grpc::Status tls_main = Check(Tls(server->port()), &response);
  ASSERT_TRUE(tls_main.ok()) << tls_main.error_message();
  EXPECT_EQ(response.status(), HealthCheckResponse::SERVING);
  server->Shutdown(absl::ZeroDuration());
}

TEST_F(HealthPortTest, PlannerAndReflectionAreNotServedOnTheHealthPort) {
  if (!have_certs_) GTEST_SKIP() << "no openssl command to make certificates";
  std::unique_ptr<PlannerServer> server = Start(&handler_);
  ASSERT_NE(server, nullptr);
  auto channel = Plaintext(server->health_port());

  // With and without the token: the Planner service is not there at all.
  for (const std::string& authorization :
       {std::string(), std::string("Bearer probe-has-no-token")}) {
    grpc::ClientContext ctx;
    ctx.set_deadline(absl::ToChronoTime(absl::Now() + absl::Seconds(5)));
    if (!authorization.empty()) ctx.AddMetadata("authorization", authorization);
    v1::ListModelsResponse models;
    grpc::Status s =
        v1::Planner::NewStub(channel)->ListModels(&ctx, {}, &models);
    EXPECT_EQ(s.error_code(), grpc::StatusCode::UNIMPLEMENTED)
        << authorization << ": " << s.error_message();
    EXPECT_EQ(s.error_message(),
              "/arachne.v1.Planner/ListModels: this port (health_listen) "
              "serves only grpc.health.v1.Health; call the main port (listen)");
  }

  // Reflection is a process-wide builder plugin; the health server drops it.
  grpc::ClientContext ctx;
  ctx.set_deadline(absl::ToChronoTime(absl::Now() + absl::Seconds(5)));
  grpc::GenericStub generic(channel);
  grpc::CompletionQueue cq;
  auto call = generic.PrepareCall(
      &ctx, "/grpc.reflection.v1alpha.ServerReflection/ServerReflectionInfo",
      &cq);
  call->StartCall(reinterpret_cast<void*>(1));
  void* tag = nullptr;
  bool ok = false;
  ASSERT_TRUE(cq.Next(&tag, &ok));
  call->WritesDone(reinterpret_cast<void*>(2));
  ASSERT_TRUE(cq.Next(&tag, &ok));
  grpc::Status status;
  call->Finish(&status, reinterpret_cast<void*>(3));
  while (cq.Next(&tag, &ok) && tag != reinterpret_cast<void*>(3)) {
  }
  EXPECT_EQ(status.error_code(), grpc::StatusCode::UNIMPLEMENTED)
      << status.error_message();
  cq.Shutdown();
  while (cq.Next(&tag, &ok)) {
  }
  server->Shutdown(absl::ZeroDuration());
}

TEST_F(HealthPortTest, ShutdownTurnsTheHealthPortNotServingThenClosesIt) {
  if (!have_certs_) GTEST_SKIP() << "no openssl command to make certificates";
  std::unique_ptr<PlannerServer> server = Start(&handler_);
  ASSERT_NE(server, nullptr);
  const int health_port = server->health_port();
  auto health_channel = Plaintext(health_port);

  // A Plan in flight on the TLS port holds the shutdown in its grace period.
  grpc::ClientContext plan_ctx;
  plan_ctx.AddMetadata("authorization", "Bearer probe-has-no-token");
  v1::PlanRequest request;
  v1::PlanResponse plan;
  absl::Notification plan_done;
  v1::Planner::NewStub(Tls(server->port()))
      ->async()
      ->Plan(&plan_ctx, &request, &plan,
             [&](grpc::Status) { plan_done.Notify(); });
  ASSERT_TRUE(handler_.entered_.WaitForNotificationWithTimeout(
      absl::Seconds(10)));

  std::thread shutdown([&] { server->Shutdown(absl::Seconds(60)); });
  // Probes see NOT_SERVING while the call finishes (not a refused
  // connection): readiness drops the pod, the call still completes.
  HealthCheckResponse response;
  const absl::Time give_up = absl::Now() + absl::Seconds(10);
  grpc::Status s;
  do {
    s = Check(health_channel, &response);
  } while (s.ok() && response.status() == HealthCheckResponse::SERVING &&
           absl::Now() < give_up);
  ASSERT_TRUE(s.ok()) << s.error_code() << ": " << s.error_message();
  EXPECT_EQ(response.status(), HealthCheckResponse::NOT_SERVING);
  EXPECT_FALSE(plan_done.HasBeenNotified());

  handler_.release_.Notify();
  shutdown.join();
  EXPECT_TRUE(plan_done.WaitForNotificationWithTimeout(absl::Seconds(10)));
  // Shutdown done: the health port is gone.
  grpc::Status after = Check(Plaintext(health_port), &response);
  EXPECT_EQ(after.error_code(), grpc::StatusCode::UNAVAILABLE)
      << after.error_message();
}

TEST(HealthPortConfigTest, UnbindableHealthAddressNamesTheField) {
  BlockingHandler handler;
  PlannerServerConfig config;
  config.listen = "127.0.0.1:0";
  config.health_listen = "256.0.0.1:1";  // not an address
  auto server = PlannerServer::Start(&handler, config);
  EXPECT_EQ(server.status().code(), absl::StatusCode::kUnavailable);
  EXPECT_THAT(server.status().message(),
              HasSubstr("health_listen: cannot bind 256.0.0.1:1"));
}

TEST(HealthPortConfigTest, NoHealthListenMeansNoHealthPort) {
  BlockingHandler handler;
  PlannerServerConfig config;
  config.listen = "127.0.0.1:0";
  auto server = PlannerServer::Start(&handler, config);
  ASSERT_TRUE(server.ok()) << server.status();
  EXPECT_EQ((*server)->health_port(), 0);
  (*server)->Shutdown(absl::ZeroDuration());
}

}  // namespace
}  // namespace arachne
