// Starting a server binary the way the end-to-end tests do: fork and exec
// it with stderr to a log file, then wait for the port it writes to its
// --port-file (the tests listen on port 0). Shared by the agent, controller
// and CLI tests.
#ifndef ARACHNE_TEST_PORT_FILE_PROCESS_H_
#define ARACHNE_TEST_PORT_FILE_PROCESS_H_

#include <signal.h>
#include <sys/prctl.h>
#include <sys/types.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cstdio>
#include <filesystem>
#include <fstream>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "absl/time/time.h"

namespace arachne::testing {

struct StartedProcess {
  pid_t pid = -1;
  int port = 0;
};

// Forks and execs `argv` (argv[0] the binary's path), its stderr into
// `log`, after removing `port_file`; returns the pid without waiting. Pair
// with AwaitPortFile: starting several processes before awaiting any lets
// them start side by side.
inline pid_t SpawnWithPortFile(std::vector<std::string> argv,
                               const std::string& log,
                               const std::string& port_file) {
  std::filesystem::remove(port_file);
  const pid_t test = getpid();
  const pid_t pid = fork();
  if (pid == 0) {
    // Dies with the test: a test that fails a CHECK runs no destructors,
    // and a server left behind would hold ctest's output pipe open.
    prctl(PR_SET_PDEATHSIG, SIGKILL);
    if (getppid() != test) _exit(127);
    FILE* f = freopen(log.c_str(), "w", stderr);
    (void)f;
    std::vector<char*> args;
    for (std::string& a : argv) args.push_back(a.data());
    args.push_back(nullptr);
    execv(args[0], args.data());
    _exit(127);
  }
  return pid;
}

// Waits up to `timeout` for a port in `port_file` from the process `pid`.
// Internal when the process exits before, DeadlineExceeded when it does not
// write it in time (the process is then killed); `what` names it in both,
// `log` is where its stderr went. On an error no process is left.
inline absl::StatusOr<StartedProcess> AwaitPortFile(
    pid_t pid, const std::string& log, const std::string& port_file,
    const std::string& what, absl::Duration timeout = absl::Seconds(30)) {
  StartedProcess p;
  p.pid = pid;
  const absl::Time deadline = absl::Now() + timeout;
  while (absl::Now() < deadline) {
    std::ifstream f(port_file);
    if (f >> p.port && p.port > 0) return p;
    if (waitpid(p.pid, nullptr, WNOHANG) == p.pid) {
      return absl::InternalError(absl::StrCat(what, " exited; see ", log));
    }
    absl::SleepFor(absl::Milliseconds(20));
  }
  kill(p.pid, SIGKILL);
  waitpid(p.pid, nullptr, 0);
  return absl::DeadlineExceededError(absl::StrCat(what, " did not start"));
}

// SpawnWithPortFile, then AwaitPortFile.
inline absl::StatusOr<StartedProcess> StartWithPortFile(
    std::vector<std::string> argv, const std::string& log,
    const std::string& port_file, const std::string& what,
    absl::Duration timeout = absl::Seconds(30)) {
  const pid_t pid = SpawnWithPortFile(std::move(argv), log, port_file);
  return AwaitPortFile(pid, log, port_file, what, timeout);
}

}  // namespace arachne::testing

#endif  // ARACHNE_TEST_PORT_FILE_PROCESS_H_
