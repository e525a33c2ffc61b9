// A virtual GPU slower than the CPU rank that stands in for it
// (NodeGpus::virtual_gpu_speed): each compute step (a micro-batch's forward
// or backward, the optimizer step) is held to 1 / speed times the CPU time
// the rank's thread spent in it; the rank sleeps out the rest. The CPU time,
// not the wall time, is what is scaled, so a step stretched by other
// processes on the same cores is not stretched again: ranks sharing a
// machine's cores run as devices of their own speeds as long as their
// speeds add up to fewer cores than the machine has. The speed a plan sees
// is then the profiled one (a CPU profile's times over the speed;
// scripts/demo). Communication is not slowed: it is the network's, not the
// device's.
#ifndef ARACHNE_WORKER_AGENT_ENGINE_COMPUTE_PACER_H_
#define ARACHNE_WORKER_AGENT_ENGINE_COMPUTE_PACER_H_

#include <time.h>

#include "absl/time/clock.h"
#include "absl/time/time.h"
#include "glog/logging.h"

namespace arachne::agent {

class ComputePacer {
 public:
  // Where a compute step started: wall clock and the thread's CPU time.
  struct Mark {
    absl::Time wall = absl::InfinitePast();
    absl::Duration cpu;
  };

  // `speed` in (0, 1] (CHECK: the agent and the engine environment refuse
  // anything else with an error naming the setting).
  explicit ComputePacer(double speed) : speed_(speed) {
    CHECK(speed > 0 && speed <= 1) << speed;
  }

  // The sleep after a step that used `cpu` of the thread's CPU time and
  // took `elapsed` of wall time: what is left of cpu / speed, or nothing.
  absl::Duration WaitAfter(absl::Duration cpu, absl::Duration elapsed) const {
    if (speed_ == 1) return absl::ZeroDuration();
    const absl::Duration wait = cpu / speed_ - elapsed;
    return wait > absl::ZeroDuration() ? wait : absl::ZeroDuration();
  }

  // The start of a compute step (what Pace measures from); at speed 1 no
  // clock is read.
  Mark Start() const {
    if (speed_ == 1) return Mark{};
    return Mark{absl::Now(), ThreadCpuTime()};
  }
  // Sleeps WaitAfter(the step since `start`); returns the sleep.
  absl::Duration Pace(const Mark& start) const {
    if (speed_ == 1) return absl::ZeroDuration();
    const absl::Duration wait =
        WaitAfter(ThreadCpuTime() - start.cpu, absl::Now() - start.wall);
    absl::SleepFor(wait);
    return wait;
  }

 private:
  static absl::Duration ThreadCpuTime() {
    timespec ts;
    CHECK_EQ(clock_gettime(CLOCK_THREAD_CPUTIME_ID, &ts), 0);
    return absl::DurationFromTimespec(ts);
  }

  double speed_;
};

}  // namespace arachne::agent

#endif  // ARACHNE_WORKER_AGENT_ENGINE_COMPUTE_PACER_H_
