// arachne-agent's settings: flags, the config file (arachne.v1.AgentConfig
// as YAML or JSON) they override, and errors that name the setting where it
// was written (flag or file field) and its value.
#include "worker_agent/agent_config.h"

#include <unistd.h>

#include <cerrno>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <string>
#include <vector>

#include "CLI/CLI.hpp"
#include "absl/strings/str_cat.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "worker_agent/checkpoint_io.h"

namespace arachne::agent {
namespace {

using ::testing::HasSubstr;

class AgentConfigTest : public ::testing::Test {
 protected:
  void SetUp() override {
    // Per process: ctest runs each case as its own process, in parallel.
    dir_ = (std::filesystem::path(::testing::TempDir()) /
            absl::StrCat("arachne_agent_config_", ::getpid()))
               .string();
    std::filesystem::create_directories(dir_);
  }
  void TearDown() override { std::filesystem::remove_all(dir_); }

  std::string Write(const std::string& name, const std::string& text) const {
    const std::string path = dir_ + "/" + name;
    std::ofstream(path) << text;
    return path;
  }

  // Parses `args` (after the program name) with AgentFlags and resolves on a
  // machine with `cuda_devices` CUDA GPUs.
  static absl::StatusOr<AgentSettings> FromArgs(std::vector<std::string> args,
                                                int cuda_devices = 0) {
    CLI::App app;
    AgentFlags flags(app);
    args.insert(args.begin(), "arachne-agent");
    std::vector<const char*> argv;
    for (const std::string& a : args) argv.push_back(a.c_str());
    app.parse(static_cast<int>(argv.size()), argv.data());
    return flags.Settings(cuda_devices);
  }

  static std::string ReadFile(const std::string& path) {
    std::ifstream in(path);
    std::stringstream buffer;
    buffer << in.rdbuf();
    return buffer.str();
  }

  std::string dir_;
};

TEST_F(AgentConfigTest, FlagsAloneGiveVirtualGpus) {
  absl::StatusOr<AgentSettings> s =
      FromArgs({"--node", "n0", "--gpu-type", "A6000", "--virtual-gpus", "2"});
  ASSERT_TRUE(s.ok()) << s.status();
  EXPECT_EQ(s->node, "n0");
  ASSERT_GE(s->gpu_type, 0);
  EXPECT_EQ(s->gpu_type, *s->catalog.IndexOf("A6000"));
  EXPECT_EQ(s->gpu_count, 2);
  EXPECT_TRUE(s->virtual_gpus);
  EXPECT_EQ(s->listen, "127.0.0.1:0");
  EXPECT_EQ(s->host, "127.0.0.1");
  EXPECT_EQ(s->grace, absl::Seconds(10));
  EXPECT_FALSE(s->tls.enabled());
  EXPECT_TRUE(s->bearer_token.empty());
  EXPECT_TRUE(s->port_file.empty());
  EXPECT_FALSE(s->models.empty());  // the built-in model catalog
}

TEST_F(AgentConfigTest, GpuTypeAliasResolvesToTheCatalogType) {
  absl::StatusOr<AgentSettings> s =
      FromArgs({"--node", "n0", "--gpu-type", "a6000", "--virtual-gpus", "1"});
  ASSERT_TRUE(s.ok()) << s.status();
  EXPECT_EQ(s->gpu_type, *s->catalog.IndexOf("A6000"));
}

TEST_F(AgentConfigTest, CudaGpusAreUsedWithoutVirtualGpus) {
  absl::StatusOr<AgentSettings> s =
      FromArgs({"--node", "n0", "--gpu-type", "A6000"}, /*cuda_devices=*/4);
  ASSERT_TRUE(s.ok()) << s.status();
  EXPECT_EQ(s->gpu_count, 4);
  EXPECT_FALSE(s->virtual_gpus);
}

TEST_F(AgentConfigTest, VirtualGpusWinOverCuda) {
  absl::StatusOr<AgentSettings> s = FromArgs(
      {"--node", "n0", "--gpu-type", "A6000", "--virtual-gpus", "3"}, 8);
  ASSERT_TRUE(s.ok()) << s.status();
  EXPECT_EQ(s->gpu_count, 3);
  EXPECT_TRUE(s->virtual_gpus);
}

TEST_F(AgentConfigTest, VirtualGpusRequiredWithoutCuda) {
  absl::StatusOr<AgentSettings> s =
      FromArgs({"--node", "n0", "--gpu-type", "A6000"}, /*cuda_devices=*/0);
  EXPECT_EQ(s.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(s.status().message(),
              HasSubstr("--virtual-gpus: required on a machine without CUDA "
                        "GPUs (none visible), got none"));
}

TEST_F(AgentConfigTest, NodeIsRequired) {
  absl::StatusOr<AgentSettings> s =
      FromArgs({"--gpu-type", "A6000", "--virtual-gpus", "2"});
  EXPECT_EQ(s.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(s.status().message(),
            "--node: required (or node in the config file), got none");
}

TEST_F(AgentConfigTest, EmptyNodeIsNamed) {
  absl::StatusOr<AgentSettings> s =
      FromArgs({"--node", "", "--gpu-type", "A6000", "--virtual-gpus", "2"});
  EXPECT_EQ(s.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(s.status().message(), "--node: must be a node name, got \"\"");
}

TEST_F(AgentConfigTest, EmptyHostIsNamed) {
  absl::StatusOr<AgentSettings> s =
      FromArgs({"--node", "n0", "--host", "", "--gpu-type", "A6000",
                "--virtual-gpus", "2"});
  EXPECT_EQ(s.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(s.status().message(),
            "--host: must be a host name or address, got \"\"");
}

TEST_F(AgentConfigTest, UnknownFailpointIsNamed) {
  absl::StatusOr<AgentSettings> s =
      FromArgs({"--node", "n0", "--failpoint", "corrupt-everything",
                "--gpu-type", "A6000", "--virtual-gpus", "2"});
  EXPECT_EQ(s.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(s.status().message(),
            "--failpoint: must be corrupt-migration-stage-1, "
            "corrupt-migration-stage-2 or hang-status-while:<absolute path>, "
            "got \"corrupt-everything\"");
  s = FromArgs({"--node", "n0", "--failpoint", "hang-status-while:relative",
                "--gpu-type", "A6000", "--virtual-gpus", "2"});
  EXPECT_EQ(s.status().code(), absl::StatusCode::kInvalidArgument);
  s = FromArgs({"--node", "n0", "--failpoint", "hang-status-while:/tmp/x",
                "--gpu-type", "A6000", "--virtual-gpus", "2"});
  ASSERT_TRUE(s.ok()) << s.status();
  s = FromArgs({"--node", "n0", "--failpoint", "corrupt-migration-stage-2",
                "--gpu-type", "A6000", "--virtual-gpus", "2"});
  ASSERT_TRUE(s.ok()) << s.status();
  EXPECT_EQ(s->failpoint, "corrupt-migration-stage-2");
}

TEST_F(AgentConfigTest, GpuTypeIsRequired) {
  absl::StatusOr<AgentSettings> s =
      FromArgs({"--node", "n0", "--virtual-gpus", "2"});
  EXPECT_EQ(s.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(s.status().message(),
            "--gpu-type: required (or gpu_type in the config file), got none");
}

TEST_F(AgentConfigTest, UnknownGpuTypeNamesTheFlagAndValue) {
  absl::StatusOr<AgentSettings> s =
      FromArgs({"--node", "n0", "--gpu-type", "B300", "--virtual-gpus", "2"});
  EXPECT_EQ(s.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(s.status().message(),
              HasSubstr("--gpu-type: unknown GPU type \"B300\"; known: "));
  EXPECT_THAT(s.status().message(), HasSubstr("A6000"));
}

TEST_F(AgentConfigTest, UnknownGpuTypeInTheFileNamesTheFileField) {
  const std::string path =
      Write("agent.yaml", "node: n0\ngpu_type: B300\nvirtual_gpus: 2\n");
  absl::StatusOr<AgentSettings> s = FromArgs({"--config", path});
  EXPECT_EQ(s.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(s.status().message(),
              HasSubstr(absl::StrCat(path,
                                     ": gpu_type: unknown GPU type "
                                     "\"B300\"")));
}

TEST_F(AgentConfigTest, VirtualGpusOutOfRange) {
  for (const char* bad : {"0", "-1", "65"}) {
    absl::StatusOr<AgentSettings> s = FromArgs(
        {"--node", "n0", "--gpu-type", "A6000", "--virtual-gpus", bad});
    EXPECT_EQ(s.status().code(), absl::StatusCode::kInvalidArgument) << bad;
    EXPECT_EQ(
        s.status().message(),
        absl::StrCat("--virtual-gpus: must be an integer in 1..64, got ", bad));
  }
}

TEST_F(AgentConfigTest, VirtualGpuSpeedIsAFractionOfAVirtualGpusRank) {
  absl::StatusOr<AgentSettings> s =
      FromArgs({"--node", "n0", "--gpu-type", "A6000", "--virtual-gpus", "1",
                "--virtual-gpu-speed", "0.35"});
  ASSERT_TRUE(s.ok()) << s.status();
  EXPECT_EQ(s->virtual_gpu_speed, 0.35);
  EXPECT_EQ(FromArgs({"--node", "n0", "--gpu-type", "A6000", "--virtual-gpus",
                      "1"})
                ->virtual_gpu_speed,
            1.0);
  for (const char* bad : {"0", "1.01", "2"}) {
    absl::StatusOr<AgentSettings> b =
        FromArgs({"--node", "n0", "--gpu-type", "A6000", "--virtual-gpus", "1",
                  "--virtual-gpu-speed", bad});
    EXPECT_EQ(b.status().code(), absl::StatusCode::kInvalidArgument) << bad;
    EXPECT_THAT(b.status().message(),
                HasSubstr("--virtual-gpu-speed: must be a fraction of a CPU "
                          "rank's speed in (0, 1], got "))
        << bad;
  }
  absl::StatusOr<AgentSettings> cuda = FromArgs(
      {"--node", "n0", "--gpu-type", "A6000", "--virtual-gpu-speed", "0.5"},
      /*cuda_devices=*/2);
  EXPECT_EQ(cuda.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(cuda.status().message(),
            "--virtual-gpu-speed: only with virtual_gpus (CPU ranks); this "
            "agent runs on 2 CUDA GPUs, got 0.5");
}

TEST_F(AgentConfigTest, MigrationStagingMibIsTheStagingOfEachGpusMigration) {
  // Default: the executor's (issue 34).
  absl::StatusOr<AgentSettings> d =
      FromArgs({"--node", "n0", "--gpu-type", "A6000", "--virtual-gpus", "1"});
  ASSERT_TRUE(d.ok()) << d.status();
  EXPECT_EQ(d->migration_staging_mib, 256);
  EXPECT_EQ(int64_t{d->migration_staging_mib} << 20,
            migration::ExecutorOptions::kDefaultStagingBytes);

  absl::StatusOr<AgentSettings> s =
      FromArgs({"--node", "n0", "--gpu-type", "A6000", "--virtual-gpus", "1",
                "--migration-staging-mib", "64"});
  ASSERT_TRUE(s.ok()) << s.status();
  EXPECT_EQ(s->migration_staging_mib, 64);
  // Both ends of the range, on CUDA GPUs too.
  EXPECT_EQ(FromArgs({"--node", "n0", "--gpu-type", "A6000",
                      "--migration-staging-mib", "1"},
                     /*cuda_devices=*/2)
                ->migration_staging_mib,
            1);
  EXPECT_EQ(FromArgs({"--node", "n0", "--gpu-type", "A6000", "--virtual-gpus",
                      "1", "--migration-staging-mib", "65536"})
                ->migration_staging_mib,
            65536);

  // The config file's key, and a flag over it.
  const std::string path = Write(
      "agent.yaml",
      "node: n0\ngpu_type: A6000\nvirtual_gpus: 1\nmigration_staging_mib: 32\n");
  EXPECT_EQ(FromArgs({"--config", path})->migration_staging_mib, 32);
  EXPECT_EQ(FromArgs({"--config", path, "--migration-staging-mib", "512"})
                ->migration_staging_mib,
            512);

  for (const char* bad : {"0", "-1", "65537"}) {
    absl::StatusOr<AgentSettings> b =
        FromArgs({"--node", "n0", "--gpu-type", "A6000", "--virtual-gpus", "1",
                  "--migration-staging-mib", bad});
    EXPECT_EQ(b.status().code(), absl::StatusCode::kInvalidArgument) << bad;
    EXPECT_EQ(b.status().message(),
              absl::StrCat("--migration-staging-mib: must be an integer in "
                           "1..65536, got ",
                           bad));
  }
  const std::string zero = Write(
      "zero.yaml",
      "node: n0\ngpu_type: A6000\nvirtual_gpus: 1\nmigration_staging_mib: 0\n");
  absl::StatusOr<v1::AgentConfig> c = LoadAgentConfigFile(zero);
  EXPECT_EQ(c.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(c.status().message(),
            absl::StrCat(zero,
                         ": migration_staging_mib: must be an integer in "
                         "1..65536, got 0"));
  absl::StatusOr<AgentSettings> f = FromArgs({"--config", zero});
  EXPECT_EQ(f.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(f.status().message(),
            absl::StrCat(zero,
                         ": migration_staging_mib: must be an integer in "
                         "1..65536, got 0"));
}

TEST_F(AgentConfigTest, NonNumericFlagIsAParseError) {
  EXPECT_THROW(FromArgs({"--node", "n0", "--gpu-type", "A6000",
                         "--virtual-gpus", "two"}),
               CLI::ParseError);
}

TEST_F(AgentConfigTest, ListenNeedsAPort) {
  absl::StatusOr<AgentSettings> s =
      FromArgs({"--node", "n0", "--gpu-type", "A6000", "--virtual-gpus", "1",
                "--listen", "localhost"});
  EXPECT_EQ(s.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(s.status().message(),
            "--listen: must be host:port, got \"localhost\"");
}

TEST_F(AgentConfigTest, NegativeOrNanGraceIsNamed) {
  for (const char* bad : {"-1", "nan"}) {
    absl::StatusOr<AgentSettings> s =
        FromArgs({"--node", "n0", "--gpu-type", "A6000", "--virtual-gpus", "1",
                  "--grace-s", bad});
    EXPECT_EQ(s.status().code(), absl::StatusCode::kInvalidArgument) << bad;
    EXPECT_THAT(s.status().message(),
                HasSubstr("--grace-s: must be >= 0, got "))
        << bad;
  }
}

TEST_F(AgentConfigTest, FileIsReadAndFlagsOverrideIt) {
  const std::string token = Write("token", "  s3cret\n");
  const std::string path = Write("agent.yaml", absl::StrCat(R"(# every field
listen: 0.0.0.0:7000
node: gpu-box-3
host: 10.0.0.3
gpu_type: A6000
virtual_gpus: 4
port_file: )",
                                                            dir_, R"(/port
grace_s: 2.5
token_file: )",
                                                            token, "\n"));
  absl::StatusOr<AgentSettings> s = FromArgs(
      {"--config", path, "--listen", "127.0.0.1:0", "--virtual-gpus", "2"});
  ASSERT_TRUE(s.ok()) << s.status();
  EXPECT_EQ(s->listen, "127.0.0.1:0");  // the flag
  EXPECT_EQ(s->gpu_count, 2);           // the flag
  EXPECT_EQ(s->node, "gpu-box-3");      // the file
  EXPECT_EQ(s->host, "10.0.0.3");
  EXPECT_EQ(s->port_file, dir_ + "/port");
  EXPECT_EQ(s->grace, absl::Milliseconds(2500));
  EXPECT_EQ(s->bearer_token, "s3cret");
}

TEST_F(AgentConfigTest, JsonFileIsReadToo) {
  const std::string path =
      Write("agent.json",
            R"({"node": "n1", "gpu_type": "A6000", "virtual_gpus": 1})");
  absl::StatusOr<AgentSettings> s = FromArgs({"--config", path});
  ASSERT_TRUE(s.ok()) << s.status();
  EXPECT_EQ(s->node, "n1");
}

TEST_F(AgentConfigTest, CommentOnlyFileMeansDefaults) {
  const std::string path = Write("agent.yaml", "# node: n0\n");
  absl::StatusOr<AgentSettings> s =
      FromArgs({"--config", path, "--node", "n0", "--gpu-type", "A6000",
                "--virtual-gpus", "1"});
  ASSERT_TRUE(s.ok()) << s.status();
  EXPECT_EQ(s->listen, "127.0.0.1:0");
}

TEST_F(AgentConfigTest, UnknownFileFieldIsNamed) {
  const std::string path = Write("agent.yaml", "node: n0\ngpu_typ: A6000\n");
  absl::StatusOr<AgentSettings> s = FromArgs({"--config", path});
  EXPECT_EQ(s.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(s.status().message(), HasSubstr(path));
  EXPECT_THAT(s.status().message(), HasSubstr("gpu_typ"));
}

TEST_F(AgentConfigTest, BadFileValueNamesTheFileField) {
  const std::string path =
      Write("agent.yaml", "node: n0\ngpu_type: A6000\nvirtual_gpus: 0\n");
  absl::StatusOr<v1::AgentConfig> c = LoadAgentConfigFile(path);
  EXPECT_EQ(c.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(
      c.status().message(),
      absl::StrCat(path, ": virtual_gpus: must be an integer in 1..64, got 0"));
}

TEST_F(AgentConfigTest, FlagFixesABadFileValue) {
  // The merged value is what counts: a flag given replaces the file's.
  const std::string path =
      Write("agent.yaml", "node: n0\ngpu_type: B300\nvirtual_gpus: 1\n");
  v1::AgentConfig file;
  file.set_node("n0");
  file.set_gpu_type("B300");
  file.set_virtual_gpus(1);
  v1::AgentConfig flags;
  flags.set_gpu_type("A6000");
  absl::StatusOr<AgentSettings> s = ResolveAgentConfig(file, path, flags, 0);
  ASSERT_TRUE(s.ok()) << s.status();
  EXPECT_EQ(s->gpu_type, *s->catalog.IndexOf("A6000"));
}

TEST_F(AgentConfigTest, MissingConfigFileIsNotFound) {
  absl::StatusOr<AgentSettings> s =
      FromArgs({"--config", dir_ + "/absent.yaml"});
  EXPECT_EQ(s.status().code(), absl::StatusCode::kNotFound);
  EXPECT_EQ(s.status().message(),
            absl::StrCat("config: cannot read \"", dir_, "/absent.yaml\""));
}

TEST_F(AgentConfigTest, TlsFilesComeInPairs) {
  const std::vector<std::string> base = {
      "--node", "n0", "--gpu-type", "A6000", "--virtual-gpus", "1"};
  std::vector<std::string> key_only = base;
  key_only.insert(key_only.end(), {"--tls-key", "/k.pem"});
  absl::StatusOr<AgentSettings> s = FromArgs(key_only);
  EXPECT_EQ(s.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(s.status().message(),
            "--tls-cert: required with --tls-key, got none");

  std::vector<std::string> ca_only = base;
  ca_only.insert(ca_only.end(), {"--tls-client-ca", "/ca.pem"});
  s = FromArgs(ca_only);
  EXPECT_EQ(s.status().message(),
            "--tls-cert: required with --tls-client-ca, got none");

  std::vector<std::string> cert_only = base;
  cert_only.insert(cert_only.end(), {"--tls-cert", "/c.pem"});
  s = FromArgs(cert_only);
  EXPECT_EQ(s.status().message(),
            "--tls-key: required with --tls-cert, got none");

  std::vector<std::string> mutual = base;
  mutual.insert(mutual.end(), {"--tls-cert", "/c.pem", "--tls-key", "/k.pem",
                               "--tls-client-ca", "/ca.pem"});
  s = FromArgs(mutual);
  ASSERT_TRUE(s.ok()) << s.status();
  EXPECT_TRUE(s->tls.enabled());
  EXPECT_EQ(s->tls.client_ca_file, "/ca.pem");
}

TEST_F(AgentConfigTest, ControllerSettingsAreRead) {
  const std::string token = Write("controller-token", " s3cret\n");
  absl::StatusOr<AgentSettings> s = FromArgs(
      {"--node", "n0", "--gpu-type", "A6000", "--virtual-gpus", "1",
       "--controller", "ctl:7000", "--controller-token-file", token,
       "--controller-tls-ca", "/ca.pem", "--controller-tls-cert", "/c.pem",
       "--controller-tls-key", "/k.pem"});
  ASSERT_TRUE(s.ok()) << s.status();
  EXPECT_EQ(s->controller, "ctl:7000");
  EXPECT_EQ(s->controller_token, "s3cret");
  EXPECT_EQ(s->controller_tls.ca_file, "/ca.pem");
  EXPECT_EQ(s->controller_tls.cert_file, "/c.pem");
  EXPECT_EQ(s->controller_tls.key_file, "/k.pem");

  // Without --controller nothing registers: no controller settings.
  s = FromArgs({"--node", "n0", "--gpu-type", "A6000", "--virtual-gpus", "1"});
  ASSERT_TRUE(s.ok()) << s.status();
  EXPECT_TRUE(s->controller.empty());
}

TEST_F(AgentConfigTest, BadControllerSettingsAreNamed) {
  const std::vector<std::string> base = {
      "--node", "n0", "--gpu-type", "A6000", "--virtual-gpus", "1"};
  auto with = [&](std::vector<std::string> extra) {
    std::vector<std::string> args = base;
    args.insert(args.end(), extra.begin(), extra.end());
    return FromArgs(args);
  };
  absl::StatusOr<AgentSettings> s = with({"--controller", "ctl"});
  EXPECT_EQ(s.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(s.status().message(),
            "--controller: must be host:port, got \"ctl\"");
  s = with({"--controller-tls-ca", "/ca.pem"});
  EXPECT_EQ(s.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(s.status().message(),
            "--controller-tls-ca: given without --controller; nothing would "
            "use it");
  s = with({"--controller", "ctl:1", "--controller-tls-ca", "/ca.pem",
            "--controller-tls-cert", "/c.pem"});
  EXPECT_EQ(s.status().message(),
            "--controller-tls-key: required with --controller-tls-cert, got "
            "none");
  s = with({"--controller", "ctl:1", "--controller-tls-cert", "/c.pem",
            "--controller-tls-key", "/k.pem"});
  EXPECT_EQ(s.status().message(),
            "--controller-tls-ca: required with --controller-tls-cert (mutual "
            "TLS needs TLS), got none");
  s = with({"--controller", "ctl:1", "--controller-token-file",
            dir_ + "/absent"});
  EXPECT_EQ(s.status().code(), absl::StatusCode::kNotFound);
  EXPECT_EQ(s.status().message(),
            absl::StrCat("--controller-token-file: cannot read \"", dir_,
                         "/absent\""));
  // In the file, the file's field is named.
  const std::string file = Write("agent.yaml", "controller: nope\n");
  s = with({"--config", file});
  EXPECT_EQ(s.status().message(),
            absl::StrCat(file, ": controller: must be host:port, got \"nope\""));
}

TEST_F(AgentConfigTest, TokenFileErrorsNameTheFlagAndPath) {
  const std::vector<std::string> base = {
      "--node", "n0", "--gpu-type", "A6000", "--virtual-gpus", "1"};
  std::vector<std::string> absent = base;
  absent.insert(absent.end(), {"--token-file", dir_ + "/absent"});
  absl::StatusOr<AgentSettings> s = FromArgs(absent);
  EXPECT_EQ(s.status().code(), absl::StatusCode::kNotFound);
  EXPECT_EQ(s.status().message(),
            absl::StrCat("--token-file: cannot read \"", dir_, "/absent\""));

  std::vector<std::string> empty = base;
  const std::string blank = Write("blank", " \n");
  empty.insert(empty.end(), {"--token-file", blank});
  s = FromArgs(empty);
  EXPECT_EQ(s.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(s.status().message(),
            absl::StrCat("--token-file: no token in \"", blank,
                         "\" (empty or only whitespace)"));
}

TEST_F(AgentConfigTest, BadProfilesDirIsNamed) {
  const std::string gpus = Write("gpus.yaml", "gpus: 3\n");
  absl::StatusOr<AgentSettings> s =
      FromArgs({"--node", "n0", "--gpu-type", "A6000", "--virtual-gpus", "1",
                "--profiles-dir", dir_});
  EXPECT_EQ(s.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(s.status().message(), HasSubstr("--profiles-dir: "));
  EXPECT_THAT(s.status().message(), HasSubstr("gpus.yaml"));
}

TEST_F(AgentConfigTest, PortFileIsWrittenWhole) {
  const std::string path = dir_ + "/port";
  ASSERT_TRUE(WritePortFile(path, 43210).ok());
  EXPECT_EQ(ReadFile(path), "43210\n");
  EXPECT_FALSE(std::filesystem::exists(path + ".tmp"));
}

TEST_F(AgentConfigTest, UnwritablePortFileIsUnavailable) {
  const absl::Status s = WritePortFile(dir_ + "/no/such/dir/port", 1);
  EXPECT_EQ(s.code(), absl::StatusCode::kUnavailable);
  EXPECT_THAT(s.message(), HasSubstr("port_file: cannot write \""));
}


// --checkpoint-root: absolute, created at start and resolved; given
// nowhere, none.
TEST_F(AgentConfigTest, CheckpointRootIsCreatedResolvedAndChecked) {
  absl::StatusOr<AgentSettings> none = FromArgs(
      {"--node", "n0", "--gpu-type", "A6000", "--virtual-gpus", "2"});
  ASSERT_TRUE(none.ok()) << none.status();
  EXPECT_EQ(none->checkpoint_root, "");

  std::filesystem::create_directories(dir_ + "/real");
  std::filesystem::create_directory_symlink(dir_ + "/real", dir_ + "/link");
  absl::StatusOr<AgentSettings> s =
      FromArgs({"--node", "n0", "--gpu-type", "A6000", "--virtual-gpus", "2",
                "--checkpoint-root", dir_ + "/link/ckpt/"});
  ASSERT_TRUE(s.ok()) << s.status();
  EXPECT_EQ(s->checkpoint_root,
            std::filesystem::canonical(dir_ + "/real/ckpt").string());
  EXPECT_TRUE(std::filesystem::is_directory(dir_ + "/real/ckpt"));

  const std::string file = Write("agent.yaml",
                                 "node: n0\ngpu_type: A6000\nvirtual_gpus: 1\n"
                                 "checkpoint_root: ckpt\n");
  absl::Status rel = FromArgs({"--config", file}).status();
  EXPECT_EQ(rel.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(rel.message(),
              HasSubstr(file + ": checkpoint_root: must be an absolute "
                               "directory path, got \"ckpt\""));

  Write("plain", "x");
  absl::Status not_dir =
      FromArgs({"--node", "n0", "--gpu-type", "A6000", "--virtual-gpus", "2",
                "--checkpoint-root", dir_ + "/plain/ckpt"})
          .status();
  EXPECT_EQ(not_dir.code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_THAT(not_dir.message(),
              HasSubstr("--checkpoint-root: cannot create or resolve \""));
}

class CheckpointDirTest : public AgentConfigTest {
 protected:
  void SetUp() override {
    AgentConfigTest::SetUp();
    root_ = std::filesystem::canonical(dir_).string() + "/root";
    std::filesystem::create_directories(root_ + "/jobs/a");
    std::filesystem::create_directories(dir_ + "/outside");
  }
  absl::StatusOr<std::string> Check(const std::string& dir) const {
    return CheckCheckpointDir(root_, "dir", dir);
  }
  std::string root_;
};

TEST_F(CheckpointDirTest, PathsInsideTheRootAreNormalisedAndResolved) {
  EXPECT_EQ(*Check(root_ + "/jobs/a"), root_ + "/jobs/a");
  EXPECT_EQ(*Check(root_ + "/jobs/a/"), root_ + "/jobs/a");
  EXPECT_EQ(*Check(root_ + "/new/deeper"), root_ + "/new/deeper");
  EXPECT_EQ(*Check(root_ + "/./jobs//a/../b"), root_ + "/jobs/b");
  EXPECT_EQ(*Check(root_), root_);
  // A symlink inside the root that stays inside: the path it resolves to.
  std::filesystem::create_directory_symlink("jobs/a", root_ + "/latest");
  EXPECT_EQ(*Check(root_ + "/latest/g3"), root_ + "/jobs/a/g3");
  std::filesystem::create_directory_symlink("..", root_ + "/jobs/a/up");
  EXPECT_EQ(*Check(root_ + "/jobs/a/up/b"), root_ + "/jobs/b");
}

TEST_F(CheckpointDirTest, PathsOutsideTheRootAreInvalidArgumentNamingDir) {
  struct Case {
    std::string dir;
    std::string message;
  };
  std::filesystem::create_directory_symlink(dir_ + "/outside",
                                            root_ + "/escape-link");
  std::filesystem::create_symlink(dir_ + "/outside/not-yet",
                                  root_ + "/dangling");
  std::filesystem::create_directory_symlink("..", root_ + "/parent");
  const std::string in_root = "must be inside the checkpoint root \"";
  const std::vector<Case> cases = {
      {"relative/ckpt",
       "dir: must be an absolute path inside the checkpoint root \"" + root_ +
           "\", got \"relative/ckpt\""},
      {"", "dir: must be an absolute path inside the checkpoint root"},
      {root_ + "/a/../../escape", "dir: " + in_root},
      {root_ + "/../root-sibling", "dir: " + in_root},
      {root_ + "-sibling/x", "dir: " + in_root},
      {"/", "dir: " + in_root},
      {root_ + "/escape-link/ckpt", "(resolved to \""},
      {root_ + "/dangling/ckpt", "(resolved to \""},
      {root_ + "/parent/x", "(resolved to \""},
  };
  for (const Case& c : cases) {
    SCOPED_TRACE(c.dir);
    absl::StatusOr<std::string> r = Check(c.dir);
    ASSERT_FALSE(r.ok()) << *r;
    EXPECT_EQ(r.status().code(), absl::StatusCode::kInvalidArgument);
    EXPECT_THAT(r.status().message(), HasSubstr(c.message));
  }
  absl::Status link = Check(root_ + "/escape-link/ckpt").status();
  EXPECT_THAT(link.message(),
              HasSubstr("(resolved to \"" +
                        std::filesystem::canonical(dir_ + "/outside").string() +
                        "/ckpt\")"));
}

TEST_F(CheckpointDirTest, LongValuesAreQuotedAbbreviated) {
  const std::string dir = root_ + "/../" + std::string(5000, 'x');
  absl::Status s = Check(dir).status();
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(s.message(), HasSubstr("...\" (" + std::to_string(dir.size()) +
                                     " bytes)"));
  EXPECT_LT(s.message().size(), 400u);
  absl::Status nul = Check(root_ + std::string("/a\0b", 4)).status();
  EXPECT_EQ(nul.code(), absl::StatusCode::kInvalidArgument);
}

TEST_F(CheckpointDirTest, PermanentFileSystemErrorsAreFailedPrecondition) {
  Write("root/file", "x");
  absl::Status s = Check(root_ + "/file/ckpt").status();
  EXPECT_EQ(s.code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_THAT(s.message(), HasSubstr("dir: cannot resolve \""));
  EXPECT_THAT(s.message(), HasSubstr("Not a directory"));
  std::filesystem::create_symlink("loop", root_ + "/loop");
  absl::Status loop = Check(root_ + "/loop/x").status();
  EXPECT_EQ(loop.code(), absl::StatusCode::kFailedPrecondition);
}

TEST_F(CheckpointDirTest, AnAgentWithoutARootTakesNoCheckpointPaths) {
  absl::Status s =
      CheckCheckpointDir("", "checkpoint_dir", "/data/ckpt").status();
  EXPECT_EQ(s.code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_THAT(s.message(),
              HasSubstr("checkpoint_dir: this agent was started without "
                        "--checkpoint-root"));
  EXPECT_THAT(s.message(), HasSubstr("got \"/data/ckpt\""));
}

TEST(CheckpointIoCode, PermanentErrorsArePermanent) {
  for (int e : {EACCES, EPERM, EROFS, ENOTDIR, ENOSPC, EDQUOT, ENAMETOOLONG}) {
    EXPECT_EQ(CheckpointIoCode(e), absl::StatusCode::kFailedPrecondition) << e;
  }
  for (int e : {EIO, EINTR, EAGAIN, EBUSY, ETIMEDOUT}) {
    EXPECT_EQ(CheckpointIoCode(e), absl::StatusCode::kUnavailable) << e;
  }
}

}  // namespace
}  // namespace arachne::agent
