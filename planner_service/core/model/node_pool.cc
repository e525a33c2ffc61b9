#include "planner_service/core/model/node_pool.h"

#include <bit>

#include "absl/strings/str_cat.h"
#include "glog/logging.h"

namespace arachne {

NodePool::NodePool(const Cluster& cluster) : cluster_(&cluster) {
  int max_type = 0;
  for (const Node& n : cluster.nodes()) max_type = std::max(max_type, n.gpu_type + 1);
  auto layout = std::make_shared<Layout>();
  layout->nodes_by_type.resize(max_type);
  free_by_type_.assign(max_type, 0);
  for (int i = 0; i < cluster.num_nodes(); ++i) {
    const Node& n = cluster.node(i);
    CHECK_LE(n.num_gpus, kMaxGpusPerNode) << "Cluster::Create bounds node size";
    free_mask_.push_back(n.num_gpus == 64 ? ~uint64_t{0}
                                          : (uint64_t{1} << n.num_gpus) - 1);
    free_count_.push_back(n.num_gpus);
    free_by_type_[n.gpu_type] += n.num_gpus;
    layout->nodes_by_type[n.gpu_type].push_back(i);
    total_free_ += n.num_gpus;
  }
  int offset = 0;
  for (int t = 0; t < max_type; ++t) {
    layout->histogram_offset.push_back(offset);
    offset += cluster.MaxNodeSizeOfType(t) + 1;
  }
  free_histogram_.assign(offset, 0);
  for (int i = 0; i < cluster.num_nodes(); ++i) {
    const Node& n = cluster.node(i);
    ++free_histogram_[layout->histogram_offset[n.gpu_type] + n.num_gpus];
  }
  layout_ = std::move(layout);
}

void NodePool::SetFreeCount(int node, int count) {
  const int type = cluster_->node(node).gpu_type;
  const int offset = layout_->histogram_offset[type];
  --free_histogram_[offset + free_count_[node]];
  ++free_histogram_[offset + count];
  const int delta = count - free_count_[node];
  free_by_type_[type] += delta;
  total_free_ += delta;
  free_count_[node] = count;
}

absl::Status NodePool::Take(const Plan& plan) {
  for (size_t t = 0; t < plan.templates.size(); ++t) {
    const Template& tmpl = plan.templates[t];
    for (size_t i = 0; i < tmpl.placement.size(); ++i) {
      const StagePlacement& p = tmpl.placement[i];
      // Built only for an error.
      auto where = [&] {
        // The path of plan files and docs/api.md: placement[r].stages[s].
        return absl::StrCat("templates[", t, "].placement[", i / tmpl.depth(),
                            "].stages[", i % tmpl.depth(), "]");
      };
      if (p.node < 0 || p.node >= cluster_->num_nodes()) {
        return absl::InvalidArgumentError(
            absl::StrCat(where(), ".node: no node with index ", p.node));
      }
      for (int g : p.gpus) {
        if (g < 0 || g >= cluster_->node(p.node).num_gpus) {
          return absl::InvalidArgumentError(absl::StrCat(
              where(), ".gpus: node \"", cluster_->node(p.node).name,
              "\" has no GPU ", g));
        }
        const uint64_t bit = uint64_t{1} << g;
        if (!(free_mask_[p.node] & bit)) {
          return absl::InvalidArgumentError(absl::StrCat(
              where(), ".gpus: GPU ", g, " of node \"",
              cluster_->node(p.node).name, "\" is used twice"));
        }
        free_mask_[p.node] &= ~bit;
        SetFreeCount(p.node, free_count_[p.node] - 1);
      }
    }
  }
  return absl::OkStatus();
}

void NodePool::Withhold(int node) {
  SetFreeCount(node, 0);
  free_mask_[node] = 0;
}

int NodePool::LargestFreeOfType(int gpu_type) const {
  if (gpu_type < 0 || gpu_type >= static_cast<int>(free_by_type_.size()))
    return 0;
  const int* histogram =
      free_histogram_.data() + layout_->histogram_offset[gpu_type];
  for (int f = cluster_->MaxNodeSizeOfType(gpu_type); f > 0; --f)
    if (histogram[f] > 0) return f;
  return 0;
}

int NodePool::ChooseNode(int gpu_type, int tp, int previous_node) const {
  if (gpu_type < 0 || gpu_type >= static_cast<int>(free_by_type_.size()))
    return -1;
  if (previous_node >= 0 && cluster_->node(previous_node).gpu_type == gpu_type &&
      free_count_[previous_node] >= tp) {
    return previous_node;
  }
  // An exact fit first, else the node with the fewest free GPUs that holds
  // the stage; the first such node in cluster order.
  const int* histogram =
      free_histogram_.data() + layout_->histogram_offset[gpu_type];
  const int largest = cluster_->MaxNodeSizeOfType(gpu_type);
  int fit = tp;
  while (fit <= largest && histogram[fit] == 0) ++fit;
  if (fit > largest) return -1;
  for (int n : layout_->nodes_by_type[gpu_type])
    if (free_count_[n] == fit) return n;
  LOG(FATAL) << "free histogram out of step with the nodes";
}

void NodePool::TakeGpus(int node, int count, StagePlacement* out) {
  out->node = node;
  out->gpus.clear();
  uint64_t mask = free_mask_[node];
  for (int i = 0; i < count; ++i) {
    const int g = std::countr_zero(mask);
    mask &= mask - 1;
    out->gpus.push_back(g);
  }
  free_mask_[node] = mask;
  SetFreeCount(node, free_count_[node] - count);
}

void NodePool::GiveBackGpus(const StagePlacement& placed) {
  for (int g : placed.gpus) free_mask_[placed.node] |= uint64_t{1} << g;
  SetFreeCount(placed.node, free_count_[placed.node] +
                                static_cast<int>(placed.gpus.size()));
}

int NodePool::PlaceStage(int gpu_type, int tp, int previous_node,
                         StagePlacement* out) {
  const int node = ChooseNode(gpu_type, tp, previous_node);
  if (node >= 0) TakeGpus(node, tp, out);
  return node;
}

bool NodePool::PlaceReplica(absl::Span<const Stage> stages,
                            std::vector<StagePlacement>* out) {
  const size_t start = out->size();
  int previous = -1;
  for (const Stage& st : stages) {
    const int node = ChooseNode(st.gpu_type, st.tp, previous);
    if (node < 0) {
      // Give back the stages placed (cheaper than copying the pool per
      // replica: auto-fill places every replica of every template it
      // prices).
      for (size_t i = start; i < out->size(); ++i) GiveBackGpus((*out)[i]);
      out->resize(start);
      return false;
    }
    out->emplace_back();
    TakeGpus(node, st.tp, &out->back());
    previous = node;
  }
  return true;
}

}  // namespace arachne
