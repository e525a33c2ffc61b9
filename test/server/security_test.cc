// TLS, mutual TLS and bearer-token tests of arachne-planner: real servers on
// 127.0.0.1:0 and real gRPC clients. Certificates are generated here with
// the `openssl` command; where it is missing the TLS tests skip.
#include <cstdlib>
#include <unistd.h>

#include <filesystem>
#include <fstream>
#include <memory>
#include <sstream>
#include <string>

#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "absl/time/time.h"
#include "arachne/v1/planner.grpc.pb.h"
#include "gmock/gmock.h"
#include "grpc/health/v1/health.grpc.pb.h"
#include "grpcpp/grpcpp.h"
#include "gtest/gtest.h"
#include "planner_service/api/planner_handler_impl.h"
#include "planner_service/server/planner_server.h"

namespace arachne {
namespace {

using ::testing::HasSubstr;

std::string ReadFile(const std::string& path) {
  std::ifstream in(path);
  std::stringstream s;
  s << in.rdbuf();
  return s.str();
}

bool HaveOpenssl() {
  return std::system("openssl version > /dev/null 2>&1") == 0;
}

// A self-signed certificate for "localhost" / 127.0.0.1 at <dir>/<name>.pem
// with its key at <dir>/<name>.key. False when openssl failed.
bool MakeSelfSigned(const std::string& dir, const std::string& name) {
  const std::string cmd = absl::StrCat(
      "openssl req -x509 -newkey rsa:2048 -nodes -days 1 -subj /CN=localhost",
      " -addext subjectAltName=DNS:localhost,IP:127.0.0.1 -keyout ", dir, "/",
      name, ".key -out ", dir, "/", name, ".pem > /dev/null 2>&1");
  return std::system(cmd.c_str()) == 0;
}

class SecurityTest : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    auto impl = PlannerHandlerImpl::Create({});
    ASSERT_TRUE(impl.ok()) << impl.status();
    handler_ = impl->release();
    dir_ = new std::string(
        // Per process: ctest runs each test of this suite as its own
        // process, in parallel, and each removes its directory at the end.
        (std::filesystem::path(::testing::TempDir()) /
         ("arachne_security_" + std::to_string(::getpid())))
            .string());
    std::filesystem::create_directories(*dir_);
    have_certs_ = HaveOpenssl() && MakeSelfSigned(*dir_, "server") &&
                  MakeSelfSigned(*dir_, "client");
  }
  static void TearDownTestSuite() {
    delete handler_;
    std::filesystem::remove_all(*dir_);
    delete dir_;
  }

  std::unique_ptr<PlannerServer> Start(const ServerTlsConfig& tls,
                                       const std::string& token = "") {
    PlannerServerConfig config;
    config.listen = "127.0.0.1:0";
    config.tls = tls;
    config.service.workers = 1;
    config.service.max_in_flight = 2;
    config.service.bearer_token = token;
    auto server = PlannerServer::Start(handler_, config);
    EXPECT_TRUE(server.ok()) << server.status();
    return server.ok() ? *std::move(server) : nullptr;
  }

  static ServerTlsConfig ServerTls(bool mutual) {
    ServerTlsConfig tls;
    tls.cert_file = *dir_ + "/server.pem";
    tls.key_file = *dir_ + "/server.key";
    if (mutual) tls.client_ca_file = *dir_ + "/client.pem";
    return tls;
  }

  // A channel trusting the server's self-signed certificate; with a client
  // certificate when `client_cert`.
  static std::shared_ptr<grpc::Channel> TlsChannel(int port, bool client_cert) {
    grpc::SslCredentialsOptions options;
    options.pem_root_certs = ReadFile(*dir_ + "/server.pem");
    if (client_cert) {
      options.pem_private_key = ReadFile(*dir_ + "/client.key");
      options.pem_cert_chain = ReadFile(*dir_ + "/client.pem");
    }
    return grpc::CreateChannel(absl::StrCat("localhost:", port),
                               grpc::SslCredentials(options));
  }

  static grpc::Status ListModels(const std::shared_ptr<grpc::Channel>& channel,
                                 const std::string& authorization = "") {
    grpc::ClientContext ctx;
    ctx.set_deadline(absl::ToChronoTime(absl::Now() + absl::Seconds(5)));
    if (!authorization.empty()) ctx.AddMetadata("authorization", authorization);
    v1::ListModelsResponse response;
    return v1::Planner::NewStub(channel)->ListModels(&ctx, {}, &response);
  }

  static PlannerHandlerImpl* handler_;
  static std::string* dir_;
  static bool have_certs_;
};
PlannerHandlerImpl* SecurityTest::handler_ = nullptr;
std::string* SecurityTest::dir_ = nullptr;
bool SecurityTest::have_certs_ = false;

TEST_F(SecurityTest, TlsClientConnectsAndPlaintextClientDoesNot) {
  if (!have_certs_) GTEST_SKIP() << "no openssl command to make certificates";
  std::unique_ptr<PlannerServer> server = Start(ServerTls(/*mutual=*/false));
  ASSERT_NE(server, nullptr);
  grpc::Status s = ListModels(TlsChannel(server->port(), false));
  EXPECT_TRUE(s.ok()) << s.error_message();

  grpc::Status plain =
      ListModels(grpc::CreateChannel(absl::StrCat("127.0.0.1:", server->port()),
                                     grpc::InsecureChannelCredentials()));
  EXPECT_EQ(plain.error_code(), grpc::StatusCode::UNAVAILABLE);
  server->Shutdown(absl::ZeroDuration());
}

TEST_F(SecurityTest, MutualTlsNeedsAClientCertificate) {
  if (!have_certs_) GTEST_SKIP() << "no openssl command to make certificates";
  std::unique_ptr<PlannerServer> server = Start(ServerTls(/*mutual=*/true));
  ASSERT_NE(server, nullptr);
  grpc::Status with_cert = ListModels(TlsChannel(server->port(), true));
  EXPECT_TRUE(with_cert.ok()) << with_cert.error_message();
  grpc::Status without = ListModels(TlsChannel(server->port(), false));
  EXPECT_EQ(without.error_code(), grpc::StatusCode::UNAVAILABLE);
  server->Shutdown(absl::ZeroDuration());
}

TEST_F(SecurityTest, BearerTokenAcceptedRejectedAndHealthStaysOpen) {
  std::unique_ptr<PlannerServer> server = Start({}, "s3cret-token");
  ASSERT_NE(server, nullptr);
  auto channel = grpc::CreateChannel(absl::StrCat("127.0.0.1:", server->port()),
                                     grpc::InsecureChannelCredentials());
  EXPECT_TRUE(ListModels(channel, "Bearer s3cret-token").ok());

  grpc::Status missing = ListModels(channel);
  EXPECT_EQ(missing.error_code(), grpc::StatusCode::UNAUTHENTICATED);
  EXPECT_THAT(missing.error_message(), HasSubstr("authorization: missing"));

  for (const char* wrong :
       {"Bearer s3cret-tokeN", "Bearer s3cret", "s3cret-token", "Basic x"}) {
    grpc::Status s = ListModels(channel, wrong);
    EXPECT_EQ(s.error_code(), grpc::StatusCode::UNAUTHENTICATED) << wrong;
    EXPECT_THAT(s.error_message(), HasSubstr("wrong bearer token")) << wrong;
  }

  // The heavy RPCs are refused before admission.
  grpc::ClientContext plan_ctx;
  v1::PlanResponse plan;
  grpc::Status p = v1::Planner::NewStub(channel)->Plan(&plan_ctx, {}, &plan);
  EXPECT_EQ(p.error_code(), grpc::StatusCode::UNAUTHENTICATED);

  // Probes cannot send metadata: health needs no token.
  grpc::ClientContext ctx;
  grpc::health::v1::HealthCheckResponse health;
  ASSERT_TRUE(grpc::health::v1::Health::NewStub(channel)
                  ->Check(&ctx, {}, &health)
                  .ok());
  EXPECT_EQ(health.status(), grpc::health::v1::HealthCheckResponse::SERVING);
  server->Shutdown(absl::ZeroDuration());
}

TEST_F(SecurityTest, BadTlsConfigNamesTheField) {
  PlannerServerConfig config;
  config.listen = "127.0.0.1:0";
  config.tls.cert_file = *dir_ + "/absent.pem";
  config.tls.key_file = *dir_ + "/absent.key";
  auto server = PlannerServer::Start(handler_, config);
  EXPECT_EQ(server.status().code(), absl::StatusCode::kNotFound);
  EXPECT_THAT(server.status().message(),
              HasSubstr("tls.cert_file: cannot read"));

  config.tls = {};
  config.tls.key_file = *dir_ + "/server.key";
  server = PlannerServer::Start(handler_, config);
  EXPECT_EQ(server.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(server.status().message(), HasSubstr("tls.cert_file: required"));

  config.tls = {};
  config.tls.cert_file = *dir_ + "/server.pem";
  server = PlannerServer::Start(handler_, config);
  EXPECT_EQ(server.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(server.status().message(), HasSubstr("tls.key_file: required"));
}

}  // namespace
}  // namespace arachne
