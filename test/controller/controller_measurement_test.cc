// The controller's record of what each generation measured: the median of
// the iteration times after the warm-up, and the state database's generations
// and corrections surviving a reopen (a controller restart), including from a
// version-2 database.
#include "controller/measurement.h"

#include <unistd.h>

#include <filesystem>

#include <sqlite3.h>

#include "controller/state_database.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace arachne::controller {
namespace {

using ::testing::ElementsAre;
using ::testing::Pair;

std::string TempDir(const std::string& name) {
  std::string d = std::string(::testing::TempDir()) + "arachne-measure-" +
                  name + "-" + std::to_string(getpid());
  std::filesystem::remove_all(d);
  return d;
}

TEST(Median, OfOddAndEvenCountsAndOfNone) {
  EXPECT_DOUBLE_EQ(Median({3, 1, 2}), 2);
  EXPECT_DOUBLE_EQ(Median({4, 1, 3, 2}), 2.5);
  EXPECT_DOUBLE_EQ(Median({}), 0);
  // One slow iteration does not move it.
  EXPECT_DOUBLE_EQ(Median({0.8, 0.81, 9.0, 0.79, 0.8}), 0.8);
}

TEST(RelativeNoise, MedianAbsoluteDeviationOverTheMedian) {
  // Median 1.0 s; deviations 0, 0.1, 0.1, 0, 0.2 -> median 0.1.
  EXPECT_NEAR(RelativeNoise({{1, 1.0}, {2, 1.1}, {3, 0.9}, {4, 1.0}, {5, 1.2}}),
              0.1, 1e-12);
  // An outlier moves it little: one 5 s iteration among 1 s ones.
  EXPECT_DOUBLE_EQ(RelativeNoise({{1, 1.0}, {2, 1.0}, {3, 5.0}, {4, 1.0}}), 0);
  // Too few samples to say.
  EXPECT_DOUBLE_EQ(RelativeNoise({{1, 1.0}, {2, 2.0}}), 0);
}

TEST(IterationMeter, SkipsTheWarmUpAndThePreviousGenerationsIterations) {
  // Started after iteration 10 (the old plan paused there), 2 warm-up.
  IterationMeter m(/*first_iteration=*/10, /*warmup=*/2, /*window=*/4);
  // The ranks report the old plan's last iteration until they run one of
  // the new plan; a joiner reports (0, 0).
  EXPECT_FALSE(m.Add(10, 0.5));
  EXPECT_FALSE(m.Add(0, 0));
  // 11 and 12 are the warm-up (slow: new groups, cold caches).
  EXPECT_FALSE(m.Add(11, 3.0));
  EXPECT_FALSE(m.Add(12, 2.0));
  EXPECT_EQ(m.measured(), 0);
  EXPECT_DOUBLE_EQ(m.MedianSeconds(), 0);
  EXPECT_TRUE(m.Add(13, 1.0));
  EXPECT_EQ(m.measured(), 1);
  EXPECT_DOUBLE_EQ(m.MedianSeconds(), 1.0);
}

TEST(IterationMeter, AnIterationIsItsSlowestRanksAndCountsOnce) {
  IterationMeter m(0, 0, 10);
  EXPECT_TRUE(m.Add(1, 1.0));
  EXPECT_TRUE(m.Add(1, 1.2));   // a slower rank of the same iteration
  EXPECT_FALSE(m.Add(1, 1.1));  // a faster one changes nothing
  EXPECT_FALSE(m.Add(1, 1.2));  // polled again
  EXPECT_EQ(m.measured(), 1);
  EXPECT_THAT(m.samples(), ElementsAre(Pair(1, 1.2)));
  // Not a number of seconds: ignored.
  EXPECT_FALSE(m.Add(2, std::numeric_limits<double>::quiet_NaN()));
  EXPECT_FALSE(m.Add(2, -1));
  EXPECT_EQ(m.measured(), 1);
}

TEST(IterationMeter, TheMedianReadsTheLastWindowOnly) {
  IterationMeter m(0, 1, 3);
  // Iteration 1 is the warm-up; 2..4 are slow, 5..7 fast.
  m.Add(1, 10);
  for (int i = 2; i <= 4; ++i) m.Add(i, 2.0);
  EXPECT_DOUBLE_EQ(m.MedianSeconds(), 2.0);
  m.Add(5, 1.0);
  m.Add(6, 1.1);
  EXPECT_DOUBLE_EQ(m.MedianSeconds(), 1.1);  // {2.0, 1.0, 1.1}
  m.Add(7, 0.9);
  EXPECT_DOUBLE_EQ(m.MedianSeconds(), 1.0);  // {1.0, 1.1, 0.9}
  EXPECT_EQ(m.measured(), 6);
  EXPECT_THAT(m.samples(), ElementsAre(Pair(5, 1.0), Pair(6, 1.1), Pair(7, 0.9)));
  // A slow rank's late report of an iteration older than the window.
  EXPECT_FALSE(m.Add(3, 5.0));
  EXPECT_EQ(m.measured(), 6);
  // Missed iterations (shorter than a poll) leave gaps, nothing else.
  EXPECT_TRUE(m.Add(10, 1.0));
  EXPECT_THAT(m.samples(), ElementsAre(Pair(6, 1.1), Pair(7, 0.9), Pair(10, 1.0)));
}

TEST(IterationMeter, RestoresWhatWasSaved) {
  IterationMeter m(4, 1, 3);
  m.Restore({{5, 9.0}, {6, 1.0}, {7, 2.0}, {8, 3.0}, {9, 4.0}}, 7);
  // 5 is warm-up; the window keeps the last 3.
  EXPECT_THAT(m.samples(), ElementsAre(Pair(7, 2.0), Pair(8, 3.0), Pair(9, 4.0)));
  EXPECT_EQ(m.measured(), 7);
  EXPECT_DOUBLE_EQ(m.MedianSeconds(), 3.0);
}

TEST(NodeMemory, APeakIsSharedByThePlansGpusOnTheNode) {
  GenerationRecord r;
  r.memory = {{.node = "a", .gpu_type = "A6000", .gpus = 2,
               .peak_rss_bytes = int64_t{3} << 30, .predicted_gib = 1.2},
              {.node = "b", .gpu_type = "A6000", .gpus = 1,
               .peak_rss_bytes = int64_t{1} << 30, .predicted_gib = 1.4}};
  EXPECT_DOUBLE_EQ(r.memory[0].MeasuredGibPerGpu(), 1.5);
  EXPECT_DOUBLE_EQ(r.MeasuredPeakGib(), 1.5);
  r.memory[0].peak_rss_bytes = 0;  // a not yet reported
  EXPECT_DOUBLE_EQ(r.MeasuredPeakGib(), 1.0);
}

GenerationRecord Record(int64_t generation) {
  GenerationRecord r;
  r.generation = generation;
  r.cluster_json = R"({"nodes":[{"name":"a","gpu":"A6000","gpus":2}]})";
  r.plan_json = R"({"templates":[],"iteration_time_s":0.0013})";
  r.predicted_iteration_s = 0.0013;
  r.predicted_peak_gib = 1.6;
  r.first_iteration = 6;
  r.warmup = 3;
  r.window = 20;
  r.samples = {{10, 0.84}, {11, 0.86}};
  r.iterations_measured = 2;
  r.measured_iteration_s = 0.85;
  r.memory = {{.node = "a", .gpu_type = "A6000", .gpus = 2,
               .peak_rss_bytes = 123456789, .predicted_gib = 1.6}};
  return r;
}

TEST(StateDatabase, GenerationsAndCorrectionsSurviveAReopen) {
  const std::string dir = TempDir("generations");
  {
    auto store = StateDatabase::Open(dir);
    ASSERT_TRUE(store.ok()) << store.status();
    ASSERT_TRUE((*store)->SaveGeneration(Record(1)).ok());
    GenerationRecord two = Record(2);
    ASSERT_TRUE((*store)->SaveGeneration(two).ok());
    two.samples[12] = 0.9;  // measured on: the row is replaced
    two.iterations_measured = 3;
    two.measured_iteration_s = 0.86;
    ASSERT_TRUE((*store)->SaveGeneration(two).ok());
    CorrectionsRecord c;
    c.corrections_json = R"({"format":"arachne-run-calibration-1"})";
    c.generations = 2;
    c.note = "fitted on 2 generations (1, 2)";
    c.fitted = absl::FromUnixSeconds(1'700'000'500);
    ASSERT_TRUE((*store)->SaveCorrections(c).ok());
  }
  auto store = StateDatabase::Open(dir);
  ASSERT_TRUE(store.ok()) << store.status();
  auto records = (*store)->Generations();
  ASSERT_TRUE(records.ok()) << records.status();
  ASSERT_EQ(records->size(), 2u);
  const GenerationRecord& one = (*records)[0];
  EXPECT_EQ(one.generation, 1);
  EXPECT_EQ(one.cluster_json, Record(1).cluster_json);
  EXPECT_EQ(one.plan_json, Record(1).plan_json);
  EXPECT_DOUBLE_EQ(one.predicted_iteration_s, 0.0013);
  EXPECT_DOUBLE_EQ(one.predicted_peak_gib, 1.6);
  EXPECT_EQ(one.first_iteration, 6);
  EXPECT_EQ(one.warmup, 3);
  EXPECT_EQ(one.window, 20);
  EXPECT_THAT(one.samples, ElementsAre(Pair(10, 0.84), Pair(11, 0.86)));
  EXPECT_EQ(one.iterations_measured, 2);
  EXPECT_DOUBLE_EQ(one.measured_iteration_s, 0.85);
  ASSERT_EQ(one.memory.size(), 1u);
  EXPECT_EQ(one.memory[0].node, "a");
  EXPECT_EQ(one.memory[0].gpu_type, "A6000");
  EXPECT_EQ(one.memory[0].gpus, 2);
  EXPECT_EQ(one.memory[0].peak_rss_bytes, 123456789);
  EXPECT_DOUBLE_EQ(one.memory[0].predicted_gib, 1.6);
  const GenerationRecord& two = (*records)[1];
  EXPECT_EQ(two.iterations_measured, 3);
  EXPECT_DOUBLE_EQ(two.measured_iteration_s, 0.86);
  EXPECT_THAT(two.samples,
              ElementsAre(Pair(10, 0.84), Pair(11, 0.86), Pair(12, 0.9)));
  auto c = (*store)->Corrections();
  ASSERT_TRUE(c.ok()) << c.status();
  EXPECT_EQ(c->corrections_json, R"({"format":"arachne-run-calibration-1"})");
  EXPECT_EQ(c->generations, 2);
  EXPECT_EQ(c->note, "fitted on 2 generations (1, 2)");
  EXPECT_EQ(c->fitted, absl::FromUnixSeconds(1'700'000'500));
}

TEST(StateDatabase, NoCorrectionsRecordedReadsEmpty) {
  auto store = StateDatabase::Open(TempDir("nocorrections"));
  ASSERT_TRUE(store.ok()) << store.status();
  auto c = (*store)->Corrections();
  ASSERT_TRUE(c.ok()) << c.status();
  EXPECT_EQ(c->corrections_json, "");
  EXPECT_EQ(c->generations, 0);
  EXPECT_EQ(c->fitted, absl::InfinitePast());
  auto records = (*store)->Generations();
  ASSERT_TRUE(records.ok());
  EXPECT_TRUE(records->empty());
}

// A database of the previous release (schema 2: decisions without raw
// throughputs, no generations table) opens; its decisions read their
// throughputs as raw (nothing was corrected then) and the new records
// are written.
TEST(StateDatabase, ASchemaTwoDatabaseIsUpgradedKeepingItsDecisions) {
  const std::string dir = TempDir("upgrade2");
  std::filesystem::create_directories(dir);
  {
    sqlite3* db = nullptr;
    ASSERT_EQ(sqlite3_open((dir + "/controller.db").c_str(), &db), SQLITE_OK);
    const char* v2 = R"sql(
      CREATE TABLE meta(key TEXT PRIMARY KEY, value TEXT NOT NULL);
      INSERT INTO meta VALUES('schema_version', '2');
      CREATE TABLE decisions(
        id INTEGER PRIMARY KEY AUTOINCREMENT, time REAL NOT NULL,
        trigger TEXT NOT NULL, verdict TEXT NOT NULL, reason TEXT NOT NULL,
        old_throughput REAL NOT NULL, new_throughput REAL NOT NULL,
        migration_estimate_s REAL NOT NULL, fixed_cost_s REAL NOT NULL,
        downtime_estimate_s REAL NOT NULL, horizon_s REAL NOT NULL,
        gain_s REAL NOT NULL, generation INTEGER NOT NULL,
        planning_s REAL NOT NULL DEFAULT 0, decision_s REAL NOT NULL DEFAULT 0);
      INSERT INTO decisions(time, trigger, verdict, reason, old_throughput,
        new_throughput, migration_estimate_s, fixed_cost_s,
        downtime_estimate_s, horizon_s, gain_s, generation, planning_s,
        decision_s)
        VALUES(1700000000, 'join c', 'switch', 'gain', 665.5, 669.4,
               0.001, 2.0, 2.001, 3600, 20.5, 2, 0.3, 0.4);)sql";
    ASSERT_EQ(sqlite3_exec(db, v2, nullptr, nullptr, nullptr), SQLITE_OK)
        << sqlite3_errmsg(db);
    sqlite3_close(db);
  }
  auto store = StateDatabase::Open(dir);
  ASSERT_TRUE(store.ok()) << store.status();
  DecisionRecord r;
  r.time = absl::FromUnixSeconds(1'700'000'100);
  r.decision.trigger = "join d";
  r.decision.verdict = Verdict::kKeep;
  r.decision.old_throughput = 1.0;
  r.decision.new_throughput = 1.0008;
  r.decision.old_throughput_raw = 700;
  r.decision.new_throughput_raw = 770;
  r.decision.corrections = "compute_scale A6000 412.300, fitted on 2 generations";
  ASSERT_TRUE((*store)->AppendDecision(r).ok());
  ASSERT_TRUE((*store)->SaveGeneration(Record(2)).ok());
  auto decisions = (*store)->RecentDecisions(10);
  ASSERT_TRUE(decisions.ok()) << decisions.status();
  ASSERT_EQ(decisions->size(), 2u);
  const Decision& now = (*decisions)[0].decision;
  EXPECT_DOUBLE_EQ(now.old_throughput, 1.0);
  EXPECT_DOUBLE_EQ(now.new_throughput_raw, 770);
  EXPECT_EQ(now.corrections, "compute_scale A6000 412.300, fitted on 2 generations");
  const Decision& old = (*decisions)[1].decision;
  EXPECT_DOUBLE_EQ(old.old_throughput, 665.5);
  EXPECT_DOUBLE_EQ(old.old_throughput_raw, 665.5);
  EXPECT_DOUBLE_EQ(old.new_throughput_raw, 669.4);
  EXPECT_EQ(old.corrections, "");
  EXPECT_DOUBLE_EQ(old.planning_s, 0.3);
  store->reset();
  // Reopened, it is a version-3 database as any other.
  auto again = StateDatabase::Open(dir);
  ASSERT_TRUE(again.ok()) << again.status();
  auto records = (*again)->Generations();
  ASSERT_TRUE(records.ok());
  ASSERT_EQ(records->size(), 1u);
  EXPECT_DOUBLE_EQ((*records)[0].measured_iteration_s, 0.85);
}

}  // namespace
}  // namespace arachne::controller
