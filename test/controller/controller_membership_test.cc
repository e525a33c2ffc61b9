// Membership: leases, join coalescing, announced joins, drains and the
// back-off of flapping nodes, on a fake clock.
#include "controller/membership.h"

#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace arachne::controller {
namespace {

using ::testing::HasSubstr;

MemberSpec Spec(const std::string& node, int gpus = 2,
                const std::string& address = "") {
  return MemberSpec{.node = node,
                    .gpu_type = "A6000",
                    .gpus = gpus,
                    .memory_gib = 48,
                    .address = address.empty() ? node + ":1" : address,
                    .incarnation = node + "-1"};
}

MembershipConfig Config() {
  MembershipConfig c;
  c.lease = absl::Seconds(10);
  c.join_window = absl::Seconds(2);
  c.flap_leaves = 3;
  c.flap_window = absl::Seconds(300);
  c.flap_backoff = absl::Seconds(30);
  return c;
}

TEST(Membership, JoinsInsideTheWindowAreOneReplan) {
  FakeClock clock;
  Membership m(Config(), &clock);
  ASSERT_TRUE(*m.Register(Spec("a")));
  EXPECT_FALSE(m.ReplanDue());
  clock.Advance(absl::Seconds(1));
  ASSERT_TRUE(*m.Register(Spec("b")));
  EXPECT_FALSE(m.ReplanDue());
  clock.Advance(absl::Seconds(1));  // 2 s since the first join
  EXPECT_TRUE(m.ReplanDue());
  std::vector<MembershipChange> pending = m.TakePending();
  ASSERT_EQ(pending.size(), 2u);
  EXPECT_EQ(pending[0].node, "a");
  EXPECT_EQ(pending[1].node, "b");
  EXPECT_FALSE(m.ReplanDue());
  EXPECT_EQ(m.SchedulableGpus(), 4);
}

TEST(Membership, ReRegisteringTheSameSpecRenewsTheLeaseWithoutAJoin) {
  FakeClock clock;
  Membership m(Config(), &clock);
  ASSERT_TRUE(*m.Register(Spec("a")));
  m.TakePending();
  clock.Advance(absl::Seconds(8));
  EXPECT_FALSE(*m.Register(Spec("a")));
  clock.Advance(absl::Seconds(8));  // 16 s after the first registration
  m.Tick();
  EXPECT_TRUE(m.Find("a").has_value());
  EXPECT_FALSE(m.HasPending());
  // Other GPUs: a leave and a join.
  EXPECT_TRUE(*m.Register(Spec("a", 4)));
  std::vector<MembershipChange> p = m.TakePending();
  ASSERT_EQ(p.size(), 2u);
  EXPECT_EQ(p[0].kind, ChangeKind::kLeave);
  EXPECT_EQ(p[1].kind, ChangeKind::kJoin);
}

TEST(Membership, AnExpiredLeaseIsALeaveDueAtOnce) {
  FakeClock clock;
  Membership m(Config(), &clock);
  ASSERT_TRUE(m.Register(Spec("a")).ok());
  ASSERT_TRUE(m.Register(Spec("b")).ok());
  clock.Advance(absl::Seconds(5));
  m.TakePending();
  m.Tick();  // the joins' log entries
  ASSERT_TRUE(m.Heartbeat("a", "a-1").ok());
  clock.Advance(absl::Seconds(6));  // b's lease (10 s) ran out, a's did not
  std::vector<MembershipChange> log = m.Tick();
  ASSERT_EQ(log.size(), 1u);
  EXPECT_EQ(log[0].kind, ChangeKind::kLeave);
  EXPECT_EQ(log[0].node, "b");
  EXPECT_THAT(log[0].detail, HasSubstr("lease of 10s ran out"));
  EXPECT_TRUE(m.ReplanDue());  // no window for a leave
  absl::Status s = m.Heartbeat("b", "b-1");
  EXPECT_EQ(s.code(), absl::StatusCode::kNotFound);
  EXPECT_THAT(s.message(), HasSubstr("\"b\" is not registered"));
}

TEST(Membership, AReplanWaitsForAnnouncedNodesUntilTheirWaitRunsOut) {
  FakeClock clock;
  Membership m(Config(), &clock);
  ASSERT_TRUE(m.AnnounceJoin({"b", "c"}, absl::Seconds(10)).ok());
  ASSERT_TRUE(m.Register(Spec("b")).ok());
  clock.Advance(absl::Seconds(3));
  EXPECT_FALSE(m.ReplanDue());  // window passed, c still awaited
  clock.Advance(absl::Seconds(8));
  EXPECT_TRUE(m.ReplanDue());  // c's wait ran out
  m.TakePending();
  ASSERT_TRUE(m.AnnounceJoin({"d"}, absl::Seconds(10)).ok());
  ASSERT_TRUE(m.Register(Spec("d")).ok());
  clock.Advance(absl::Seconds(2));
  EXPECT_TRUE(m.ReplanDue());  // all announced arrived, window passed
}

TEST(Membership, ADrainingNodeStaysAMemberButIsNotSchedulable) {
  FakeClock clock;
  Membership m(Config(), &clock);
  ASSERT_TRUE(m.Register(Spec("a")).ok());
  ASSERT_TRUE(m.Register(Spec("b")).ok());
  m.TakePending();
  ASSERT_TRUE(m.Drain("b", absl::Seconds(30)).ok());
  EXPECT_TRUE(m.ReplanDue());
  EXPECT_EQ(m.Members().size(), 2u);
  ASSERT_EQ(m.Schedulable().size(), 1u);
  EXPECT_EQ(m.Schedulable()[0].spec.node, "a");
  EXPECT_EQ(m.Drain("x", absl::Seconds(1)).code(), absl::StatusCode::kNotFound);
  absl::Status s = m.Drain("a", absl::ZeroDuration());
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(s.message(), HasSubstr("deadline_s: must be > 0, got 0"));
}

TEST(Membership, ADrainDeadlinePassedIsALeave) {
  FakeClock clock;
  Membership m(Config(), &clock);
  ASSERT_TRUE(*m.Register(Spec("a")));
  m.TakePending();
  ASSERT_TRUE(m.Drain("a", absl::Seconds(5)).ok());
  m.TakePending();
  m.Tick();  // the join and the drain, logged
  clock.Advance(absl::Seconds(4));
  ASSERT_TRUE(m.Heartbeat("a", "a-1").ok());  // still a member before the deadline
  clock.Advance(absl::Seconds(1));
  std::vector<MembershipChange> log = m.Tick();
  ASSERT_EQ(log.size(), 1u);
  EXPECT_EQ(log[0].kind, ChangeKind::kLeave);
  EXPECT_EQ(log[0].node, "a");
  EXPECT_THAT(log[0].detail, HasSubstr("drain deadline passed"));
  EXPECT_FALSE(m.Find("a").has_value());
}

TEST(Membership, AReleasedNodesHeartbeatIsRefusedUntilItRegistersAgain) {
  FakeClock clock;
  Membership m(Config(), &clock);
  ASSERT_TRUE(*m.Register(Spec("a")));
  ASSERT_TRUE(*m.Register(Spec("c")));
  // Only a draining member is released (the caller's view may be stale).
  EXPECT_FALSE(m.Remove("c"));
  EXPECT_TRUE(m.Find("c").has_value());
  ASSERT_TRUE(m.Drain("a", absl::Seconds(30)).ok());
  EXPECT_TRUE(m.Remove("a"));
  EXPECT_FALSE(m.Remove("a"));
  absl::Status s = m.Heartbeat("a", "a-1");
  EXPECT_EQ(s.code(), absl::StatusCode::kFailedPrecondition) << s;
  EXPECT_THAT(s.message(), HasSubstr("was drained and released"));
  ASSERT_TRUE(*m.Register(Spec("a")));  // an agent started again
  EXPECT_TRUE(m.Heartbeat("a", "a-1").ok());
  EXPECT_EQ(m.Heartbeat("b", "b-1").code(), absl::StatusCode::kNotFound);
}

TEST(Membership, AFlappingNodeIsBackedOffWithGrowingBackoff) {
  FakeClock clock;
  Membership m(Config(), &clock);
  for (int i = 0; i < 3; ++i) {
    ASSERT_TRUE(m.Register(Spec("f")).ok()) << i;
    clock.Advance(absl::Seconds(11));  // lease runs out: a leave
    m.Tick();
  }
  absl::StatusOr<bool> r = m.Register(Spec("f"));
  EXPECT_EQ(r.status().code(), absl::StatusCode::kUnavailable);
  EXPECT_THAT(r.status().message(), HasSubstr("node f: backed off for flapping"));
  clock.Advance(absl::Seconds(30));  // the 30 s back-off after the third leave
  ASSERT_TRUE(m.Register(Spec("f")).ok());
  clock.Advance(absl::Seconds(11));
  m.Tick();  // a fourth leave: 60 s now
  clock.Advance(absl::Seconds(31));  // inside the doubled 60 s back-off
  EXPECT_FALSE(m.Register(Spec("f")).ok());
  clock.Advance(absl::Seconds(30));
  EXPECT_TRUE(m.Register(Spec("f")).ok());
}

TEST(Membership, BadRegistrationsNameTheField) {
  FakeClock clock;
  Membership m(Config(), &clock);
  MemberSpec s = Spec("a");
  s.gpus = 0;
  EXPECT_THAT(m.Register(s).status().message(), HasSubstr("gpus: must be >= 1, got 0"));
  s = Spec("");
  EXPECT_THAT(m.Register(s).status().message(), HasSubstr("node: required"));
  MemberSpec t{.node = "a", .gpu_type = "A6000", .gpus = 1};
  EXPECT_THAT(m.Register(t).status().message(), HasSubstr("address: required"));
  EXPECT_TRUE(m.Members().empty());
  EXPECT_EQ(m.AnnounceJoin({}, absl::Seconds(1)).code(),
            absl::StatusCode::kInvalidArgument);
}

// One node name, one agent process: while a's lease is live another
// process (another incarnation, or the same name at another address) is
// refused, and the refusal names who holds the name and since when; the
// real agent's heartbeats do not renew anyone else's lease.
TEST(Membership, ALiveNodeCannotBeTakenOverByAnotherProcess) {
  FakeClock clock;
  Membership m(Config(), &clock);
  ASSERT_TRUE(*m.Register(Spec("a")));
  m.TakePending();
  clock.Advance(absl::Seconds(3));
  MemberSpec impostor = Spec("a");
  impostor.incarnation = "other";
  absl::StatusOr<bool> r = m.Register(impostor);
  EXPECT_EQ(r.status().code(), absl::StatusCode::kAlreadyExists);
  EXPECT_EQ(r.status().message(),
            "node: \"a\" is a live member, the agent at a:1 (incarnation a-1) "
            "since 2023-11-14T22:13:20Z; the agent at a:1 (incarnation other) "
            "may register as it once that lease runs out (at "
            "2023-11-14T22:13:30Z unless renewed) or the node is drained");
  MemberSpec moved = Spec("a", 2, "elsewhere:1");
  EXPECT_EQ(m.Register(moved).status().code(), absl::StatusCode::kAlreadyExists);
  EXPECT_FALSE(m.HasPending());
  EXPECT_EQ(m.Find("a")->spec.incarnation, "a-1");
  // The impostor's heartbeat renews nothing.
  absl::Status h = m.Heartbeat("a", "other");
  EXPECT_EQ(h.code(), absl::StatusCode::kNotFound);
  EXPECT_EQ(h.message(),
            "node: \"a\" has no member of incarnation other (it is the agent "
            "at a:1, incarnation a-1); Register again");
  EXPECT_TRUE(m.Heartbeat("a", "a-1").ok());
  // Once a's lease ran out (the agent stopped), the name is free: the next
  // process joins, and the old one's heartbeats are refused from then on.
  clock.Advance(absl::Seconds(11));
  m.Tick();
  ASSERT_TRUE(*m.Register(impostor));
  EXPECT_EQ(m.Find("a")->spec.incarnation, "other");
  EXPECT_EQ(m.Find("a")->since, clock.Now());
  EXPECT_EQ(m.Heartbeat("a", "a-1").code(), absl::StatusCode::kNotFound);
  std::vector<MembershipChange> p = m.TakePending();
  ASSERT_EQ(p.size(), 2u);
  EXPECT_EQ(p[0].kind, ChangeKind::kLeave);
  EXPECT_EQ(p[1].kind, ChangeKind::kJoin);
}

TEST(Membership, ADrainedAndReleasedNodeIsFreeForANewProcess) {
  FakeClock clock;
  Membership m(Config(), &clock);
  ASSERT_TRUE(*m.Register(Spec("a")));
  MemberSpec next = Spec("a");
  next.incarnation = "a-2";
  ASSERT_TRUE(m.Drain("a", absl::Seconds(30)).ok());
  // Draining is not released yet: the drained agent still holds its state.
  EXPECT_EQ(m.Register(next).status().code(), absl::StatusCode::kAlreadyExists);
  ASSERT_TRUE(m.Remove("a"));
  EXPECT_TRUE(*m.Register(next));
  EXPECT_TRUE(m.Heartbeat("a", "a-2").ok());
}

// A member read back from a store that kept no incarnation (an older
// controller's) is taken by the first incarnation heard at its address.
TEST(Membership, ARestoredMemberWithoutIncarnationTakesTheFirstHeard) {
  FakeClock clock;
  Membership m(Config(), &clock);
  Member old;
  old.spec = Spec("a");
  old.spec.incarnation = "";
  m.Restore({old});
  EXPECT_TRUE(m.Heartbeat("a", "a-7").ok());
  EXPECT_EQ(m.Find("a")->spec.incarnation, "a-7");
  EXPECT_EQ(m.Heartbeat("a", "a-8").code(), absl::StatusCode::kNotFound);
  Member old_b;
  old_b.spec = Spec("b");
  old_b.spec.incarnation = "";
  m.Restore({old_b});
  MemberSpec b = Spec("b");
  EXPECT_FALSE(*m.Register(b));  // the same agent: a renewal, not a join
  EXPECT_EQ(m.Find("b")->spec.incarnation, "b-1");
  EXPECT_FALSE(m.HasPending());
}

TEST(Membership, ARegistrationWithoutIncarnationIsRefused) {
  FakeClock clock;
  Membership m(Config(), &clock);
  MemberSpec s = Spec("a");
  s.incarnation = "";
  EXPECT_EQ(m.Register(s).status().message(), "incarnation: required, got none");
  EXPECT_TRUE(m.Members().empty());
}

}  // namespace
}  // namespace arachne::controller
