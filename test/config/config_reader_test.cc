// The settings reader the binaries share (config/config_reader.h), on
// arachne.v1.AgentConfig, whose fields have every type a flag reads (text,
// int32, double, bool). What each binary makes of the values is tested with
// the binary (test/server/server_config_test.cc, test/agent/...).
#include "config/config_reader.h"

#include <unistd.h>

#include <cmath>
#include <filesystem>
#include <fstream>
#include <string>
#include <vector>

#include "CLI/CLI.hpp"
#include "absl/strings/str_cat.h"
#include "arachne/v1/agent_config.pb.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace arachne {
namespace {

using ::testing::HasSubstr;

// Parses `args` (after the program name) into `app`.
void Parse(CLI::App& app, std::vector<std::string> args) {
  args.insert(args.begin(), "prog");
  std::vector<const char*> argv;
  for (const std::string& a : args) argv.push_back(a.c_str());
  app.parse(static_cast<int>(argv.size()), argv.data());
}

// A check that accepts everything and records the source it was given.
struct SourceRecorder {
  std::string* source;
  absl::Status operator()(const v1::AgentConfig&, absl::string_view s) const {
    *source = std::string(s);
    return absl::OkStatus();
  }
};

// A directory of its own for each test (ctest runs each case as its own
// process, in parallel), removed after it.
class ConfigReaderTest : public ::testing::Test {
 protected:
  ConfigReaderTest()
      : dir_(absl::StrCat(::testing::TempDir(), "/arachne_config_reader_",
                          ::getpid())) {
    std::filesystem::create_directories(dir_);
  }
  ~ConfigReaderTest() override { std::filesystem::remove_all(dir_); }

  // `text` as the file `name` in the directory; its path.
  std::string Write(absl::string_view name, absl::string_view text) const {
    const std::string path = absl::StrCat(dir_, "/", name);
    std::ofstream(path) << text;
    return path;
  }

  const std::string dir_;
};

TEST(ConfigFlagNameTest, UnderscoresBecomeDashes) {
  EXPECT_EQ(ConfigFlagName("max_budget_s"), "--max-budget-s");
  EXPECT_EQ(ConfigFlagName("node"), "--node");
}

TEST(ConfigFlagsTest, OnlyTheFlagsGivenAreSetTypedAsTheirFields) {
  CLI::App app;
  ConfigFlags flags(app, *v1::AgentConfig::descriptor());
  flags.Add("node", "name");
  flags.Add("virtual_gpus", "count");
  flags.Add("grace_s", "seconds", 10.0);
  flags.Add("in_process_ranks", "threads");
  flags.Add("listen", "address", std::string("127.0.0.1:0"));
  Parse(app, {"--node", "n0", "--virtual-gpus", "0", "--grace-s", "2.5",
              "--in-process-ranks"});
  const v1::AgentConfig given = flags.Given<v1::AgentConfig>();
  EXPECT_EQ(given.node(), "n0");
  // Given as 0: set, so it overrides the file (and is checked).
  ASSERT_TRUE(given.has_virtual_gpus());
  EXPECT_EQ(given.virtual_gpus(), 0);
  EXPECT_EQ(given.grace_s(), 2.5);
  EXPECT_TRUE(given.in_process_ranks());
  // Not given: unset, though --help shows a default.
  EXPECT_FALSE(given.has_listen());
  EXPECT_EQ(flags.config_file(), "");
}

TEST(ConfigFlagsTest, HelpNamesTheSchemaAndShowsTheDefaultsGiven) {
  CLI::App app;
  ConfigFlags flags(app, *v1::AgentConfig::descriptor());
  flags.Add("listen", "where to listen", std::string("127.0.0.1:0"));
  flags.Add("virtual_gpus", "count", 3);
  flags.Add("node", "name");
  const std::string help = app.help();
  EXPECT_THAT(help, HasSubstr("settings file (YAML or JSON, "
                              "arachne.v1.AgentConfig: the flags below with "
                              "'-' written '_'); flags given here override "
                              "it"));
  EXPECT_THAT(help, HasSubstr("--listen TEXT=127.0.0.1:0"));
  EXPECT_THAT(help, HasSubstr("--virtual-gpus INT=3"));
  EXPECT_THAT(help, HasSubstr("--node TEXT "));
}

TEST(ConfigFlagsTest, AValueOfTheWrongTypeIsACommandLineError) {
  CLI::App app;
  ConfigFlags flags(app, *v1::AgentConfig::descriptor());
  flags.Add("virtual_gpus", "count");
  EXPECT_THROW(Parse(app, {"--virtual-gpus", "two"}), CLI::ParseError);
}

TEST(ConfigFlagsDeathTest, AFieldNotInTheSchemaIsABug) {
  CLI::App app;
  ConfigFlags flags(app, *v1::AgentConfig::descriptor());
  EXPECT_DEATH(flags.Add("gpu_typ", "typo"),
               "arachne.v1.AgentConfig has no field gpu_typ");
}

TEST_F(ConfigReaderTest, TheFileIsReadCheckedAndNamedByItsPath) {
  const std::string path =
      Write("agent.yaml", "node: n0\nvirtual_gpus: 2\ngrace_s: 1\n");
  CLI::App app;
  ConfigFlags flags(app, *v1::AgentConfig::descriptor());
  Parse(app, {"--config", path});
  EXPECT_EQ(flags.config_file(), path);
  std::string source;
  absl::StatusOr<v1::AgentConfig> file =
      flags.File<v1::AgentConfig>(SourceRecorder{&source});
  ASSERT_TRUE(file.ok()) << file.status();
  EXPECT_EQ(file->node(), "n0");
  EXPECT_EQ(file->virtual_gpus(), 2);
  EXPECT_EQ(source, path);

  // The check's error is the answer.
  file = flags.File<v1::AgentConfig>(
      [](const v1::AgentConfig& c, absl::string_view s) {
        return CheckIntegerSetting(absl::StrCat(s, ": virtual_gpus"),
                                   c.virtual_gpus(), 3);
      });
  EXPECT_EQ(file.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(file.status().message(),
            absl::StrCat(path,
                         ": virtual_gpus: must be an integer >= 3, "
                         "got 2"));
}

TEST_F(ConfigReaderTest, NoConfigFlagMeansAnEmptyFileAndNoCheck) {
  CLI::App app;
  ConfigFlags flags(app, *v1::AgentConfig::descriptor());
  Parse(app, {});
  std::string source = "not called";
  absl::StatusOr<v1::AgentConfig> file =
      flags.File<v1::AgentConfig>(SourceRecorder{&source});
  ASSERT_TRUE(file.ok()) << file.status();
  EXPECT_EQ(file->ByteSizeLong(), 0u);
  EXPECT_EQ(source, "not called");
}

TEST_F(ConfigReaderTest, FileErrorsNameThePathTheFieldAndTheValue) {
  const auto accept = [](const v1::AgentConfig&, absl::string_view) {
    return absl::OkStatus();
  };
  absl::StatusOr<v1::AgentConfig> c =
      ReadConfigFile<v1::AgentConfig>(dir_ + "/absent.yaml", accept);
  EXPECT_EQ(c.status().code(), absl::StatusCode::kNotFound);
  EXPECT_EQ(c.status().message(),
            absl::StrCat("config: cannot read \"", dir_, "/absent.yaml\""));

  const std::string typo = Write("typo.yaml", "gpu_typ: A6000\n");
  c = ReadConfigFile<v1::AgentConfig>(typo, accept);
  EXPECT_EQ(c.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(c.status().message(),
              HasSubstr(absl::StrCat(typo, ": unknown field \"gpu_typ\"")));

  c = ReadConfigText<v1::AgentConfig>("virtual_gpus: many\n", "agent.yaml",
                                      accept);
  EXPECT_EQ(c.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(c.status().message(), HasSubstr("agent.yaml: virtual_gpus: "));
  EXPECT_THAT(c.status().message(), HasSubstr("got "));

  // Nothing but comments: all defaults.
  c = ReadConfigText<v1::AgentConfig>("# node: n0\n", "agent.yaml", accept);
  ASSERT_TRUE(c.ok()) << c.status();
  EXPECT_EQ(c->ByteSizeLong(), 0u);
}

TEST(MergeFlagsOverFileTest, AFlagGivenReplacesTheFilesValueEvenWithZero) {
  v1::AgentConfig file;
  file.set_node("from-file");
  file.set_virtual_gpus(4);
  file.set_grace_s(3);
  v1::AgentConfig flags;
  flags.set_virtual_gpus(0);
  flags.set_listen("127.0.0.1:1");
  const v1::AgentConfig merged = MergeFlagsOverFile(file, flags);
  EXPECT_EQ(merged.node(), "from-file");
  EXPECT_EQ(merged.virtual_gpus(), 0);
  EXPECT_EQ(merged.grace_s(), 3);
  EXPECT_EQ(merged.listen(), "127.0.0.1:1");
  EXPECT_FALSE(merged.has_host());
}

TEST(SettingNamesTest, ASettingIsNamedWhereItWasWritten) {
  v1::AgentConfig file;
  file.set_node("n0");
  file.set_gpu_type("B300");
  v1::AgentConfig flags;
  flags.set_gpu_type("A6000");
  const SettingNames names("agent.yaml", &file, &flags);
  EXPECT_EQ(names("gpu_type"), "--gpu-type");    // the flag wins
  EXPECT_EQ(names("node"), "agent.yaml: node");  // the file alone
  EXPECT_EQ(names("tls_cert"), "--tls-cert");    // nowhere: the flag
  EXPECT_TRUE(HasConfigField(file, "node"));
  EXPECT_FALSE(HasConfigField(flags, "node"));

  const absl::Status s = names.Error("node", "must be a node name, got \"\"");
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(s.message(), "agent.yaml: node: must be a node name, got \"\"");

  // A file without a name: its fields bare.
  EXPECT_EQ(SettingNames("", &file, nullptr)("node"), "node");

  const absl::Status required = RequiredSettingError("gpu_type");
  EXPECT_EQ(required.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(required.message(),
            "--gpu-type: required (or gpu_type in the config file), got none");
}

TEST(RangeChecksTest, MessagesNameTheSettingTheBoundAndTheValue) {
  EXPECT_TRUE(CheckSecondsSetting("--grace-s", 0, true).ok());
  EXPECT_TRUE(CheckSecondsSetting("--max-budget-s", 0.5, false).ok());
  EXPECT_EQ(CheckSecondsSetting("p.yaml: max_budget_s", -3, false).message(),
            "p.yaml: max_budget_s: must be > 0, got -3");
  EXPECT_EQ(CheckSecondsSetting("--default-budget-s", 0, false).message(),
            "--default-budget-s: must be > 0, got 0");
  EXPECT_EQ(CheckSecondsSetting("--grace-s", std::nan(""), true).message(),
            "--grace-s: must be >= 0, got nan");
  EXPECT_EQ(CheckSecondsSetting("--grace-s", HUGE_VAL, true).code(),
            absl::StatusCode::kInvalidArgument);

  EXPECT_TRUE(CheckIntegerSetting("--workers", 1, 1).ok());
  EXPECT_EQ(CheckIntegerSetting("--workers", 0, 1).message(),
            "--workers: must be an integer >= 1, got 0");
  EXPECT_TRUE(CheckIntegerSetting("--virtual-gpus", 64, 1, 64).ok());
  EXPECT_EQ(CheckIntegerSetting("--virtual-gpus", 65, 1, 64).message(),
            "--virtual-gpus: must be an integer in 1..64, got 65");
}

TEST(ServerTlsSettingsTest, KeyAndClientCaNeedACertificateAndItItsKey) {
  const auto bare = [](absl::string_view field) { return std::string(field); };
  EXPECT_TRUE(CheckServerTlsSettings("", "", "", bare).ok());
  EXPECT_TRUE(CheckServerTlsSettings("c.pem", "k.pem", "", bare).ok());
  EXPECT_TRUE(CheckServerTlsSettings("c.pem", "k.pem", "ca.pem", bare).ok());
  EXPECT_EQ(CheckServerTlsSettings("", "k.pem", "", bare).message(),
            "tls_cert: required with tls_key, got none");
  EXPECT_EQ(CheckServerTlsSettings("", "", "ca.pem", bare).message(),
            "tls_cert: required with tls_client_ca, got none");
  const absl::Status s = CheckServerTlsSettings("c.pem", "", "", bare);
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(s.message(), "tls_key: required with tls_cert, got none");

  // Named where the user wrote them.
  v1::AgentConfig flags;
  flags.set_tls_key("k.pem");
  EXPECT_EQ(
      CheckServerTlsSettings("", "k.pem", "", SettingNames("", nullptr, &flags))
          .message(),
      "--tls-cert: required with --tls-key, got none");
}

}  // namespace
}  // namespace arachne
