#include <iostream>

#include "glog/logging.h"
#include "planner_service/cli/cli.h"

int main(int argc, char** argv) {
  google::InitGoogleLogging(argv[0]);
  FLAGS_logtostderr = true;
  FLAGS_minloglevel = 1;  // warnings and up; the CLI prints its own output
  return arachne::RunCli(argc, argv, std::cout, std::cerr);
}
