// `arachne plan|evaluate --server`: the CLI run in process against a real
// arachne-planner on 127.0.0.1:0 prints what the in-process run prints
// (JSON equal but for planning_time_s; the table equal but for its timing
// line), through a bearer token and, where openssl exists, TLS.
#include <cstdlib>
#include <unistd.h>

#include <filesystem>
#include <fstream>
#include <memory>
#include <regex>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/time/time.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "nlohmann/json.hpp"
#include "planner_service/api/planner_handler_impl.h"
#include "test/server/loopback_server.h"
#include "planner_service/server/planner_server.h"
#include "test/cli/cli_runner.h"

namespace arachne {
namespace {

using ::arachne::testing::Cli;
using ::arachne::testing::CliRun;
using ::testing::HasSubstr;

constexpr char kToken[] = "remote-cli-token";

std::string Example(const std::string& name) {
  return std::string(ARACHNE_SOURCE_DIR) + "/examples/" + name;
}

std::vector<std::string> PlanArgs(const std::string& cluster) {
  return {"plan",  "--model",        "llama3-8b", "--cluster",
          cluster, "--planner",      "exact",     "--max-evaluations",
          "60",    "--global-batch", "512"};
}

std::vector<std::string> With(std::vector<std::string> args,
                              const std::vector<std::string>& more) {
  args.insert(args.end(), more.begin(), more.end());
  return args;
}

nlohmann::json JsonWithoutTiming(const std::string& out) {
  nlohmann::json j = nlohmann::json::parse(out);
  j.erase("planning_time_s");
  return j;
}

class RemoteCliTest : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    server_ = new testing::LoopbackServer(
        {.workers = 2, .max_in_flight = 4, .bearer_token = kToken});
  }
  static void TearDownTestSuite() {
    delete server_;
  }

  static std::vector<std::string> Remote() {
    return {"--server", server_->address(), "--token",
            kToken};
  }

  static testing::LoopbackServer* server_;
};
testing::LoopbackServer* RemoteCliTest::server_ = nullptr;

TEST_F(RemoteCliTest, PlanJsonEqualsInProcess) {
  for (const char* cluster : {"small-8.yaml", "a100-h100-64.yaml"}) {
    const auto args = With(PlanArgs(Example(cluster)), {"--format", "json"});
    CliRun local = Cli(args);
    ASSERT_EQ(local.code, 0) << local.err;
    CliRun remote = Cli(With(args, Remote()));
    ASSERT_EQ(remote.code, 0) << remote.err;
    EXPECT_EQ(JsonWithoutTiming(remote.out), JsonWithoutTiming(local.out))
        << cluster;
  }
}

TEST_F(RemoteCliTest, UsdPerTokenObjectiveTravelsToTheServer) {
  // small-8: 4 A100 + 4 A6000. The cheapest plan per token leaves the
  // A6000s idle (objective_cli_test), in process and over the service.
  const auto args = With(PlanArgs(Example("small-8.yaml")),
                         {"--format", "json", "--objective", "usd_per_token"});
  CliRun local = Cli(args);
  ASSERT_EQ(local.code, 0) << local.err;
  CliRun remote = Cli(With(args, Remote()));
  ASSERT_EQ(remote.code, 0) << remote.err;
  const nlohmann::json j = JsonWithoutTiming(remote.out);
  EXPECT_EQ(j, JsonWithoutTiming(local.out));
  EXPECT_EQ(j["unused_gpus"], 4);
}

TEST_F(RemoteCliTest, FrameworkTravelsToTheServer) {
  // The server prices with the request's framework: its answer equals the
  // in-process one, and both differ from the default framework's.
  const auto args = With(PlanArgs(Example("small-8.yaml")), {"--format", "json"});
  const auto deepspeed =
      With(args, {"--framework", "deepspeed-zero1", "--framework-set",
                  "micro_batch_fixed_ms=5"});
  CliRun local = Cli(deepspeed);
  ASSERT_EQ(local.code, 0) << local.err;
  CliRun remote = Cli(With(deepspeed, Remote()));
  ASSERT_EQ(remote.code, 0) << remote.err;
  CliRun core = Cli(args);
  ASSERT_EQ(core.code, 0) << core.err;
  const nlohmann::json j = JsonWithoutTiming(remote.out);
  EXPECT_EQ(j, JsonWithoutTiming(local.out));
  EXPECT_EQ(j["training"]["framework"]["preset"], "deepspeed-zero1");
  EXPECT_NE(j["iteration_time_s"],
            JsonWithoutTiming(core.out)["iteration_time_s"]);
}

TEST_F(RemoteCliTest, CalibrationTravelsToTheServer) {
  // A calibration file's scales go as the request's calibration, its
  // framework fields as framework overrides: the server's answer equals
  // the in-process one, and both differ from the uncalibrated one.
  const std::string cal = ::testing::TempDir() + "/remote_cal.json";
  std::ofstream(cal) << R"({"format": "arachne-run-calibration-1",
                           "compute_scale": {"A6000": 1.7, "A100-40GB": 1.2},
                           "tp_comm_scale": {"A6000": 2},
                           "framework": {"micro_batch_fixed_ms": 2}})";
  const auto args = With(PlanArgs(Example("small-8.yaml")), {"--format", "json"});
  const auto calibrated = With(args, {"--calibration", cal});
  CliRun local = Cli(calibrated);
  ASSERT_EQ(local.code, 0) << local.err;
  CliRun remote = Cli(With(calibrated, Remote()));
  ASSERT_EQ(remote.code, 0) << remote.err;
  CliRun raw = Cli(args);
  ASSERT_EQ(raw.code, 0) << raw.err;
  const nlohmann::json j = JsonWithoutTiming(remote.out);
  EXPECT_EQ(j, JsonWithoutTiming(local.out));
  EXPECT_GT(j["iteration_time_s"].get<double>(),
            1.1 * JsonWithoutTiming(raw.out)["iteration_time_s"].get<double>());
}

TEST_F(RemoteCliTest, PlanTableEqualsInProcess) {
  const auto args = PlanArgs(Example("small-8.yaml"));
  CliRun local = Cli(args);
  ASSERT_EQ(local.code, 0) << local.err;
  CliRun remote = Cli(With(args, Remote()));
  ASSERT_EQ(remote.code, 0) << remote.err;
  const std::regex timing("planner exact: [0-9.]+ s");
  EXPECT_EQ(std::regex_replace(remote.out, timing, "T"),
            std::regex_replace(local.out, timing, "T"));
  EXPECT_THAT(remote.out, HasSubstr(" plan evaluations"));
}

TEST_F(RemoteCliTest, EvaluateJsonEqualsInProcess) {
  CliRun planned =
      Cli(With(PlanArgs(Example("small-8.yaml")), {"--format", "json"}));
  ASSERT_EQ(planned.code, 0) << planned.err;
  const std::string plan_file =
      (std::filesystem::path(::testing::TempDir()) /
       ("remote_cli_plan_" + std::to_string(::getpid()) + ".json"))
          .string();
  std::ofstream(plan_file) << planned.out;
  const std::vector<std::string> args = {
      "evaluate", "--model", "llama3-8b", "--cluster", Example("small-8.yaml"),
      "--plan",   plan_file, "--format",  "json",      "--global-batch",
      "512"};
  CliRun local = Cli(args);
  ASSERT_EQ(local.code, 0) << local.err;
  CliRun remote = Cli(With(args, Remote()));
  ASSERT_EQ(remote.code, 0) << remote.err;
  EXPECT_EQ(JsonWithoutTiming(remote.out), JsonWithoutTiming(local.out));
  std::filesystem::remove(plan_file);
}

TEST_F(RemoteCliTest, MissingOrWrongTokenIsRefused) {
  const auto args = PlanArgs(Example("small-8.yaml"));
  CliRun none = Cli(
      With(args, {"--server", server_->address()}));
  EXPECT_EQ(none.code, kExitInternal);
  EXPECT_THAT(none.err, HasSubstr("authorization: missing"));
  CliRun wrong =
      Cli(With(args, {"--server", server_->address(),
                      "--token", "nope"}));
  EXPECT_EQ(wrong.code, kExitInternal);
  EXPECT_THAT(wrong.err, HasSubstr("wrong bearer token"));
}

TEST_F(RemoteCliTest, ServerErrorsKeepTheirCodeAndField) {
  // The options are checked here by the service's own rules (an
  // out-of-range depth never leaves the CLI), and a plan is searched only
  // there: a model that fits nowhere is the server's to say.
  const std::string one_a5000 =
      (std::filesystem::path(::testing::TempDir()) /
       ("remote_cli_a5000_" + std::to_string(::getpid()) + ".yaml"))
          .string();
  std::ofstream(one_a5000) << "nodes:\n  - {name: box, gpu: A5000, gpus: 1}\n";
  CliRun r = Cli(With({"plan", "--model", "gpt3-175b", "--cluster", one_a5000,
                       "--planner", "exact"},
                      Remote()));
  EXPECT_EQ(r.code, kExitBadInput);
  EXPECT_THAT(r.err,
              HasSubstr(absl::StrCat("server 127.0.0.1:", server_->port(),
                                     ": exact: no plan fits gpt3-175b")));
  std::filesystem::remove(one_a5000);
}

TEST_F(RemoteCliTest, UnreachableServerNamesTheAddress) {
  // Port 1 on loopback: nothing listens there.
  CliRun r =
      Cli(With(PlanArgs(Example("small-8.yaml")), {"--server", "127.0.0.1:1"}));
  EXPECT_EQ(r.code, kExitInternal);
  EXPECT_THAT(r.err, HasSubstr("server 127.0.0.1:1: "));
}

TEST_F(RemoteCliTest, MissingCaFileNamesTheFlag) {
  CliRun r = Cli(With(PlanArgs(Example("small-8.yaml")),
                      {"--server", "127.0.0.1:1", "--tls-ca", "/absent.pem"}));
  EXPECT_EQ(r.code, kExitBadInput);
  EXPECT_THAT(r.err,
              HasSubstr("--server: tls_ca_file: cannot read \"/absent.pem\""));
}

TEST(RemoteCliTlsTest, PlanOverTls) {
  if (std::system("openssl version > /dev/null 2>&1") != 0) {
    GTEST_SKIP() << "no openssl command to make a certificate";
  }
  const std::string dir =
      (std::filesystem::path(::testing::TempDir()) /
       ("remote_cli_tls_" + std::to_string(::getpid())))
          .string();
  std::filesystem::create_directories(dir);
  const std::string cmd = absl::StrCat(
      "openssl req -x509 -newkey rsa:2048 -nodes -days 1 -subj /CN=localhost",
      " -addext subjectAltName=DNS:localhost,IP:127.0.0.1 -keyout ", dir,
      "/s.key -out ", dir, "/s.pem > /dev/null 2>&1");
  ASSERT_EQ(std::system(cmd.c_str()), 0);
  auto impl = PlannerHandlerImpl::Create({});
  ASSERT_TRUE(impl.ok()) << impl.status();
  PlannerServerConfig config;
  config.listen = "127.0.0.1:0";
  config.tls.cert_file = dir + "/s.pem";
  config.tls.key_file = dir + "/s.key";
  config.service.workers = 1;
  config.service.max_in_flight = 1;
  auto server = PlannerServer::Start(impl->get(), config);
  ASSERT_TRUE(server.ok()) << server.status();
  const auto args =
      With(PlanArgs(Example("small-8.yaml")), {"--format", "json"});
  CliRun local = Cli(args);
  CliRun remote =
      Cli(With(args, {"--server", absl::StrCat("localhost:", (*server)->port()),
                      "--tls-ca", dir + "/s.pem"}));
  ASSERT_EQ(remote.code, 0) << remote.err;
  EXPECT_EQ(JsonWithoutTiming(remote.out), JsonWithoutTiming(local.out));
  (*server)->Shutdown(absl::ZeroDuration());
  std::filesystem::remove_all(dir);
}

}  // namespace
}  // namespace arachne
