// Free GPUs of a cluster while a plan is being built, and the placement rule
// that packs TP groups into nodes (paper §5.2: a TP group never crosses a
// node; prefer a node whose free size equals the TP degree, else take GPUs
// from a larger node; keep a replica's consecutive stages on one node when
// they share a type, so activations cross NVLink/PCIe, not the network).
#ifndef ARACHNE_PLANNER_SERVICE_CORE_MODEL_NODE_POOL_H_
#define ARACHNE_PLANNER_SERVICE_CORE_MODEL_NODE_POOL_H_

#include <cstdint>
#include <memory>
#include <vector>

#include "absl/status/status.h"
#include "absl/types/span.h"
#include "planner_service/core/model/cluster.h"
#include "planner_service/core/model/plan.h"

namespace arachne {

inline constexpr int kMaxGpusPerNode = 64;

class NodePool {
 public:
  // All GPUs of `cluster` free. The cluster must outlive the pool.
  explicit NodePool(const Cluster& cluster);

  // Marks the GPUs of every template of `plan` as used; InvalidArgument
  // naming the template, replica and stage when one is absent or taken.
  absl::Status Take(const Plan& plan);

  // Places one replica of `stages` (type and tp of each) and appends its
  // placement to `out`; returns false and changes nothing when it does not
  // fit.
  bool PlaceReplica(absl::Span<const Stage> stages,
                    std::vector<StagePlacement>* out);

  // Places the TP group of one stage of a replica by the rule PlaceReplica
  // applies to each of its stages (`previous_node`: the node of the
  // replica's previous stage, -1 for its first). Returns the node taken, or
  // -1 and changes nothing when no node of `gpu_type` has `tp` GPUs free.
  // Calling it stage after stage (passing back the node it returned) places
  // a replica exactly as PlaceReplica does, so a caller that builds a
  // structure one stage at a time (the construction environment's masks)
  // sees the placement auto-fill will make.
  int PlaceStage(int gpu_type, int tp, int previous_node, StagePlacement* out);

  // Marks every free GPU of `node` as used, so no placement goes there
  // (a planner confined to part of the cluster withholds the rest).
  void Withhold(int node);

  // 0 for a type the cluster does not have.
  int FreeOfType(int gpu_type) const {
    return gpu_type >= 0 && gpu_type < static_cast<int>(free_by_type_.size())
               ? free_by_type_[gpu_type]
               : 0;
  }
  int FreeOnNode(int node) const { return free_count_[node]; }
  int TotalFree() const { return total_free_; }
  // Largest free block on one node of `gpu_type`.
  int LargestFreeOfType(int gpu_type) const;

 private:
  int ChooseNode(int gpu_type, int tp, int previous_node) const;
  void TakeGpus(int node, int count, StagePlacement* out);
  // Frees the GPUs TakeGpus took for `placed`.
  void GiveBackGpus(const StagePlacement& placed);

  // Sets `node`'s free GPU count, keeping the per-type counts, the total
  // and the histogram in step (the free mask is the caller's).
  void SetFreeCount(int node, int count);

  // What depends only on the cluster, shared by every copy of a pool
  // (searches copy pools per template they fill).
  struct Layout {
    std::vector<std::vector<int>> nodes_by_type;
    // free_histogram_[histogram_offset[t] + f]: nodes of type t with f free
    // GPUs, f in [0, Cluster::MaxNodeSizeOfType(t)].
    std::vector<int> histogram_offset;
  };

  const Cluster* cluster_;
  std::shared_ptr<const Layout> layout_;
  std::vector<uint64_t> free_mask_;  // bit i: local GPU i is free
  std::vector<int> free_count_;
  std::vector<int> free_by_type_;
  // How many nodes of each type have each free count: the largest free
  // node and the best-fitting one without a scan of every node.
  std::vector<int> free_histogram_;
  int total_free_ = 0;
};

}  // namespace arachne

#endif  // ARACHNE_PLANNER_SERVICE_CORE_MODEL_NODE_POOL_H_
