// arachne-profile: `arachne profile measure`'s flags at top level
// (profile_measure.h). A binary of its own because timing layers needs
// LibTorch and `arachne` does not load it: `arachne profile measure ARGS`
// execs this binary beside it.
#include <iostream>

#include "CLI/CLI.hpp"
#include "glog/logging.h"
#include "planner_service/profiler/profile_measure.h"

int main(int argc, char** argv) {
  google::InitGoogleLogging(argv[0]);
  FLAGS_logtostderr = true;
  FLAGS_minloglevel = 1;
  CLI::App app{
      "arachne profile measure: time one layer of a model per TP slice and "
      "micro-batch size on this machine and write measured profile entries "
      "(docs/profiler.md)",
      "arachne profile measure"};
  arachne::ProfileMeasureOptions options;
  arachne::AddProfileMeasureFlags(&app, &options);
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
  return arachne::RunProfileMeasure(options, std::cout, std::cerr);
}
