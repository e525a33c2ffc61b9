#include "controller/state_database.h"

#include <sqlite3.h>

#include <cstdlib>
#include <filesystem>
#include <map>
#include <random>
#include <system_error>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "glog/logging.h"

namespace arachne::controller {
namespace {

bool IsCorruption(int rc) {
  const int primary = rc & 0xff;
  return primary == SQLITE_CORRUPT || primary == SQLITE_NOTADB;
}

// One prepared statement, finalized on scope exit.
class Statement {
 public:
  Statement(sqlite3* db, const std::string& sql) {
    rc_ = sqlite3_prepare_v2(db, sql.c_str(), -1, &stmt_, nullptr);
  }
  ~Statement() { sqlite3_finalize(stmt_); }
  int rc() const { return rc_; }
  void Bind(int i, const std::string& v) {
    sqlite3_bind_text(stmt_, i, v.data(), static_cast<int>(v.size()),
                      SQLITE_TRANSIENT);
  }
  void Bind(int i, double v) { sqlite3_bind_double(stmt_, i, v); }
  void Bind(int i, int64_t v) { sqlite3_bind_int64(stmt_, i, v); }
  void Bind(int i, int v) { sqlite3_bind_int(stmt_, i, v); }
  int Step() { return sqlite3_step(stmt_); }
  std::string Text(int c) const {
    const unsigned char* p = sqlite3_column_text(stmt_, c);
    return p == nullptr ? std::string()
                        : std::string(reinterpret_cast<const char*>(p),
                                      sqlite3_column_bytes(stmt_, c));
  }
  std::string Blob(int c) const {
    const void* p = sqlite3_column_blob(stmt_, c);
    return p == nullptr ? std::string()
                        : std::string(static_cast<const char*>(p),
                                      sqlite3_column_bytes(stmt_, c));
  }
  sqlite3_stmt* get() const { return stmt_; }
  double Double(int c) const { return sqlite3_column_double(stmt_, c); }
  int64_t Int(int c) const { return sqlite3_column_int64(stmt_, c); }

 private:
  sqlite3_stmt* stmt_ = nullptr;
  int rc_ = SQLITE_OK;
};

double ToUnix(absl::Time t) {
  if (t == absl::InfiniteFuture()) return -1;
  return absl::ToDoubleSeconds(t - absl::UnixEpoch());
}
absl::Time FromUnix(double s) {
  if (s < 0) return absl::InfiniteFuture();
  return absl::UnixEpoch() + absl::Seconds(s);
}

constexpr const char* kSchema = R"sql(
CREATE TABLE IF NOT EXISTS meta(key TEXT PRIMARY KEY, value TEXT NOT NULL);
CREATE TABLE IF NOT EXISTS members(
  node TEXT PRIMARY KEY, gpu_type TEXT NOT NULL, gpus INTEGER NOT NULL,
  memory_gib REAL NOT NULL, address TEXT NOT NULL, draining INTEGER NOT NULL,
  drain_deadline REAL NOT NULL, incarnation TEXT NOT NULL DEFAULT '',
  since REAL NOT NULL DEFAULT 0);
CREATE TABLE IF NOT EXISTS decisions(
  id INTEGER PRIMARY KEY AUTOINCREMENT, time REAL NOT NULL,
  trigger TEXT NOT NULL, verdict TEXT NOT NULL, reason TEXT NOT NULL,
  old_throughput REAL NOT NULL, new_throughput REAL NOT NULL,
  migration_estimate_s REAL NOT NULL, fixed_cost_s REAL NOT NULL,
  downtime_estimate_s REAL NOT NULL, horizon_s REAL NOT NULL,
  gain_s REAL NOT NULL, generation INTEGER NOT NULL,
  planning_s REAL NOT NULL DEFAULT 0, decision_s REAL NOT NULL DEFAULT 0,
  old_throughput_raw REAL NOT NULL DEFAULT 0,
  new_throughput_raw REAL NOT NULL DEFAULT 0,
  corrections TEXT NOT NULL DEFAULT '');
CREATE TABLE IF NOT EXISTS generations(
  generation INTEGER PRIMARY KEY, cluster_json TEXT NOT NULL,
  plan_json TEXT NOT NULL, predicted_iteration_s REAL NOT NULL,
  predicted_peak_gib REAL NOT NULL, first_iteration INTEGER NOT NULL,
  warmup INTEGER NOT NULL, window_size INTEGER NOT NULL,
  samples_json TEXT NOT NULL, iterations_measured INTEGER NOT NULL,
  measured_iteration_s REAL NOT NULL, memory_json TEXT NOT NULL);
CREATE TABLE IF NOT EXISTS switches(
  generation INTEGER PRIMARY KEY, outcome TEXT NOT NULL,
  timings_json TEXT NOT NULL);
CREATE TABLE IF NOT EXISTS events(sequence INTEGER PRIMARY KEY, event BLOB NOT NULL);
)sql";

Verdict VerdictFromName(const std::string& s) {
  if (s == "switch") return Verdict::kSwitch;
  if (s == "cannot_switch") return Verdict::kCannotSwitch;
  return Verdict::kKeep;
}

}  // namespace

absl::Status StateDatabase::ErrorLocked(const std::string& what, int rc) const {
  const std::string message =
      absl::StrCat(path_, ": ", what, " (SQLite: ", sqlite3_errstr(rc),
                   db_ != nullptr ? absl::StrCat("; ", sqlite3_errmsg(db_)) : "",
                   ")");
  if (IsCorruption(rc)) {
    return absl::DataLossError(absl::StrCat(
        message,
        "; the database is torn or not a controller database: move it away "
        "to start afresh, or restore a backup"));
  }
  return absl::InternalError(message);
}

absl::StatusOr<std::unique_ptr<StateDatabase>> StateDatabase::Open(
    const std::string& state_dir) {
  if (state_dir.empty()) {
    return absl::InvalidArgumentError("state_dir: required, got none");
  }
  std::error_code ec;
  std::filesystem::create_directories(state_dir, ec);
  if (ec) {
    return absl::UnavailableError(absl::StrCat(
        "state_dir: cannot create \"", state_dir, "\": ", ec.message()));
  }
  const std::string path = (std::filesystem::path(state_dir) / "controller.db").string();
  sqlite3* db = nullptr;
  const int rc = sqlite3_open_v2(
      path.c_str(), &db,
      SQLITE_OPEN_READWRITE | SQLITE_OPEN_CREATE | SQLITE_OPEN_FULLMUTEX,
      nullptr);
  std::unique_ptr<StateDatabase> store(new StateDatabase(path, db));
  absl::MutexLock lock(&store->mu_);
  if (rc != SQLITE_OK) return store->ErrorLocked("cannot open", rc);
  sqlite3_busy_timeout(db, 5000);
  // WAL: a writer never blocks readers and a crash mid-write leaves the last
  // committed state. synchronous=FULL: a committed switch survives power loss.
  if (absl::Status s = store->ExecLocked("PRAGMA journal_mode=WAL;"); !s.ok()) {
    return s;
  }
  if (absl::Status s = store->ExecLocked("PRAGMA synchronous=FULL;"); !s.ok()) {
    return s;
  }
  {
    Statement check(db, "PRAGMA quick_check;");
    if (check.rc() != SQLITE_OK) {
      return store->ErrorLocked("cannot check its integrity", check.rc());
    }
    const int step = check.Step();
    if (step != SQLITE_ROW) {
      return store->ErrorLocked("cannot check its integrity", step);
    }
    if (check.Text(0) != "ok") {
      return absl::DataLossError(absl::StrCat(
          path, ": fails its integrity check (", check.Text(0),
          "); the database is torn: move it away to start afresh, or restore "
          "a backup"));
    }
  }
  if (absl::Status s = store->ExecLocked(kSchema); !s.ok()) return s;
  {
    Statement get(db, "SELECT value FROM meta WHERE key='schema_version';");
    if (get.rc() != SQLITE_OK) return store->ErrorLocked("cannot read", get.rc());
    if (get.Step() == SQLITE_ROW) {
      const std::string version = get.Text(0);
      if (version == "1" || version == "2" || version == "3") {
        // Version 1 lacked the decision timings; the rows it has keep 0.
        // Versions 1 and 2 lacked the raw throughputs and corrections: their
        // rows read the decided throughputs as raw (nothing was corrected
        // then). The generations table is new (kSchema made it). Versions
        // 1 to 3 lacked the members' incarnations: a member read back
        // without one takes the first its agent sends (Membership).
        std::vector<std::pair<std::string, std::string>> columns;
        if (version == "1") {
          columns = {{"decisions", "planning_s REAL NOT NULL DEFAULT 0"},
                     {"decisions", "decision_s REAL NOT NULL DEFAULT 0"}};
        }
        if (version != "3") {
          columns.push_back(
              {"decisions", "old_throughput_raw REAL NOT NULL DEFAULT 0"});
          columns.push_back(
              {"decisions", "new_throughput_raw REAL NOT NULL DEFAULT 0"});
          columns.push_back({"decisions", "corrections TEXT NOT NULL DEFAULT ''"});
        }
        columns.push_back({"members", "incarnation TEXT NOT NULL DEFAULT ''"});
        columns.push_back({"members", "since REAL NOT NULL DEFAULT 0"});
        for (const auto& [table, column] : columns) {
          // A table this version lacked whole was just made by kSchema with
          // every column.
          const std::string name = column.substr(0, column.find(' '));
          Statement has(db, absl::StrCat("SELECT COUNT(*) FROM pragma_table_info('",
                                         table, "') WHERE name='", name, "';"));
          if (has.rc() != SQLITE_OK || has.Step() != SQLITE_ROW) {
            return store->ErrorLocked("cannot read its tables", has.rc());
          }
          if (has.Int(0) > 0) continue;
          if (absl::Status s = store->ExecLocked(absl::StrCat(
                  "ALTER TABLE ", table, " ADD COLUMN ", column, ";"));
              !s.ok()) {
            return s;
          }
        }
        if (absl::Status s = store->SetMetaLocked(
                "schema_version", std::to_string(kStateDatabaseSchemaVersion));
            !s.ok()) {
          return s;
        }
      } else if (version != std::to_string(kStateDatabaseSchemaVersion)) {
        return absl::FailedPreconditionError(absl::StrCat(
            path, ": schema version ", version, ", this controller reads ",
            kStateDatabaseSchemaVersion));
      }
    } else if (absl::Status s = store->SetMetaLocked(
                   "schema_version",
                   std::to_string(kStateDatabaseSchemaVersion));
               !s.ok()) {
      return s;
    }
  }
  return store;
}

StateDatabase::~StateDatabase() {
  absl::MutexLock lock(&mu_);
  if (db_ != nullptr) sqlite3_close_v2(db_);
}

absl::Status StateDatabase::ExecLocked(const std::string& sql) {
  char* error = nullptr;
  const int rc = sqlite3_exec(db_, sql.c_str(), nullptr, nullptr, &error);
  sqlite3_free(error);
  if (rc != SQLITE_OK) return ErrorLocked("cannot run \"" + sql.substr(0, 40) + "\"", rc);
  return absl::OkStatus();
}

absl::Status StateDatabase::SetMetaLocked(const std::string& key,
                                          const std::string& value) {
  Statement s(db_, "INSERT INTO meta(key, value) VALUES(?1, ?2) ON CONFLICT(key) DO UPDATE SET value=?2;");
  if (s.rc() != SQLITE_OK) return ErrorLocked("cannot write " + key, s.rc());
  s.Bind(1, key);
  s.Bind(2, value);
  if (int rc = s.Step(); rc != SQLITE_DONE) {
    return ErrorLocked("cannot write " + key, rc);
  }
  return absl::OkStatus();
}

absl::StatusOr<std::string> StateDatabase::ControllerId() {
  absl::MutexLock lock(&mu_);
  {
    Statement get(db_, "SELECT value FROM meta WHERE key='controller_id';");
    if (get.rc() != SQLITE_OK) return ErrorLocked("cannot read", get.rc());
    if (get.Step() == SQLITE_ROW) return get.Text(0);
  }
  // Not a secret against someone who can read the database or the wire
  // without TLS; it tells two controllers apart, so that an agent never
  // obeys a controller of another job (or a stale copy of this one).
  std::random_device random;
  std::string id;
  for (int i = 0; i < 4; ++i) {
    absl::StrAppendFormat(&id, "%08x", static_cast<uint32_t>(random()));
  }
  if (absl::Status s = SetMetaLocked("controller_id", id); !s.ok()) return s;
  return id;
}

absl::Status StateDatabase::DeleteMetaLocked(const std::string& key) {
  Statement s(db_, "DELETE FROM meta WHERE key=?1;");
  if (s.rc() != SQLITE_OK) return ErrorLocked("cannot delete " + key, s.rc());
  s.Bind(1, key);
  if (int rc = s.Step(); rc != SQLITE_DONE) {
    return ErrorLocked("cannot delete " + key, rc);
  }
  return absl::OkStatus();
}

absl::StatusOr<StoredState> StateDatabase::Load() {
  absl::MutexLock lock(&mu_);
  StoredState out;
  std::map<std::string, std::string> meta;
  {
    Statement s(db_, "SELECT key, value FROM meta;");
    if (s.rc() != SQLITE_OK) return ErrorLocked("cannot read meta", s.rc());
    int rc;
    while ((rc = s.Step()) == SQLITE_ROW) meta[s.Text(0)] = s.Text(1);
    if (rc != SQLITE_DONE) return ErrorLocked("cannot read meta", rc);
  }
  auto get = [&](const std::string& k) {
    auto it = meta.find(k);
    return it == meta.end() ? std::string() : it->second;
  };
  if (!get("generation").empty()) {
    out.current.generation = std::stoll(get("generation"));
    out.current.cluster_json = get("cluster_json");
    out.current.plan_json = get("plan_json");
  }
  if (!get("switch_generation").empty()) {
    SwitchInProgress p;
    p.generation = std::stoll(get("switch_generation"));
    p.phase = get("switch_phase");
    p.cluster_json = get("switch_cluster_json");
    p.plan_json = get("switch_plan_json");
    p.started = FromUnix(std::stod(get("switch_started")));
    out.in_progress = p;
  }
  {
    Statement s(db_,
                "SELECT node, gpu_type, gpus, memory_gib, address, draining, "
                "drain_deadline, incarnation, since FROM members ORDER BY node;");
    if (s.rc() != SQLITE_OK) return ErrorLocked("cannot read members", s.rc());
    int rc;
    while ((rc = s.Step()) == SQLITE_ROW) {
      Member m;
      m.spec.node = s.Text(0);
      m.spec.gpu_type = s.Text(1);
      m.spec.gpus = static_cast<int>(s.Int(2));
      m.spec.memory_gib = s.Double(3);
      m.spec.address = s.Text(4);
      m.draining = s.Int(5) != 0;
      m.drain_deadline = FromUnix(s.Double(6));
      m.spec.incarnation = s.Text(7);
      m.since = FromUnix(s.Double(8));
      out.members.push_back(m);
    }
    if (rc != SQLITE_DONE) return ErrorLocked("cannot read members", rc);
  }
  return out;
}

absl::Status StateDatabase::SaveMembers(const std::vector<Member>& members) {
  absl::MutexLock lock(&mu_);
  if (absl::Status s = ExecLocked("BEGIN IMMEDIATE;"); !s.ok()) return s;
  absl::Status status = ExecLocked("DELETE FROM members;");
  for (const Member& m : members) {
    if (!status.ok()) break;
    Statement s(db_,
                "INSERT INTO members(node, gpu_type, gpus, memory_gib, address, "
                "draining, drain_deadline, incarnation, since) "
                "VALUES(?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8, ?9);");
    if (s.rc() != SQLITE_OK) {
      status = ErrorLocked("cannot write members", s.rc());
      break;
    }
    s.Bind(1, m.spec.node);
    s.Bind(2, m.spec.gpu_type);
    s.Bind(3, m.spec.gpus);
    s.Bind(4, m.spec.memory_gib);
    s.Bind(5, m.spec.address);
    s.Bind(6, m.draining ? 1 : 0);
    s.Bind(7, ToUnix(m.drain_deadline));
    s.Bind(8, m.spec.incarnation);
    s.Bind(9, ToUnix(m.since));
    if (int rc = s.Step(); rc != SQLITE_DONE) {
      status = ErrorLocked("cannot write members", rc);
    }
  }
  if (!status.ok()) {
    ExecLocked("ROLLBACK;").IgnoreError();
    return status;
  }
  return ExecLocked("COMMIT;");
}

absl::Status StateDatabase::SaveCurrentLocked(
    const CurrentPlanRecord& current) {
  if (absl::Status s = SetMetaLocked("generation", std::to_string(current.generation)); !s.ok()) return s;
  if (absl::Status s = SetMetaLocked("cluster_json", current.cluster_json); !s.ok()) return s;
  return SetMetaLocked("plan_json", current.plan_json);
}

absl::Status StateDatabase::ClearSwitchLocked() {
  for (const char* k : {"switch_generation", "switch_phase",
                        "switch_cluster_json", "switch_plan_json",
                        "switch_started"}) {
    if (absl::Status s = DeleteMetaLocked(k); !s.ok()) return s;
  }
  return absl::OkStatus();
}

template <typename Body>
absl::Status StateDatabase::TransactionLocked(Body body) {
  if (absl::Status s = ExecLocked("BEGIN IMMEDIATE;"); !s.ok()) return s;
  absl::Status status = body();
  if (!status.ok()) {
    ExecLocked("ROLLBACK;").IgnoreError();
    return status;
  }
  return ExecLocked("COMMIT;");
}

absl::Status StateDatabase::SaveCurrent(const CurrentPlanRecord& current) {
  absl::MutexLock lock(&mu_);
  return TransactionLocked([&]() ABSL_NO_THREAD_SAFETY_ANALYSIS {
    return SaveCurrentLocked(current);
  });
}

absl::Status StateDatabase::SaveSwitch(const SwitchInProgress& p) {
  absl::MutexLock lock(&mu_);
  return TransactionLocked([&]() ABSL_NO_THREAD_SAFETY_ANALYSIS -> absl::Status {
    if (absl::Status s = SetMetaLocked("switch_generation", std::to_string(p.generation)); !s.ok()) return s;
    if (absl::Status s = SetMetaLocked("switch_phase", p.phase); !s.ok()) return s;
    if (absl::Status s = SetMetaLocked("switch_cluster_json", p.cluster_json); !s.ok()) return s;
    if (absl::Status s = SetMetaLocked("switch_plan_json", p.plan_json); !s.ok()) return s;
    return SetMetaLocked("switch_started", absl::StrCat(ToUnix(p.started)));
  });
}

absl::Status StateDatabase::ClearSwitch() {
  absl::MutexLock lock(&mu_);
  return TransactionLocked(
      [&]() ABSL_NO_THREAD_SAFETY_ANALYSIS { return ClearSwitchLocked(); });
}

absl::Status StateDatabase::CommitSwitch(const CurrentPlanRecord& current) {
  absl::MutexLock lock(&mu_);
  return TransactionLocked([&]() ABSL_NO_THREAD_SAFETY_ANALYSIS -> absl::Status {
    if (absl::Status s = SaveCurrentLocked(current); !s.ok()) return s;
    return ClearSwitchLocked();
  });
}

absl::StatusOr<int64_t> StateDatabase::AppendDecision(const DecisionRecord& r) {
  absl::MutexLock lock(&mu_);
  Statement s(db_,
              "INSERT INTO decisions(time, trigger, verdict, reason, "
              "old_throughput, new_throughput, migration_estimate_s, "
              "fixed_cost_s, downtime_estimate_s, horizon_s, gain_s, "
              "generation, planning_s, decision_s, old_throughput_raw, "
              "new_throughput_raw, corrections) VALUES(?1, ?2, ?3, ?4, ?5, "
              "?6, ?7, ?8, ?9, ?10, ?11, ?12, ?13, ?14, ?15, ?16, ?17);");
  if (s.rc() != SQLITE_OK) return ErrorLocked("cannot write a decision", s.rc());
  const Decision& d = r.decision;
  s.Bind(1, ToUnix(r.time));
  s.Bind(2, d.trigger);
  s.Bind(3, std::string(VerdictName(d.verdict)));
  s.Bind(4, d.reason);
  s.Bind(5, d.old_throughput);
  s.Bind(6, d.new_throughput);
  s.Bind(7, d.migration_estimate_s);
  s.Bind(8, d.fixed_cost_s);
  s.Bind(9, d.downtime_estimate_s);
  s.Bind(10, d.horizon_s);
  s.Bind(11, d.gain_s);
  s.Bind(12, r.generation);
  s.Bind(13, d.planning_s);
  s.Bind(14, d.decision_s);
  s.Bind(15, d.old_throughput_raw);
  s.Bind(16, d.new_throughput_raw);
  s.Bind(17, d.corrections);
  if (int rc = s.Step(); rc != SQLITE_DONE) {
    return ErrorLocked("cannot write a decision", rc);
  }
  return static_cast<int64_t>(sqlite3_last_insert_rowid(db_));
}

absl::StatusOr<std::vector<DecisionRecord>> StateDatabase::RecentDecisions(
    int limit) {
  absl::MutexLock lock(&mu_);
  Statement s(db_,
              "SELECT id, time, trigger, verdict, reason, old_throughput, "
              "new_throughput, migration_estimate_s, fixed_cost_s, "
              "downtime_estimate_s, horizon_s, gain_s, generation, planning_s, "
              "decision_s, old_throughput_raw, new_throughput_raw, "
              "corrections FROM decisions ORDER BY id DESC LIMIT ?1;");
  if (s.rc() != SQLITE_OK) return ErrorLocked("cannot read decisions", s.rc());
  s.Bind(1, limit);
  std::vector<DecisionRecord> out;
  int rc;
  while ((rc = s.Step()) == SQLITE_ROW) {
    DecisionRecord r;
    r.id = s.Int(0);
    r.time = FromUnix(s.Double(1));
    r.decision.trigger = s.Text(2);
    r.decision.verdict = VerdictFromName(s.Text(3));
    r.decision.reason = s.Text(4);
    r.decision.old_throughput = s.Double(5);
    r.decision.new_throughput = s.Double(6);
    r.decision.migration_estimate_s = s.Double(7);
    r.decision.fixed_cost_s = s.Double(8);
    r.decision.downtime_estimate_s = s.Double(9);
    r.decision.horizon_s = s.Double(10);
    r.decision.gain_s = s.Double(11);
    r.generation = s.Int(12);
    r.decision.planning_s = s.Double(13);
    r.decision.decision_s = s.Double(14);
    r.decision.old_throughput_raw = s.Double(15);
    r.decision.new_throughput_raw = s.Double(16);
    r.decision.corrections = s.Text(17);
    // A row of a version 1 or 2 database: it decided on raw predictions.
    if (r.decision.corrections.empty() && r.decision.old_throughput_raw == 0 &&
        r.decision.new_throughput_raw == 0) {
      r.decision.old_throughput_raw = r.decision.old_throughput;
      r.decision.new_throughput_raw = r.decision.new_throughput;
    }
    out.push_back(r);
  }
  if (rc != SQLITE_DONE) return ErrorLocked("cannot read decisions", rc);
  return out;
}

absl::Status StateDatabase::SaveSwitchRecord(const SwitchRecord& r) {
  absl::MutexLock lock(&mu_);
  Statement s(db_,
              "INSERT INTO switches(generation, outcome, timings_json) "
              "VALUES(?1, ?2, ?3) ON CONFLICT(generation) DO UPDATE SET "
              "outcome=?2, timings_json=?3;");
  if (s.rc() != SQLITE_OK) return ErrorLocked("cannot write a switch", s.rc());
  s.Bind(1, r.generation);
  s.Bind(2, r.outcome);
  s.Bind(3, r.timings_json);
  if (int rc = s.Step(); rc != SQLITE_DONE) {
    return ErrorLocked("cannot write a switch", rc);
  }
  return absl::OkStatus();
}

absl::Status StateDatabase::AppendEvent(int64_t sequence,
                                        const std::string& event,
                                        int64_t keep) {
  absl::MutexLock lock(&mu_);
  if (absl::Status s = ExecLocked("PRAGMA synchronous=NORMAL;"); !s.ok()) return s;
  absl::Status written =
      TransactionLocked([&]() ABSL_NO_THREAD_SAFETY_ANALYSIS -> absl::Status {
        Statement last(db_, "SELECT COALESCE(MAX(sequence), 0) FROM events;");
        if (last.rc() != SQLITE_OK || last.Step() != SQLITE_ROW) {
          return ErrorLocked("cannot read the events", last.rc());
        }
        if (sequence <= last.Int(0)) {
          return absl::InvalidArgumentError(absl::StrCat(
              "event sequence ", sequence, " is not above the last stored, ",
              last.Int(0)));
        }
        Statement put(db_, "INSERT INTO events(sequence, event) VALUES(?1, ?2);");
        if (put.rc() != SQLITE_OK) return ErrorLocked("cannot write an event", put.rc());
        put.Bind(1, sequence);
        sqlite3_bind_blob(put.get(), 2, event.data(),
                          static_cast<int>(event.size()), SQLITE_TRANSIENT);
        if (int rc = put.Step(); rc != SQLITE_DONE) {
          return ErrorLocked("cannot write an event", rc);
        }
        Statement trim(db_, "DELETE FROM events WHERE sequence <= ?1;");
        if (trim.rc() != SQLITE_OK) return ErrorLocked("cannot trim the events", trim.rc());
        trim.Bind(1, sequence - keep);
        if (int rc = trim.Step(); rc != SQLITE_DONE) {
          return ErrorLocked("cannot trim the events", rc);
        }
        return absl::OkStatus();
      });
  absl::Status full = ExecLocked("PRAGMA synchronous=FULL;");
  return written.ok() ? full : written;
}

absl::StatusOr<std::vector<StateDatabase::StoredEvent>>
StateDatabase::RecentEvents(int64_t limit) {
  absl::MutexLock lock(&mu_);
  Statement s(db_,
              "SELECT sequence, event FROM (SELECT sequence, event FROM events "
              "ORDER BY sequence DESC LIMIT ?1) ORDER BY sequence;");
  if (s.rc() != SQLITE_OK) return ErrorLocked("cannot read the events", s.rc());
  s.Bind(1, limit);
  std::vector<StoredEvent> out;
  int rc;
  while ((rc = s.Step()) == SQLITE_ROW) {
    out.push_back(StoredEvent{s.Int(0), s.Blob(1)});
  }
  if (rc != SQLITE_DONE) return ErrorLocked("cannot read the events", rc);
  return out;
}

absl::StatusOr<std::vector<SwitchRecord>> StateDatabase::SwitchRecords() {
  absl::MutexLock lock(&mu_);
  Statement s(db_,
              "SELECT generation, outcome, timings_json FROM switches ORDER "
              "BY generation;");
  if (s.rc() != SQLITE_OK) return ErrorLocked("cannot read switches", s.rc());
  std::vector<SwitchRecord> out;
  int rc;
  while ((rc = s.Step()) == SQLITE_ROW) {
    out.push_back(SwitchRecord{s.Int(0), s.Text(1), s.Text(2)});
  }
  if (rc != SQLITE_DONE) return ErrorLocked("cannot read switches", rc);
  return out;
}

absl::Status StateDatabase::SaveGeneration(const GenerationRecord& r) {
  absl::MutexLock lock(&mu_);
  Statement s(db_,
              "INSERT INTO generations(generation, cluster_json, plan_json, "
              "predicted_iteration_s, predicted_peak_gib, first_iteration, "
              "warmup, window_size, samples_json, iterations_measured, "
              "measured_iteration_s, memory_json) VALUES(?1, ?2, ?3, ?4, ?5, "
              "?6, ?7, ?8, ?9, ?10, ?11, ?12) ON CONFLICT(generation) DO "
              "UPDATE SET cluster_json=?2, plan_json=?3, "
              "predicted_iteration_s=?4, predicted_peak_gib=?5, "
              "first_iteration=?6, warmup=?7, window_size=?8, samples_json=?9, "
              "iterations_measured=?10, measured_iteration_s=?11, "
              "memory_json=?12;");
  if (s.rc() != SQLITE_OK) {
    return ErrorLocked("cannot write generation " + std::to_string(r.generation), s.rc());
  }
  s.Bind(1, r.generation);
  s.Bind(2, r.cluster_json);
  s.Bind(3, r.plan_json);
  s.Bind(4, r.predicted_iteration_s);
  s.Bind(5, r.predicted_peak_gib);
  s.Bind(6, r.first_iteration);
  s.Bind(7, r.warmup);
  s.Bind(8, r.window);
  s.Bind(9, SamplesToJson(r.samples));
  s.Bind(10, r.iterations_measured);
  s.Bind(11, r.measured_iteration_s);
  s.Bind(12, MemoryToJson(r.memory));
  if (int rc = s.Step(); rc != SQLITE_DONE) {
    return ErrorLocked("cannot write generation " + std::to_string(r.generation), rc);
  }
  return absl::OkStatus();
}

absl::StatusOr<std::vector<GenerationRecord>> StateDatabase::Generations() {
  absl::MutexLock lock(&mu_);
  Statement s(db_,
              "SELECT generation, cluster_json, plan_json, "
              "predicted_iteration_s, predicted_peak_gib, first_iteration, "
              "warmup, window_size, samples_json, iterations_measured, "
              "measured_iteration_s, memory_json FROM generations ORDER BY "
              "generation;");
  if (s.rc() != SQLITE_OK) return ErrorLocked("cannot read generations", s.rc());
  std::vector<GenerationRecord> out;
  int rc;
  while ((rc = s.Step()) == SQLITE_ROW) {
    GenerationRecord r;
    r.generation = s.Int(0);
    r.cluster_json = s.Text(1);
    r.plan_json = s.Text(2);
    r.predicted_iteration_s = s.Double(3);
    r.predicted_peak_gib = s.Double(4);
    r.first_iteration = s.Int(5);
    r.warmup = static_cast<int>(s.Int(6));
    r.window = static_cast<int>(s.Int(7));
    absl::StatusOr<std::map<int64_t, double>> samples = SamplesFromJson(s.Text(8));
    if (!samples.ok()) {
      return absl::DataLossError(absl::StrCat(path_, ": generation ",
                                              r.generation, ": ",
                                              samples.status().message()));
    }
    r.samples = *std::move(samples);
    r.iterations_measured = static_cast<int>(s.Int(9));
    r.measured_iteration_s = s.Double(10);
    absl::StatusOr<std::vector<NodeMemoryRecord>> memory = MemoryFromJson(s.Text(11));
    if (!memory.ok()) {
      return absl::DataLossError(absl::StrCat(path_, ": generation ",
                                              r.generation, ": ",
                                              memory.status().message()));
    }
    r.memory = *std::move(memory);
    out.push_back(std::move(r));
  }
  if (rc != SQLITE_DONE) return ErrorLocked("cannot read generations", rc);
  return out;
}

absl::Status StateDatabase::SaveCorrections(const CorrectionsRecord& r) {
  absl::MutexLock lock(&mu_);
  return TransactionLocked([&]() ABSL_NO_THREAD_SAFETY_ANALYSIS -> absl::Status {
    if (absl::Status s = SetMetaLocked("corrections_json", r.corrections_json); !s.ok()) return s;
    if (absl::Status s = SetMetaLocked("corrections_generations", std::to_string(r.generations)); !s.ok()) return s;
    if (absl::Status s = SetMetaLocked("corrections_note", r.note); !s.ok()) return s;
    // %.6f: StrCat keeps 6 significant digits, 100 s at today's Unix time.
    return SetMetaLocked("corrections_fitted",
                         absl::StrFormat("%.6f", r.fitted == absl::InfinitePast()
                                                     ? -1.0
                                                     : ToUnix(r.fitted)));
  });
}

absl::StatusOr<CorrectionsRecord> StateDatabase::Corrections() {
  absl::MutexLock lock(&mu_);
  CorrectionsRecord out;
  Statement s(db_,
              "SELECT key, value FROM meta WHERE key IN ('corrections_json', "
              "'corrections_generations', 'corrections_note', "
              "'corrections_fitted');");
  if (s.rc() != SQLITE_OK) return ErrorLocked("cannot read corrections", s.rc());
  int rc;
  while ((rc = s.Step()) == SQLITE_ROW) {
    const std::string key = s.Text(0), value = s.Text(1);
    if (key == "corrections_json") out.corrections_json = value;
    if (key == "corrections_note") out.note = value;
    if (key == "corrections_generations") {
      out.generations = static_cast<int>(std::strtol(value.c_str(), nullptr, 10));
    }
    if (key == "corrections_fitted") {
      const double t = std::strtod(value.c_str(), nullptr);
      if (t >= 0) out.fitted = FromUnix(t);
    }
  }
  if (rc != SQLITE_DONE) return ErrorLocked("cannot read corrections", rc);
  return out;
}

}  // namespace arachne::controller
