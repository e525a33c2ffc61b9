// Memory during a switch (docs/migration.md, "Memory during a switch"), end
// to end: real arachne-agent processes, one arachne-engine process per
// virtual GPU, the driver in this process playing the controller. Each
// engine process reports its resident set when the switch's Prepare began
// and its peak since (RankStatus::switch_*), measured by the kernel
// (VmRSS, VmHWM). A rank already holds its old state when Prepare begins,
// so the switch may add at most its new state and the staging memory: the
// migration reads the old engine's tensors and writes the new engine's in
// place, and a tensor a rank keeps whole is shared, not held twice. The
// earlier runtime copied the old state out and received into a copy of the
// new state, adding about old + 2 x new (bench/results/reconfig.md).
#include <algorithm>
#include <filesystem>
#include <fstream>
#include <map>
#include <sstream>
#include <string>
#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "planner_service/io/gpu_catalog_io.h"
#include "test/agent/agent_harness.h"

namespace arachne::agent {
namespace {

using testing::Driver;
using testing::NamedCluster;
using testing::Place;

// What a switch may add to a rank's resident set besides its new state:
// the packed small segments (norm weights: a few KiB here), the new
// generation's process groups and transport, allocator rounding.
constexpr int64_t kSlackBytes = int64_t{40} << 20;

// A LLaMA-shaped model of ~17 M parameters: 118 MB of state per rank under
// PP 2 (14 bytes per parameter), large enough that a copy of it cannot
// hide in the slack.
JobSpec MemoryJob() {
  JobSpec job = testing::TinyJob();
  ModelSpec& m = job.model;
  m.name = "switch-memory-test";
  m.hidden = 512;
  m.num_heads = 8;
  m.num_kv_heads = 4;
  m.head_dim = 64;
  m.ffn = 1536;
  m.vocab = 4096;
  m.num_layers = 4;
  job.training.seq_len = 8;
  job.training.global_batch = 8;
  return job;
}

std::string TempDir() {
  std::string d = std::string(::testing::TempDir()) + "arachne-switch-mem-" +
                  std::to_string(getpid());
  std::filesystem::remove_all(d);
  std::filesystem::create_directories(d);
  return d;
}

struct RankMemory {
  std::string gpu;
  int64_t old_state = 0, new_state = 0;
  int64_t start_rss = 0, peak_rss = 0;
  int64_t rise() const { return peak_rss - start_rss; }
};

// The state every GPU of `agents` holds now, by name.
std::map<std::string, int64_t> StateBytes(Driver& d,
                                          const std::vector<std::string>& nodes) {
  std::map<std::string, int64_t> out;
  for (const std::string& n : nodes) {
    absl::StatusOr<NodeStatus> st = d.agent(n)->client().Status(d.generation());
    CHECK(st.ok()) << st.status();
    for (const RankStatus& r : st->ranks) {
      out[migration::GpuIdName(r.gpu)] = r.in_plan ? r.state_bytes : 0;
    }
  }
  return out;
}

TEST(SwitchMemory, ARankAddsAtMostItsNewStateJoinTpDepthAndLeave) {
  const std::string dir = TempDir();
  const JobSpec job = MemoryJob();
  Driver d(job, dir);
  d.Agent("a", 2);
  d.Agent("b", 2);
  const Cluster a = NamedCluster({{"a", 2}});
  const Cluster ab = NamedCluster({{"a", 2}, {"b", 2}});
  const std::vector<std::pair<int, int>> all = {{0, 0}, {0, 1}, {1, 0}, {1, 1}};
  // PP 2 on a.
  const Plan pp2_on_a{{Place({{1, 0, 2}, {1, 2, 4}}, 1, 1, 8, {{0, 0}, {0, 1}})}};
  ASSERT_TRUE(d.Start(pp2_on_a, a).ok());
  ASSERT_TRUE(d.TrainUntil(1).ok());

  struct Step {
    std::string what;
    Plan plan;
    Cluster cluster;
  };
  const std::vector<Step> steps = {
      // b joins as a second replica: a's ranks keep everything (shared),
      // b's receive a whole rank's state each.
      {"join", Plan{{Place({{1, 0, 2}, {1, 2, 4}}, 2, 1, 8, all)}}, ab},
      // TP 2 per stage: every split tensor's shard changes.
      {"tp change", Plan{{Place({{2, 0, 2}, {2, 2, 4}}, 1, 1, 8, all)}}, ab},
      // PP 4, TP 1.
      {"depth change",
       Plan{{Place({{1, 0, 1}, {1, 1, 2}, {1, 2, 3}, {1, 3, 4}}, 1, 1, 8, all)}},
       ab},
      // b leaves (drains): a's ranks take the whole model back.
      {"leave", pp2_on_a, ab},
  };
  for (const Step& s : steps) {
    SCOPED_TRACE(s.what);
    const std::map<std::string, int64_t> before = StateBytes(d, {"a", "b"});
    ASSERT_TRUE(d.Switch(s.plan, s.cluster).ok());
    const std::map<std::string, int64_t> after = StateBytes(d, {"a", "b"});
    for (const std::string node : {"a", "b"}) {
      absl::StatusOr<NodeStatus> st =
          d.agent(node)->client().Status(d.generation());
      ASSERT_TRUE(st.ok()) << st.status();
      for (const RankStatus& r : st->ranks) {
        RankMemory m;
        m.gpu = migration::GpuIdName(r.gpu);
        m.old_state = before.at(m.gpu);
        m.new_state = after.at(m.gpu);
        m.start_rss = r.switch_start_rss_bytes;
        m.peak_rss = r.switch_peak_rss_bytes;
        ASSERT_GT(m.start_rss, 0) << m.gpu;
        ASSERT_GE(m.peak_rss, m.start_rss) << m.gpu;
        // Figures for docs/migration.md: peak / the larger state.
        LOG(INFO) << s.what << " " << m.gpu << ": old " << m.old_state / 1e6
                  << " MB, new " << m.new_state / 1e6 << " MB, RSS at Prepare "
                  << m.start_rss / 1e6 << " MB, peak " << m.peak_rss / 1e6
                  << " MB, rise " << m.rise() / 1e6 << " MB";
        EXPECT_LE(m.rise(), m.new_state + kSlackBytes)
            << m.gpu << " (old " << m.old_state << ", new " << m.new_state
            << " bytes)";
        if (s.what == "join" && node == std::string("a")) {
          // It keeps its whole state: shared with the new engine, not
          // allocated again.
          EXPECT_EQ(m.new_state, m.old_state) << m.gpu;
          EXPECT_LE(m.rise(), kSlackBytes) << m.gpu;
        }
      }
    }
  }
  // The last plan trains.
  ASSERT_TRUE(d.TrainUntil(2).ok());
  std::filesystem::remove_all(dir);
}

// The variables of process `pid`'s environment, "NAME=value" each.
std::vector<std::string> EnvironmentOf(int64_t pid) {
  std::ifstream in(absl::StrCat("/proc/", pid, "/environ"));
  std::vector<std::string> vars;
  std::string v;
  while (std::getline(in, v, '\0')) vars.push_back(v);
  return vars;
}

// The agent's --migration-staging-mib reaches each of its engine processes
// (ARACHNE_MIGRATION_STAGING_MIB), whose runtime stages a switch's packed
// small segments in it and counts it in admission (issue 34); an agent
// without it leaves the variable unset and its engines take the default.
TEST(SwitchMemory, TheStagingSettingReachesEveryEngineProcess) {
  const std::string dir = TempDir();
  Driver d(testing::TinyJob(), dir);
  d.Agent("a", 2, {"--migration-staging-mib", "64"});
  d.Agent("b", 1);
  for (const auto& [node, want] :
       std::vector<std::pair<std::string, std::string>>{
           {"a", "ARACHNE_MIGRATION_STAGING_MIB=64"}, {"b", ""}}) {
    absl::StatusOr<NodeStatus> st = d.agent(node)->client().Status();
    ASSERT_TRUE(st.ok()) << st.status();
    ASSERT_EQ(st->ranks.size(), node == "a" ? 2u : 1u);
    for (const RankStatus& r : st->ranks) {
      ASSERT_GT(r.engine_pid, 0) << node;
      const std::vector<std::string> env = EnvironmentOf(r.engine_pid);
      ASSERT_FALSE(env.empty()) << node << " engine " << r.engine_pid;
      std::vector<std::string> staging;
      for (const std::string& v : env) {
        if (absl::StartsWith(v, "ARACHNE_MIGRATION_STAGING_MIB=")) {
          staging.push_back(v);
        }
      }
      if (want.empty()) {
        EXPECT_TRUE(staging.empty()) << node << ": " << staging[0];
      } else {
        EXPECT_EQ(staging, std::vector<std::string>{want}) << node;
      }
    }
  }
  std::filesystem::remove_all(dir);
}

// A profiles directory of the built-in data plus a GPU type "TEST-TINY"
// of `memory_gib`.
std::string TinyGpuProfiles(const std::string& dir, double memory_gib) {
  const std::string out = dir + "/profiles";
  std::filesystem::create_directories(out);
  const std::string src = std::string(ARACHNE_SOURCE_DIR) + "/profiles";
  std::filesystem::copy_file(src + "/models.yaml", out + "/models.yaml");
  std::ifstream in(src + "/gpus.yaml");
  std::stringstream gpus;
  gpus << in.rdbuf();
  gpus << "  - id: TEST-TINY\n"
          "    product_name: a virtual GPU for the admission test\n"
          "    architecture: ampere\n"
          "    peak_bf16_tflops: 100\n"
          "    peak_fp32_tflops: 10\n"
       << "    memory_gib: " << memory_gib << "\n"
       << "    hbm_gbps: 1000\n"
          "    intra_node_gbps: 24\n"
          "    intra_node_link: PCIe4\n"
          "    default_gpus_per_node: 2\n"
          "    usd_per_hour: 1\n"
          "    source: \"test\"\n";
  std::ofstream(out + "/gpus.yaml") << gpus.str();
  return out;
}

// Admission by memory, end to end: on virtual GPUs of 1.5x a PP 2 rank's
// state, a switch to TP 2 (each rank would add a whole new state beside the
// old) is refused at Prepare, before anything pauses, naming the GPU and
// its free bytes; training goes on under the current plan with its state
// intact; a join that fits (the old ranks share what they keep) commits.
TEST(SwitchMemory, ASwitchThatDoesNotFitIsRefusedBeforeThePause) {
  const std::string dir = TempDir();
  const JobSpec job = MemoryJob();
  absl::StatusOr<migration::ModelState> state = ReferenceModelState(job);
  ASSERT_TRUE(state.ok());
  const Plan pp2{{Place({{1, 0, 2}, {1, 2, 4}}, 1, 1, 8, {{0, 0}, {0, 1}})}};
  // A PP 2 rank's state, on any catalog (no memory check in the layout).
  absl::StatusOr<migration::PlanLayout> layout =
      migration::PlanLayout::Create(*state, pp2, NamedCluster({{"a", 2}}));
  ASSERT_TRUE(layout.ok()) << layout.status();
  const int64_t rank_state = std::max(layout->BytesOn(0), layout->BytesOn(1));
  const double memory_gib = 1.5 * rank_state / double{1 << 30};
  const std::string profiles = TinyGpuProfiles(dir, memory_gib);
  absl::StatusOr<GpuCatalog> catalog = LoadGpuCatalog(profiles);
  ASSERT_TRUE(catalog.ok()) << catalog.status();
  const int64_t capacity = static_cast<int64_t>(
      catalog->type(*catalog->IndexOf("TEST-TINY")).memory_gib *
      double{1 << 30});

  Driver d(job, dir, *catalog);
  d.Agent("a", 2, {"--profiles-dir", profiles}, "TEST-TINY");
  d.Agent("b", 2, {"--profiles-dir", profiles}, "TEST-TINY");
  const Cluster a = NamedCluster({{"a", 2}}, *catalog, "TEST-TINY");
  const Cluster ab = NamedCluster({{"a", 2}, {"b", 2}}, *catalog, "TEST-TINY");
  ASSERT_TRUE(d.Start(pp2, a).ok());
  ASSERT_TRUE(d.TrainUntil(1).ok());
  absl::StatusOr<FullState> before = d.Gather("before");
  ASSERT_TRUE(before.ok()) << before.status();

  const Plan tp2{{Place({{2, 0, 4}}, 1, 1, 8, {{0, 0}, {0, 1}})}};
  const absl::Status refused = d.Switch(tp2, a);
  EXPECT_EQ(refused.code(), absl::StatusCode::kResourceExhausted) << refused;
  EXPECT_THAT(std::string(refused.message()),
              ::testing::MatchesRegex(
                  ".*node a GPU [01]: the switch to generation 2 needs [0-9]+ "
                  "bytes .* and its GPU has [0-9]+ free .*TEST-TINY.*"));
  // The free figure is the type's memory less the state the rank holds.
  const int64_t free0 = capacity - layout->BytesOn(0);
  const int64_t free1 = capacity - layout->BytesOn(1);
  EXPECT_TRUE(
      absl::StrContains(refused.message(),
                        absl::StrCat("its GPU has ", free0, " free")) ||
      absl::StrContains(refused.message(),
                        absl::StrCat("its GPU has ", free1, " free")))
      << refused;
  LOG(INFO) << "refused: " << refused;

  // Nothing paused, nothing lost: generation 1 trains on from its state.
  EXPECT_EQ(d.generation(), 1);
  absl::StatusOr<FullState> after = d.Gather("after");
  ASSERT_TRUE(after.ok()) << after.status();
  EXPECT_TRUE(*before == *after);
  ASSERT_TRUE(d.TrainUntil(2).ok());

  // A join fits: a's ranks share what they keep, b's hold one state each.
  const Plan joined{{Place({{1, 0, 2}, {1, 2, 4}}, 2, 1, 8,
                           {{0, 0}, {0, 1}, {1, 0}, {1, 1}})}};
  const absl::Status joined_status = d.Switch(joined, ab);
  ASSERT_TRUE(joined_status.ok()) << joined_status;
  ASSERT_TRUE(d.TrainUntil(3).ok());
  std::filesystem::remove_all(dir);
}

}  // namespace
}  // namespace arachne::agent
