// `arachne train`: a tiny training run writes a checkpoint the learned
// planner accepts, its metadata and the curve; --evaluate plans the suite's
// compositions with it; bad options are named.
#include "planner_service/policy/train_command.h"

#include <filesystem>
#include <fstream>
#include <sstream>

#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "planner_service/io/data_files.h"
#include "planner_service/policy/checkpoint.h"

namespace arachne {
namespace {

using ::testing::HasSubstr;

std::string Slurp(const std::string& path) {
  std::ifstream f(path);
  std::stringstream s;
  s << f.rdbuf();
  return s.str();
}

// An empty directory `name` under the test's temporary directory.
std::filesystem::path FreshDir(const std::string& name) {
  const std::filesystem::path dir =
      std::filesystem::path(::testing::TempDir()) / name;
  std::filesystem::remove_all(dir);
  std::filesystem::create_directories(dir);
  return dir;
}

// A run of llama3-8b small enough for a test: 2 compositions of at most
// `max_gpus` GPUs, a tiny network, writing `out`.
TrainOptions TinyRun(int64_t episodes, int max_gpus, uint64_t seed,
                     const std::filesystem::path& out) {
  TrainOptions o;
  o.model = "llama3-8b";
  o.compositions = 2;
  o.episodes = episodes;
  o.max_gpus = max_gpus;
  o.seed = seed;
  o.out = out.string();
  o.grpo.network = {.hidden = 16, .layers = 1, .head_hidden = 8,
                    .film_hidden = 4};
  return o;
}

TEST(TrainCommandTest, TrainsWritesAndEvaluates) {
  const std::filesystem::path dir = FreshDir("train_command_test");
  TrainOptions o = TinyRun(32, 32, 3, dir / "llama3-8b.pt");
  std::ostringstream out, err;
  ASSERT_EQ(RunTrainCommand(o, out, err), 0) << err.str();
  EXPECT_THAT(out.str(),
              HasSubstr("train llama3-8b: 2 compositions (53 suite "
                        "compositions excluded), 32 episodes"));
  EXPECT_THAT(out.str(), HasSubstr("episodes 32/32"));
  EXPECT_THAT(out.str(), HasSubstr("trained llama3-8b in"));

  auto loaded = LoadPolicyCheckpoint(o.out);
  ASSERT_TRUE(loaded.ok()) << loaded.status();
  EXPECT_EQ(loaded->info.model, "llama3-8b");
  EXPECT_EQ(loaded->info.training.episodes, 32);
  EXPECT_EQ(loaded->info.training.compositions, 2);
  EXPECT_EQ(loaded->info.network.hidden, 16);
  EXPECT_THAT(Slurp((dir / "llama3-8b.json").string()),
              HasSubstr("\"model\": \"llama3-8b\""));
  // Header + one row per iteration (2 groups of 8 per iteration).
  const std::string curve = Slurp((dir / "llama3-8b.curve.csv").string());
  EXPECT_THAT(curve, HasSubstr("iteration,episodes,elapsed_s,mean_reward,"
                               "best_reward,greedy_reward,"
                               "forced_probability,loss\n1,16,"));
  EXPECT_EQ(std::count(curve.begin(), curve.end(), '\n'), 3);

  // Continuing from the checkpoint starts from its weights: the greedy
  // return before is the first run's greedy return after.
  const std::string first = out.str();
  const size_t at = first.find("greedy reward ");
  ASSERT_NE(at, std::string::npos);
  const std::string after_first =
      first.substr(first.find("-> ", at) + 3, 6);  // e.g. "0.3117"
  TrainOptions c = o;
  c.init = o.out;
  c.out = (dir / "continued.pt").string();
  c.grpo.network = {};  // replaced by the checkpoint's sizes
  std::ostringstream out2;
  ASSERT_EQ(RunTrainCommand(c, out2, err), 0) << err.str();
  EXPECT_THAT(out2.str(), HasSubstr("greedy reward before " + after_first))
      << first << out2.str();

  // A warm start from another profile set (a recalibration): the weights
  // carry over, the new checkpoint gets the new set's fingerprint, and the
  // run says so.
  const std::filesystem::path recal = dir / "recalibrated";
  std::filesystem::create_directories(recal);
  {
    auto shipped = ReadDataFile("calibration.json", "");
    ASSERT_TRUE(shipped.ok()) << shipped.status();
    std::ofstream(recal / "calibration.json") << *shipped << "\n";
  }
  TrainOptions r = c;
  r.profiles_dir = recal.string();
  r.out = (dir / "recalibrated.pt").string();
  std::ostringstream out3;
  ASSERT_EQ(RunTrainCommand(r, out3, err), 0) << err.str();
  auto first_ckpt = LoadPolicyCheckpoint(o.out);
  auto recal_ckpt = LoadPolicyCheckpoint(r.out);
  ASSERT_TRUE(first_ckpt.ok() && recal_ckpt.ok());
  EXPECT_NE(recal_ckpt->info.profile_fingerprint,
            first_ckpt->info.profile_fingerprint);
  EXPECT_THAT(out3.str(),
              HasSubstr(o.out + ": trained on profile fingerprint " +
                        first_ckpt->info.profile_fingerprint +
                        "; continuing on these profiles (" +
                        recal_ckpt->info.profile_fingerprint + ")"));
  EXPECT_THAT(out3.str(), HasSubstr("greedy reward before "));
  // A checkpoint of another model is still no warm start.
  TrainOptions q = c;
  q.model = "qwen3-32b";
  q.out = (dir / "qwen.pt").string();
  std::ostringstream out4, err4;
  EXPECT_EQ(RunTrainCommand(q, out4, err4), 2);
  EXPECT_THAT(err4.str(), HasSubstr("checkpoint is for model \"llama3-8b\", "
                                    "not \"qwen3-32b\""));

  // Evaluation: every suite composition of llama3-8b gets a learned plan.
  TrainOptions e;
  e.model = "llama3-8b";
  e.evaluate = o.out;
  e.eval_planners = {};
  e.eval_samples = 2;
  std::ostringstream table;
  auto rows = EvaluatePolicy(e, table);
  ASSERT_TRUE(rows.ok()) << rows.status();
  EXPECT_GT(rows->size(), 15u);
  for (const PolicyEvaluationRow& row : *rows) {
    EXPECT_GT(row.learned_throughput, 0) << row.scenario << " "
                                         << row.composition;
  }
  // A checkpoint for another model is refused.
  e.model = "qwen3-32b";
  auto other = EvaluatePolicy(e, table);
  EXPECT_EQ(other.status().code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_THAT(other.status().message(),
              HasSubstr("checkpoint is for model \"llama3-8b\", not "
                        "\"qwen3-32b\""));
}

TEST(TrainCommandTest, TrainsOnManyTypesAndRecordsTheMostDrawn) {
  const std::filesystem::path dir = FreshDir("train_many_types");
  TrainOptions o = TinyRun(16, 64, 5, dir / "llama3-8b.pt");
  o.gpu_types = {"H100-80GB", "A100-80GB", "A100-40GB",
                 "L40S",      "A6000",     "V100-32GB"};
  o.min_types = 5;
  o.max_types = 6;
  // Both suites stay unseen: 53 compositions of bench/scenarios and 18 of
  // bench/many-types.
  o.exclude_scenarios = {std::string(ARACHNE_SOURCE_DIR) + "/bench/scenarios",
                         std::string(ARACHNE_SOURCE_DIR) +
                             "/bench/many-types"};
  std::ostringstream out, err;
  ASSERT_EQ(RunTrainCommand(o, out, err), 0) << err.str();
  EXPECT_THAT(out.str(), HasSubstr("train llama3-8b: 2 compositions (71 "
                                   "suite compositions excluded)"));
  auto loaded = LoadPolicyCheckpoint(o.out);
  ASSERT_TRUE(loaded.ok()) << loaded.status();
  EXPECT_EQ(loaded->info.training.max_gpu_types, 6);
  EXPECT_THAT(Slurp((dir / "llama3-8b.json").string()),
              HasSubstr("\"max_gpu_types\": 6"));

  // No more types than given: three types at --max-types 8 record 3.
  o.gpu_types = {"H100-80GB", "A100-80GB", "A6000"};
  o.min_types = 2;
  o.max_types = 8;
  o.out = (dir / "three.pt").string();
  ASSERT_EQ(RunTrainCommand(o, out, err), 0) << err.str();
  auto three = LoadPolicyCheckpoint(o.out);
  ASSERT_TRUE(three.ok()) << three.status();
  EXPECT_EQ(three->info.training.max_gpu_types, 3);
}

TEST(TrainCommandTest, NamesBadOptions) {
  TrainOptions o;
  o.model = "no-such-model";
  o.out = "/tmp/x.pt";
  std::ostringstream out, err;
  EXPECT_EQ(RunTrainCommand(o, out, err), 2);
  EXPECT_THAT(err.str(), HasSubstr("--model: unknown model \"no-such-model\""));
  o.model = "llama3-8b";
  o.out = "";
  err.str("");
  EXPECT_EQ(RunTrainCommand(o, out, err), 2);
  EXPECT_THAT(err.str(), HasSubstr("--out must name a file"));
  o.out = "/tmp/x.pt";
  // The types range: each refused with its own line, before any training.
  auto refused = [&](int min_types, int max_types) {
    o.min_types = min_types;
    o.max_types = max_types;
    err.str("");
    EXPECT_EQ(RunTrainCommand(o, out, err), 2);
    return err.str();
  };
  EXPECT_EQ(refused(2, 17),
            "error: train: --max-types must be in [1, 16] (the device head's "
            "slots), got 17\n");
  EXPECT_EQ(refused(9, 8),
            "error: train: --min-types must be in [1, --max-types = 8], got "
            "9\n");
  EXPECT_EQ(refused(0, 8),
            "error: train: --min-types must be in [1, --max-types = 8], got "
            "0\n");
}

}  // namespace
}  // namespace arachne
