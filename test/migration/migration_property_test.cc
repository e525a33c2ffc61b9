// Property: for random pairs of valid plans on random small clusters (joins,
// leaves, lost GPUs, TP and depth changes, MoE), executing the schedule on
// Gloo leaves every GPU holding exactly the reference bytes of the new
// plan, and no round gives a rank two peers. Seeded, so reproducible.
#include <algorithm>
#include <numeric>
#include <optional>
#include <random>
#include <set>

#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "test/migration/migration_fixture.h"
#include "test/migration/migration_harness.h"

#ifdef ARACHNE_HAVE_GLOO
#include "migration/gloo/gloo_transport.h"

namespace arachne::migration {
namespace {

using testing::MakeCluster;
using testing::NodeRow;

int Pick(std::mt19937& rng, int lo, int hi) {  // inclusive
  return std::uniform_int_distribution<int>(lo, hi)(rng);
}

// A random structurally valid plan using some GPUs of `cluster`, or nullopt
// when the draw did not fit.
std::optional<Plan> RandomPlan(const ModelSpec& m, const Cluster& cluster,
                               std::mt19937& rng) {
  std::vector<std::vector<int>> free(cluster.num_nodes());
  int max_node = 0;
  for (int n = 0; n < cluster.num_nodes(); ++n) {
    for (int g = 0; g < cluster.node(n).num_gpus; ++g) free[n].push_back(g);
    std::shuffle(free[n].begin(), free[n].end(), rng);
    max_node = std::max(max_node, cluster.node(n).num_gpus);
  }
  Plan plan;
  const int num_templates = Pick(rng, 1, 2);
  for (int ti = 0; ti < num_templates; ++ti) {
    Template t;
    const int depth = std::vector<int>{1, 2, 4}[Pick(rng, 0, 2)];
    std::vector<int> cuts = {1, 2, 3};
    std::shuffle(cuts.begin(), cuts.end(), rng);
    cuts.resize(depth - 1);
    cuts.push_back(0);
    cuts.push_back(m.num_layers);
    std::sort(cuts.begin(), cuts.end());
    t.replicas = Pick(rng, 1, 3);
    for (int s = 0; s < depth; ++s) {
      int tp = std::vector<int>{1, 2, 4}[Pick(rng, 0, 2)];
      while (tp > max_node) tp /= 2;
      Stage st{.gpu_type = 0, .tp = tp, .layer_begin = cuts[s],
               .layer_end = cuts[s + 1], .tiling = {}};
      if (m.is_moe()) {
        const int w = tp * t.replicas;
        std::vector<int> eps;
        for (int ep = 1; ep <= std::gcd(w, m.moe.num_experts); ++ep) {
          if (std::gcd(w, m.moe.num_experts) % ep == 0) eps.push_back(ep);
        }
        st.tiling.ep = eps[Pick(rng, 0, static_cast<int>(eps.size()) - 1)];
        st.tiling.edp = w / st.tiling.ep;
      }
      t.stages.push_back(st);
    }
    for (int r = 0; r < t.replicas; ++r) {
      for (int s = 0; s < depth; ++s) {
        std::vector<int> fits;
        for (int n = 0; n < cluster.num_nodes(); ++n) {
          if (static_cast<int>(free[n].size()) >= t.stages[s].tp) {
            fits.push_back(n);
          }
        }
        if (fits.empty()) return std::nullopt;
        const int n = fits[Pick(rng, 0, static_cast<int>(fits.size()) - 1)];
        StagePlacement p{.node = n, .gpus = {}};
        for (int k = 0; k < t.stages[s].tp; ++k) {
          p.gpus.push_back(free[n].back());
          free[n].pop_back();
        }
        t.placement.push_back(p);
      }
    }
    plan.templates.push_back(std::move(t));
  }
  return plan;
}

Plan DrawPlan(const ModelSpec& m, const Cluster& c, std::mt19937& rng) {
  for (int attempt = 0; attempt < 200; ++attempt) {
    if (auto p = RandomPlan(m, c, rng)) return *p;
  }
  LOG(FATAL) << "no random plan fits";
}

Cluster RandomCluster(std::mt19937& rng, int nodes, const std::string& prefix) {
  std::vector<NodeRow> rows;
  for (int n = 0; n < nodes; ++n) {
    rows.push_back({absl::StrCat(prefix, n), Pick(rng, 0, 1), Pick(rng, 1, 4)});
  }
  return MakeCluster(rows);
}

TEST(MigrationPropertyTest, RandomPlanPairsArriveBitForBitOnGloo) {
  std::mt19937 rng(20261129);
  auto gloo = MakeGlooTransportFactory();
  int executed = 0, unrecoverable = 0;
  std::set<std::string> kinds;
  for (int i = 0; i < 14; ++i) {
    const int scenario = i % 4;  // join, leave, same GPUs, lost GPU
    testing::MigrationCase c;
    c.model = i % 3 == 2 ? testing::TinyMoeModel() : testing::TinyModel();
    c.catalog = testing::ToyCatalog();
    const Cluster base = RandomCluster(rng, Pick(rng, 2, 3), "n");
    std::vector<Node> nodes = base.nodes();
    c.new_cluster = base;
    c.old_cluster = base;
    if (scenario == 0) {  // the last node joins
      nodes.pop_back();
      c.old_cluster = *Cluster::Create(nodes, c.catalog);
      kinds.insert("join");
    } else if (scenario == 1) {  // node x leaves
      nodes.push_back({.name = "x", .gpu_type = 0, .num_gpus = Pick(rng, 1, 2)});
      c.old_cluster = *Cluster::Create(nodes, c.catalog);
      kinds.insert("leave");
    } else if (scenario == 3) {
      c.diff_options.lost = {{"n0", 0}};
      kinds.insert("lost");
    } else {
      kinds.insert("reshape");
    }
    c.old_plan = DrawPlan(c.model, c.old_cluster, rng);
    c.new_plan = DrawPlan(c.model, c.new_cluster, rng);
    c.diff_options.min_split_bytes = Pick(rng, 0, 1) ? 32 << 10 : 4 << 20;
    c.schedule_options.min_piece_bytes = 16 << 10;
    c.schedule_options.target_rounds = Pick(rng, 4, 32);

    SCOPED_TRACE(absl::StrCat("case ", i, " scenario ", scenario));
    auto state = ModelState::Create(c.model);
    ASSERT_TRUE(state.ok());
    const MigrationWorld world(c.new_cluster, c.catalog);
    auto diff = ComputeDiff(*state, c.old_plan, c.old_cluster, c.new_plan,
                            c.new_cluster, world, c.diff_options);
    if (!diff.ok()) {
      // Only a leave or a lost GPU can make state unrecoverable.
      EXPECT_TRUE(scenario == 1 || scenario == 3) << diff.status();
      EXPECT_EQ(diff.status().code(), absl::StatusCode::kFailedPrecondition);
      EXPECT_THAT(diff.status().message(),
                  ::testing::HasSubstr("restore this state from a checkpoint"));
      ++unrecoverable;
      continue;
    }
    const MigrationSchedule s = BuildSchedule(*diff, world, c.schedule_options);
    for (int stage : {1, 2}) {
      for (const Round& r : s.stage(stage)) {
        std::set<int> senders, receivers;
        for (const Transfer& t : r.transfers) {
          EXPECT_TRUE(senders.insert(t.sender).second);
          EXPECT_TRUE(receivers.insert(t.receiver).second);
        }
      }
    }
    const auto st = testing::RunMigration(c, gloo.get());
    for (size_t r = 0; r < st.size(); ++r) {
      EXPECT_TRUE(st[r].ok()) << "rank " << r << ": " << st[r];
    }
    ++executed;
  }
  EXPECT_GE(executed, 9);
  EXPECT_EQ(kinds.size(), 4u);
  RecordProperty("executed", executed);
  RecordProperty("unrecoverable", unrecoverable);
}

}  // namespace
}  // namespace arachne::migration
#else
TEST(MigrationPropertyTest, NotBuilt) { GTEST_SKIP() << "built without Gloo"; }
#endif
