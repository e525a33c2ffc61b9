// A virtual GPU's pacing (worker_agent/engine/compute_pacer.h): a compute
// step is held to 1 / speed times the CPU time it used, so the sleep is
// what is left of that after the step's wall time; at speed 1 nothing
// waits.
#include "worker_agent/engine/compute_pacer.h"

#include "absl/time/time.h"
#include "gtest/gtest.h"

namespace arachne::agent {
namespace {

TEST(ComputePacer, AStepTakesItsCpuTimeOverTheSpeed) {
  const ComputePacer quarter(0.25);
  // 30 ms of CPU in 30 ms: 120 ms in all, 90 ms asleep.
  EXPECT_EQ(quarter.WaitAfter(absl::Milliseconds(30), absl::Milliseconds(30)),
            absl::Milliseconds(90));
  // The same step stretched to 50 ms by other processes on the core: the
  // stretch is not scaled again (120 ms in all).
  EXPECT_EQ(quarter.WaitAfter(absl::Milliseconds(30), absl::Milliseconds(50)),
            absl::Milliseconds(70));
  // Stretched past 1 / speed: no sleep.
  EXPECT_EQ(quarter.WaitAfter(absl::Milliseconds(30), absl::Milliseconds(200)),
            absl::ZeroDuration());
  const ComputePacer half(0.5);
  EXPECT_EQ(half.WaitAfter(absl::Seconds(1), absl::Seconds(1)),
            absl::Seconds(1));
}

TEST(ComputePacer, FullSpeedNeverWaitsNorReadsTheClocks) {
  const ComputePacer full(1.0);
  EXPECT_EQ(full.WaitAfter(absl::Seconds(5), absl::Seconds(1)),
            absl::ZeroDuration());
  EXPECT_EQ(full.Start().wall, absl::InfinitePast());
  EXPECT_EQ(full.Pace(full.Start()), absl::ZeroDuration());
}

TEST(ComputePacer, AStepThatOnlyWaitsIsNotPaced) {
  // A step that used no CPU (it only waited) is not slowed: the pacer
  // scales compute, not waiting.
  const ComputePacer slow(0.1);
  EXPECT_EQ(slow.WaitAfter(absl::ZeroDuration(), absl::Milliseconds(20)),
            absl::ZeroDuration());
}

TEST(ComputePacerDeathTest, ASpeedOutsideZeroToOneIsABrokenInvariant) {
  EXPECT_DEATH(ComputePacer(0.0), "0");
  EXPECT_DEATH(ComputePacer(1.5), "1.5");
}

}  // namespace
}  // namespace arachne::agent
