#include <iostream>
#include <string>

#include "glog/logging.h"
#include "planner_service/cli/cli.h"
#include "planner_service/policy/torch_policy.h"

int main(int argc, char** argv) {
  google::InitGoogleLogging(argv[0]);
  FLAGS_logtostderr = true;
  FLAGS_minloglevel = 1;  // warnings and up; the CLI prints its own output
  // `--planner learned` finds the shipped checkpoints (profiles/policies or
  // $ARACHNE_POLICIES_DIR), checked against the profile data the command
  // plans with: the built-in data, or --profiles-dir's (a checkpoint trained
  // on other profiles is refused). The factory is registered before the
  // flags are parsed, so the directory is read from argv here.
  arachne::TorchPolicyOptions options;
  for (int i = 1; i < argc; ++i) {
    const std::string arg = argv[i];
    if (arg == "--profiles-dir" && i + 1 < argc) {
      options.profiles_dir = argv[i + 1];
    } else if (arg.rfind("--profiles-dir=", 0) == 0) {
      options.profiles_dir = arg.substr(std::string("--profiles-dir=").size());
    }
  }
  arachne::RegisterTorchPolicy(options);
  return arachne::RunCli(argc, argv, std::cout, std::cerr);
}
