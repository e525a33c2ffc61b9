// The job's membership (docs/controller.md): the agents that
// registered, each under a lease that Heartbeat renews (a lease that runs
// out is an ungraceful leave), the joins a scheduler announced, and the
// nodes draining toward a deadline. It also decides *when* a change is
// planned for: leaves, drains and requested replans at once; joins once the
// join window since the first of them has passed (so that joins arriving
// together cost one replan), and not before announced nodes arrived or their
// wait ran out. A node that leaves too often is backed off.
//
// Pure logic over an injected clock: no gRPC, no threads; thread-safe.
#ifndef ARACHNE_CONTROLLER_MEMBERSHIP_H_
#define ARACHNE_CONTROLLER_MEMBERSHIP_H_

#include <deque>
#include <map>
#include <optional>
#include <set>
#include <string>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "controller/clock.h"

namespace arachne::controller {

// What an agent registers with.
struct MemberSpec {
  std::string node;
  std::string gpu_type;  // canonical catalog id
  int gpus = 0;
  double memory_gib = 0;  // per GPU
  std::string address;    // host:port of its arachne-agent
  // The agent process's identity (new at each start): one node name, one
  // agent process at a time (see Register).
  std::string incarnation;
  friend bool operator==(const MemberSpec&, const MemberSpec&) = default;
};

struct Member {
  MemberSpec spec;
  absl::Time since;  // when this incarnation joined
  absl::Time lease_expiry;
  bool draining = false;
  absl::Time drain_deadline = absl::InfiniteFuture();
};

enum class ChangeKind {
  kJoin,       // a node registered
  kLeave,      // its lease ran out (ungraceful)
  kDrain,      // a drain was asked for (graceful leave)
  kReplan,     // an operator asked for a replan
};
const char* ChangeKindName(ChangeKind kind);

struct MembershipChange {
  ChangeKind kind;
  std::string node;  // empty for kReplan
  std::string detail;
  absl::Time at;
};

struct MembershipConfig {
  absl::Duration lease = absl::Seconds(10);
  absl::Duration join_window = absl::Seconds(2);
  int flap_leaves = 3;  // this many leaves within flap_window back a node off
  absl::Duration flap_window = absl::Seconds(300);
  absl::Duration flap_backoff = absl::Seconds(30);  // doubled per extra leave
};

class Membership {
 public:
  // `clock` must outlive this object.
  Membership(MembershipConfig config, const Clock* clock);

  // A node registers (or registers again). A new node is a join. The same
  // agent process (incarnation) registering again with the same GPUs renews
  // its lease (its registration loop restarted); with other GPUs it is a
  // leave and a join. Another incarnation or another address for a member
  // whose lease is live is refused with AlreadyExists (naming the member's
  // address, incarnation and since when) until that lease runs out or the
  // node is drained and released: a second process cannot take over a
  // live node's name (and be sent its training state). InvalidArgument
  // naming the field for an empty node, GPU type, address or incarnation or
  // GPUs < 1; Unavailable while the node is backed off for flapping (naming
  // until when). Returns whether this was a join.
  absl::StatusOr<bool> Register(const MemberSpec& spec);
  // Renews `node`'s lease for the agent process `incarnation`. NotFound
  // when it is not registered (never, or its lease ran out) or registered
  // by another incarnation: the agent must Register again. A member read
  // back from a state database that kept no incarnation takes the first one
  // heard. FailedPrecondition for a node that was drained and released
  // (Remove): its agent must not come back by itself (an agent started again
  // registers anew).
  absl::Status Heartbeat(const std::string& node,
                         const std::string& incarnation);
  // A replan waits (at most `within`) for these nodes to register.
  // InvalidArgument for no nodes, an empty name or within <= 0.
  absl::Status AnnounceJoin(const std::vector<std::string>& nodes,
                            absl::Duration within);
  // `node` leaves gracefully by `deadline` from now: it stays a member (its
  // state must be moved off) but no new plan uses it; still a member at the
  // deadline, it leaves as if its lease ran out (Tick records a kLeave).
  // NotFound for an unknown node, InvalidArgument for deadline <= 0.
  absl::Status Drain(const std::string& node, absl::Duration deadline);
  void RequestReplan(const std::string& reason);
  // Removes a drained node once the plan no longer uses it (not a flap);
  // its heartbeats are refused from then on (see Heartbeat). Only a member
  // that drains now is removed (the caller's view may be older); returns
  // whether it was.
  bool Remove(const std::string& node);
  // `node`'s agent answered nothing for `silent` (its Status polls all
  // failed) though its heartbeats may go on: an ungraceful leave, as if its
  // lease had run out. False when it is no member.
  bool LeaveUnresponsive(const std::string& node, absl::Duration silent);

  // Expires the leases that ran out (each a kLeave, counted for flapping)
  // and returns the changes recorded since the last Tick, for the log.
  std::vector<MembershipChange> Tick();
  // True when the pending changes should be planned for now (see above).
  bool ReplanDue() const;
  // The pending changes, cleared: what the next replan is for.
  std::vector<MembershipChange> TakePending();
  bool HasPending() const;

  // Every member, by node name.
  std::vector<Member> Members() const;
  // Members a new plan may use: lease live, not draining.
  std::vector<Member> Schedulable() const;
  int SchedulableGpus() const;
  std::optional<Member> Find(const std::string& node) const;
  // The node's back-off end, if it is backed off now.
  std::optional<absl::Time> BackedOffUntil(const std::string& node) const;

  // Members read back from the state database after a restart: their leases
  // start now (they must heartbeat within one lease), nothing is pending.
  void Restore(const std::vector<Member>& members);

  const MembershipConfig& config() const { return config_; }

 private:
  void LeaveLocked(const std::string& node, const std::string& detail,
                   absl::Time now) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  void RecordLocked(ChangeKind kind, const std::string& node,
                    const std::string& detail, absl::Time now)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  void ExpireLocked(absl::Time now) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  std::optional<absl::Time> BackedOffUntilLocked(const std::string& node,
                                                 absl::Time now) const
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);

  const MembershipConfig config_;
  const Clock* const clock_;
  mutable absl::Mutex mu_;
  std::map<std::string, Member> members_ ABSL_GUARDED_BY(mu_);
  // Announced nodes not yet registered, with when the wait for each ends.
  std::map<std::string, absl::Time> announced_ ABSL_GUARDED_BY(mu_);
  std::map<std::string, std::deque<absl::Time>> leaves_ ABSL_GUARDED_BY(mu_);
  std::vector<MembershipChange> pending_ ABSL_GUARDED_BY(mu_);
  std::vector<MembershipChange> log_ ABSL_GUARDED_BY(mu_);
  std::set<std::string> released_ ABSL_GUARDED_BY(mu_);
  std::optional<absl::Time> first_pending_join_ ABSL_GUARDED_BY(mu_);
};

}  // namespace arachne::controller

#endif  // ARACHNE_CONTROLLER_MEMBERSHIP_H_
