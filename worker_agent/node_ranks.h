// What a node's training ranks are and do, independent of where they run
// (docs/engines.md): the GPUs of the node, the phases of a live switch,
// and the NodeRanks interface the Agent service drives.
#ifndef ARACHNE_WORKER_AGENT_NODE_RANKS_H_
#define ARACHNE_WORKER_AGENT_NODE_RANKS_H_

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "migration/core/state_layout.h"
#include "planner_service/core/model/cluster.h"
#include "planner_service/core/model/plan.h"
#include "worker_agent/engine/engine.h"

namespace arachne::agent {

// The GPUs this agent owns: `count` GPUs of one catalog type on node `node`.
struct NodeGpus {
  std::string node;
  int gpu_type = -1;  // catalog index
  int count = 0;
  bool virtual_gpus = true;  // CPU ranks over Gloo standing in for GPUs
  // A virtual GPU's speed as a fraction of its CPU rank's, in (0, 1]: each
  // compute step is held to 1 / speed times its CPU time (compute_pacer.h).
  double virtual_gpu_speed = 1;
  // The address other nodes reach this node's ranks at (process groups and
  // the migration transport listen there).
  std::string host = "127.0.0.1";
  // Fault injection (agent_config.proto): "corrupt-migration-stage-<1|2>"
  // flips a byte of the first transfer this node receives in that stage.
  std::string failpoint;
  // How long a rank waits in one collective or point-to-point transfer of
  // an iteration before it gives up. When a peer dies, the ranks blocked on
  // it fail within this time, so the node can pause for the recovery switch
  // (it must stay below the controller's pause timeout).
  absl::Duration collective_timeout = absl::Seconds(10);
  // -1: the runtime runs every GPU of the node (ranks as threads of the
  // agent); >= 0: only that local GPU (the runtime inside an arachne-engine
  // process). `count` is the node's GPU count either way: clusters name
  // nodes, not single GPUs.
  int local_rank = -1;
  // A migration's staging memory per GPU (packed small segments, both
  // directions; migration::ExecutorOptions::staging_bytes), kept between
  // switches.
  int64_t staging_bytes = migration::ExecutorOptions::kDefaultStagingBytes;
  bool Owns(int index) const { return local_rank < 0 || local_rank == index; }
};

enum class Phase {
  kIdle,       // no plan yet
  kPrepared,   // generation n prepared, c (if any) still current
  kPaused,     // c paused at an iteration boundary, n prepared
  kMigrated1,  // stage 1 of c -> n done
  kMigrated2,  // stage 2 done
  kRebuilt,    // n's groups and engines built
  kRunning,    // current generation training (or idle between iterations)
  kStopped,    // current generation paused, nothing prepared
  kFailed,     // a rank failed; see RankStatus::error
};
const char* PhaseName(Phase p);

struct PrepareArgs {
  int64_t generation = 0;  // the new generation, > the current one
  JobSpec job;
  // The plan to switch to and the cluster it is placed on: every GPU of this
  // cluster is a migration rank (cluster order), so a node that drains stays
  // in it until the switch commits.
  Cluster cluster;
  Plan plan;
  // The current plan and its cluster (none for generation 1).
  std::optional<Cluster> old_cluster;
  std::optional<Plan> old_plan;
  // GPUs of the old plan whose state is gone (their agent died).
  std::vector<migration::GpuId> lost;
  // host:port of the job's TCPStore (c10d), the rendezvous of every group.
  std::string store_address;
  // Load generation 1 from this checkpoint instead of the initial weights;
  // for a later generation, restore from it instead of migrating.
  std::string checkpoint_dir;
};

struct PrepareResult {
  int64_t bytes_to_receive = 0;  // this node's ranks, both stages
  int64_t bytes_to_send = 0;
  int64_t bytes_kept = 0;
  double estimated_seconds = 0;  // the schedule's makespan estimate
};

struct RankStatus {
  migration::GpuId gpu;
  bool in_plan = false;  // the current plan uses this GPU
  int64_t iteration = 0;
  double loss = 0;
  double iteration_seconds = 0;
  double tokens_per_second = 0;
  int64_t state_bytes = 0;
  // Of the process that runs the rank (its engine process; the agent with
  // in-process ranks, which then share it).
  int64_t peak_rss_bytes = 0;
  std::string error;  // non-empty when the rank failed
  // The rank's engine process died: its state is gone (the supervisor has
  // started a fresh engine on the GPU, which holds nothing).
  bool lost = false;
  int64_t engine_pid = 0;  // 0 for a rank running in this process
  std::string device = "cpu";
  // The last switch's memory, of the same process as peak_rss_bytes: its
  // resident set when Prepare began and its peak since (0 before any).
  int64_t switch_start_rss_bytes = 0;
  int64_t switch_peak_rss_bytes = 0;
};

struct PhaseTiming {
  double seconds = 0;
  int64_t bytes_sent = 0;
  int64_t bytes_received = 0;
};

struct NodeStatus {
  int64_t current_generation = 0;   // 0: none
  int64_t prepared_generation = 0;  // 0: none
  Phase phase = Phase::kIdle;
  int64_t iteration = 0;  // of the current generation's ranks
  double loss = 0;        // of the last iteration
  std::vector<RankStatus> ranks;
  // Of the last switch this node took part in.
  PhaseTiming pause, stage1, stage2, rebuild_groups, rebuild_engines, resume;
};

// The training ranks of one node, whichever way they run: as threads of
// this process (NodeRuntime) or as one engine process per GPU under a
// supervisor (EngineSupervisor, worker_agent/engine_supervisor.h). The
// Agent service serves either. The contract of each call:
//
// Every call carries a generation. Generation g names one plan; the store
// prefix of each of its process groups is "arachne/g<g>/...". The switch
// from the current generation c to n > c:
//   Prepare(n)  plan n's layout, diff and two-stage schedule are computed
//               (the same on every agent); the migration transport connects
//               and plan n's process groups and engines are built, their
//               state not yet filled. Training under c goes on.
//   Pause(n, k) every rank of c stops after iteration k (the same k on all).
//   Migrate(n, 1), Migrate(n, 2)  the schedule's stages; the old state is
//               only read.
//   Rebuild(n)  plan n's engines load the migrated state (their groups
//               exist since Prepare).
//   Commit(n)   n becomes current; c's engines and groups are destroyed.
//   Resume(n)   training goes on under n.
//   Abort(n)    n's state is dropped; c stays current (and resumes when
//               asked).
// The first plan of a job is generation 1, prepared with no old plan and
// rebuilt from the initial weights (or a checkpoint).
// Every call is idempotent: repeating a call that succeeded answers the same
// without doing it again. A call for a generation other than the current or
// the prepared one is FailedPrecondition naming both.
// A job's training state as an engine describes it (the engine protocol's
// Describe): what the controller computes diffs from.
struct StateDescription {
  std::string engine;  // e.g. "arachne-engine (reference engine, ...)"
  migration::ModelState state;
};

class NodeRanks {
 public:
  virtual ~NodeRanks() = default;
  virtual const NodeGpus& gpus() const = 0;

  // InvalidArgument when the cluster's entry for this node disagrees with
  // the GPUs this agent owns (type, count) or the plan/job is malformed;
  // FailedPrecondition for a stale generation or a diff with a byte no
  // live GPU holds.
  virtual absl::StatusOr<PrepareResult> Prepare(const PrepareArgs& args) = 0;
  // Asks the current plan's ranks to stop at the first iteration boundary
  // at or after `at_iteration` (0: the next one) and blocks until this
  // node's ranks stopped, or `timeout` (DeadlineExceeded). The ranks agree
  // on the boundary in the iteration's last collective, so every rank of the
  // plan (on every agent, whether its Pause arrived yet or not) stops at the
  // same one. Returns that iteration. Ranks already stopped (Resume's
  // run_until reached) stay where they are.
  virtual absl::StatusOr<int64_t> Pause(int64_t generation,
                                        int64_t at_iteration,
                                        absl::Duration timeout) = 0;
  // stage is 1 or 2. Each transfer round of the stage may take
  // `round_timeout` (zero: the phase's `timeout`).
  virtual absl::Status Migrate(int64_t generation, int stage,
                               absl::Duration timeout,
                               absl::Duration round_timeout) = 0;
  virtual absl::Status Rebuild(int64_t generation, absl::Duration timeout) = 0;
  virtual absl::Status Commit(int64_t generation) = 0;
  // Trains until iteration `run_until` (0: until paused).
  virtual absl::Status Resume(int64_t generation, int64_t run_until) = 0;
  virtual absl::Status Abort(int64_t generation) = 0;
  // Writes the current state of every local rank of the current plan into
  // `dir` (canonical layout; see worker_agent/checkpoint.h). Training must
  // be paused or stopped.
  virtual absl::Status SaveCheckpoint(int64_t generation,
                                      const std::string& dir) = 0;
  virtual NodeStatus Status() const = 0;
  // The job's training state in the canonical layout as this node's engine
  // holds it, with the engine's name; InvalidArgument naming the field for
  // a job the engine cannot train. Independent of any generation.
  virtual absl::StatusOr<StateDescription> DescribeState(
      const JobSpec& job) const = 0;
};

}  // namespace arachne::agent

#endif  // ARACHNE_WORKER_AGENT_NODE_RANKS_H_
