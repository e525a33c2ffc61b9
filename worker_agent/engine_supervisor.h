// A node's ranks as engine processes, one per GPU (docs/engines.md): the
// agent's default way to run them. The supervisor starts the engine
// command once per local GPU (environment: engine_launch.h), talks to each
// over arachne.v1.Engine on its Unix socket, forwards every phase of a
// switch to its engines in parallel and merges their answers into the
// node's, so the Agent service cannot tell it from in-process ranks
// (NodeRanks, node_ranks.h).
//
// An engine that exits (waitpid, on a thread that keeps it) or stops
// answering (Status unanswered for hang_timeout, or a phase call past its
// timeout: then the supervisor kills it) is reported at once: its rank is
// `lost` in Status with the reason, the agent itself stays up, and a fresh
// engine is started on the GPU, holding nothing until a generation that
// includes it commits. A fresh engine takes part in Prepare, Migrate,
// Rebuild, Commit and Abort (a joiner of the next generation) but not in
// Pause, Resume or SaveCheckpoint (it has no current generation).
//
// Engines die with the agent (PR_SET_PDEATHSIG), and on destruction get
// SIGTERM, then SIGKILL after a grace period.
#ifndef ARACHNE_WORKER_AGENT_ENGINE_SUPERVISOR_H_
#define ARACHNE_WORKER_AGENT_ENGINE_SUPERVISOR_H_

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "planner_service/core/model/gpu_catalog.h"
#include "worker_agent/node_ranks.h"

namespace arachne::agent {

struct EngineSupervisorConfig {
  // argv of the engine; command[0] is the program (a path). The launch
  // environment is added to this process's.
  std::vector<std::string> command;
  // Engine logs (engine-<i>.log, appended across restarts); "" = the
  // socket directory.
  std::string log_dir;
  // Where the engines' sockets go; "" = a fresh directory under $TMPDIR
  // (or /tmp), mode 0700, removed on destruction.
  std::string socket_dir;
  std::string profiles_dir;  // passed as ARACHNE_PROFILES_DIR
  // How long an engine may take from exec to answering Describe.
  absl::Duration start_timeout = absl::Seconds(60);
  // An engine that has not answered Status for this long is killed.
  absl::Duration hang_timeout = absl::Seconds(10);
  // Deadline of the calls without a phase timeout (Prepare, Commit,
  // Resume, Abort, SaveCheckpoint); Pause, Migrate and Rebuild get their
  // phase timeout plus phase_margin.
  absl::Duration call_timeout = absl::Minutes(2);
  absl::Duration phase_margin = absl::Seconds(5);
  // Deadline of one Status call (Status, and the liveness check each
  // second).
  absl::Duration status_timeout = absl::Seconds(2);
  // SIGTERM to SIGKILL on destruction.
  absl::Duration stop_grace = absl::Seconds(5);
};

class EngineSupervisor final : public NodeRanks {
 public:
  // Starts one engine per GPU of `gpus` and waits until each answers
  // Describe with this build's protocol version. InvalidArgument naming
  // "engine_command" when the program cannot be executed; a start that
  // fails (the engine exits, answers another protocol version, or does not
  // answer within start_timeout) is that error naming the GPU, with the
  // last lines of the engine's log.
  static absl::StatusOr<std::unique_ptr<EngineSupervisor>> Start(
      NodeGpus gpus, GpuCatalog catalog, EngineSupervisorConfig config);
  ~EngineSupervisor() override;
  EngineSupervisor(const EngineSupervisor&) = delete;
  EngineSupervisor& operator=(const EngineSupervisor&) = delete;

  const NodeGpus& gpus() const override { return gpus_; }
  absl::StatusOr<PrepareResult> Prepare(const PrepareArgs& args) override;
  absl::StatusOr<int64_t> Pause(int64_t generation, int64_t at_iteration,
                                absl::Duration timeout) override;
  absl::Status Migrate(int64_t generation, int stage, absl::Duration timeout,
                       absl::Duration round_timeout) override;
  absl::Status Rebuild(int64_t generation, absl::Duration timeout) override;
  absl::Status Commit(int64_t generation) override;
  absl::Status Resume(int64_t generation, int64_t run_until) override;
  absl::Status Abort(int64_t generation) override;
  absl::Status SaveCheckpoint(int64_t generation,
                              const std::string& dir) override;
  NodeStatus Status() const override;
  // Asks the first running engine (each engine of a node runs the same
  // command, so any one answers for all).
  absl::StatusOr<StateDescription> DescribeState(
      const JobSpec& job) const override;

  // The pid of GPU `index`'s engine; 0 while it is being restarted.
  int64_t EnginePid(int index) const;
  const std::string& log_dir() const { return log_dir_; }

 private:
  struct Engine;
  EngineSupervisor(NodeGpus gpus, GpuCatalog catalog,
                   EngineSupervisorConfig config);
  void Keep(Engine* e);  // the thread that starts and reaps one engine
  void WatchLiveness();  // the thread that kills engines that hang
  absl::Status StartOnce(Engine* e);
  // One call to one engine, its error prefixed "GPU <i>: ". A phase call
  // past `deadline` means the engine hung: it is killed (and so lost).
  template <typename Method, typename Request, typename Response>
  absl::Status Call(Engine& e, const char* name, Method method,
                    const Request& request, Response* response,
                    absl::Duration deadline) const;
  std::vector<int> AllEngines() const;
  // The engines that hold a generation (not started since the last commit).
  std::vector<int> Holders() const;

  NodeGpus gpus_;
  GpuCatalog catalog_;
  EngineSupervisorConfig config_;
  std::string log_dir_;
  bool own_socket_dir_ = false;
  std::vector<std::unique_ptr<Engine>> engines_;
  struct Shared;
  std::unique_ptr<Shared> shared_;
};

}  // namespace arachne::agent

#endif  // ARACHNE_WORKER_AGENT_ENGINE_SUPERVISOR_H_
