// NodePool's node choice against a plain scan of every node, over random
// clusters and random sequences of placements, give-backs and withheld
// nodes: the pool's free-count histogram must pick the same node.
#include "planner_service/core/model/node_pool.h"

#include <algorithm>
#include <random>
#include <utility>
#include <vector>

#include "gtest/gtest.h"
#include "test/core/toy_fixture.h"

namespace arachne {
namespace {

using ::arachne::testing::MakeCluster;

// What the pool must choose: the previous stage's node when it still holds
// the stage, else the first node (in cluster order) with exactly `tp` free,
// else the first with the fewest free GPUs above `tp`; -1 when none.
int ReferenceChoice(const Cluster& cluster, const std::vector<int>& free,
                    int type, int tp, int previous) {
  if (previous >= 0 && cluster.node(previous).gpu_type == type &&
      free[previous] >= tp)
    return previous;
  int best = -1;
  for (int n = 0; n < cluster.num_nodes(); ++n) {
    if (cluster.node(n).gpu_type != type || free[n] < tp) continue;
    if (free[n] == tp) return n;
    if (best < 0 || free[n] < free[best]) best = n;
  }
  return best;
}

TEST(NodePoolProperty, ChoosesTheSameNodeAsAScanOfEveryNode) {
  const GpuCatalog catalog = testing::ToyCatalog();
  std::mt19937 rng(3);
  int placed = 0, refused = 0, given_back = 0;
  for (int trial = 0; trial < 200; ++trial) {
    std::vector<std::pair<int, int>> nodes;
    for (int i = 0, n = 1 + rng() % 30; i < n; ++i) {
      static constexpr int kSizes[] = {1, 2, 4, 8};
      nodes.push_back({static_cast<int>(rng() % 2), kSizes[rng() % 4]});
    }
    const Cluster cluster = MakeCluster(catalog, nodes);
    NodePool pool(cluster);
    std::vector<int> free;
    for (const Node& n : cluster.nodes()) free.push_back(n.num_gpus);
    int previous = -1;
    for (int step = 0; step < 60; ++step) {
      const int type = static_cast<int>(rng() % 2);
      const int op = static_cast<int>(rng() % 10);
      if (op == 0) {
        const int node = static_cast<int>(rng() % cluster.num_nodes());
        pool.Withhold(node);
        free[node] = 0;
      } else if (op <= 2) {
        // A replica that may not fit: a refused one gives its stages back.
        std::vector<Stage> stages(1 + rng() % 4);
        for (Stage& st : stages) {
          st.gpu_type = static_cast<int>(rng() % 2);
          st.tp = 1 << (rng() % 4);
        }
        std::vector<StagePlacement> out;
        if (pool.PlaceReplica(stages, &out)) {
          for (const StagePlacement& p : out)
            free[p.node] -= static_cast<int>(p.gpus.size());
        } else {
          EXPECT_TRUE(out.empty());
          ++given_back;
        }
      } else {
        const int tp = 1 << (rng() % 4);
        const int expected = ReferenceChoice(cluster, free, type, tp, previous);
        StagePlacement p;
        const int node = pool.PlaceStage(type, tp, previous, &p);
        ASSERT_EQ(node, expected) << "trial " << trial << " step " << step;
        if (node >= 0) {
          free[node] -= tp;
          previous = node;
          ++placed;
        } else {
          ++refused;
        }
      }
      int largest = 0, of_type = 0;
      for (int n = 0; n < cluster.num_nodes(); ++n) {
        if (cluster.node(n).gpu_type != type) continue;
        largest = std::max(largest, free[n]);
        of_type += free[n];
      }
      ASSERT_EQ(pool.LargestFreeOfType(type), largest)
          << "trial " << trial << " step " << step;
      ASSERT_EQ(pool.FreeOfType(type), of_type);
      // A copy chooses as its original does.
      if (step % 20 == 19) {
        NodePool copy = pool;
        StagePlacement a;
        EXPECT_EQ(copy.PlaceStage(type, 1, -1, &a),
                  ReferenceChoice(cluster, free, type, 1, -1));
      }
    }
  }
  EXPECT_GT(placed, 2000);
  EXPECT_GT(refused, 2000);
  EXPECT_GT(given_back, 1000);

}

}  // namespace
}  // namespace arachne
