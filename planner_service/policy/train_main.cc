// arachne-train: `arachne train`'s flags at top level (train_command.h).
// A binary of its own because training needs LibTorch and `arachne` does
// not load it: `arachne train ARGS` execs this binary beside it.
#include "planner_service/cli/standalone_command_main.h"
#include "planner_service/policy/train_command.h"

int main(int argc, char** argv) {
  return arachne::RunStandaloneCommand<arachne::TrainOptions>(
      argc, argv,
      "arachne train: train a model's learned policy (GRPO, "
      "docs/learned-policy.md)",
      "arachne train", &arachne::AddTrainFlags, &arachne::RunTrainCommand);
}
