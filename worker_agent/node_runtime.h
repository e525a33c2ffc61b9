// The training ranks of one node as threads of this process, one per
// local GPU (real or virtual), or a single GPU's rank inside an
// arachne-engine process (NodeGpus::local_rank). The contract of every
// call is NodeRanks' (node_ranks.h).
//
// The engines' state stays in this process's memory, so checkpoints,
// migration and status need no extra process boundary; a rank whose engine
// fails is reported as failed in Status, never hidden.
#ifndef ARACHNE_WORKER_AGENT_NODE_RUNTIME_H_
#define ARACHNE_WORKER_AGENT_NODE_RUNTIME_H_

#include <cstdint>
#include <memory>
#include <string>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "planner_service/core/model/gpu_catalog.h"
#include "worker_agent/node_ranks.h"

namespace arachne::agent {

class NodeRuntime final : public NodeRanks {
 public:
  NodeRuntime(NodeGpus gpus, GpuCatalog catalog);
  ~NodeRuntime();
  NodeRuntime(const NodeRuntime&) = delete;
  NodeRuntime& operator=(const NodeRuntime&) = delete;

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
  absl::StatusOr<StateDescription> DescribeState(
      const JobSpec& job) const override;

 private:
  struct Impl;
  NodeGpus gpus_;
  std::unique_ptr<Impl> impl_;
};

}  // namespace arachne::agent

#endif  // ARACHNE_WORKER_AGENT_NODE_RUNTIME_H_
