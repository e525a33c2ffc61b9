// `arachne status`, `watch`, `drain` and `replan` against a real
// arachne-controller process on 127.0.0.1 (port read back from
// --port-file), run in process through RunCli. No agents: the controller
// has a job but no members, which is what `status` of a job not started
// yet must show; membership and replan events are enough for `watch`.
// The controller is built only with LibTorch: without it these tests skip.
#include <netinet/in.h>
#include <signal.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include <filesystem>
#include <fstream>
#include <string>
#include <thread>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "nlohmann/json.hpp"
#include "test/cli/cli_runner.h"
#include "test/port_file_process.h"

namespace arachne {
namespace {

using ::arachne::testing::Cli;
using ::arachne::testing::CliRun;
using ::testing::HasSubstr;

std::string ControllerBinary() {
  return std::string(ARACHNE_BINARY_DIR) + "/controller/arachne-controller";
}

std::string TempDir(const std::string& name) {
  const std::string d = std::string(::testing::TempDir()) +
                        "arachne-controller-cli-" + name + "-" +
                        std::to_string(getpid());
  std::filesystem::remove_all(d);
  std::filesystem::create_directories(d);
  return d;
}

constexpr char kJob[] = R"(model: {name: tiny-gpt}
training: {seq_len: 32, global_batch: 32}
iterations: 10
min_gpus: 3
join_window_s: 0.2
)";

// One arachne-controller process with kJob and no agents.
class ControllerProcess {
 public:
  explicit ControllerProcess(std::string dir) : dir_(std::move(dir)) {}
  ~ControllerProcess() { Stop(); }

  // Starts it and waits for its port; `extra` flags are appended.
  ::testing::AssertionResult Start(std::vector<std::string> extra = {}) {
    const std::string job = dir_ + "/job.yaml";
    std::ofstream(job) << kJob;
    const std::string port_file = dir_ + "/controller.port";
    const std::string log = dir_ + "/controller.log";
    std::vector<std::string> argv = {ControllerBinary(), "--job", job,
                                     "--state-dir", dir_ + "/state",
                                     "--listen", "127.0.0.1:0",
                                     "--port-file", port_file};
    argv.insert(argv.end(), extra.begin(), extra.end());
    absl::StatusOr<arachne::testing::StartedProcess> p =
        arachne::testing::StartWithPortFile(std::move(argv), log, port_file,
                                            "controller");
    if (!p.ok()) return ::testing::AssertionFailure() << p.status().message();
    pid_ = p->pid;
    address_ = absl::StrCat("127.0.0.1:", p->port);
    return ::testing::AssertionSuccess();
  }
  // SIGTERM and wait: the controller shuts down gracefully.
  void Stop() {
    if (pid_ > 0) {
      kill(pid_, SIGTERM);
      waitpid(pid_, nullptr, 0);
      pid_ = -1;
    }
  }
  const std::string& address() const { return address_; }

 private:
  std::string dir_;
  pid_t pid_ = -1;
  std::string address_;
};

// A loopback port nobody listens on (bound, then closed).
int ClosedPort() {
  const int fd = socket(AF_INET, SOCK_STREAM, 0);
  sockaddr_in a{};
  a.sin_family = AF_INET;
  a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  a.sin_port = 0;
  socklen_t len = sizeof(a);
  (void)bind(fd, reinterpret_cast<sockaddr*>(&a), sizeof(a));
  (void)getsockname(fd, reinterpret_cast<sockaddr*>(&a), &len);
  close(fd);
  return ntohs(a.sin_port);
}

class ControllerCliTest : public ::testing::Test {
 protected:
  void SetUp() override {
    if (!std::filesystem::exists(ControllerBinary())) {
      GTEST_SKIP() << "no arachne-controller in this build (needs LibTorch)";
    }
  }
};

TEST(ControllerCliAddressTest, ABadAddressIsNamedWithTheFlag) {
  for (const std::string command : {"status", "watch", "replan"}) {
    CliRun r = Cli({command, "--controller", "nohost"});
    EXPECT_EQ(r.code, 2) << command;
    EXPECT_EQ(r.err,
              "error: --controller: must be HOST:PORT (e.g. 127.0.0.1:7100), "
              "got \"nohost\" (no port)\n")
        << command;
  }
  CliRun port = Cli({"status", "--controller", "127.0.0.1:99999"});
  EXPECT_EQ(port.code, 2);
  EXPECT_THAT(port.err, HasSubstr("--controller: must be HOST:PORT (e.g. "
                                  "127.0.0.1:7100), got \"127.0.0.1:99999\" "
                                  "(the port must be a number in 1..65535)"));
  CliRun host = Cli({"drain", "--controller", ":7100", "--node", "a"});
  EXPECT_EQ(host.code, 2);
  EXPECT_THAT(host.err, HasSubstr("got \":7100\" (no host)"));
  CliRun missing = Cli({"status"});
  EXPECT_EQ(missing.code, 2);
  EXPECT_THAT(missing.err, HasSubstr("--controller is required"));
}

TEST(ControllerCliAddressTest, AnUnreachableControllerIsUnavailable) {
  const std::string address = absl::StrCat("127.0.0.1:", ClosedPort());
  for (const std::string command : {"status", "watch"}) {
    CliRun r = Cli({command, "--controller", address});
    EXPECT_EQ(r.code, 1) << command;
    EXPECT_THAT(r.err, HasSubstr(absl::StrCat("error: controller ", address,
                                              ": ")))
        << command;
    EXPECT_TRUE(r.out.empty()) << r.out;
  }
}

TEST(ControllerCliAddressTest, AMissingTokenFileIsNamedWithTheFlag) {
  CliRun r = Cli({"status", "--controller", "127.0.0.1:7100", "--token-file",
                  "/nonexistent/token"});
  EXPECT_EQ(r.code, 2);
  EXPECT_EQ(r.err,
            "error: --token-file: cannot read \"/nonexistent/token\"\n");
  CliRun tls = Cli({"status", "--controller", "127.0.0.1:7100", "--tls-cert",
                    "/nonexistent/cert.pem"});
  EXPECT_EQ(tls.code, 2);
  EXPECT_THAT(tls.err, HasSubstr("error: --tls-cert, --tls-key: "));
}

TEST_F(ControllerCliTest, StatusOfAControllerWithNoJobStartedYet) {
  ControllerProcess controller(TempDir("status"));
  ASSERT_TRUE(controller.Start());
  CliRun r = Cli({"status", "--controller", controller.address()});
  ASSERT_EQ(r.code, 0) << r.err;
  EXPECT_THAT(r.out, HasSubstr(absl::StrCat("controller ", controller.address(),
                                            ": generation 0, waiting\n")));
  EXPECT_THAT(r.out, HasSubstr("members: 0 nodes, 0 GPUs\n"));
  EXPECT_THAT(r.out, HasSubstr("plan: none yet\n"));
  EXPECT_THAT(r.out, HasSubstr("decisions: 0 (most recent first)\n"));
  EXPECT_THAT(r.out, ::testing::Not(HasSubstr("last switch")));

  CliRun j = Cli({"status", "--controller", controller.address(), "--format",
                  "json"});
  ASSERT_EQ(j.code, 0) << j.err;
  const nlohmann::json s = nlohmann::json::parse(j.out);
  // int64 fields are strings in protobuf's JSON mapping.
  EXPECT_EQ(s["generation"], "0");
  EXPECT_EQ(s["phase"], "waiting");
  EXPECT_EQ(s["iteration"], "0");
  EXPECT_TRUE(s["members"].empty());
  EXPECT_TRUE(s["decisions"].empty());

  CliRun bad = Cli({"status", "--controller", controller.address(),
                    "--format", "yaml"});
  EXPECT_EQ(bad.code, 2);
  EXPECT_EQ(bad.err, "error: --format: expected table or json, got \"yaml\"\n");
}

TEST_F(ControllerCliTest, WatchPrintsOneLinePerEventAndDrainNamesTheNode) {
  ControllerProcess controller(TempDir("watch"));
  ASSERT_TRUE(controller.Start());
  CliRun replan = Cli({"replan", "--controller", controller.address(),
                       "--reason", "operator test"});
  ASSERT_EQ(replan.code, 0) << replan.err;
  EXPECT_EQ(replan.out, "replan requested\n");

  CliRun w = Cli({"watch", "--controller", controller.address(),
                  "--max-events", "1"});
  ASSERT_EQ(w.code, 0) << w.err;
  EXPECT_THAT(w.out, ::testing::MatchesRegex(
                         "[0-9:.]+ #1 +membership +g0 +replan operator test\n"));

  CliRun j = Cli({"watch", "--controller", controller.address(),
                  "--max-events", "1", "--format", "json"});
  ASSERT_EQ(j.code, 0) << j.err;
  const nlohmann::json e = nlohmann::json::parse(j.out);
  EXPECT_EQ(e["sequence"], "1");
  EXPECT_EQ(e["kind"], "membership");
  EXPECT_EQ(e["message"], "replan operator test");

  // Nothing after the last event: --after skips it, and a second replan
  // is the next line.
  std::thread second([&]() {
    absl::SleepFor(absl::Milliseconds(300));
    Cli({"replan", "--controller", controller.address(), "--reason", "again"});
  });
  CliRun after = Cli({"watch", "--controller", controller.address(),
                      "--after", "1", "--max-events", "1"});
  second.join();
  ASSERT_EQ(after.code, 0) << after.err;
  EXPECT_THAT(after.out, HasSubstr("#2 "));
  EXPECT_THAT(after.out, HasSubstr("replan again"));

  CliRun drain = Cli({"drain", "--controller", controller.address(), "--node",
                      "ghost", "--deadline-s", "30"});
  EXPECT_EQ(drain.code, 2);
  EXPECT_EQ(drain.err, absl::StrCat("error: controller ", controller.address(),
                                    ": node: \"ghost\" is not a member\n"));
  CliRun deadline = Cli({"drain", "--controller", controller.address(),
                         "--node", "ghost", "--deadline-s", "0"});
  EXPECT_EQ(deadline.code, 2);
  EXPECT_EQ(deadline.err, "error: --deadline-s: must be > 0 seconds, got 0\n");
}

TEST_F(ControllerCliTest, WatchEndsWhenTheControllerShutsDown) {
  ControllerProcess controller(TempDir("shutdown"));
  ASSERT_TRUE(controller.Start());
  CliRun w{-1, "", ""};
  std::thread watcher(
      [&]() { w = Cli({"watch", "--controller", controller.address()}); });
  Cli({"replan", "--controller", controller.address(), "--reason", "r"});
  absl::SleepFor(absl::Milliseconds(500));
  controller.Stop();
  watcher.join();
  EXPECT_EQ(w.code, 0) << w.err;
  EXPECT_THAT(w.out, HasSubstr("replan r"));
}

TEST_F(ControllerCliTest, AControllerWithATokenRefusesCallsWithoutIt) {
  const std::string dir = TempDir("token");
  const std::string token = dir + "/token";
  std::ofstream(token) << "s3cret\n";
  ControllerProcess controller(dir);
  ASSERT_TRUE(controller.Start({"--token-file", token}));
  CliRun none = Cli({"status", "--controller", controller.address()});
  EXPECT_EQ(none.code, 2);
  EXPECT_EQ(none.err,
            absl::StrCat("error: controller ", controller.address(),
                         ": authorization: missing; send the metadata "
                         "\"authorization: Bearer <token>\"\n"));
  const std::string wrong = dir + "/wrong";
  std::ofstream(wrong) << "guess";
  CliRun bad = Cli({"status", "--controller", controller.address(),
                    "--token-file", wrong});
  EXPECT_EQ(bad.code, 2);
  EXPECT_THAT(bad.err, HasSubstr("authorization: wrong bearer token"));
  CliRun ok = Cli({"status", "--controller", controller.address(),
                   "--token-file", token});
  EXPECT_EQ(ok.code, 0) << ok.err;
  EXPECT_THAT(ok.out, HasSubstr("generation 0, waiting"));
}

}  // namespace
}  // namespace arachne
