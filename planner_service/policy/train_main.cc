// arachne-train: `arachne train`'s flags at top level (train_command.h).
// A binary of its own because training needs LibTorch and `arachne` does
// not load it: `arachne train ARGS` execs this binary beside it.
#include <iostream>
#include <sstream>

#include "CLI/CLI.hpp"
#include "glog/logging.h"
#include "planner_service/policy/train_command.h"

int main(int argc, char** argv) {
  google::InitGoogleLogging(argv[0]);
  FLAGS_logtostderr = true;
  FLAGS_minloglevel = 1;
  CLI::App app{
      "arachne train: train a model's learned policy (GRPO, "
      "docs/learned-policy.md)",
      "arachne train"};
  arachne::TrainOptions options;
  arachne::AddTrainFlags(&app, &options);
  try {
    app.parse(argc, argv);
  } catch (const CLI::ParseError& e) {
    if (e.get_exit_code() == 0) {
      std::cout << app.help();
      return 0;
    }
    std::cerr << "error: " << e.what() << "\n";
    return 2;
  }
  return arachne::RunTrainCommand(options, std::cout, std::cerr);
}
