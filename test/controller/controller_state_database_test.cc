// The SQLite state database (controller/state_database.h): what is written
// reads back after a reopen, and a torn or foreign database is refused
// precisely.
#include "controller/state_database.h"

#include <unistd.h>

#include <filesystem>
#include <fstream>

#include <sqlite3.h>

#include "gmock/gmock.h"
#include "absl/strings/str_cat.h"
#include "gtest/gtest.h"

namespace arachne::controller {
namespace {

using ::testing::HasSubstr;

std::string TempDir(const std::string& name) {
  std::string d = std::string(::testing::TempDir()) + "arachne-store-" + name +
                  "-" + std::to_string(getpid());
  std::filesystem::remove_all(d);
  return d;
}

Member M(const std::string& node, bool draining = false) {
  Member m;
  m.spec = MemberSpec{.node = node, .gpu_type = "A6000", .gpus = 2,
                      .memory_gib = 48, .address = "127.0.0.1:7" + node,
                      .incarnation = "inc-" + node};
  m.since = absl::FromUnixSeconds(1'700'000'000);
  m.draining = draining;
  if (draining) m.drain_deadline = absl::FromUnixSeconds(1'700'000'030);
  return m;
}

TEST(StateDatabase, EverythingReadsBackAfterReopening) {
  const std::string dir = TempDir("reopen");
  {
    auto store = StateDatabase::Open(dir);
    ASSERT_TRUE(store.ok()) << store.status();
    ASSERT_TRUE((*store)->SaveMembers({M("a"), M("b", true)}).ok());
    ASSERT_TRUE((*store)->SaveCurrent({1, "{\"nodes\":[]}", "{\"templates\":[]}"}).ok());
    SwitchInProgress p{2, "migrate1", "{\"c\":1}", "{\"p\":2}",
                       absl::FromUnixSeconds(1'700'000'000)};
    ASSERT_TRUE((*store)->SaveSwitch(p).ok());
    DecisionRecord r;
    r.time = absl::FromUnixSeconds(1'700'000'001);
    r.decision.verdict = Verdict::kSwitch;
    r.decision.trigger = "join c";
    r.decision.reason = "gain beats downtime";
    r.decision.old_throughput = 561;
    r.decision.new_throughput = 620;
    r.decision.migration_estimate_s = 0.01;
    r.decision.fixed_cost_s = 2;
    r.decision.downtime_estimate_s = 2.01;
    r.decision.horizon_s = 3600;
    r.decision.gain_s = 342;
    r.generation = 2;
    ASSERT_TRUE((*store)->AppendDecision(r).ok());
    r.decision.verdict = Verdict::kKeep;
    r.generation = 0;
    ASSERT_TRUE((*store)->AppendDecision(r).ok());
    ASSERT_TRUE((*store)->SaveSwitchRecord({2, "committed", "{\"pause_s\":0.1}"}).ok());
  }
  auto store = StateDatabase::Open(dir);
  ASSERT_TRUE(store.ok()) << store.status();
  absl::StatusOr<StoredState> s = (*store)->Load();
  ASSERT_TRUE(s.ok()) << s.status();
  ASSERT_EQ(s->members.size(), 2u);
  EXPECT_EQ(s->members[0].spec, M("a").spec);
  EXPECT_EQ(s->members[0].spec.incarnation, "inc-a");
  EXPECT_EQ(s->members[0].since, absl::FromUnixSeconds(1'700'000'000));
  EXPECT_TRUE(s->members[1].draining);
  EXPECT_EQ(s->members[1].drain_deadline, absl::FromUnixSeconds(1'700'000'030));
  EXPECT_EQ(s->members[0].drain_deadline, absl::InfiniteFuture());
  EXPECT_EQ(s->current.generation, 1);
  EXPECT_EQ(s->current.plan_json, "{\"templates\":[]}");
  ASSERT_TRUE(s->in_progress.has_value());
  EXPECT_EQ(s->in_progress->generation, 2);
  EXPECT_EQ(s->in_progress->phase, "migrate1");
  EXPECT_EQ(s->in_progress->started, absl::FromUnixSeconds(1'700'000'000));
  auto decisions = (*store)->RecentDecisions(10);
  ASSERT_TRUE(decisions.ok());
  ASSERT_EQ(decisions->size(), 2u);
  EXPECT_EQ((*decisions)[0].decision.verdict, Verdict::kKeep);  // newest first
  const DecisionRecord& sw = (*decisions)[1];
  EXPECT_EQ(sw.decision.verdict, Verdict::kSwitch);
  EXPECT_EQ(sw.decision.trigger, "join c");
  EXPECT_DOUBLE_EQ(sw.decision.new_throughput, 620);
  EXPECT_DOUBLE_EQ(sw.decision.gain_s, 342);
  EXPECT_EQ(sw.generation, 2);
  auto switches = (*store)->SwitchRecords();
  ASSERT_TRUE(switches.ok());
  ASSERT_EQ(switches->size(), 1u);
  EXPECT_EQ((*switches)[0].outcome, "committed");

  // A committed switch replaces the current plan and clears the switch.
  ASSERT_TRUE((*store)->CommitSwitch({2, "{\"c\":1}", "{\"p\":2}"}).ok());
  s = (*store)->Load();
  ASSERT_TRUE(s.ok());
  EXPECT_EQ(s->current.generation, 2);
  EXPECT_FALSE(s->in_progress.has_value());
  EXPECT_TRUE(std::filesystem::exists(dir + "/controller.db"));
}

TEST(StateDatabase, EventsKeepTheNewestAndReadBackInOrderAfterReopening) {
  const std::string dir = TempDir("events");
  {
    auto store = StateDatabase::Open(dir);
    ASSERT_TRUE(store.ok()) << store.status();
    for (int64_t seq = 1; seq <= 7; ++seq) {
      ASSERT_TRUE((*store)->AppendEvent(seq, absl::StrCat("event-", seq), 5).ok());
    }
    // Numbers only go up: a repeat or a step back is refused, nothing written.
    absl::Status again = (*store)->AppendEvent(7, "again", 5);
    EXPECT_EQ(again.code(), absl::StatusCode::kInvalidArgument);
    EXPECT_EQ(again.message(), "event sequence 7 is not above the last stored, 7");
  }
  auto store = StateDatabase::Open(dir);
  ASSERT_TRUE(store.ok()) << store.status();
  auto events = (*store)->RecentEvents(100);
  ASSERT_TRUE(events.ok()) << events.status();
  ASSERT_EQ(events->size(), 5u);  // 1 and 2 trimmed: 5 kept
  for (size_t i = 0; i < events->size(); ++i) {
    EXPECT_EQ((*events)[i].sequence, static_cast<int64_t>(i) + 3);
    EXPECT_EQ((*events)[i].event, absl::StrCat("event-", i + 3));
  }
  auto newest = (*store)->RecentEvents(2);
  ASSERT_TRUE(newest.ok());
  ASSERT_EQ(newest->size(), 2u);
  EXPECT_EQ((*newest)[0].sequence, 6);
  EXPECT_EQ((*newest)[1].sequence, 7);
  // Bytes, not text: a NUL inside survives.
  const std::string binary("a\0b", 3);
  ASSERT_TRUE((*store)->AppendEvent(8, binary, 5).ok());
  newest = (*store)->RecentEvents(1);
  ASSERT_TRUE(newest.ok());
  EXPECT_EQ((*newest)[0].event, binary);
}

TEST(StateDatabase, AFileThatIsNotADatabaseIsDataLossNamingIt) {
  const std::string dir = TempDir("garbage");
  std::filesystem::create_directories(dir);
  {
    std::ofstream f(dir + "/controller.db");
    f << std::string(8192, 'x');
  }
  auto store = StateDatabase::Open(dir);
  ASSERT_FALSE(store.ok());
  EXPECT_EQ(store.status().code(), absl::StatusCode::kDataLoss) << store.status();
  EXPECT_THAT(store.status().message(), HasSubstr(dir + "/controller.db"));
  EXPECT_THAT(store.status().message(), HasSubstr("file is not a database"));
  EXPECT_THAT(store.status().message(), HasSubstr("move it away"));
}

TEST(StateDatabase, ATornDatabaseIsDataLoss) {
  const std::string dir = TempDir("torn");
  {
    auto store = StateDatabase::Open(dir);
    ASSERT_TRUE(store.ok());
    std::vector<Member> many;
    for (int i = 0; i < 200; ++i) many.push_back(M("node-" + std::to_string(i)));
    ASSERT_TRUE((*store)->SaveMembers(many).ok());
    DecisionRecord r;
    r.decision.reason = std::string(2000, 'r');
    for (int i = 0; i < 50; ++i) ASSERT_TRUE((*store)->AppendDecision(r).ok());
  }
  const std::string path = dir + "/controller.db";
  const auto size = std::filesystem::file_size(path);
  ASSERT_GT(size, 16384u);
  // Torn: the second half of the file overwritten, as a crash of a careless
  // copy or a bad disk leaves it.
  {
    std::fstream f(path, std::ios::in | std::ios::out | std::ios::binary);
    f.seekp(static_cast<std::streamoff>(size / 2));
    std::string junk(size / 2, '\x5a');
    f.write(junk.data(), static_cast<std::streamsize>(junk.size()));
  }
  auto store = StateDatabase::Open(dir);
  ASSERT_FALSE(store.ok());
  EXPECT_EQ(store.status().code(), absl::StatusCode::kDataLoss) << store.status();
  EXPECT_THAT(store.status().message(), HasSubstr(path));
}

TEST(StateDatabase, AnotherSchemaVersionIsFailedPrecondition) {
  const std::string dir = TempDir("version");
  { ASSERT_TRUE(StateDatabase::Open(dir).ok()); }
  // Rewrite the version with the sqlite3 command-line shell when present.
  if (std::system("command -v sqlite3 > /dev/null") != 0) {
    GTEST_SKIP() << "no sqlite3 shell";
  }
  ASSERT_EQ(std::system(("sqlite3 " + dir +
                         "/controller.db \"UPDATE meta SET value='99' WHERE "
                         "key='schema_version';\"")
                            .c_str()),
            0);
  auto store = StateDatabase::Open(dir);
  ASSERT_FALSE(store.ok());
  EXPECT_EQ(store.status().code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_THAT(store.status().message(), HasSubstr("schema version 99"));
}

// A database the previous controller release wrote (schema 1: decisions
// without their timings) opens, keeps its decisions and records timings.
TEST(StateDatabase, ASchemaOneDatabaseIsUpgradedKeepingItsDecisions) {
  const std::string dir = TempDir("upgrade");
  std::filesystem::create_directories(dir);
  {
    sqlite3* db = nullptr;
    ASSERT_EQ(sqlite3_open((dir + "/controller.db").c_str(), &db), SQLITE_OK);
    const char* v1 = R"sql(
      CREATE TABLE meta(key TEXT PRIMARY KEY, value TEXT NOT NULL);
      INSERT INTO meta VALUES('schema_version', '1');
      CREATE TABLE decisions(
        id INTEGER PRIMARY KEY AUTOINCREMENT, time REAL NOT NULL,
        trigger TEXT NOT NULL, verdict TEXT NOT NULL, reason TEXT NOT NULL,
        old_throughput REAL NOT NULL, new_throughput REAL NOT NULL,
        migration_estimate_s REAL NOT NULL, fixed_cost_s REAL NOT NULL,
        downtime_estimate_s REAL NOT NULL, horizon_s REAL NOT NULL,
        gain_s REAL NOT NULL, generation INTEGER NOT NULL);
      INSERT INTO decisions(time, trigger, verdict, reason, old_throughput,
        new_throughput, migration_estimate_s, fixed_cost_s,
        downtime_estimate_s, horizon_s, gain_s, generation)
        VALUES(1700000000, 'join of c', 'keep', 'gain too small', 2.0, 2.1,
               0.5, 1.0, 1.5, 60, 2.9, 0);)sql";
    ASSERT_EQ(sqlite3_exec(db, v1, nullptr, nullptr, nullptr), SQLITE_OK)
        << sqlite3_errmsg(db);
    sqlite3_close(db);
  }
  auto store = StateDatabase::Open(dir);
  ASSERT_TRUE(store.ok()) << store.status();
  DecisionRecord r;
  r.time = absl::FromUnixSeconds(1'700'000'100);
  r.decision.trigger = "join of d";
  r.decision.verdict = Verdict::kSwitch;
  r.decision.planning_s = 0.25;
  r.decision.decision_s = 0.375;
  r.generation = 2;
  ASSERT_TRUE((*store)->AppendDecision(r).ok());
  auto decisions = (*store)->RecentDecisions(10);
  ASSERT_TRUE(decisions.ok()) << decisions.status();
  ASSERT_EQ(decisions->size(), 2u);
  EXPECT_EQ((*decisions)[0].decision.trigger, "join of d");
  EXPECT_EQ((*decisions)[0].decision.planning_s, 0.25);
  EXPECT_EQ((*decisions)[0].decision.decision_s, 0.375);
  EXPECT_EQ((*decisions)[1].decision.trigger, "join of c");
  EXPECT_EQ((*decisions)[1].decision.reason, "gain too small");
  EXPECT_EQ((*decisions)[1].decision.planning_s, 0);
  store->reset();
  // Reopened, it is a database of the current version as any other.
  EXPECT_TRUE(StateDatabase::Open(dir).ok());
}

// A schema-3 database (members without incarnations) opens, keeps its
// members (their incarnation empty: the first heartbeat's is taken, see
// Membership) and writes incarnations from then on.
TEST(StateDatabase, ASchemaThreeDatabaseKeepsItsMembersWithoutIncarnations) {
  const std::string dir = TempDir("upgrade3");
  std::filesystem::create_directories(dir);
  {
    sqlite3* db = nullptr;
    ASSERT_EQ(sqlite3_open((dir + "/controller.db").c_str(), &db), SQLITE_OK);
    const char* v3 = R"sql(
      CREATE TABLE meta(key TEXT PRIMARY KEY, value TEXT NOT NULL);
      INSERT INTO meta VALUES('schema_version', '3');
      CREATE TABLE members(
        node TEXT PRIMARY KEY, gpu_type TEXT NOT NULL, gpus INTEGER NOT NULL,
        memory_gib REAL NOT NULL, address TEXT NOT NULL,
        draining INTEGER NOT NULL, drain_deadline REAL NOT NULL);
      INSERT INTO members VALUES('a', 'A6000', 2, 48, '127.0.0.1:7a', 0, -1);
      CREATE TABLE decisions(
        id INTEGER PRIMARY KEY AUTOINCREMENT, time REAL NOT NULL,
        trigger TEXT NOT NULL, verdict TEXT NOT NULL, reason TEXT NOT NULL,
        old_throughput REAL NOT NULL, new_throughput REAL NOT NULL,
        migration_estimate_s REAL NOT NULL, fixed_cost_s REAL NOT NULL,
        downtime_estimate_s REAL NOT NULL, horizon_s REAL NOT NULL,
        gain_s REAL NOT NULL, generation INTEGER NOT NULL,
        planning_s REAL NOT NULL DEFAULT 0, decision_s REAL NOT NULL DEFAULT 0,
        old_throughput_raw REAL NOT NULL DEFAULT 0,
        new_throughput_raw REAL NOT NULL DEFAULT 0,
        corrections TEXT NOT NULL DEFAULT '');)sql";
    ASSERT_EQ(sqlite3_exec(db, v3, nullptr, nullptr, nullptr), SQLITE_OK)
        << sqlite3_errmsg(db);
    sqlite3_close(db);
  }
  {
    auto store = StateDatabase::Open(dir);
    ASSERT_TRUE(store.ok()) << store.status();
    auto s = (*store)->Load();
    ASSERT_TRUE(s.ok()) << s.status();
    ASSERT_EQ(s->members.size(), 1u);
    EXPECT_EQ(s->members[0].spec.node, "a");
    EXPECT_EQ(s->members[0].spec.address, "127.0.0.1:7a");
    EXPECT_EQ(s->members[0].spec.incarnation, "");
    ASSERT_TRUE((*store)->SaveMembers({M("a")}).ok());
  }
  auto store = StateDatabase::Open(dir);
  ASSERT_TRUE(store.ok()) << store.status();
  auto s = (*store)->Load();
  ASSERT_TRUE(s.ok()) << s.status();
  ASSERT_EQ(s->members.size(), 1u);
  EXPECT_EQ(s->members[0].spec.incarnation, "inc-a");
}

}  // namespace
}  // namespace arachne::controller
