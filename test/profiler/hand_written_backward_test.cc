// The profiler's hand-written backwards (which keep what fused kernels
// keep, so activation bytes are measured as Megatron's) compute the same
// gradients as autograd over the plain ops they replace.
#include "gtest/gtest.h"
#include "planner_service/profiler/layer_timer.h"

namespace arachne {
namespace {

TEST(HandWrittenBackwardTest, MatchesAutogradInFp64) {
  const absl::Status s = CheckHandWrittenBackwards();
  EXPECT_TRUE(s.ok()) << s;
}

}  // namespace
}  // namespace arachne
