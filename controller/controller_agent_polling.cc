// The JobController's polls of the current plan's agents: a round of
// Status calls in the background (PollAgents) whose answers a later tick
// reads (ReadPoll): progress, lost engines, rank errors, measurements, and
// a node silent for a lease counted as a leave. Separate because of its
// one rule: no tick waits on an agent (docs/controller.md, "A reconcile
// loop no agent can stall"), so the round runs on threads of its own.
#include "controller/controller.h"

#include <algorithm>
#include <atomic>
#include <chrono>
#include <future>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "controller/controller_internal.h"
#include "glog/logging.h"

namespace arachne::controller {

void JobController::PollAgents() {
  if (poll_.has_value()) {
    if (poll_->wait_for(std::chrono::seconds(0)) != std::future_status::ready) {
      return;  // an agent has not answered yet: nothing waits for it
    }
    const std::vector<PolledNode> polled = poll_->get();
    poll_.reset();
    ReadPoll(poll_generation_, polled);
  }
  std::vector<std::pair<std::string, agent::AgentClient*>> clients;
  int64_t generation;
  {
    absl::MutexLock lock(&mu_);
    if (generation_ == 0) return;
    const absl::Time now = absl::Now();
    // status_poll apart, and 1 ms per node at least: a thousand nodes cost
    // a thousand Status calls a second, not a core (bench/controller_scale).
    const absl::Duration period = std::max(
        config_.status_poll,
        absl::Milliseconds(static_cast<int64_t>(cluster_.nodes().size())));
    if (now - last_poll_ < period) return;
    last_poll_ = now;
    generation = generation_;
    for (const Node& n : cluster_.nodes()) clients.emplace_back(n.name, nullptr);
  }
  // Clients live as long as the controller (a replaced one is retired, not
  // destroyed), so the round may use them after this returns.
  for (auto& [node, client] : clients) client = AgentFor(node);
  poll_generation_ = generation;
  poll_ = std::async(std::launch::async, [clients, generation]() {
    std::vector<PolledNode> polled(clients.size());
    for (size_t i = 0; i < clients.size(); ++i) polled[i].node = clients[i].first;
    // At most kPollThreads calls at once, each worker taking the next node:
    // an agent that does not answer holds one worker for its deadline, not
    // the round's other nodes, and a thousand nodes cost no thousand threads.
    constexpr size_t kPollThreads = 32;
    std::atomic<size_t> next{0};
    auto work = [&]() {
      for (size_t i = next++; i < clients.size(); i = next++) {
        polled[i].status = clients[i].second == nullptr
                               ? absl::UnavailableError("not a member")
                               : clients[i].second->Status(generation);
      }
    };
    std::vector<std::thread> threads;
    for (size_t t = 0; t < std::min(kPollThreads, clients.size()); ++t) {
      threads.emplace_back(work);
    }
    for (std::thread& t : threads) t.join();
    return polled;
  });
}

void JobController::ReadPoll(int64_t generation,
                             const std::vector<PolledNode>& polled) {
  {
    // Answers to a round of an older generation describe another plan.
    absl::MutexLock lock(&mu_);
    if (generation != generation_) return;
  }
  // A node silent for a lease is gone whatever it does: its heartbeats
  // may come from a thread that still runs beside a hung service.
  if (answered_generation_ != generation) {
    answered_.clear();
    answered_generation_ = generation;
  }
  const absl::Time now = clock_->Now();
  const absl::Duration lease = config_.job.membership.lease;
  for (const PolledNode& p : polled) {
    auto [it, first] = answered_.emplace(p.node, now);
    if (p.status.ok()) {
      it->second = now;
    } else if (!first && now - it->second > lease &&
               membership_.LeaveUnresponsive(p.node, lease)) {
      LOG(WARNING) << "node " << p.node << ": no Status answered since "
                   << absl::FormatDuration(now - it->second)
                   << " ago: a leave (" << p.status.status() << ")";
      answered_.erase(it);
    }
  }
  int64_t iteration = -1;
  double loss = 0, tokens = 0;
  std::string rank_error;
  std::vector<NodeReport> reports;
  for (const PolledNode& p : polled) {
    const std::string& node = p.node;
    const absl::StatusOr<agent::NodeStatus>& st = p.status;
    if (!st.ok()) continue;  // silent for a lease: a leave (above)
    // An agent still on another generation (it has not committed this one
    // yet) reports the other plan's iterations.
    const bool current = st->current_generation == generation;
    NodeReport report;
    report.node = node;
    for (const agent::RankStatus& r : st->ranks) {
      if (r.lost) {
        // The engine died with its state; a fresh one stands on the GPU.
        // Recovered as a leave is: a switch that counts the GPU lost.
        bool first_seen;
        {
          absl::MutexLock lock(&mu_);
          first_seen = lost_gpus_.insert({node, r.gpu.index}).second;
        }
        if (first_seen) {
          Emit("membership", absl::StrCat("lost ", node, " GPU ", r.gpu.index,
                                          ": ", r.error));
          membership_.RequestReplan(
              absl::StrCat("engine lost on ", node, " GPU ", r.gpu.index));
        }
        continue;
      }
      if (!r.error.empty() && rank_error.empty()) {
        rank_error = absl::StrCat("node ", node, " GPU ", r.gpu.index, ": ", r.error);
      }
      if (!r.in_plan) continue;
      if (iteration < 0 || r.iteration < iteration) {
        iteration = r.iteration;
        loss = r.loss;
      }
      tokens = std::max(tokens, r.tokens_per_second);
      if (current) {
        ++report.gpus_in_plan;
        // One engine process per rank: the node's peak is their sum; ranks
        // in the agent's process share one peak.
        report.peak_rss_bytes =
            r.engine_pid > 0 ? report.peak_rss_bytes + r.peak_rss_bytes
                             : std::max(report.peak_rss_bytes, r.peak_rss_bytes);
        report.iterations.emplace_back(r.iteration, r.iteration_seconds);
      }
    }
    if (report.gpus_in_plan > 0) reports.push_back(std::move(report));
  }
  if (!rank_error.empty()) Fail(rank_error);
  Measure(generation, reports);
  MaybeFit(false);
  if (iteration < 0) return;
  bool advanced;
  {
    absl::MutexLock lock(&mu_);
    advanced = iteration > iteration_;
    iteration_ = iteration;
    loss_ = loss;
    tokens_per_s_ = tokens;
    if (iteration >= config_.job.iterations && phase_ == "running") {
      phase_ = "finished";
    }
  }
  if (advanced) {
    v1::Event e;
    e.set_time_unix_s(UnixSeconds(clock_->Now()));
    e.set_kind("iteration");
    e.set_generation(generation);
    e.set_iteration(iteration);
    e.set_loss(loss);
    e.set_message(absl::StrFormat("iteration %d loss %.6f", iteration, loss));
    events_.Add(std::move(e));
  }
}

}  // namespace arachne::controller
