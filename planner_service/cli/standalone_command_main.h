// The main() of a command that runs as a binary of its own beside `arachne`
// (arachne-train, arachne-profile: they need LibTorch, which `arachne` does
// not load, so `arachne train|profile measure ARGS` execs them): logging
// set up as the CLI's, the command's flags at top level, help on -h, exit 2
// with the parse error otherwise. Header-only, so each binary links only
// its own command.
#ifndef ARACHNE_PLANNER_SERVICE_CLI_STANDALONE_COMMAND_MAIN_H_
#define ARACHNE_PLANNER_SERVICE_CLI_STANDALONE_COMMAND_MAIN_H_

#include <iostream>
#include <string>

#include "CLI/CLI.hpp"
#include "glog/logging.h"

namespace arachne {

template <typename Options>
int RunStandaloneCommand(int argc, char** argv, const std::string& description,
                         const std::string& name,
                         void (*add_flags)(CLI::App*, Options*),
                         int (*run)(const Options&, std::ostream&,
                                    std::ostream&)) {
  google::InitGoogleLogging(argv[0]);
  FLAGS_logtostderr = true;
  FLAGS_minloglevel = 1;  // warnings and up; the command prints its output
  CLI::App app{description, name};
  Options options;
  add_flags(&app, &options);
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
  return run(options, std::cout, std::cerr);
}

}  // namespace arachne

#endif  // ARACHNE_PLANNER_SERVICE_CLI_STANDALONE_COMMAND_MAIN_H_
