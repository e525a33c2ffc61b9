// The switch state machine (docs/architecture.md, docs/controller.md): drives
// the agents from the current generation c to a new generation n (one past
// the highest generation ever attempted, so an aborted one is never reused)
// as
//   Prepare(n)   on every agent of the new cluster, in parallel (joiners
//                warm up; training under c goes on)
//   Pause(n, 0)  on the agents of the old cluster (the ranks agree on the
//                boundary)
//   Migrate(n, 1), Migrate(n, 2), Rebuild(n)   on the new cluster
//   Commit(n)    on the new cluster: the point of no return
//   Resume(n, run_until)
// each phase broadcast to its agents at once. Any failure or timeout
// before Commit aborts: Abort(n) on every agent still reachable, then
// Resume(c) where training was paused, so the old plan goes on. After the
// first Commit the switch is finished, retrying Commit on the agents that
// did not answer (every call is idempotent). The first plan (generation 1)
// runs Prepare, Rebuild, Commit, Resume.
//
// The generation is the caller's: it must be the current one + 1 and is
// what every RPC and the job's store prefix carry. Phase timeouts are the
// phase timeout capped by what is left of the whole switch's.
//
// The job's TCPStore (c10d, the rendezvous of every process group) is
// hosted by the caller (JobStoreServer) and named by `store_address`.
#ifndef ARACHNE_CONTROLLER_RECONFIGURER_H_
#define ARACHNE_CONTROLLER_RECONFIGURER_H_

#include <cstdint>
#include <functional>
#include <map>
#include <optional>
#include <set>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/time/time.h"
#include "planner_service/core/model/cluster.h"
#include "planner_service/core/model/gpu_catalog.h"
#include "planner_service/core/model/plan.h"
#include "worker_agent/agent_client.h"
#include "worker_agent/node_runtime.h"

namespace arachne::controller {

enum class SwitchPhase {
  kPrepare,
  kPause,
  kStage1,
  kStage2,
  kRebuild,
  kCommit,
  kResume,
  kAbort,
};
const char* SwitchPhaseName(SwitchPhase phase);

struct ReconfigurerConfig {
  absl::Duration phase_timeout = absl::Seconds(30);
  absl::Duration switch_timeout = absl::Seconds(120);
  // Each transfer round of a migration stage (sent to the agents with
  // Migrate); zero = the phase timeout.
  absl::Duration transfer_round = absl::ZeroDuration();
  // Whether a node's agent answers at all now (a short Status call). When a
  // phase fails only with peers' timeouts and disconnections, the node
  // whose agent does not answer is the root cause. Null: not asked.
  std::function<bool(const std::string&)> answers;
};

struct SwitchTarget {
  int64_t generation = 0;  // the new one
  agent::JobSpec job;
  Cluster cluster;  // the new plan's cluster (draining nodes included)
  Plan plan;
  std::optional<Cluster> old_cluster;  // none for generation 1
  std::optional<Plan> old_plan;
  int64_t old_generation = 0;
  std::vector<migration::GpuId> lost;
  std::string store_address;
  std::string checkpoint_dir;
  int64_t run_until = 0;
  // A deadline of its own, sooner than the switch timeout (a draining
  // node's), and what it is, for the error when it passes.
  absl::Time deadline = absl::InfiniteFuture();
  std::string deadline_reason;
};

// The seconds of each phase as the controller saw them (call to the last
// answer), and the slowest agent's own accounting (NodeStatus).
struct SwitchTimings {
  double prepare_s = 0, pause_s = 0, stage1_s = 0, stage2_s = 0,
         rebuild_s = 0, commit_s = 0, resume_s = 0;
  double downtime_s = 0;  // Pause sent to the last Resume answered (of the new plan, or of the old one after an abort)
  double total_s = 0;
  int64_t paused_at_iteration = 0;
  int64_t bytes_moved = 0;          // the agents' bytes sent, both stages
  int64_t bytes_stage1 = 0, bytes_stage2 = 0;
  double estimated_seconds = 0;     // the agents' schedule estimate (max)
  double agent_pause_s = 0, agent_stage1_s = 0, agent_stage2_s = 0,
         agent_rebuild_s = 0, agent_resume_s = 0;
  double agent_groups_s = 0;  // built in Prepare, not downtime
};

struct SwitchOutcome {
  absl::Status status;     // OK when committed
  bool committed = false;  // false: aborted, generation old_generation current
  SwitchPhase failed_in = SwitchPhase::kPrepare;  // when !status.ok()
  SwitchTimings timings;
};

// The nodes that host a rank of `plan`.
std::set<std::string> NodesUsed(const Plan& plan, const Cluster& cluster);
// The GPUs that host a rank of `plan`.
std::set<migration::GpuId> GpusUsed(const Plan& plan, const Cluster& cluster);

class Reconfigurer {
 public:
  // `agents` resolves a node name to its client; called for every node of
  // the old and the new cluster, it returns null for a node whose agent is
  // gone (left). The clients must outlive the call.
  using AgentLookup = std::function<agent::AgentClient*(const std::string&)>;
  // Called as each phase begins (the caller persists it) — before any RPC
  // of the phase is sent.
  using PhaseObserver = std::function<void(SwitchPhase)>;

  Reconfigurer(ReconfigurerConfig config, GpuCatalog catalog)
      : config_(config), catalog_(std::move(catalog)) {}

  SwitchOutcome Run(const SwitchTarget& target, const AgentLookup& agents,
                    const PhaseObserver& observer) const;

  // Finishes a switch found at Commit after a restart: Commit(n) then
  // Resume(n) on `nodes`.
  absl::Status FinishCommit(int64_t generation, int64_t run_until,
                            const std::vector<std::string>& nodes,
                            const AgentLookup& agents) const;
  // Rolls back a switch found before Commit after a restart: Abort(n) on
  // `nodes`, Resume(old) on `old_nodes`.
  absl::Status RollBack(int64_t generation, int64_t old_generation,
                        int64_t run_until,
                        const std::vector<std::string>& nodes,
                        const std::vector<std::string>& old_nodes,
                        const AgentLookup& agents) const;

 private:
  const ReconfigurerConfig config_;
  const GpuCatalog catalog_;
};

// Calls `fn` on every (node, client) at once and returns the first error,
// its message prefixed with the node ("node b: ..."); a null client is
// Unavailable "node x: its agent is gone".
// When every error is such a consequence and `answers` is given, the first
// failed node whose agent does not answer is named instead ("node c: its
// agent does not answer: ...").
absl::Status OnEveryAgent(
    const std::vector<std::string>& nodes,
    const Reconfigurer::AgentLookup& agents,
    const std::function<absl::Status(agent::AgentClient&)>& fn,
    const std::function<bool(const std::string&)>& answers = nullptr);

}  // namespace arachne::controller

#endif  // ARACHNE_CONTROLLER_RECONFIGURER_H_
