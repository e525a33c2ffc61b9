// `arachne status` as text: a status the controller cut to fit its size
// budget (GetStatusResponse.decisions_omitted / generations_omitted) says
// how much it left out, so an operator knows the list is not whole.
#include "planner_service/cli/controller_status_text.h"

#include <string>

#include "absl/time/time.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace arachne {
namespace {

using ::testing::HasSubstr;
using ::testing::Not;

TEST(ControllerStatusText, SaysHowManyDecisionsAndGenerationsWereLeftOut) {
  v1::GetStatusResponse s;
  s.set_generation(3);
  v1::Decision* d = s.add_decisions();
  d->set_id(40);
  d->set_verdict("keep");
  d->set_trigger("join c");
  // The generations print under the plan's measurements.
  s.mutable_plan()->add_templates()->set_replicas(1);
  s.add_generations()->set_generation(3);
  s.set_decisions_omitted(39);
  s.set_generations_omitted(1);
  const std::string out =
      RenderControllerStatus(s, "127.0.0.1:7070", absl::UTCTimeZone());
  EXPECT_THAT(out, HasSubstr("decisions: 1 (most recent first)\n"
                             "  (39 older decisions left out of this status "
                             "to keep it within its size budget)\n"));
  EXPECT_THAT(out, HasSubstr("  (1 older generation left out of this status "
                             "to keep it within its size budget)\n"));
}

TEST(ControllerStatusText, AWholeStatusSaysNothingWasLeftOut) {
  v1::GetStatusResponse s;
  s.add_decisions()->set_id(1);
  const std::string out =
      RenderControllerStatus(s, "127.0.0.1:7070", absl::UTCTimeZone());
  EXPECT_THAT(out, HasSubstr("decisions: 1 (most recent first)\n"));
  EXPECT_THAT(out, Not(HasSubstr("left out")));
}

}  // namespace
}  // namespace arachne
