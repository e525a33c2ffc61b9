// Runs the `arachne` command in process for tests: arguments in, exit code
// and both output streams back.
#ifndef ARACHNE_TEST_CLI_CLI_RUNNER_H_
#define ARACHNE_TEST_CLI_CLI_RUNNER_H_

#include <sstream>
#include <string>
#include <vector>

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

}  // namespace arachne::testing

#endif  // ARACHNE_TEST_CLI_CLI_RUNNER_H_
