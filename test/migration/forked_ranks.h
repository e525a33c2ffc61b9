// Runs the ranks of a test as forked processes, the way Gloo's own tests do:
// each child runs the body for its rank and reports its Status through a
// file; the parent waits for all of them (killing the rest at the deadline).
// Children exit with _exit, so no test state is torn down twice.
#ifndef ARACHNE_TEST_MIGRATION_FORKED_RANKS_H_
#define ARACHNE_TEST_MIGRATION_FORKED_RANKS_H_

#include <signal.h>
#include <stdlib.h>
#include <sys/wait.h>
#include <unistd.h>

#include <fstream>
#include <functional>
#include <sstream>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "absl/time/time.h"
#include "gtest/gtest.h"

namespace arachne::migration::testing {

// A fresh directory under the test's temp dir (for a FileRendezvousStore).
inline std::string MakeTempDir() {
  std::string tmpl = ::testing::TempDir() + "/arachne_migration_XXXXXX";
  char* dir = mkdtemp(tmpl.data());
  EXPECT_NE(dir, nullptr);
  return tmpl;
}

// body(rank) in `n` processes; the Status of each rank, in rank order.
// A rank that crashed or missed `deadline` reports Internal/DeadlineExceeded.
inline std::vector<absl::Status> RunForkedRanks(
    int n, const std::function<absl::Status(int)>& body,
    absl::Duration deadline = absl::Seconds(30)) {
  const std::string dir = MakeTempDir();
  std::vector<pid_t> pids;
  for (int r = 0; r < n; ++r) {
    const pid_t pid = fork();
    if (pid == 0) {
      absl::Status s = body(r);
      std::ofstream(absl::StrCat(dir, "/status.", r))
          << static_cast<int>(s.code()) << "\n"
          << s.message();
      _exit(0);
    }
    pids.push_back(pid);
  }
  std::vector<absl::Status> result(n, absl::InternalError("rank crashed"));
  std::vector<bool> done(n, false);
  const absl::Time end = absl::Now() + deadline;
  int left = n;
  while (left > 0) {
    for (int r = 0; r < n; ++r) {
      if (done[r]) continue;
      int wstatus = 0;
      if (waitpid(pids[r], &wstatus, WNOHANG) == pids[r]) {
        done[r] = true;
        --left;
        std::ifstream in(absl::StrCat(dir, "/status.", r));
        int code;
        if (in >> code) {
          std::stringstream msg;
          in.get();
          msg << in.rdbuf();
          result[r] = absl::Status(static_cast<absl::StatusCode>(code),
                                   msg.str());
        }
      }
    }
    if (left > 0 && absl::Now() > end) {
      for (int r = 0; r < n; ++r) {
        if (!done[r]) {
          kill(pids[r], SIGKILL);
          waitpid(pids[r], nullptr, 0);
          result[r] = absl::DeadlineExceededError("rank did not finish");
        }
      }
      break;
    }
    if (left > 0) absl::SleepFor(absl::Milliseconds(2));
  }
  return result;
}

}  // namespace arachne::migration::testing

#endif  // ARACHNE_TEST_MIGRATION_FORKED_RANKS_H_
