// How a file system error met reading or writing a checkpoint becomes a
// status code, in one place for the agent's path check (agent_config.h,
// CheckCheckpointDir) and the shard writer (checkpoint.h). Header-only so
// that both libraries use it without linking each other.
//
// FailedPrecondition for the permanent errors, which a retry does not cure
// and an operator must: permission denied, a read-only file system, a path
// component that is not a directory (or a directory where a file must go),
// no space or quota left, a name too long, a symlink loop. Unavailable for
// the rest (I/O errors, interrupted or busy resources, ...), which a retry
// may cure. Why FailedPrecondition and not PermissionDenied:
// docs/errors.md, "Checkpoints".
#ifndef ARACHNE_WORKER_AGENT_CHECKPOINT_IO_H_
#define ARACHNE_WORKER_AGENT_CHECKPOINT_IO_H_

#include <cerrno>
#include <system_error>

#include "absl/status/status.h"

namespace arachne::agent {

inline absl::StatusCode CheckpointIoCode(const std::error_code& ec) {
  if (ec.category() != std::generic_category() &&
      ec.category() != std::system_category()) {
    return absl::StatusCode::kUnavailable;
  }
  switch (ec.value()) {
    case EACCES:
    case EPERM:
    case EROFS:
    case ENOTDIR:
    case EISDIR:
    case EEXIST:
    case ENOSPC:
    case EDQUOT:
    case ENAMETOOLONG:
    case ELOOP:
    case EFBIG:
      return absl::StatusCode::kFailedPrecondition;
    default:
      return absl::StatusCode::kUnavailable;
  }
}

inline absl::StatusCode CheckpointIoCode(int errno_value) {
  return CheckpointIoCode(std::error_code(errno_value, std::generic_category()));
}

}  // namespace arachne::agent

#endif  // ARACHNE_WORKER_AGENT_CHECKPOINT_IO_H_
