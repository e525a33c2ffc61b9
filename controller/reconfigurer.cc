#include "controller/reconfigurer.h"

#include <algorithm>
#include <map>
#include <set>
#include <thread>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/clock.h"
#include "glog/logging.h"

namespace arachne::controller {
namespace {

std::vector<std::string> NodesOf(const Cluster& c) {
  std::vector<std::string> out;
  for (const Node& n : c.nodes()) out.push_back(n.name);
  return out;
}

// The nodes whose agent is still there.
std::vector<std::string> Reachable(const std::vector<std::string>& nodes,
                                   const Reconfigurer::AgentLookup& agents) {
  std::vector<std::string> out;
  for (const std::string& n : nodes) {
    if (agents(n) != nullptr) out.push_back(n);
  }
  return out;
}

double Since(absl::Time t) { return absl::ToDoubleSeconds(absl::Now() - t); }

}  // namespace

const char* SwitchPhaseName(SwitchPhase phase) {
  switch (phase) {
    case SwitchPhase::kPrepare:
      return "prepare";
    case SwitchPhase::kPause:
      return "pause";
    case SwitchPhase::kStage1:
      return "migrate1";
    case SwitchPhase::kStage2:
      return "migrate2";
    case SwitchPhase::kRebuild:
      return "rebuild";
    case SwitchPhase::kCommit:
      return "commit";
    case SwitchPhase::kResume:
      return "resume";
    case SwitchPhase::kAbort:
      return "abort";
  }
  return "?";
}

std::vector<absl::Status> Broadcast(
    const std::vector<std::string>& nodes,
    const Reconfigurer::AgentLookup& agents,
    const std::function<absl::Status(agent::AgentClient&)>& fn) {
  std::vector<absl::Status> status(nodes.size());
  std::vector<std::thread> threads;
  threads.reserve(nodes.size());
  for (size_t i = 0; i < nodes.size(); ++i) {
    agent::AgentClient* client = agents(nodes[i]);
    if (client == nullptr) {
      status[i] = absl::UnavailableError("its agent is gone");
      continue;
    }
    threads.emplace_back([&, i, client]() { status[i] = fn(*client); });
  }
  for (std::thread& t : threads) t.join();
  return status;
}

absl::Status OnEveryAgent(
    const std::vector<std::string>& nodes,
    const Reconfigurer::AgentLookup& agents,
    const std::function<absl::Status(agent::AgentClient&)>& fn,
    const std::function<bool(const std::string&)>& answers) {
  const std::vector<absl::Status> status = Broadcast(nodes, agents, fn);
  // The root cause: when one agent fails, its peers in the same collective
  // time out or lose their connection; report the first error that is not
  // such a consequence (else the first error).
  auto consequence = [](const absl::Status& s) {
    return absl::IsDeadlineExceeded(s) || absl::IsUnavailable(s);
  };
  int first = -1;
  for (size_t i = 0; i < nodes.size(); ++i) {
    if (status[i].ok()) continue;
    if (first < 0 || (!consequence(status[i]) && consequence(status[first]))) {
      first = static_cast<int>(i);
    }
  }
  if (first < 0) return absl::OkStatus();
  if (answers && consequence(status[first])) {
    for (size_t i = 0; i < nodes.size(); ++i) {
      if (status[i].ok() || answers(nodes[i])) continue;
      return absl::Status(status[i].code(),
                          absl::StrCat("node ", nodes[i],
                                       ": its agent does not answer: ",
                                       status[i].message()));
    }
  }
  return absl::Status(status[first].code(),
                      absl::StrCat("node ", nodes[first], ": ",
                                   status[first].message()));
}

std::set<std::string> NodesUsed(const Plan& plan, const Cluster& cluster) {
  std::set<std::string> out;
  for (const Template& t : plan.templates) {
    for (const StagePlacement& p : t.placement) {
      out.insert(cluster.node(p.node).name);
    }
  }
  return out;
}

std::set<migration::GpuId> GpusUsed(const Plan& plan, const Cluster& cluster) {
  std::set<migration::GpuId> out;
  for (const Template& t : plan.templates) {
    for (const StagePlacement& p : t.placement) {
      for (int g : p.gpus) out.insert({cluster.node(p.node).name, g});
    }
  }
  return out;
}

SwitchOutcome Reconfigurer::Run(const SwitchTarget& target,
                                const AgentLookup& agents,
                                const PhaseObserver& observer) const {
  CHECK_GE(target.generation, 1);
  CHECK_EQ(target.old_plan.has_value(), target.old_cluster.has_value());
  const absl::Time start = absl::Now();
  const bool own_deadline = target.deadline < start + config_.switch_timeout;
  const absl::Time deadline =
      own_deadline ? target.deadline : start + config_.switch_timeout;
  const std::vector<std::string> nodes = NodesOf(target.cluster);
  // The old cluster's nodes that take part: those of the new cluster
  // (draining nodes are in it as sources). A node that left the old cluster
  // is no part of the switch even if its agent registered again meanwhile
  // (it was not prepared; it prepares as a joiner next time).
  std::vector<std::string> old_in_switch;
  if (target.old_cluster) {
    for (const std::string& o : NodesOf(*target.old_cluster)) {
      if (std::find(nodes.begin(), nodes.end(), o) != nodes.end()) {
        old_in_switch.push_back(o);
      }
    }
  }
  const std::vector<std::string> old_nodes = Reachable(old_in_switch, agents);
  const int64_t n = target.generation;
  SwitchOutcome out;
  SwitchTimings& t = out.timings;
  bool paused = false;
  // When Pause was sent: training stopped there, also when the switch aborts.
  absl::Time pause_start = absl::Now();

  // The time a phase may take: the phase timeout, capped by the switch's.
  auto phase_timeout = [&]() -> absl::StatusOr<absl::Duration> {
    const absl::Duration left = deadline - absl::Now();
    if (left <= absl::ZeroDuration()) {
      if (own_deadline) {
        return absl::DeadlineExceededError(
            absl::StrCat("switch to generation ", n, " ran past ",
                         target.deadline_reason));
      }
      return absl::DeadlineExceededError(absl::StrCat(
          "switch to generation ", n, " ran past its timeout of ",
          absl::FormatDuration(config_.switch_timeout)));
    }
    return std::min(config_.phase_timeout, left);
  };
  auto abort = [&](SwitchPhase in, absl::Status why) {
    out.status = why;
    out.failed_in = in;
    observer(SwitchPhase::kAbort);
    LOG(WARNING) << "switch to generation " << n << " failed in "
                 << SwitchPhaseName(in) << ": " << why << "; aborting";
    // Every agent still reachable drops n; the ones that never heard of it
    // answer Abort as a no-op.
    std::vector<std::string> all = Reachable(nodes, agents);
    for (const std::string& o : old_nodes) {
      if (std::find(all.begin(), all.end(), o) == all.end()) all.push_back(o);
    }
    if (absl::Status s = OnEveryAgent(
            all, agents, [&](agent::AgentClient& a) { return a.Abort(n); });
        !s.ok()) {
      LOG(WARNING) << "abort of generation " << n << ": " << s;
    }
    if (paused && target.old_plan.has_value()) {
      if (absl::Status s = OnEveryAgent(old_nodes, agents,
                                        [&](agent::AgentClient& a) {
                                          return a.Resume(target.old_generation,
                                                          target.run_until);
                                        });
          !s.ok()) {
        LOG(ERROR) << "resuming generation " << target.old_generation
                   << " after the abort: " << s;
        out.status = absl::Status(
            why.code(), absl::StrCat(why.message(), "; and resuming generation ",
                                     target.old_generation, " failed: ",
                                     s.message()));
      }
      // Training stood still from Pause until the old plan resumed.
      t.downtime_s = Since(pause_start);
    }
    t.total_s = Since(start);
    return out;
  };

  // Prepare: the new cluster's agents, training goes on meanwhile.
  observer(SwitchPhase::kPrepare);
  agent::PrepareArgs args;
  args.generation = n;
  args.job = target.job;
  args.cluster = target.cluster;
  args.plan = target.plan;
  args.old_cluster = target.old_cluster;
  args.old_plan = target.old_plan;
  args.lost = target.lost;
  args.store_address = target.store_address;
  args.checkpoint_dir = target.checkpoint_dir;
  absl::Time phase_start = absl::Now();
  absl::Mutex estimate_mu;
  absl::Status s = OnEveryAgent(nodes, agents, [&](agent::AgentClient& a) {
    absl::StatusOr<agent::PrepareResult> r = a.Prepare(args, catalog_);
    if (!r.ok()) return r.status();
    absl::MutexLock lock(&estimate_mu);
    t.estimated_seconds = std::max(t.estimated_seconds, r->estimated_seconds);
    return absl::OkStatus();
  }, config_.answers);
  t.prepare_s = Since(phase_start);
  if (s.ok() && absl::Now() > deadline) {
    s = phase_timeout().status();
  }
  if (!s.ok()) return abort(SwitchPhase::kPrepare, s);

  pause_start = absl::Now();
  if (target.old_plan.has_value()) {
    observer(SwitchPhase::kPause);
    absl::StatusOr<absl::Duration> timeout = phase_timeout();
    if (!timeout.ok()) return abort(SwitchPhase::kPause, timeout.status());
    pause_start = absl::Now();
    // Marked before the call: an agent may stop even when another fails,
    // and Resume of a running generation is harmless.
    paused = true;
    std::map<std::string, int64_t> stopped_after;  // by node
    s = OnEveryAgent(old_nodes, agents, [&](agent::AgentClient& a) {
      absl::StatusOr<int64_t> it = a.Pause(n, 0, *timeout);
      if (!it.ok()) return it.status();
      absl::MutexLock lock(&estimate_mu);
      stopped_after[a.address()] = *it;
      return absl::OkStatus();
    }, config_.answers);
    t.pause_s = Since(pause_start);
    if (!s.ok()) return abort(SwitchPhase::kPause, s);
    // The ranks agree on the boundary in their last all-reduce, so every
    // node that hosts one stopped after the same iteration; if not, the
    // states to migrate belong to different iterations and mixing them
    // would corrupt the model. Nodes with no rank of the old plan answer 0,
    // and so do nodes whose every rank of it is lost (its engines died and
    // were restarted empty).
    std::set<std::string> hosting;
    {
      const std::set<migration::GpuId> lost(target.lost.begin(),
                                            target.lost.end());
      for (const migration::GpuId& g :
           GpusUsed(*target.old_plan, *target.old_cluster)) {
        if (lost.count(g) == 0) hosting.insert(g.node);
      }
    }
    std::string first_node;
    for (const std::string& node : old_nodes) {
      if (hosting.count(node) == 0) continue;
      agent::AgentClient* c = agents(node);
      const int64_t it = stopped_after.at(c->address());
      if (first_node.empty()) {
        first_node = node;
        t.paused_at_iteration = it;
      } else if (it != t.paused_at_iteration) {
        return abort(SwitchPhase::kPause,
                     absl::InternalError(absl::StrCat(
                         "nodes paused at different iterations (", first_node,
                         " after ", t.paused_at_iteration, ", ", node,
                         " after ", it,
                         "): their states do not belong to one iteration")));
      }
    }

    for (auto [phase, stage] : {std::pair{SwitchPhase::kStage1, 1},
                                std::pair{SwitchPhase::kStage2, 2}}) {
      observer(phase);
      timeout = phase_timeout();
      if (!timeout.ok()) return abort(phase, timeout.status());
      phase_start = absl::Now();
      s = OnEveryAgent(nodes, agents, [&, stage = stage](agent::AgentClient& a) {
        return a.Migrate(n, stage, *timeout,
                         std::min(config_.transfer_round, *timeout));
      }, config_.answers);
      (stage == 1 ? t.stage1_s : t.stage2_s) = Since(phase_start);
      if (!s.ok()) return abort(phase, s);
    }
  }

  observer(SwitchPhase::kRebuild);
  absl::StatusOr<absl::Duration> timeout = phase_timeout();
  if (!timeout.ok()) return abort(SwitchPhase::kRebuild, timeout.status());
  phase_start = absl::Now();
  s = OnEveryAgent(nodes, agents,
                   [&](agent::AgentClient& a) { return a.Rebuild(n, *timeout); },
                   config_.answers);
  t.rebuild_s = Since(phase_start);
  if (!s.ok()) return abort(SwitchPhase::kRebuild, s);

  // Commit: past here the switch is done whatever happens; the agents that
  // do not answer are asked again (Commit is idempotent).
  observer(SwitchPhase::kCommit);
  phase_start = absl::Now();
  std::vector<std::string> pending = nodes;
  for (int attempt = 0;; ++attempt) {
    const std::vector<absl::Status> status = Broadcast(
        pending, agents, [&](agent::AgentClient& a) { return a.Commit(n); });
    std::vector<std::string> again;
    for (size_t i = 0; i < pending.size(); ++i) {
      if (status[i].ok()) continue;
      LOG(WARNING) << "commit of generation " << n << " on node " << pending[i]
                   << ": " << status[i];
      again.push_back(pending[i]);
    }
    pending = again;
    if (pending.empty()) break;
    if (absl::Now() > deadline || attempt >= 10) {
      out.committed = true;
      out.failed_in = SwitchPhase::kCommit;
      out.status = absl::UnavailableError(absl::StrCat(
          "generation ", n, " committed, but nodes ",
          absl::StrJoin(pending, ", "),
          " did not confirm Commit; they are asked again on restart"));
      t.total_s = Since(start);
      return out;
    }
    absl::SleepFor(absl::Milliseconds(200));
  }
  out.committed = true;
  t.commit_s = Since(phase_start);

  observer(SwitchPhase::kResume);
  phase_start = absl::Now();
  s = OnEveryAgent(nodes, agents, [&](agent::AgentClient& a) {
    return a.Resume(n, target.run_until);
  });
  t.resume_s = Since(phase_start);
  if (target.old_plan.has_value()) t.downtime_s = Since(pause_start);
  t.total_s = Since(start);
  if (!s.ok()) {
    out.failed_in = SwitchPhase::kResume;
    out.status = s;
    return out;
  }

  // The agents' own accounting of the switch.
  for (const std::string& node : nodes) {
    agent::AgentClient* c = agents(node);
    if (c == nullptr) continue;
    absl::StatusOr<agent::NodeStatus> st = c->Status(n);
    if (!st.ok()) continue;
    t.agent_pause_s = std::max(t.agent_pause_s, st->pause.seconds);
    t.agent_stage1_s = std::max(t.agent_stage1_s, st->stage1.seconds);
    t.agent_stage2_s = std::max(t.agent_stage2_s, st->stage2.seconds);
    t.agent_rebuild_s = std::max(t.agent_rebuild_s, st->rebuild_engines.seconds);
    t.agent_groups_s = std::max(t.agent_groups_s, st->rebuild_groups.seconds);
    t.agent_resume_s = std::max(t.agent_resume_s, st->resume.seconds);
    // Counted where the bytes landed: every receiver is in the new plan,
    // while a drained sender may already be released and not answer.
    t.bytes_stage1 += st->stage1.bytes_received;
    t.bytes_stage2 += st->stage2.bytes_received;
    t.bytes_moved += st->stage1.bytes_received + st->stage2.bytes_received;
  }
  out.status = absl::OkStatus();
  return out;
}

absl::Status Reconfigurer::FinishCommit(int64_t generation, int64_t run_until,
                                        const std::vector<std::string>& nodes,
                                        const AgentLookup& agents) const {
  if (absl::Status s = OnEveryAgent(
          nodes, agents,
          [&](agent::AgentClient& a) { return a.Commit(generation); });
      !s.ok()) {
    return s;
  }
  return OnEveryAgent(nodes, agents, [&](agent::AgentClient& a) {
    return a.Resume(generation, run_until);
  });
}

absl::Status Reconfigurer::RollBack(int64_t generation, int64_t old_generation,
                                    int64_t run_until,
                                    const std::vector<std::string>& nodes,
                                    const std::vector<std::string>& old_nodes,
                                    const AgentLookup& agents) const {
  absl::Status aborted = OnEveryAgent(
      Reachable(nodes, agents), agents,
      [&](agent::AgentClient& a) { return a.Abort(generation); });
  if (old_generation == 0) return aborted;
  absl::Status resumed = OnEveryAgent(old_nodes, agents, [&](agent::AgentClient& a) {
    return a.Resume(old_generation, run_until);
  });
  return aborted.ok() ? resumed : aborted;
}

}  // namespace arachne::controller
