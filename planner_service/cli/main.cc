#include <iostream>

#include "glog/logging.h"
#include "planner_service/cli/cli.h"
#include "planner_service/policy/torch_policy.h"

int main(int argc, char** argv) {
  google::InitGoogleLogging(argv[0]);
  FLAGS_logtostderr = true;
  FLAGS_minloglevel = 1;  // warnings and up; the CLI prints its own output
  // `--planner learned` finds the shipped checkpoints (profiles/policies or
  // $ARACHNE_POLICIES_DIR), checked against the built-in profile data.
  arachne::RegisterTorchPolicy();
  return arachne::RunCli(argc, argv, std::cout, std::cerr);
}
