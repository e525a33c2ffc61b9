#include "migration/core/diff.h"

#include <algorithm>
#include <array>
#include <tuple>
#include <utility>

#include "absl/container/flat_hash_map.h"
#include "absl/container/flat_hash_set.h"
#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "glog/logging.h"

namespace arachne::migration {

MigrationWorld::MigrationWorld(const Cluster& cluster,
                               const GpuCatalog& catalog) {
  for (int n = 0; n < cluster.num_nodes(); ++n) {
    const Node& node = cluster.node(n);
    first_rank_.push_back(size());
    node_names_.push_back(node.name);
    intra_gbytes_.push_back(catalog.type(node.gpu_type).intra_node_gbps);
    nic_gbytes_.push_back(cluster.NicGBps(n));
    for (int g = 0; g < node.num_gpus; ++g) {
      gpus_.push_back({node.name, g});
      node_of_.push_back(n);
    }
  }
}

int MigrationWorld::RankOf(const GpuId& id) const {
  for (int n = 0; n < num_nodes(); ++n) {
    if (node_names_[n] != id.node) continue;
    const int count = (n + 1 < num_nodes() ? first_rank_[n + 1] : size()) -
                      first_rank_[n];
    return id.index >= 0 && id.index < count ? first_rank_[n] + id.index : -1;
  }
  return -1;
}

double MigrationWorld::BytesPerSecond(int a, int b) const {
  const int na = node_of_[a], nb = node_of_[b];
  if (na == nb) return intra_gbytes_[na] * 1e9;
  return std::min(nic_gbytes_[na], nic_gbytes_[nb]) * 1e9;
}

namespace {

struct Holder {
  int rank;
  ByteRange range;
};

// A range a receiver needs and the holders it may come from.
struct Need {
  int receiver;
  int tensor;
  ByteRange range;
  std::vector<int> candidates;  // ranks, ascending
};

// Sender load, in seconds of link time, used to balance the choice.
class SenderLoad {
 public:
  explicit SenderLoad(const MigrationWorld& world)
      : world_(world), gpu_s_(world.size(), 0.0), nic_s_(world.num_nodes(), 0.0) {}

  // What the busiest resource of `sender` would reach with this transfer.
  double ScoreIfAdded(int sender, int receiver, int64_t bytes) const {
    const double t = bytes / world_.BytesPerSecond(sender, receiver);
    double score = gpu_s_[sender] + t;
    if (!world_.SameNode(sender, receiver)) {
      score = std::max(score, nic_s_[world_.node_of(sender)] + t);
    }
    return score;
  }
  void Add(int sender, int receiver, int64_t bytes) {
    const double t = bytes / world_.BytesPerSecond(sender, receiver);
    gpu_s_[sender] += t;
    if (!world_.SameNode(sender, receiver)) nic_s_[world_.node_of(sender)] += t;
  }
  double gpu_seconds(int rank) const { return gpu_s_[rank]; }

 private:
  const MigrationWorld& world_;
  std::vector<double> gpu_s_;
  std::vector<double> nic_s_;
};

// Per-stage resource loads (a GPU's sends, its receives, a NIC each way),
// as the schedule's lower bound counts them. The two stages run one after
// the other, so the makespan is at least the sum of their busiest
// resources; a sender that keeps that sum lower is preferred.
class StageLoad {
 public:
  explicit StageLoad(const MigrationWorld& world) : world_(world) {
    for (auto& l : load_) l.assign(2 * world.size() + 2 * world.num_nodes(), 0);
  }
  // Sum of both stages' busiest resources with this transfer in `stage`.
  double SumIfAdded(int stage, int sender, int receiver, int64_t bytes) const {
    const double t = bytes / world_.BytesPerSecond(sender, receiver);
    const auto& l = load_[stage - 1];
    double m = max_[stage - 1];
    for (int r : Resources(sender, receiver)) {
      if (r >= 0) m = std::max(m, l[r] + t);
    }
    return m + max_[2 - stage];
  }
  void Add(int stage, int sender, int receiver, int64_t bytes) {
    const double t = bytes / world_.BytesPerSecond(sender, receiver);
    auto& l = load_[stage - 1];
    for (int r : Resources(sender, receiver)) {
      if (r >= 0) {
        l[r] += t;
        max_[stage - 1] = std::max(max_[stage - 1], l[r]);
      }
    }
  }

 private:
  std::array<int, 4> Resources(int sender, int receiver) const {
    const int w = world_.size(), n = world_.num_nodes();
    if (world_.SameNode(sender, receiver)) return {sender, w + receiver, -1, -1};
    return {sender, w + receiver, 2 * w + world_.node_of(sender),
            2 * w + n + world_.node_of(receiver)};
  }
  const MigrationWorld& world_;
  std::array<std::vector<double>, 2> load_;
  std::array<double, 2> max_ = {0, 0};
};

// `range` minus `cut` (at most two pieces).
std::vector<ByteRange> Subtract(const ByteRange& range, const ByteRange& cut) {
  if (cut.empty()) return {range};
  std::vector<ByteRange> out;
  if (cut.begin > range.begin) out.push_back({range.begin, cut.begin});
  if (cut.end < range.end) out.push_back({cut.end, range.end});
  return out;
}

const Holding* FindHolding(const std::vector<Holding>& sorted, int tensor) {
  auto it = std::lower_bound(
      sorted.begin(), sorted.end(), tensor,
      [](const Holding& h, int t) { return h.tensor < t; });
  return it != sorted.end() && it->tensor == tensor ? &*it : nullptr;
}

}  // namespace

absl::StatusOr<StateDiff> ComputeDiff(const ModelState& state,
                                      const Plan& old_plan,
                                      const Cluster& old_cluster,
                                      const Plan& new_plan,
                                      const Cluster& new_cluster,
                                      const MigrationWorld& world,
                                      const DiffOptions& options) {
  absl::StatusOr<PlanLayout> old_layout =
      PlanLayout::Create(state, old_plan, old_cluster);
  if (!old_layout.ok()) {
    return absl::InvalidArgumentError(
        absl::StrCat("old plan: ", old_layout.status().message()));
  }
  absl::StatusOr<PlanLayout> new_layout =
      PlanLayout::Create(state, new_plan, new_cluster);
  if (!new_layout.ok()) {
    return absl::InvalidArgumentError(
        absl::StrCat("new plan: ", new_layout.status().message()));
  }
  for (const Node& old_node : old_cluster.nodes()) {
    for (const Node& new_node : new_cluster.nodes()) {
      if (old_node.name == new_node.name &&
          old_node.gpu_type != new_node.gpu_type) {
        return absl::InvalidArgumentError(absl::StrCat(
            "node ", old_node.name, " has GPU type ", old_node.gpu_type,
            " in the old cluster and ", new_node.gpu_type,
            " in the new one; a changed node needs a new name"));
      }
    }
  }
  absl::flat_hash_set<int> lost;
  for (const GpuId& id : options.lost) {
    const int r = world.RankOf(id);
    if (r >= 0) lost.insert(r);
  }

  // Who still holds what from the old plan.
  std::vector<std::vector<Holder>> holders(state.num_tensors());
  std::vector<std::vector<Holding>> old_by_rank(world.size());
  for (int g = 0; g < old_layout->num_gpus(); ++g) {
    const int rank = world.RankOf(old_layout->gpus()[g]);
    if (rank < 0 || lost.contains(rank)) continue;
    old_by_rank[rank] = old_layout->holdings(g);
    for (const Holding& h : old_layout->holdings(g)) {
      holders[h.tensor].push_back({rank, h.range});
    }
  }
  // Pipeline replica of the new plan each rank serves, for the stage split.
  std::vector<int> pipeline(world.size(), -1);
  {
    absl::flat_hash_map<std::pair<int, int>, int> ids;
    for (int g = 0; g < new_layout->num_gpus(); ++g) {
      const GpuRole& role = new_layout->role(g);
      const int rank = world.RankOf(new_layout->gpus()[g]);
      CHECK_GE(rank, 0) << "the world is the new cluster";
      auto [it, inserted] = ids.try_emplace({role.template_index, role.replica},
                                            static_cast<int>(ids.size()));
      pipeline[rank] = it->second;
    }
  }

  StateDiff diff;
  diff.required.resize(world.size());
  diff.kept.resize(world.size());
  std::vector<Need> needs;
  for (int g = 0; g < new_layout->num_gpus(); ++g) {
    const int rank = world.RankOf(new_layout->gpus()[g]);
    diff.required[rank] = new_layout->holdings(g);
    for (const Holding& h : new_layout->holdings(g)) {
      diff.naive_bytes += h.range.size();
      ByteRange keep;
      if (const Holding* own = FindHolding(old_by_rank[rank], h.tensor)) {
        keep = Intersect(own->range, h.range);
      }
      if (!keep.empty()) {
        diff.kept[rank].push_back({h.tensor, keep});
        diff.bytes_kept += keep.size();
      }
      for (const ByteRange& missing : Subtract(h.range, keep)) {
        // Cut the missing range where holders' ranges begin or end, so each
        // segment has one set of holders covering it whole.
        std::vector<int64_t> cuts = {missing.begin, missing.end};
        for (const Holder& ho : holders[h.tensor]) {
          if (ho.range.begin > missing.begin && ho.range.begin < missing.end) {
            cuts.push_back(ho.range.begin);
          }
          if (ho.range.end > missing.begin && ho.range.end < missing.end) {
            cuts.push_back(ho.range.end);
          }
        }
        std::sort(cuts.begin(), cuts.end());
        cuts.erase(std::unique(cuts.begin(), cuts.end()), cuts.end());
        for (size_t i = 0; i + 1 < cuts.size(); ++i) {
          const ByteRange seg{cuts[i], cuts[i + 1]};
          std::vector<int> cands;
          for (const Holder& ho : holders[h.tensor]) {
            if (ho.range.begin <= seg.begin && ho.range.end >= seg.end) {
              cands.push_back(ho.rank);
            }
          }
          if (cands.empty()) {
            return absl::FailedPreconditionError(absl::StrCat(
                "no GPU still holds bytes [", seg.begin, ", ", seg.end,
                ") of tensor '", state.tensor(h.tensor).name,
                "' that the new plan needs on GPU ",
                GpuIdName(world.gpu(rank)),
                "; restore this state from a checkpoint"));
          }
          std::sort(cands.begin(), cands.end());
          if (!needs.empty() && needs.back().receiver == rank &&
              needs.back().tensor == h.tensor &&
              needs.back().range.end == seg.begin &&
              needs.back().candidates == cands) {
            needs.back().range.end = seg.end;
          } else {
            needs.push_back({rank, h.tensor, seg, std::move(cands)});
          }
        }
      }
    }
  }

  // Largest first, so balancing has the small ranges left to even out.
  std::sort(needs.begin(), needs.end(), [](const Need& a, const Need& b) {
    return std::make_tuple(-a.range.size(), a.receiver, a.tensor,
                           a.range.begin) <
           std::make_tuple(-b.range.size(), b.receiver, b.tensor,
                           b.range.begin);
  });
  SenderLoad load(world);
  StageLoad stages(world);
  for (const Need& need : needs) {
    std::vector<int> best;
    for (int c : need.candidates) {
      if (world.SameNode(c, need.receiver)) best.push_back(c);
    }
    if (best.empty()) best = need.candidates;
    int parts = 1;
    if (options.split_across_holders && best.size() > 1 &&
        options.min_split_bytes > 0) {
      parts = static_cast<int>(std::min<int64_t>(
          best.size(), need.range.size() / options.min_split_bytes));
      parts = std::max(parts, 1);
    }
    for (int p = 0; p < parts; ++p) {
      const ByteRange part{
          need.range.begin + need.range.size() * p / parts,
          need.range.begin + need.range.size() * (p + 1) / parts};
      // Least loaded: the sum of the stages' busiest resources first, then
      // the sender's busiest resource, then its own sends (GPUs behind one
      // NIC tie on the second), then the lower rank.
      auto stage_of = [&](int sender) {
        return pipeline[sender] >= 0 && pipeline[sender] == pipeline[need.receiver]
                   ? 1
                   : 2;
      };
      int chosen = -1;
      std::tuple<double, double, double> chosen_score;
      for (int c : best) {
        const std::tuple<double, double, double> score = {
            stages.SumIfAdded(stage_of(c), c, need.receiver, part.size()),
            load.ScoreIfAdded(c, need.receiver, part.size()),
            load.gpu_seconds(c)};
        if (chosen < 0 || score < chosen_score) {
          chosen = c;
          chosen_score = score;
        }
      }
      load.Add(chosen, need.receiver, part.size());
      stages.Add(stage_of(chosen), chosen, need.receiver, part.size());
      MigrationTuple t{.sender = chosen,
                       .receiver = need.receiver,
                       .tensor = need.tensor,
                       .range = part,
                       .stage = stage_of(chosen)};
      MigrationTuple* last = diff.tuples.empty() ? nullptr : &diff.tuples.back();
      if (p > 0 && last->sender == t.sender && last->range.end == part.begin) {
        last->range.end = part.end;
      } else {
        diff.tuples.push_back(t);
      }
      diff.bytes_moved += part.size();
    }
  }
  std::sort(diff.tuples.begin(), diff.tuples.end(),
            [](const MigrationTuple& a, const MigrationTuple& b) {
              return std::make_tuple(a.stage, a.sender, a.receiver, a.tensor,
                                     a.range.begin) <
                     std::make_tuple(b.stage, b.sender, b.receiver, b.tensor,
                                     b.range.begin);
            });
  return diff;
}

}  // namespace arachne::migration
