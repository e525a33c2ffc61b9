// What `arachne status` and `arachne watch` print: a controller's status
// (GetStatusResponse) as tables or JSON, and its events (Event) one line
// each, readable or as JSON lines. Pure functions of the messages, so tests
// render hand-made statuses without a controller.
#ifndef ARACHNE_PLANNER_SERVICE_CLI_CONTROLLER_STATUS_TEXT_H_
#define ARACHNE_PLANNER_SERVICE_CLI_CONTROLLER_STATUS_TEXT_H_

#include <string>

#include "absl/time/time.h"
#include "arachne/v1/controller.pb.h"

namespace arachne {

// The job line (generation, phase, iteration, loss, tokens/s, error), the
// members, the current plan (per template: replicas, micro-batches; per
// stage: GPU type, TP, layers, memory, nodes), its measured iteration time
// and peak memory beside the raw and corrected predictions with the
// corrections in force and every recorded generation, the last switch's
// timings and the recent decisions with their numbers (and how many older
// decisions and generations the controller left out to keep the status
// within its size budget). `address` names the controller
// in the first line. Times print in `zone`.
std::string RenderControllerStatus(const v1::GetStatusResponse& status,
                                   const std::string& address,
                                   absl::TimeZone zone);

// The status as one JSON object: the message's JSON mapping with the
// proto field names and every field present (zeros included).
std::string ControllerStatusJson(const v1::GetStatusResponse& status);

// One event on one line, no newline: time, sequence, kind, generation and
// the message; a decision adds its numbers, an iteration its loss.
std::string RenderEvent(const v1::Event& event, absl::TimeZone zone);

// One event as a single-line JSON object (JSON mapping, proto field names).
std::string EventJson(const v1::Event& event);

// One decision's numbers: "old 376.935 -> new 605.250 it/s (raw), gain
// 1357.8 s over 3600 s vs downtime 2.001 s (migration 0.001 + fixed
// 2.000)"; decided on corrected throughputs, "(raw)" is "corrected (raw
// A -> B it/s; <corrections>)".
std::string DecisionNumbers(const v1::Decision& decision);

}  // namespace arachne

#endif  // ARACHNE_PLANNER_SERVICE_CLI_CONTROLLER_STATUS_TEXT_H_
