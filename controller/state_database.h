// The controller's persistent state (docs/controller.md):
// membership, the current plan and its cluster, the generation, the switch
// in progress with its phase, the decision log and the timings of every
// switch, in one SQLite database in WAL mode, `<state_dir>/controller.db`.
// Each write is one transaction, so a crash leaves either the old or the
// new value, never half of one; the controller is level-triggered and
// recomputes what to do from what it reads back here.
//
// Plans and clusters are stored as their file JSON (plan_io.h,
// cluster_io.h), so the database reads like the files an operator knows.
//
// Errors: DataLoss naming the file for a database SQLite cannot read (torn,
// truncated, not a database, failing its integrity check);
// FailedPrecondition for a database of another schema version; Internal for
// SQLite failing otherwise; Unavailable when the directory cannot be made.
// Thread-safe.
#ifndef ARACHNE_CONTROLLER_STATE_DATABASE_H_
#define ARACHNE_CONTROLLER_STATE_DATABASE_H_

#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "controller/decision.h"
#include "controller/measurement.h"
#include "controller/membership.h"

struct sqlite3;

namespace arachne::controller {

// 2 added decisions.planning_s / decision_s; 3 the decisions' raw
// throughputs and corrections, the generations table (each generation's
// plan, predicted and measured) and the corrections in force; 4 the
// members' incarnations and since when, and the event log. A version-1, -2
// or -3 database is upgraded in place when opened.
inline constexpr int kStateDatabaseSchemaVersion = 4;

// The measured-run corrections in force (RunCorrections as the
// calibration file's JSON, io/run_corrections_io.h) and what the last fit
// said.
struct CorrectionsRecord {
  std::string corrections_json;  // "" = none
  int generations = 0;           // fitted on
  std::string note;              // the last fit's outcome
  absl::Time fitted = absl::InfinitePast();
};

// The plan training runs under.
struct CurrentPlanRecord {
  int64_t generation = 0;  // 0: none yet
  std::string cluster_json;
  std::string plan_json;
};

// A switch that started and has not committed or aborted yet.
struct SwitchInProgress {
  int64_t generation = 0;  // the generation it switches to
  std::string phase;       // the last phase entered ("prepare", ... "commit")
  std::string cluster_json;
  std::string plan_json;
  absl::Time started;
};

struct DecisionRecord {
  int64_t id = 0;
  absl::Time time;
  Decision decision;
  int64_t generation = 0;  // switched to; 0 = none
};

struct SwitchRecord {
  int64_t generation = 0;
  std::string outcome;       // "committed" / "aborted: ..."
  std::string timings_json;  // arachne.v1.SwitchTimings as JSON
};

struct StoredState {
  std::vector<Member> members;
  CurrentPlanRecord current;
  std::optional<SwitchInProgress> in_progress;
};

class StateDatabase {
 public:
  // Opens (creating when absent) `<state_dir>/controller.db`, creating the
  // directory too, and checks it (see the errors above).
  static absl::StatusOr<std::unique_ptr<StateDatabase>> Open(
      const std::string& state_dir);
  ~StateDatabase();
  StateDatabase(const StateDatabase&) = delete;
  StateDatabase& operator=(const StateDatabase&) = delete;

  const std::string& path() const { return path_; }

  absl::StatusOr<StoredState> Load();
  // Replaces the stored membership.
  absl::Status SaveMembers(const std::vector<Member>& members);
  absl::Status SaveCurrent(const CurrentPlanRecord& current);
  // Records the switch's phase; `ClearSwitch` once it committed or aborted.
  absl::Status SaveSwitch(const SwitchInProgress& in_progress);
  absl::Status ClearSwitch();
  // A committed switch: the new current plan and no switch in progress, in
  // one transaction (a crash between them cannot leave both or neither).
  absl::Status CommitSwitch(const CurrentPlanRecord& current);
  // Returns the record's id.
  absl::StatusOr<int64_t> AppendDecision(const DecisionRecord& record);
  // The `limit` most recent, newest first.
  absl::StatusOr<std::vector<DecisionRecord>> RecentDecisions(int limit);
  absl::Status SaveSwitchRecord(const SwitchRecord& record);
  absl::StatusOr<std::vector<SwitchRecord>> SwitchRecords();
  // Writes generation `record.generation`'s row (replacing it): its plan,
  // raw prediction and measurements so far.
  absl::Status SaveGeneration(const GenerationRecord& record);
  // Every recorded generation, oldest first.
  absl::StatusOr<std::vector<GenerationRecord>> Generations();
  absl::Status SaveCorrections(const CorrectionsRecord& record);
  // None recorded: an empty record.
  absl::StatusOr<CorrectionsRecord> Corrections();
  // The event log WatchEvents serves, so sequence numbers go on across
  // restarts: `event` (an arachne.v1.Event's bytes) under `sequence`, and
  // only the `keep` newest events kept. Durable against a crash of the
  // controller process, not of the machine: a WAL commit without an fsync
  // (synchronous=NORMAL), since a flush per event would add to the
  // downtime of every switch phase; the next FULL write flushes it too.
  // InvalidArgument for a sequence not above the last one stored.
  absl::Status AppendEvent(int64_t sequence, const std::string& event,
                           int64_t keep);
  struct StoredEvent {
    int64_t sequence = 0;
    std::string event;  // an arachne.v1.Event's bytes
  };
  // The `limit` newest, oldest first.
  absl::StatusOr<std::vector<StoredEvent>> RecentEvents(int64_t limit);
  // This job's controller identity: 32 hex digits drawn once, when the
  // database is created, and kept across restarts. Agents registered with
  // the controller accept commands carrying it only (docs/agent.md).
  absl::StatusOr<std::string> ControllerId();

 private:
  StateDatabase(std::string path, sqlite3* db)
      : path_(std::move(path)), db_(db) {}
  absl::Status ExecLocked(const std::string& sql)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  absl::Status SetMetaLocked(const std::string& key, const std::string& value)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  absl::Status DeleteMetaLocked(const std::string& key)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  absl::Status SaveCurrentLocked(const CurrentPlanRecord& current)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  absl::Status ClearSwitchLocked() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Runs `body` in one transaction, rolled back when it fails.
  template <typename Body>
  absl::Status TransactionLocked(Body body) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // `what` failed with SQLite's current error: the Status naming the file.
  absl::Status ErrorLocked(const std::string& what, int rc) const
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);

  const std::string path_;
  absl::Mutex mu_;
  sqlite3* db_ ABSL_GUARDED_BY(mu_);
};

}  // namespace arachne::controller

#endif  // ARACHNE_CONTROLLER_STATE_DATABASE_H_
