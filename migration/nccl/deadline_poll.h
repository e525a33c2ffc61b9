// The one loop by which the NCCL transport waits for anything (communicator
// init, ncclGroupEnd in non-blocking mode, a round's stream, finalize): poll
// until done, and on a timeout or an error abort BEFORE returning. CUDA-free,
// so its guarantees are tested on CPU with a fake clock
// (test/migration/nccl_staging_test.cc).
//
// The clock is a tiny interface of its own rather than controller::Clock or
// the planner's Clock: the loop also sleeps, and a fake clock must advance
// when it does (neither of those can sleep, and migration must not depend on
// the controller).
#ifndef ARACHNE_MIGRATION_NCCL_DEADLINE_POLL_H_
#define ARACHNE_MIGRATION_NCCL_DEADLINE_POLL_H_

#include <string>

#include "absl/functional/function_ref.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/time/time.h"

namespace arachne::migration::nccl {

class PollClock {
 public:
  virtual ~PollClock() = default;
  virtual absl::Time Now() const = 0;
  virtual void Sleep(absl::Duration d) = 0;
};

// absl::Now and absl::SleepFor.
class RealPollClock final : public PollClock {
 public:
  absl::Time Now() const override;
  void Sleep(absl::Duration d) override;
};

struct PollSpec {
  // Names the operation in the error messages, e.g. "communicator init of
  // rank 1 of world size 2 (store prefix 'g7')".
  std::string what;
  absl::Time deadline;
  // The timeout the deadline came from, for the message.
  absl::Duration budget;
  // Sleep between polls (never past the deadline).
  absl::Duration interval = absl::Microseconds(50);
};

// Calls `poll` until it returns true (done), it fails, or the clock reaches
// spec.deadline; `poll` is called at least once, also when the deadline has
// already passed. Returns
//   - OkStatus when `poll` returned true; `abort` is not called;
//   - when `poll` failed with status S: calls `abort` once, then returns S's
//     code with message "<what>: <S's message>; aborted";
//   - when the deadline passed first: calls `abort` once, then returns
//     DeadlineExceeded "<what> did not finish within <budget>; aborted".
// `abort` runs exactly once on every failure and never on success, before
// this returns. If `abort` itself fails, its message is appended
// ("; abort failed: ...") and the code stays the one above.
absl::Status PollUntilDone(const PollSpec& spec,
                           absl::FunctionRef<absl::StatusOr<bool>()> poll,
                           absl::FunctionRef<absl::Status()> abort,
                           PollClock& clock);

}  // namespace arachne::migration::nccl

#endif  // ARACHNE_MIGRATION_NCCL_DEADLINE_POLL_H_
