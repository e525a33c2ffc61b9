// arachne-planner's settings: the config file (arachne.v1.ServerConfig as
// YAML or JSON), the flags that override it, and the errors that name the
// field and the value.
#include "planner_service/server/server_config.h"

#include <unistd.h>

#include <filesystem>
#include <fstream>
#include <sstream>
#include <string>
#include <utility>
#include <vector>

#include "CLI/CLI.hpp"
#include "absl/strings/str_cat.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "planner_service/io/json_yaml.h"
#include "planner_service/server/planner_server.h"

namespace arachne {
namespace {

using ::testing::HasSubstr;

class ServerConfigTest : public ::testing::Test {
 protected:
  void SetUp() override {
    // Per process: ctest runs each case as its own process, in parallel.
    dir_ = (std::filesystem::path(::testing::TempDir()) /
            absl::StrCat("arachne_server_config_", ::getpid()))
               .string();
    std::filesystem::create_directories(dir_);
  }
  void TearDown() override { std::filesystem::remove_all(dir_); }

  std::string Write(const std::string& name, const std::string& text) const {
    const std::string path = dir_ + "/" + name;
    std::ofstream(path) << text;
    return path;
  }

  // Parses `args` (after the program name) with ServerFlags and resolves.
  static absl::StatusOr<ServerSettings> FromArgs(
      std::vector<std::string> args) {
    CLI::App app;
    ServerFlags flags(app);
    args.insert(args.begin(), "arachne-planner");
    std::vector<const char*> argv;
    for (const std::string& a : args) argv.push_back(a.c_str());
    app.parse(static_cast<int>(argv.size()), argv.data());
    return flags.Settings();
  }

  std::string dir_;
};

TEST_F(ServerConfigTest, FullYamlConfigIsRead) {
  const std::string token = Write("token", "  s3cret\n");
  const std::string text = absl::StrCat(R"(# every field
listen: 0.0.0.0:50051
health_listen: 0.0.0.0:8081
profiles_dir: /etc/arachne/profiles
workers: 8
max_in_flight: 32
default_budget_s: 5
max_budget_s: 30.5
grace_s: 0
tls_cert: /tls/server.pem
tls_key: /tls/server.key
tls_client_ca: /tls/clients.pem
token_file: )",
                                        token, "\n");
  absl::StatusOr<v1::ServerConfig> config =
      ParseServerConfig(text, "planner.yaml");
  ASSERT_TRUE(config.ok()) << config.status();
  absl::StatusOr<ServerSettings> s = ResolveServerConfig(*config);
  ASSERT_TRUE(s.ok()) << s.status();
  EXPECT_EQ(s->server.listen, "0.0.0.0:50051");
  EXPECT_EQ(s->server.health_listen, "0.0.0.0:8081");
  EXPECT_EQ(s->handler.profiles_dir, "/etc/arachne/profiles");
  EXPECT_EQ(s->server.service.workers, 8);
  EXPECT_EQ(s->server.service.max_in_flight, 32);
  EXPECT_EQ(s->handler.default_budget, absl::Seconds(5));
  EXPECT_EQ(s->handler.max_budget, absl::Seconds(30.5));
  EXPECT_EQ(s->grace, absl::ZeroDuration());
  EXPECT_EQ(s->server.tls.cert_file, "/tls/server.pem");
  EXPECT_EQ(s->server.tls.key_file, "/tls/server.key");
  EXPECT_EQ(s->server.tls.client_ca_file, "/tls/clients.pem");
  EXPECT_EQ(s->server.service.bearer_token, "s3cret");  // whitespace stripped
}

TEST_F(ServerConfigTest, JsonConfigIsReadAndUnsetFieldsKeepDefaults) {
  absl::StatusOr<v1::ServerConfig> config =
      ParseServerConfig(R"({"workers": 2, "max_in_flight": 2})", "p.json");
  ASSERT_TRUE(config.ok()) << config.status();
  absl::StatusOr<ServerSettings> s = ResolveServerConfig(*config);
  ASSERT_TRUE(s.ok()) << s.status();
  EXPECT_EQ(s->server.service.workers, 2);
  EXPECT_EQ(s->server.service.max_in_flight, 2);
  EXPECT_EQ(s->server.listen, "127.0.0.1:50051");
  EXPECT_EQ(s->server.health_listen, "");
  EXPECT_EQ(s->handler.default_budget, absl::Seconds(10));
  EXPECT_EQ(s->handler.max_budget, absl::Seconds(60));
  EXPECT_EQ(s->grace, absl::Seconds(10));
  EXPECT_FALSE(s->server.tls.enabled());
  EXPECT_EQ(s->server.service.bearer_token, "");
}

TEST_F(ServerConfigTest, CommentsOnlyFileMeansAllDefaults) {
  absl::StatusOr<v1::ServerConfig> config =
      ParseServerConfig("# workers: 8\n\n# listen: 0.0.0.0:1\n", "p.yaml");
  ASSERT_TRUE(config.ok()) << config.status();
  EXPECT_EQ(config->ByteSizeLong(), 0u);
  absl::StatusOr<ServerSettings> s = ResolveServerConfig(*config);
  ASSERT_TRUE(s.ok()) << s.status();
  EXPECT_EQ(s->server.service.workers, 4);
  EXPECT_EQ(s->server.listen, "127.0.0.1:50051");
}

TEST_F(ServerConfigTest, FlagGivenOverridesTheFileAndFlagNotGivenDoesNot) {
  const std::string path = Write("planner.yaml", R"(listen: 0.0.0.0:7000
workers: 8
max_in_flight: 8
max_budget_s: 30
)");
  absl::StatusOr<ServerSettings> s = FromArgs(
      {"--config", path, "--workers", "2", "--listen", "127.0.0.1:7001"});
  ASSERT_TRUE(s.ok()) << s.status();
  EXPECT_EQ(s->server.service.workers, 2);             // flag
  EXPECT_EQ(s->server.listen, "127.0.0.1:7001");       // flag
  EXPECT_EQ(s->server.service.max_in_flight, 8);       // file
  EXPECT_EQ(s->handler.max_budget, absl::Seconds(30));  // file, not the
                                                        // flag's default 60
  EXPECT_EQ(s->handler.default_budget, absl::Seconds(10));  // neither

  // Without --config the flags alone, defaults for the rest.
  s = FromArgs({"--grace-s", "3", "--health-listen", "127.0.0.1:0"});
  ASSERT_TRUE(s.ok()) << s.status();
  EXPECT_EQ(s->grace, absl::Seconds(3));
  EXPECT_EQ(s->server.health_listen, "127.0.0.1:0");
  EXPECT_EQ(s->server.service.workers, 4);
}

TEST_F(ServerConfigTest, UnknownFieldIsNamed) {
  absl::StatusOr<v1::ServerConfig> config =
      ParseServerConfig("max_budget: 30\n", "planner.yaml");
  EXPECT_EQ(config.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(config.status().message(), HasSubstr("planner.yaml"));
  EXPECT_THAT(config.status().message(),
              HasSubstr("unknown field \"max_budget\""));
  // A list is not a mapping of settings.
  config = ParseServerConfig("[1, 2]\n", "planner.yaml");
  EXPECT_EQ(config.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(config.status().message(), HasSubstr("planner.yaml: "));
}

TEST_F(ServerConfigTest, BadValuesNameTheFieldAndTheValue) {
  struct Case {
    const char* text;
    const char* message;
  };
  for (const Case& c : {
           Case{"max_budget_s: -3\n",
                "planner.yaml: max_budget_s: must be > 0, got -3"},
           Case{"default_budget_s: 0\n",
                "planner.yaml: default_budget_s: must be > 0, got 0"},
           Case{"grace_s: -0.5\n",
                "planner.yaml: grace_s: must be >= 0, got -0.5"},
           Case{"workers: 0\n",
                "planner.yaml: workers: must be an integer >= 1, got 0"},
           Case{"max_in_flight: -1\n",
                "planner.yaml: max_in_flight: must be an integer >= 1, got -1"},
           Case{
               "listen: \"\"\n",
               "planner.yaml: listen: must be HOST:PORT (e.g. 127.0.0.1:50051; "
               "port 0 picks a free one) or unix:PATH, got \"\""},
           // gRPC itself would serve 99999 on another port, "host:" on 443.
           Case{"listen: 127.0.0.1:99999\n",
                "planner.yaml: listen: the port must be a number in 0..65535 "
                "(0 picks a free one), got \"127.0.0.1:99999\""},
           Case{"health_listen: \"127.0.0.1:\"\n",
                "planner.yaml: health_listen: missing port after ':' "
                "(0..65535; 0 picks a free one), got \"127.0.0.1:\""},
       }) {
    absl::StatusOr<v1::ServerConfig> config =
        ParseServerConfig(c.text, "planner.yaml");
    EXPECT_EQ(config.status().code(), absl::StatusCode::kInvalidArgument)
        << c.text;
    EXPECT_EQ(config.status().message(), c.message) << c.text;
  }
  // Types and ranges are the schema's (ParseMessageText): the field and the
  // value are named.
  for (const char* text : {"workers: many\n", "workers: 3000000000\n",
                           "max_budget_s: [1]\n", "tls_cert: {a: 1}\n"}) {
    absl::StatusOr<v1::ServerConfig> config =
        ParseServerConfig(text, "planner.yaml");
    EXPECT_EQ(config.status().code(), absl::StatusCode::kInvalidArgument)
        << text;
    const std::string field(text, std::string(text).find(':'));
    EXPECT_THAT(config.status().message(),
                HasSubstr(absl::StrCat("planner.yaml: ", field, ": ")))
        << text;
    EXPECT_THAT(config.status().message(), HasSubstr("got ")) << text;
  }
}

TEST_F(ServerConfigTest, BadFlagValuesNameTheFlag) {
  struct Case {
    std::vector<std::string> args;
    const char* message;
  };
  for (const Case& c : {
           Case{{"--workers", "-1"},
                "command line: --workers: must be an integer >= 1, got -1"},
           Case{{"--max-in-flight", "0"},
                "command line: --max-in-flight: must be an integer >= 1, "
                "got 0"},
           Case{{"--default-budget-s", "0"},
                "command line: --default-budget-s: must be > 0, got 0"},
           Case{{"--max-budget-s", "inf"},
                "command line: --max-budget-s: must be > 0, got inf"},
           Case{{"--grace-s", "nan"},
                "command line: --grace-s: must be >= 0, got nan"},
           Case{{"--grace-s", "-0.5"},
                "command line: --grace-s: must be >= 0, got -0.5"},
       }) {
    absl::StatusOr<ServerSettings> s = FromArgs(c.args);
    EXPECT_EQ(s.status().code(), absl::StatusCode::kInvalidArgument)
        << c.args[0];
    EXPECT_EQ(s.status().message(), c.message) << c.args[0];
  }
}

TEST_F(ServerConfigTest, ErrorsAcrossFileAndFlagsNameBothFields) {
  const std::string path =
      Write("planner.yaml", "workers: 8\nmax_in_flight: 16\n");
  absl::StatusOr<ServerSettings> s =
      FromArgs({"--config", path, "--max-in-flight", "4"});
  EXPECT_EQ(s.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(s.status().message(), "max_in_flight: must be >= workers (8), got 4");

  s = FromArgs({"--tls-key", "/tls/server.key"});
  EXPECT_EQ(s.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(s.status().message(), "tls_cert: required with tls_key, got none");

  s = FromArgs({"--tls-cert", "/tls/server.pem"});
  EXPECT_EQ(s.status().message(), "tls_key: required with tls_cert, got none");

  s = FromArgs(
      {"--listen", "0.0.0.0:50051", "--health-listen", "0.0.0.0:50051"});
  EXPECT_EQ(s.status().message(),
            "health_listen: must differ from listen, got \"0.0.0.0:50051\"");
}

TEST_F(ServerConfigTest, MissingFilesAreNamed) {
  absl::StatusOr<ServerSettings> s =
      FromArgs({"--config", dir_ + "/absent.yaml"});
  EXPECT_EQ(s.status().code(), absl::StatusCode::kNotFound);
  EXPECT_EQ(s.status().message(),
            absl::StrCat("config: cannot read \"", dir_, "/absent.yaml\""));

  const std::string path =
      Write("planner.yaml", absl::StrCat("token_file: ", dir_, "/no-token\n"));
  s = FromArgs({"--config", path});
  EXPECT_EQ(s.status().code(), absl::StatusCode::kNotFound);
  EXPECT_EQ(s.status().message(),
            absl::StrCat("token_file: cannot read \"", dir_, "/no-token\""));

  const std::string blank = Write("blank-token", " \n");
  s = FromArgs({"--token-file", blank});
  EXPECT_EQ(s.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(s.status().message(),
            absl::StrCat("token_file: no token in \"", blank,
                         "\" (empty or only whitespace)"));
}

// The configs shipped in deploy/ read and resolve (their TLS and token
// paths are only read when the server starts, so they need not exist here).
TEST_F(ServerConfigTest, ShippedConfigsAreValid) {
  const std::string deploy = std::string(ARACHNE_SOURCE_DIR) + "/deploy";
  absl::StatusOr<v1::ServerConfig> example =
      LoadServerConfigFile(deploy + "/arachne-planner.yaml");
  ASSERT_TRUE(example.ok()) << example.status();
  absl::StatusOr<ServerSettings> s = ResolveServerConfig(*example);
  ASSERT_TRUE(s.ok()) << s.status();
  EXPECT_EQ(s->server.listen, "127.0.0.1:50051");  // the systemd unit's

  // The Kubernetes ConfigMap carries its own copy (TLS, health port).
  std::ifstream in(deploy + "/kubernetes/server-config.yaml");
  std::stringstream text;
  text << in.rdbuf();
  absl::StatusOr<nlohmann::json> configmap =
      ParseJsonOrYaml(text.str(), "server-config.yaml");
  ASSERT_TRUE(configmap.ok()) << configmap.status();
  const nlohmann::json& data = (*configmap)["data"]["arachne-planner.yaml"];
  ASSERT_TRUE(data.is_string());
  absl::StatusOr<v1::ServerConfig> k8s =
      ParseServerConfig(data.get<std::string>(), "server-config.yaml");
  ASSERT_TRUE(k8s.ok()) << k8s.status();
  EXPECT_EQ(k8s->health_listen(), "0.0.0.0:8081");
  EXPECT_EQ(k8s->tls_cert(), "/etc/arachne/tls/tls.crt");
  EXPECT_TRUE(ResolveServerConfig(*k8s).ok());
}

TEST(ListenAddressTest, AcceptsWhatGrpcListensOnAndNothingItMisreads) {
  for (const char* ok :
       {"127.0.0.1:0", "0.0.0.0:50051", "localhost:65535", "[::]:50051",
        "[::1]:0", "unix:/tmp/arachne.sock", "unix:///tmp/arachne.sock",
        "unix:arachne.sock", "unix-abstract:arachne"}) {
    EXPECT_TRUE(CheckListenAddress(ok).ok()) << ok;
  }
  for (const auto& [address, message] :
       std::vector<std::pair<std::string, std::string>>{
           {"127.0.0.1:65536", "the port must be a number in 0..65535"},
           {"127.0.0.1:5a", "the port must be a number in 0..65535"},
           {"127.0.0.1:+5", "the port must be a number in 0..65535"},
           {"::1:50051", "an IPv6 host is written in brackets"},
           {"unix:", "unix: needs a socket path"},
           {"unix-abstract:", "unix-abstract: needs a socket name"},
           {std::string(300, 'a'), "got 300 characters"}}) {
    absl::Status s = CheckListenAddress(address);
    EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument) << address;
    EXPECT_THAT(s.message(), HasSubstr(message)) << address;
  }
}

}  // namespace
}  // namespace arachne
