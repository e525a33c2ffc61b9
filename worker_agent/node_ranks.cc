#include "worker_agent/node_ranks.h"

namespace arachne::agent {

const char* PhaseName(Phase p) {
  switch (p) {
    case Phase::kIdle:
      return "idle";
    case Phase::kPrepared:
      return "prepared";
    case Phase::kPaused:
      return "paused";
    case Phase::kMigrated1:
      return "migrated-1";
    case Phase::kMigrated2:
      return "migrated-2";
    case Phase::kRebuilt:
      return "rebuilt";
    case Phase::kRunning:
      return "running";
    case Phase::kStopped:
      return "stopped";
    case Phase::kFailed:
      return "failed";
  }
  return "?";
}

}  // namespace arachne::agent
