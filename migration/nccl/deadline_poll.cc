#include "migration/nccl/deadline_poll.h"

#include <algorithm>

#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"

namespace arachne::migration::nccl {
namespace {

absl::Status AbortThen(absl::Status failure,
                       absl::FunctionRef<absl::Status()> abort) {
  const absl::Status a = abort();
  if (a.ok()) return failure;
  return absl::Status(failure.code(), absl::StrCat(failure.message(),
                                                   "; abort failed: ",
                                                   a.message()));
}

}  // namespace

absl::Time RealPollClock::Now() const { return absl::Now(); }
void RealPollClock::Sleep(absl::Duration d) { absl::SleepFor(d); }

absl::Status PollUntilDone(const PollSpec& spec,
                           absl::FunctionRef<absl::StatusOr<bool>()> poll,
                           absl::FunctionRef<absl::Status()> abort,
                           PollClock& clock) {
  while (true) {
    const absl::StatusOr<bool> done = poll();
    if (!done.ok()) {
      return AbortThen(
          absl::Status(done.status().code(),
                       absl::StrCat(spec.what, ": ", done.status().message(),
                                    "; aborted")),
          abort);
    }
    if (*done) return absl::OkStatus();
    const absl::Time now = clock.Now();
    if (now >= spec.deadline) {
      return AbortThen(absl::DeadlineExceededError(absl::StrCat(
                           spec.what, " did not finish within ",
                           absl::FormatDuration(spec.budget), "; aborted")),
                       abort);
    }
    clock.Sleep(std::min(spec.interval, spec.deadline - now));
  }
}

}  // namespace arachne::migration::nccl
