// The `arachne` command line: plan, evaluate, profile show/calibrate,
// models, gpus, bench, train; and status, watch, drain, replan against a
// running arachne-controller. Kept out of main.cc so tests can run commands
// in process.
#ifndef ARACHNE_PLANNER_SERVICE_CLI_CLI_H_
#define ARACHNE_PLANNER_SERVICE_CLI_CLI_H_

#include <ostream>

#include "absl/status/status.h"

namespace arachne {

// Exit codes: 0 success, 2 bad input (the message names the field and
// value; also a model that fits on no plan), 1 internal error, 3 (plan)
// the search was stopped before it found any plan, by --budget,
// --max-evaluations or a busy --server: more of them, or a retry, may
// find one.
inline constexpr int kExitOk = 0;
inline constexpr int kExitInternal = 1;
inline constexpr int kExitBadInput = 2;
inline constexpr int kExitSearchStopped = 3;

int RunCli(int argc, const char* const* argv, std::ostream& out,
           std::ostream& err);

// Writes "error: <message>" to `err` and returns the exit code of `s`:
// kExitBadInput for the caller's mistakes (invalid argument, not found,
// failed precondition, out of range, already exists, permission denied),
// kExitInternal otherwise. Every subcommand fails through it.
int FailCommand(std::ostream& err, const absl::Status& s);

}  // namespace arachne

#endif  // ARACHNE_PLANNER_SERVICE_CLI_CLI_H_
