// arachne-profile: `arachne profile measure`'s flags at top level
// (profile_measure.h). A binary of its own because timing layers needs
// LibTorch and `arachne` does not load it: `arachne profile measure ARGS`
// execs this binary beside it.
#include "planner_service/cli/standalone_command_main.h"
#include "planner_service/profiler/profile_measure.h"

int main(int argc, char** argv) {
  return arachne::RunStandaloneCommand<arachne::ProfileMeasureOptions>(
      argc, argv,
      "arachne profile measure: time one layer of a model per TP slice and "
      "micro-batch size on this machine and write measured profile entries "
      "(docs/profiler.md)",
      "arachne profile measure", &arachne::AddProfileMeasureFlags,
      &arachne::RunProfileMeasure);
}
