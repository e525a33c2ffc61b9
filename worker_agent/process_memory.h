// The memory of this process and of the machine, as Linux reports it in
// /proc: what an engine on a CPU (a virtual GPU) reports as its memory in
// use and free, and how a switch's peak is measured (docs/migration.md,
// "Memory during a switch").
#ifndef ARACHNE_WORKER_AGENT_PROCESS_MEMORY_H_
#define ARACHNE_WORKER_AGENT_PROCESS_MEMORY_H_

#include <cstdint>

namespace arachne::agent {

// Resident set of this process (VmRSS), bytes; 0 when it cannot be read.
int64_t ResidentBytes();

// The peak resident set since the last ResetWindowPeak (VmHWM), bytes.
int64_t WindowPeakResidentBytes();

// The peak resident set since the process started, bytes: the largest
// window peak seen so far, over every window.
int64_t PeakResidentBytes();

// Starts a new window: the kernel's peak (VmHWM) is set back to the current
// resident set (/proc/self/clear_refs, "5"); the process's peak so far is
// kept for PeakResidentBytes. A switch starts one at Prepare, so its peak
// is its own, not that of training before it.
void ResetWindowPeak();

// MemAvailable of /proc/meminfo, bytes; 0 when it cannot be read.
int64_t AvailableBytes();

}  // namespace arachne::agent

#endif  // ARACHNE_WORKER_AGENT_PROCESS_MEMORY_H_
