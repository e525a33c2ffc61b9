// Runs the `arachne` command for tests: in process (Cli: arguments in, exit
// code and both output streams back), or as a process (Shell: a command
// line, for the binaries `arachne` execs), and a fresh scratch directory.
#ifndef ARACHNE_TEST_CLI_CLI_RUNNER_H_
#define ARACHNE_TEST_CLI_CLI_RUNNER_H_

#include <sys/wait.h>

#include <cstdio>
#include <filesystem>
#include <sstream>
#include <string>
#include <vector>

#include "gtest/gtest.h"

#include "planner_service/cli/cli.h"

namespace arachne::testing {

struct CliRun {
  int code;
  std::string out, err;
};

// `args` without the program name.
inline CliRun Cli(std::vector<std::string> args) {
  args.insert(args.begin(), "arachne");
  std::vector<const char*> argv;
  for (const std::string& a : args) argv.push_back(a.c_str());
  std::ostringstream out, err;
  const int code = RunCli(static_cast<int>(argv.size()), argv.data(), out, err);
  return {code, out.str(), err.str()};
}

struct ShellRun {
  int code = -1;    // exit status, -1 when it did not exit normally
  std::string out;  // stdout and stderr
};

// `command` through /bin/sh, stderr merged into stdout.
inline ShellRun Shell(const std::string& command) {
  ShellRun r;
  FILE* p = popen((command + " 2>&1").c_str(), "r");
  if (p == nullptr) return r;
  char buf[4096];
  size_t n;
  while ((n = fread(buf, 1, sizeof buf, p)) > 0) r.out.append(buf, n);
  const int status = pclose(p);
  r.code = WIFEXITED(status) ? WEXITSTATUS(status) : -1;
  return r;
}

// An empty directory `name` under the test's temporary directory.
inline std::filesystem::path FreshDir(const std::string& name) {
  auto dir = std::filesystem::path(::testing::TempDir()) / name;
  std::filesystem::remove_all(dir);
  std::filesystem::create_directories(dir);
  return dir;
}

}  // namespace arachne::testing

#endif  // ARACHNE_TEST_CLI_CLI_RUNNER_H_
