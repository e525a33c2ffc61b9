// The plan diff (paper §5.6): which bytes must move from which GPU to which
// so that, afterwards, every GPU holds exactly what the new plan requires.
//
// The migration world is every GPU of the new plan's cluster; its rank is
// the GPU's position in that cluster (nodes in file order, local index
// inside). A GPU of the old plan whose node or index is absent from the new
// cluster has left and holds nothing. A GPU that holds a range it needs
// keeps it and copies nothing; every other needed range is fetched from a
// holder: among those with the best link (same node over NVLink/PCIe before
// the network), the one that keeps lowest the sum of the two stages' busiest
// resources, then its own busiest resource, its sends, its rank. A range
// several equally linked holders share is cut into parts chosen the same way,
// so it is split among them when that lowers their load (docs/migration.md).
#ifndef ARACHNE_MIGRATION_CORE_DIFF_H_
#define ARACHNE_MIGRATION_CORE_DIFF_H_

#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "migration/core/state_layout.h"
#include "planner_service/core/model/cluster.h"
#include "planner_service/core/model/gpu_catalog.h"
#include "planner_service/core/model/plan.h"

namespace arachne::migration {

// The GPUs taking part in a migration and the links between them.
class MigrationWorld {
 public:
  // All GPUs of `cluster`, ranked in cluster order.
  MigrationWorld(const Cluster& cluster, const GpuCatalog& catalog);

  int size() const { return static_cast<int>(gpus_.size()); }
  const GpuId& gpu(int rank) const { return gpus_[rank]; }
  // Rank of `id`, or -1 when the GPU is not in the world.
  int RankOf(const GpuId& id) const;
  int node_of(int rank) const { return node_of_[rank]; }
  int num_nodes() const { return static_cast<int>(nic_gbytes_.size()); }
  bool SameNode(int a, int b) const { return node_of_[a] == node_of_[b]; }
  // Bandwidth of a transfer from `a` to `b` in bytes/s: the node's
  // intra-node link (catalog) on one node, else the slower of the two NICs.
  double BytesPerSecond(int a, int b) const;
  // NIC bandwidth of a node in bytes/s.
  double NicBytesPerSecond(int node) const { return nic_gbytes_[node] * 1e9; }

 private:
  std::vector<GpuId> gpus_;
  std::vector<int> node_of_;
  std::vector<double> intra_gbytes_;  // per node, GB/s
  std::vector<double> nic_gbytes_;    // per node, GB/s
  std::vector<int> first_rank_;       // per node
  std::vector<std::string> node_names_;
};

// One byte range of one tensor to copy from `sender` to `receiver` (ranks of
// the world). Stage 1 when both lie in one pipeline replica of the new plan,
// else stage 2.
struct MigrationTuple {
  int sender = 0;
  int receiver = 0;
  int tensor = 0;
  ByteRange range;
  int stage = 2;
  friend bool operator==(const MigrationTuple&, const MigrationTuple&) =
      default;
};

struct DiffOptions {
  // GPUs of the new cluster whose old state is lost (a GPU that failed and
  // came back empty); they may still receive.
  std::vector<GpuId> lost;
  // A range several equally linked holders share is split into parts of at
  // least this many bytes, one per holder, to balance their sends.
  int64_t min_split_bytes = int64_t{4} << 20;
  bool split_across_holders = true;
};

struct StateDiff {
  // Ranked GPUs; what every rank must hold under the new plan (empty for a
  // GPU the new plan does not use), sorted by tensor.
  std::vector<std::vector<Holding>> required;
  // Bytes each rank already holds and keeps (copied locally, not sent).
  std::vector<std::vector<Holding>> kept;
  // Sorted by (stage, sender, receiver, tensor, range.begin).
  std::vector<MigrationTuple> tuples;
  int64_t bytes_moved = 0;
  int64_t bytes_kept = 0;
  // What a diff that re-sends every shard of the new plan would move.
  int64_t naive_bytes = 0;
};

// The diff from `old_plan` on `old_cluster` to `new_plan` on `new_cluster`.
// Errors: InvalidArgument from PlanLayout::Create for a malformed plan (the
// message says "old plan" or "new plan"), or when a node name has a
// different GPU type in the two clusters; FailedPrecondition naming the
// tensor, byte range and receiving GPU when no GPU still holds a range the
// new plan needs (the caller must restore from a checkpoint instead).
absl::StatusOr<StateDiff> ComputeDiff(const ModelState& state,
                                      const Plan& old_plan,
                                      const Cluster& old_cluster,
                                      const Plan& new_plan,
                                      const Cluster& new_cluster,
                                      const MigrationWorld& world,
                                      const DiffOptions& options = {});

}  // namespace arachne::migration

#endif  // ARACHNE_MIGRATION_CORE_DIFF_H_
