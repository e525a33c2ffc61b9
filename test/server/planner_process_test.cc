// The real `arachne-planner` binary started with settings it cannot serve
// with: it must exit 2 with the reason on stderr, before it serves, and never
// die of a signal (it used to segfault in its destructor whenever the
// listener could not be created).
#include <sys/wait.h>
#include <unistd.h>

#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace arachne {
namespace {

using ::testing::HasSubstr;

struct Exit {
  bool signalled = false;
  int code = -1;
  std::string err;
};

// Runs arachne-planner with `args`; a command that does not exit within 20 s
// (it would be serving) is killed by `timeout` and reads as code 124.
Exit RunPlanner(const std::vector<std::string>& args) {
  const std::string dir = (std::filesystem::path(::testing::TempDir()) /
                           absl::StrCat("arachne_planner_process_", ::getpid()))
                              .string();
  std::filesystem::create_directories(dir);
  const std::string err_file = dir + "/stderr";
  std::vector<std::string> quoted;
  for (const std::string& a : args) quoted.push_back(absl::StrCat("'", a, "'"));
  const std::string cmd =
      absl::StrCat("timeout 20 ", ARACHNE_BINARY_DIR,
                   "/planner_service/server/arachne-planner ",
                   absl::StrJoin(quoted, " "), " 2>", err_file, " >/dev/null");
  const int status = std::system(cmd.c_str());
  Exit e;
  // timeout(1) reports a child killed by a signal as 128 + signal.
  e.code = WIFEXITED(status) ? WEXITSTATUS(status) : -1;
  e.signalled = WIFSIGNALED(status) || e.code > 128;
  std::ifstream in(err_file);
  e.err.assign(std::istreambuf_iterator<char>(in), {});
  return e;
}

struct ListenCase {
  std::string listen;
  std::string message;
};

TEST(PlannerProcessTest, UnusableListenAddressExitsTwoWithTheReason) {
  for (const ListenCase& c : std::vector<ListenCase>{
           {"garbage",
            "listen: must be HOST:PORT (e.g. 127.0.0.1:50051; port 0 picks a "
            "free one) or unix:PATH, got \"garbage\""},
           {"127.0.0.1:-5",
            "listen: the port must be a number in 0..65535 (0 picks a free "
            "one), got \"127.0.0.1:-5\""},
           {"127.0.0.1:99999",
            "listen: the port must be a number in 0..65535 (0 picks a free "
            "one), got \"127.0.0.1:99999\""},
           {"127.0.0.1:",
            "listen: missing port after ':' (0..65535; 0 picks a free one), "
            "got \"127.0.0.1:\""},
           {"unix:/nonexistent-arachne/dir/planner.sock",
            "listen: the folder \"/nonexistent-arachne/dir\" of the unix "
            "socket does not exist"},
       }) {
    const Exit e = RunPlanner({"--listen", c.listen});
    EXPECT_FALSE(e.signalled) << c.listen << ": " << e.err;
    EXPECT_EQ(e.code, 2) << c.listen << ": " << e.err;
    EXPECT_THAT(e.err, HasSubstr(absl::StrCat("command line: --", c.message)))
        << c.listen;
  }
  // The same check on the health port's address.
  const Exit health = RunPlanner(
      {"--listen", "127.0.0.1:0", "--health-listen", "127.0.0.1:70000"});
  EXPECT_EQ(health.code, 2) << health.err;
  EXPECT_THAT(health.err,
              HasSubstr("command line: --health-listen: the port must be a "
                        "number in 0..65535"));
}

TEST(PlannerProcessTest, AddressThatCannotBeBoundExitsTwoNotASegfault) {
  // Well formed, but no such host: gRPC fails to create the listener.
  const Exit e = RunPlanner({"--listen", "no-such-host.invalid:0"});
  EXPECT_FALSE(e.signalled) << e.err;
  EXPECT_EQ(e.code, 2) << e.err;
  EXPECT_THAT(e.err, HasSubstr("listen: cannot bind no-such-host.invalid:0"));
}

TEST(PlannerProcessTest, TlsKeyOfAnotherCertificateExitsTwo) {
  const std::string dir = (std::filesystem::path(::testing::TempDir()) /
                           absl::StrCat("arachne_planner_tls_", ::getpid()))
                              .string();
  std::filesystem::create_directories(dir);
  bool have_openssl = true;
  for (const char* name : {"a", "b"}) {
    const std::string cmd = absl::StrCat(
        "openssl req -x509 -newkey rsa:2048 -nodes -days 1 -subj /CN=localhost "
        "-keyout ",
        dir, "/", name, ".key -out ", dir, "/", name, ".pem > /dev/null 2>&1");
    have_openssl = have_openssl && std::system(cmd.c_str()) == 0;
  }
  if (!have_openssl) GTEST_SKIP() << "no openssl command to make certificates";
  const Exit e = RunPlanner({"--listen", "127.0.0.1:0", "--tls-cert",
                             dir + "/a.pem", "--tls-key", dir + "/b.key"});
  EXPECT_FALSE(e.signalled) << e.err;
  EXPECT_EQ(e.code, 2) << e.err;
  EXPECT_THAT(e.err, HasSubstr(absl::StrCat(
                         "tls_key: the private key in \"", dir,
                         "/b.key\" does not match the certificate in \"", dir,
                         "/a.pem\"")));
  std::filesystem::remove_all(dir);
}

TEST(PlannerProcessTest, ProfilesDirThatIsNoDirectoryExitsTwo) {
  const Exit missing = RunPlanner(
      {"--listen", "127.0.0.1:0", "--profiles-dir", "/nonexistent-arachne"});
  EXPECT_EQ(missing.code, 2) << missing.err;
  EXPECT_THAT(missing.err, HasSubstr("profiles_dir: \"/nonexistent-arachne\" "
                                     "does not exist"));
  const std::string file =
      std::string(ARACHNE_SOURCE_DIR) + "/profiles/gpus.yaml";
  const Exit regular =
      RunPlanner({"--listen", "127.0.0.1:0", "--profiles-dir", file});
  EXPECT_EQ(regular.code, 2) << regular.err;
  EXPECT_THAT(regular.err, HasSubstr(absl::StrCat("profiles_dir: \"", file,
                                                  "\" is not a directory")));
}

}  // namespace
}  // namespace arachne
