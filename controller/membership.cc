#include "controller/membership.h"

#include <algorithm>
#include <cmath>

#include "absl/strings/str_cat.h"
#include "glog/logging.h"

namespace arachne::controller {

const char* ChangeKindName(ChangeKind kind) {
  switch (kind) {
    case ChangeKind::kJoin:
      return "join";
    case ChangeKind::kLeave:
      return "leave";
    case ChangeKind::kDrain:
      return "drain";
    case ChangeKind::kReplan:
      return "replan";
  }
  return "?";
}

Membership::Membership(MembershipConfig config, const Clock* clock)
    : config_(std::move(config)), clock_(clock) {
  CHECK(clock_ != nullptr);
  CHECK_GT(config_.lease, absl::ZeroDuration());
}

void Membership::RecordLocked(ChangeKind kind, const std::string& node,
                              const std::string& detail, absl::Time now) {
  MembershipChange c{kind, node, detail, now};
  pending_.push_back(c);
  log_.push_back(c);
  if (kind == ChangeKind::kJoin && !first_pending_join_.has_value()) {
    first_pending_join_ = now;
  }
}

void Membership::LeaveLocked(const std::string& node, const std::string& detail,
                             absl::Time now) {
  members_.erase(node);
  std::deque<absl::Time>& history = leaves_[node];
  history.push_back(now);
  while (!history.empty() && history.front() < now - config_.flap_window) {
    history.pop_front();
  }
  RecordLocked(ChangeKind::kLeave, node, detail, now);
}

std::optional<absl::Time> Membership::BackedOffUntilLocked(
    const std::string& node, absl::Time now) const {
  auto it = leaves_.find(node);
  if (it == leaves_.end()) return std::nullopt;
  int recent = 0;
  for (absl::Time t : it->second) {
    if (t >= now - config_.flap_window) ++recent;
  }
  if (config_.flap_leaves <= 0 || recent < config_.flap_leaves) {
    return std::nullopt;
  }
  // Each leave beyond the threshold doubles the back-off, so a node that
  // keeps flapping costs ever fewer replans.
  const int extra = std::min(recent - config_.flap_leaves, 20);
  const absl::Time until =
      it->second.back() + config_.flap_backoff * std::pow(2.0, extra);
  if (now >= until) return std::nullopt;
  return until;
}

void Membership::ExpireLocked(absl::Time now) {
  std::vector<std::string> expired;
  for (const auto& [name, m] : members_) {
    if (m.lease_expiry <= now) expired.push_back(name);
  }
  for (const std::string& name : expired) {
    LeaveLocked(name,
                absl::StrCat("lease of ", absl::FormatDuration(config_.lease),
                             " ran out without a heartbeat"),
                now);
  }
  // A drained node still here at its deadline is gone from then on (the
  // machine is taken away), whatever was left on it: an ungraceful leave.
  std::vector<std::string> overdue;
  for (const auto& [name, m] : members_) {
    if (m.draining && m.drain_deadline <= now) overdue.push_back(name);
  }
  for (const std::string& name : overdue) {
    LeaveLocked(name, "its drain deadline passed before its state was moved off",
                now);
  }
}

absl::StatusOr<bool> Membership::Register(const MemberSpec& spec) {
  if (spec.node.empty()) {
    return absl::InvalidArgumentError("node: required, got none");
  }
  if (spec.gpu_type.empty()) {
    return absl::InvalidArgumentError("gpu_type: required, got none");
  }
  if (spec.gpus < 1) {
    return absl::InvalidArgumentError(
        absl::StrCat("gpus: must be >= 1, got ", spec.gpus));
  }
  if (spec.address.empty()) {
    return absl::InvalidArgumentError("address: required, got none");
  }
  if (spec.incarnation.empty()) {
    return absl::InvalidArgumentError("incarnation: required, got none");
  }
  const absl::Time now = clock_->Now();
  absl::MutexLock lock(&mu_);
  ExpireLocked(now);
  if (std::optional<absl::Time> until = BackedOffUntilLocked(spec.node, now)) {
    return absl::UnavailableError(absl::StrCat(
        "node ", spec.node, ": backed off for flapping (",
        leaves_[spec.node].size(), " leaves within ",
        absl::FormatDuration(config_.flap_window), ") until ",
        absl::FormatTime(*until, absl::UTCTimeZone()), "; register again then"));
  }
  auto it = members_.find(spec.node);
  if (it != members_.end()) {
    Member& m = it->second;
    // A member restored from a state database that kept no incarnation is taken
    // by the first agent process heard at its address.
    const bool same_process =
        m.spec.address == spec.address &&
        (m.spec.incarnation == spec.incarnation || m.spec.incarnation.empty());
    if (!same_process) {
      return absl::AlreadyExistsError(absl::StrCat(
          "node: \"", spec.node, "\" is a live member, the agent at ",
          m.spec.address, " (incarnation ", m.spec.incarnation, ") since ",
          absl::FormatTime("%Y-%m-%dT%H:%M:%SZ", m.since, absl::UTCTimeZone()),
          "; the agent at ", spec.address, " (incarnation ", spec.incarnation,
          ") may register as it once that lease runs out (at ",
          absl::FormatTime("%Y-%m-%dT%H:%M:%SZ", m.lease_expiry,
                           absl::UTCTimeZone()),
          " unless renewed) or the node is drained"));
    }
    m.spec.incarnation = spec.incarnation;  // same, or none was stored
    if (m.spec == spec) {
      m.lease_expiry = now + config_.lease;
      return false;
    }
    LeaveLocked(spec.node,
                absl::StrCat("registered again as ", spec.gpus, " ",
                             spec.gpu_type, " at ", spec.address),
                now);
  }
  Member m;
  m.spec = spec;
  m.since = now;
  m.lease_expiry = now + config_.lease;
  members_[spec.node] = m;
  released_.erase(spec.node);
  announced_.erase(spec.node);
  RecordLocked(ChangeKind::kJoin, spec.node,
               absl::StrCat(spec.gpus, " ", spec.gpu_type, " at ", spec.address),
               now);
  return true;
}

absl::Status Membership::Heartbeat(const std::string& node,
                                   const std::string& incarnation) {
  const absl::Time now = clock_->Now();
  absl::MutexLock lock(&mu_);
  ExpireLocked(now);
  auto it = members_.find(node);
  if (it == members_.end() && released_.count(node) > 0) {
    return absl::FailedPreconditionError(absl::StrCat(
        "node: \"", node,
        "\" was drained and released; it joins again only by a new Register"));
  }
  if (it == members_.end()) {
    return absl::NotFoundError(absl::StrCat(
        "node: \"", node,
        "\" is not registered (never, or its lease ran out); Register again"));
  }
  Member& m = it->second;
  if (m.spec.incarnation.empty()) m.spec.incarnation = incarnation;
  if (m.spec.incarnation != incarnation) {
    // Only the process that registered keeps the lease alive: an agent
    // that lost its membership (its lease ran out while it was stopped, and
    // another process registered the name) must not renew the other's.
    return absl::NotFoundError(absl::StrCat(
        "node: \"", node, "\" has no member of incarnation ", incarnation,
        " (it is the agent at ", m.spec.address, ", incarnation ",
        m.spec.incarnation, "); Register again"));
  }
  it->second.lease_expiry = now + config_.lease;
  return absl::OkStatus();
}

absl::Status Membership::AnnounceJoin(const std::vector<std::string>& nodes,
                                      absl::Duration within) {
  if (nodes.empty()) {
    return absl::InvalidArgumentError("nodes: required, got none");
  }
  if (within <= absl::ZeroDuration()) {
    return absl::InvalidArgumentError(absl::StrCat(
        "within_s: must be > 0, got ", absl::ToDoubleSeconds(within)));
  }
  for (size_t i = 0; i < nodes.size(); ++i) {
    if (nodes[i].empty()) {
      return absl::InvalidArgumentError(
          absl::StrCat("nodes[", i, "]: must be a node name, got \"\""));
    }
  }
  const absl::Time now = clock_->Now();
  absl::MutexLock lock(&mu_);
  for (const std::string& n : nodes) {
    if (members_.count(n) == 0) announced_[n] = now + within;
  }
  return absl::OkStatus();
}

absl::Status Membership::Drain(const std::string& node,
                               absl::Duration deadline) {
  if (deadline <= absl::ZeroDuration()) {
    return absl::InvalidArgumentError(absl::StrCat(
        "deadline_s: must be > 0, got ", absl::ToDoubleSeconds(deadline)));
  }
  const absl::Time now = clock_->Now();
  absl::MutexLock lock(&mu_);
  ExpireLocked(now);
  auto it = members_.find(node);
  if (it == members_.end()) {
    return absl::NotFoundError(
        absl::StrCat("node: \"", node, "\" is not a member"));
  }
  if (it->second.draining) return absl::OkStatus();  // idempotent
  it->second.draining = true;
  it->second.drain_deadline = now + deadline;
  RecordLocked(ChangeKind::kDrain, node,
               absl::StrCat("deadline in ", absl::FormatDuration(deadline)),
               now);
  return absl::OkStatus();
}

void Membership::RequestReplan(const std::string& reason) {
  const absl::Time now = clock_->Now();
  absl::MutexLock lock(&mu_);
  RecordLocked(ChangeKind::kReplan, "", reason, now);
}

bool Membership::Remove(const std::string& node) {
  absl::MutexLock lock(&mu_);
  auto it = members_.find(node);
  if (it == members_.end() || !it->second.draining) return false;
  members_.erase(it);
  released_.insert(node);
  return true;
}

bool Membership::LeaveUnresponsive(const std::string& node,
                                   absl::Duration silent) {
  const absl::Time now = clock_->Now();
  absl::MutexLock lock(&mu_);
  if (members_.count(node) == 0) return false;
  LeaveLocked(node,
              absl::StrCat("its agent answered no Status for ",
                           absl::FormatDuration(silent),
                           " (a lease) though it heartbeats"),
              now);
  return true;
}

std::vector<MembershipChange> Membership::Tick() {
  const absl::Time now = clock_->Now();
  absl::MutexLock lock(&mu_);
  ExpireLocked(now);
  std::vector<MembershipChange> out;
  out.swap(log_);
  return out;
}

bool Membership::ReplanDue() const {
  const absl::Time now = clock_->Now();
  absl::MutexLock lock(&mu_);
  bool joins = false;
  for (const MembershipChange& c : pending_) {
    // A leave or drain cannot wait: the current plan may already have lost
    // a GPU, or a deadline is running.
    if (c.kind != ChangeKind::kJoin) return true;
    joins = true;
  }
  if (!joins) return false;
  if (now < *first_pending_join_ + config_.join_window) return false;
  for (const auto& [node, until] : announced_) {
    if (now < until) return false;  // still waiting for an announced node
  }
  return true;
}

std::vector<MembershipChange> Membership::TakePending() {
  const absl::Time now = clock_->Now();
  absl::MutexLock lock(&mu_);
  std::vector<MembershipChange> out;
  out.swap(pending_);
  first_pending_join_.reset();
  // Announcements whose wait ran out are forgotten: the replan went ahead
  // without them.
  for (auto it = announced_.begin(); it != announced_.end();) {
    it = it->second <= now ? announced_.erase(it) : std::next(it);
  }
  return out;
}

bool Membership::HasPending() const {
  absl::MutexLock lock(&mu_);
  return !pending_.empty();
}

std::vector<Member> Membership::Members() const {
  absl::MutexLock lock(&mu_);
  std::vector<Member> out;
  for (const auto& [name, m] : members_) out.push_back(m);
  return out;
}

std::vector<Member> Membership::Schedulable() const {
  const absl::Time now = clock_->Now();
  absl::MutexLock lock(&mu_);
  std::vector<Member> out;
  for (const auto& [name, m] : members_) {
    if (!m.draining && m.lease_expiry > now) out.push_back(m);
  }
  return out;
}

int Membership::SchedulableGpus() const {
  int n = 0;
  for (const Member& m : Schedulable()) n += m.spec.gpus;
  return n;
}

std::optional<Member> Membership::Find(const std::string& node) const {
  absl::MutexLock lock(&mu_);
  auto it = members_.find(node);
  if (it == members_.end()) return std::nullopt;
  return it->second;
}

std::optional<absl::Time> Membership::BackedOffUntil(
    const std::string& node) const {
  const absl::Time now = clock_->Now();
  absl::MutexLock lock(&mu_);
  return BackedOffUntilLocked(node, now);
}

void Membership::Restore(const std::vector<Member>& members) {
  const absl::Time now = clock_->Now();
  absl::MutexLock lock(&mu_);
  members_.clear();
  for (Member m : members) {
    m.lease_expiry = now + config_.lease;
    members_[m.spec.node] = m;
  }
  pending_.clear();
  first_pending_join_.reset();
}

}  // namespace arachne::controller
