// JobController::Recover: what the controller does at start with what the
// state database holds (membership, the current plan, the last switch, and a
// switch found in flight, which is finished or rolled back after asking
// the agents). Separate because it runs once, from Create before the
// reconcile thread starts, and follows its own rules (docs/controller.md,
// "Persistence"). The measurements' part (RestoreMeasurements) is in
// controller_measurements.cc.
#include "controller/controller.h"

#include <algorithm>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "glog/logging.h"
#include "google/protobuf/util/json_util.h"
#include "planner_service/io/cluster_io.h"
#include "planner_service/io/plan_io.h"

namespace arachne::controller {

absl::Status JobController::Recover() {
  absl::StatusOr<StoredState> stored = store_->Load();
  if (!stored.ok()) return stored.status();
  membership_.Restore(stored->members);
  for (const Member& m : stored->members) EnsureClient(m.spec);
  absl::StatusOr<std::vector<SwitchRecord>> switches = store_->SwitchRecords();
  if (!switches.ok()) return switches.status();
  int64_t attempted = stored->current.generation;
  for (const SwitchRecord& r : *switches) attempted = std::max(attempted, r.generation);
  if (stored->in_progress) {
    attempted = std::max(attempted, stored->in_progress->generation);
  }
  // The last switch as GetStatus showed it before the restart, and its
  // error while no later generation has committed.
  v1::SwitchTimings last_switch;
  if (!switches->empty()) {
    const SwitchRecord& last = switches->back();
    if (!google::protobuf::util::JsonStringToMessage(last.timings_json,
                                                     &last_switch)
             .ok()) {
      return absl::DataLossError(absl::StrCat(
          store_->path(), ": the timings of the switch to generation ",
          last.generation, " are not SwitchTimings JSON"));
    }
  }
  {
    absl::MutexLock lock(&mu_);
    last_attempted_ = attempted;
    last_switch_ = last_switch;
    if (!switches->empty() && switches->back().outcome != "committed") {
      error_ = switches->back().outcome;
    }
  }
  if (absl::Status s = RestoreMeasurements(); !s.ok()) return s;
  if (stored->current.generation > 0) {
    auto parse = [&](const std::string& cluster_json, const std::string& plan_json,
                     Cluster* cluster, Plan* plan,
                     nlohmann::json* json) -> absl::Status {
      absl::StatusOr<Cluster> c = ParseCluster(cluster_json, store_->path(), catalog_);
      if (!c.ok()) return absl::DataLossError(absl::StrCat("stored cluster: ", c.status().message()));
      *json = nlohmann::json::parse(plan_json, nullptr, false);
      if (json->is_discarded()) {
        return absl::DataLossError(absl::StrCat(store_->path(), ": stored plan is not JSON"));
      }
      absl::StatusOr<Plan> p = PlanFromJson(*json, *c, catalog_, "stored plan");
      if (!p.ok()) return absl::DataLossError(p.status().message());
      *cluster = *c;
      *plan = *p;
      return absl::OkStatus();
    };
    Cluster cluster;
    Plan plan;
    nlohmann::json json;
    if (absl::Status s = parse(stored->current.cluster_json,
                               stored->current.plan_json, &cluster, &plan, &json);
        !s.ok()) {
      return s;
    }
    {
      absl::MutexLock lock(&mu_);
      generation_ = stored->current.generation;
      cluster_ = cluster;
      plan_ = plan;
      plan_json_ = json;
      phase_ = "running";
    }
    // A generation current before this release recorded none: it is
    // measured from the first iteration its ranks report.
    StartMeasuring(stored->current.generation, cluster, plan, json, -1);
  }
  if (!stored->in_progress) return absl::OkStatus();

  // A switch was in flight when the controller went down: Commit reached
  // means it is finished (ask again, Commit is idempotent); before that it
  // is rolled back and the current plan resumes.
  const SwitchInProgress& p = *stored->in_progress;
  absl::StatusOr<Cluster> target_cluster =
      ParseCluster(p.cluster_json, store_->path(), catalog_);
  if (!target_cluster.ok()) return target_cluster.status();
  std::vector<std::string> nodes;
  for (const Node& n : target_cluster->nodes()) nodes.push_back(n.name);
  auto lookup = [this](const std::string& n) { return AgentFor(n); };
  // Level-triggered: what the agents report decides, the stored phase only
  // where they cannot tell. An agent already running generation n means
  // Commit was sent, so the switch is finished on every agent; the stored
  // phase "commit" means every agent rebuilt n, so finishing is safe too.
  std::vector<std::string> committed_on;
  for (const std::string& node : nodes) {
    agent::AgentClient* client = AgentFor(node);
    if (client == nullptr) continue;
    absl::StatusOr<agent::NodeStatus> st = client->Status(p.generation);
    if (st.ok() && st->current_generation == p.generation) {
      committed_on.push_back(node);
    }
  }
  if (!committed_on.empty() || p.phase == "commit" || p.phase == "resume") {
    LOG(INFO) << "restart: switch to generation " << p.generation
              << " found at " << p.phase << ", committed on "
              << (committed_on.empty() ? std::string("no agent yet")
                                       : absl::StrJoin(committed_on, ", "));
    absl::Status s = reconfigurer_.FinishCommit(p.generation,
                                                config_.job.iterations, nodes,
                                                lookup);
    nlohmann::json json = nlohmann::json::parse(p.plan_json, nullptr, false);
    absl::StatusOr<Plan> plan =
        PlanFromJson(json, *target_cluster, catalog_, "stored switch plan");
    if (!plan.ok()) return absl::DataLossError(plan.status().message());
    if (absl::Status c = store_->CommitSwitch(
            {p.generation, p.cluster_json, p.plan_json});
        !c.ok()) {
      return c;
    }
    {
      absl::MutexLock lock(&mu_);
      generation_ = p.generation;
      cluster_ = *target_cluster;
      plan_ = *plan;
      plan_json_ = json;
      phase_ = "running";
    }
    // Where the old plan paused is not stored: the first iteration the new
    // plan's ranks report starts its measurement.
    StartMeasuring(p.generation, *target_cluster, *plan, json, -1);
    Emit("phase",
         absl::StrCat("restart: finished the switch to generation ",
                      p.generation, " found at ", p.phase, " (committed on ",
                      committed_on.empty() ? std::string("no agent")
                                           : absl::StrJoin(committed_on, ", "),
                      ")",
                      s.ok() ? "" : absl::StrCat(" (", s.message(), ")")),
         p.generation);
    return absl::OkStatus();
  }
  std::vector<std::string> old_nodes;
  int64_t old_generation;
  {
    absl::MutexLock lock(&mu_);
    old_generation = generation_;
    for (const Node& n : cluster_.nodes()) old_nodes.push_back(n.name);
  }
  absl::Status s = reconfigurer_.RollBack(p.generation, old_generation,
                                          config_.job.iterations, nodes,
                                          old_nodes, lookup);
  if (absl::Status c = store_->ClearSwitch(); !c.ok()) return c;
  (void)store_->SaveSwitchRecord(
      {p.generation, "aborted: the controller restarted before its commit",
       "{}"});
  Emit("phase",
       absl::StrCat("restart: rolled back the switch to generation ",
                    p.generation, ", found before its commit",
                    s.ok() ? "" : absl::StrCat(" (", s.message(), ")")),
       old_generation);
  return absl::OkStatus();
}

}  // namespace arachne::controller
