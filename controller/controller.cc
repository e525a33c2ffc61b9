#include "controller/controller.h"

#include <algorithm>
#include <cmath>
#include <set>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "glog/logging.h"
#include "google/protobuf/util/json_util.h"
#include "planner_service/io/cluster_io.h"
#include "planner_service/io/input_bounds.h"
#include "planner_service/io/json_yaml.h"
#include "migration/core/diff.h"
#include "migration/core/schedule.h"
#include "planner_service/io/plan_io.h"

namespace arachne::controller {
namespace {

double UnixSeconds(absl::Time t) {
  return absl::ToDoubleSeconds(t - absl::UnixEpoch());
}

double Throughput(const nlohmann::json& plan) {
  auto it = plan.find("throughput_iters_per_s");
  return it != plan.end() && it->is_number() ? it->get<double>() : 0.0;
}

// The plan file's templates without the per-stage memory figures, which
// differ with the cluster they were priced on: what "the same plan" means.
nlohmann::json TemplatesOf(const nlohmann::json& plan) {
  nlohmann::json t = plan.value("templates", nlohmann::json::array());
  for (nlohmann::json& tmpl : t) {
    for (nlohmann::json& st : tmpl["stages"]) st.erase("memory_gib");
  }
  return t;
}

// The GPU types (catalog ids) of a plan file's stages.
std::set<std::string> GpuTypesOf(const nlohmann::json& plan) {
  std::set<std::string> types;
  for (const nlohmann::json& t :
       plan.value("templates", nlohmann::json::array())) {
    for (const nlohmann::json& st :
         t.value("stages", nlohmann::json::array())) {
      auto type = st.find("gpu_type");
      if (type != st.end() && type->is_string())
        types.insert(type->get<std::string>());
    }
  }
  return types;
}

v1::SwitchTimings TimingsToProto(int64_t generation, const std::string& outcome,
                                 const SwitchTimings& t,
                                 double migration_estimate_s) {
  v1::SwitchTimings m;
  m.set_generation(generation);
  m.set_outcome(outcome);
  m.set_prepare_s(t.prepare_s);
  m.set_pause_s(t.pause_s);
  m.set_stage1_s(t.stage1_s);
  m.set_stage2_s(t.stage2_s);
  m.set_rebuild_s(t.rebuild_s);
  m.set_commit_s(t.commit_s);
  m.set_resume_s(t.resume_s);
  m.set_downtime_s(t.downtime_s);
  m.set_total_s(t.total_s);
  m.set_paused_at_iteration(t.paused_at_iteration);
  m.set_bytes_moved(t.bytes_moved);
  m.set_bytes_stage1(t.bytes_stage1);
  m.set_bytes_stage2(t.bytes_stage2);
  m.set_migration_estimate_s(migration_estimate_s);
  m.set_agent_pause_s(t.agent_pause_s);
  m.set_agent_stage1_s(t.agent_stage1_s);
  m.set_agent_stage2_s(t.agent_stage2_s);
  m.set_agent_rebuild_s(t.agent_rebuild_s);
  m.set_agent_groups_s(t.agent_groups_s);
  m.set_agent_resume_s(t.agent_resume_s);
  return m;
}

std::string ToJson(const google::protobuf::Message& m) {
  std::string out;
  (void)google::protobuf::util::MessageToJsonString(m, &out);
  return out;
}

// "a: 2 x A6000, b: 1 x A6000".
std::string ClusterLine(const Cluster& cluster, const GpuCatalog& catalog) {
  std::vector<std::string> parts;
  for (const Node& n : cluster.nodes()) {
    parts.push_back(absl::StrCat(n.name, ": ", n.num_gpus, " x ",
                                 catalog.type(n.gpu_type).id));
  }
  return absl::StrJoin(parts, ", ");
}

double JsonNumber(const nlohmann::json& j, const char* key) {
  auto it = j.find(key);
  return it != j.end() && it->is_number() ? it->get<double>() : 0.0;
}

// Per node of the plan: the GPUs it uses there and the highest predicted
// stage memory per GPU among them (the plan file's templates[].stages[]
// .memory_gib).
std::vector<NodeMemoryRecord> PlannedMemory(const Plan& plan,
                                            const Cluster& cluster,
                                            const nlohmann::json& plan_json,
                                            const GpuCatalog& catalog) {
  std::map<int, NodeMemoryRecord> by_node;
  const nlohmann::json templates =
      plan_json.value("templates", nlohmann::json::array());
  for (size_t t = 0; t < plan.templates.size(); ++t) {
    const Template& tmpl = plan.templates[t];
    for (size_t i = 0; i < tmpl.placement.size(); ++i) {
      const StagePlacement& p = tmpl.placement[i];
      const int stage = static_cast<int>(i) % tmpl.depth();
      NodeMemoryRecord& m = by_node[p.node];
      m.node = cluster.node(p.node).name;
      m.gpu_type = catalog.type(cluster.node(p.node).gpu_type).id;
      m.gpus += static_cast<int>(p.gpus.size());
      double gib = 0;
      if (t < templates.size() && templates[t].contains("stages") &&
          stage < static_cast<int>(templates[t]["stages"].size())) {
        gib = JsonNumber(templates[t]["stages"][stage], "memory_gib");
      }
      m.predicted_gib = std::max(m.predicted_gib, gib);
    }
  }
  std::vector<NodeMemoryRecord> out;
  for (auto& [index, m] : by_node) out.push_back(std::move(m));
  return out;
}

}  // namespace

v1::Decision DecisionToProto(const DecisionRecord& r) {
  v1::Decision m;
  m.set_id(r.id);
  m.set_time_unix_s(UnixSeconds(r.time));
  m.set_trigger(r.decision.trigger);
  m.set_verdict(VerdictName(r.decision.verdict));
  m.set_reason(r.decision.reason);
  m.set_old_throughput(r.decision.old_throughput);
  m.set_new_throughput(r.decision.new_throughput);
  m.set_migration_estimate_s(r.decision.migration_estimate_s);
  m.set_fixed_cost_s(r.decision.fixed_cost_s);
  m.set_downtime_estimate_s(r.decision.downtime_estimate_s);
  m.set_horizon_s(r.decision.horizon_s);
  m.set_gain_s(r.decision.gain_s);
  m.set_generation(r.generation);
  m.set_planning_s(r.decision.planning_s);
  m.set_decision_s(r.decision.decision_s);
  m.set_old_throughput_raw(r.decision.old_throughput_raw);
  m.set_new_throughput_raw(r.decision.new_throughput_raw);
  m.set_corrections(r.decision.corrections);
  return m;
}

// ---- JobController ----

JobController::JobController(JobControllerConfig config, GpuCatalog catalog,
                             std::unique_ptr<PlanSource> planner,
                             const Clock* clock,
                             std::unique_ptr<StateStore> store)
    : config_(std::move(config)),
      catalog_(std::move(catalog)),
      planner_(std::move(planner)),
      clock_(clock),
      store_(std::move(store)),
      membership_(config_.job.membership, clock),
      reconfigurer_(
          ReconfigurerConfig{
              .phase_timeout = config_.job.phase,
              .switch_timeout = config_.job.switch_timeout,
              .transfer_round = config_.job.transfer_round,
              .answers = [this](const std::string& node) {
                return AgentAnswers(node);
              }},
          catalog_),
      cost_model_(config_.job.switch_fixed_cost_s) {}

absl::StatusOr<std::unique_ptr<JobController>> JobController::Create(
    JobControllerConfig config, GpuCatalog catalog,
    std::unique_ptr<PlanSource> planner, const Clock* clock) {
  CHECK(planner != nullptr && clock != nullptr);
  absl::StatusOr<std::unique_ptr<StateStore>> store =
      StateStore::Open(config.state_dir);
  if (!store.ok()) return store.status();
  absl::StatusOr<std::string> id = (*store)->ControllerId();
  if (!id.ok()) return id.status();
  // A poll waits less than a lease for an agent's answer: a stopped agent
  // is then a leave before it could hold a poll round up much longer.
  if (!config.agent_networks.has_value()) {
    config.agent_networks = AgentNetworks::Default();
  }
  config.agent_client.status_timeout = std::min(
      config.agent_client.status_timeout, config.job.membership.lease / 2);
  std::unique_ptr<JobController> c(
      new JobController(std::move(config), std::move(catalog),
                        std::move(planner), clock, *std::move(store)));
  c->controller_id_ = *id;
  // Before anything emits: events go on from the stored ones.
  if (absl::Status s = c->events_.Restore(c->store_.get()); !s.ok()) return s;
  // A generation is fitted on after 3 measured iterations (fewer when the
  // window is shorter): one iteration's median is one noisy sample.
  c->calibration_ = std::make_unique<OnlineCalibration>(
      c->catalog_, c->config_.job.job.model, c->config_.job.job.training,
      c->config_.profiles_dir, std::min(3, c->config_.job.measure_window));
  absl::StatusOr<std::unique_ptr<agent::JobStoreServer>> job_store =
      agent::JobStoreServer::Start(c->config_.store_host, 0);
  if (!job_store.ok()) return job_store.status();
  c->job_store_ = *std::move(job_store);
  c->planner_->SetNotify(
      [p = c.get()](const std::string& m) { p->Emit("planner", m); });
  if (absl::Status s = c->Recover(); !s.ok()) return s;
  // Level-triggered: changes that arrived before the restart but were not
  // planned for yet (pending changes are not persisted) show as members
  // the current cluster lacks, or nodes of it that are no members.
  {
    std::set<std::string> members, in_cluster;
    for (const Member& m : c->membership_.Schedulable()) members.insert(m.spec.node);
    int64_t generation;
    {
      absl::MutexLock lock(&c->mu_);
      generation = c->generation_;
      for (const Node& n : c->cluster_.nodes()) in_cluster.insert(n.name);
    }
    if (generation > 0 && members != in_cluster) {
      c->membership_.RequestReplan(
          "restart: the members differ from the current plan's cluster");
    }
  }
  c->loop_ = std::thread([p = c.get()]() { p->Loop(); });
  return c;
}

JobController::~JobController() { Stop(); }

void JobController::Stop() {
  stop_ = true;
  if (loop_.joinable()) loop_.join();
}

int64_t JobController::generation() const {
  absl::MutexLock lock(&mu_);
  return generation_;
}

void JobController::Emit(const std::string& kind, const std::string& message,
                         int64_t generation) {
  v1::Event e;
  e.set_time_unix_s(UnixSeconds(clock_->Now()));
  e.set_kind(kind);
  e.set_message(TruncateText(message, kMaxRecordTextBytes));
  e.set_generation(generation);
  LOG(INFO) << kind << ": " << e.message();
  events_.Add(std::move(e));
}

void JobController::Fail(const std::string& message) {
  {
    absl::MutexLock lock(&mu_);
    error_ = TruncateText(message, kMaxRecordTextBytes);
  }
  Emit("error", message);
}

void JobController::EnsureClient(const MemberSpec& spec) {
  absl::MutexLock lock(&mu_);
  auto it = clients_.find(spec.node);
  if (it != clients_.end() && it->second->address() == spec.address) return;
  agent::AgentClientConfig c = config_.agent_client;
  c.address = spec.address;
  c.controller_id = controller_id_;
  absl::StatusOr<std::unique_ptr<agent::AgentClient>> client =
      agent::AgentClient::Connect(c);
  // The address and TLS files were checked already (Register, settings).
  CHECK(client.ok()) << client.status();
  if (it != clients_.end()) retired_.push_back(std::move(it->second));
  clients_[spec.node] = *std::move(client);
}

agent::AgentClient* JobController::AgentFor(const std::string& node) {
  // A node that left (lease ran out) has no agent to talk to.
  if (!membership_.Find(node).has_value()) return nullptr;
  absl::MutexLock lock(&mu_);
  auto it = clients_.find(node);
  return it == clients_.end() ? nullptr : it->second.get();
}

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

absl::StatusOr<v1::RegisterResponse> JobController::Register(
    const v1::RegisterRequest& r) {
  MemberSpec spec;
  spec.node = r.node();
  if (!spec.node.empty()) {
    if (absl::Status s = CheckNodeName("node", spec.node); !s.ok()) return s;
  }
  // 0 is the catalog's figure; anything else a real GPU's memory.
  if (r.memory_gib() != 0 &&
      !(std::isfinite(r.memory_gib()) && r.memory_gib() > 0 &&
        r.memory_gib() <= kMaxMemoryGibPerGpu)) {
    return absl::InvalidArgumentError(
        absl::StrCat("memory_gib: must be GiB per GPU in (0, ",
                     kMaxMemoryGibPerGpu, "] (or 0 for the catalog's), got ",
                     r.memory_gib()));
  }
  if (!r.gpu_type().empty()) {
    absl::StatusOr<int> type = catalog_.IndexOf(r.gpu_type());
    if (!type.ok()) {
      return absl::InvalidArgumentError(
          absl::StrCat("gpu_type: ", AbbreviateQuoted(type.status().message(),
                                                      r.gpu_type())));
    }
    spec.gpu_type = catalog_.type(*type).id;
    spec.memory_gib =
        r.memory_gib() > 0 ? r.memory_gib() : catalog_.type(*type).memory_gib;
  }
  spec.gpus = r.gpus();
  spec.address = r.address();
  if (!r.incarnation().empty()) {
    if (absl::Status s = CheckIncarnation(r.incarnation()); !s.ok()) return s;
  }
  spec.incarnation = r.incarnation();
  if (spec.address.size() > kMaxAddressBytes) {
    return absl::InvalidArgumentError(
        absl::StrCat("address: must be host:port of at most ", kMaxAddressBytes,
                     " bytes, got ", QuoteForMessage(spec.address)));
  }
  if (!spec.address.empty() && spec.address.find(':') == std::string::npos) {
    return absl::InvalidArgumentError(absl::StrCat(
        "address: must be host:port, got ", QuoteForMessage(spec.address)));
  }
  if (r.gpus() > 64) {
    return absl::InvalidArgumentError(
        absl::StrCat("gpus: must be in 1..64, got ", r.gpus()));
  }
  if (!spec.address.empty()) {
    // Before anything dials it.
    if (absl::Status s = config_.agent_networks->Check(spec.address); !s.ok()) {
      return s;
    }
  }
  if (!spec.node.empty() && !spec.gpu_type.empty() && spec.gpus >= 1 &&
      !spec.address.empty()) {
    // Nothing is recorded for a registration the agent itself contradicts.
    if (absl::Status s = CheckAgent(spec); !s.ok()) return s;
  }
  absl::StatusOr<bool> joined = membership_.Register(spec);
  if (!joined.ok()) return joined.status();
  EnsureClient(spec);
  if (*joined) {
    (void)store_->SaveMembers(membership_.Members());
  }
  v1::RegisterResponse out;
  out.set_lease_s(absl::ToDoubleSeconds(config_.job.membership.lease));
  out.set_generation(generation());
  out.set_controller_id(controller_id_);
  return out;
}

absl::StatusOr<std::unique_ptr<agent::AgentClient>>
JobController::ConnectForCheck(const std::string& address) const {
  agent::AgentClientConfig c = config_.agent_client;
  c.address = address;
  c.call_timeout = config_.register_check_timeout;
  c.status_timeout = config_.register_check_timeout;
  return agent::AgentClient::Connect(c);
}

absl::Status JobController::CheckAgent(const MemberSpec& spec) {
  absl::StatusOr<std::unique_ptr<agent::AgentClient>> client =
      ConnectForCheck(spec.address);
  if (!client.ok()) {
    return absl::InvalidArgumentError(
        absl::StrCat("address: ", client.status().message()));
  }
  absl::StatusOr<v1::StatusResponse> st = (*client)->StatusMessage(0);
  if (!st.ok()) {
    return absl::Status(
        absl::IsUnauthenticated(st.status()) ? absl::StatusCode::kUnauthenticated
                                             : absl::StatusCode::kUnavailable,
        absl::StrCat("address: the agent at ", spec.address,
                     " does not answer Status, so node ", spec.node,
                     " cannot be checked: ", st.status().message()));
  }
  if (st->node() != spec.node) {
    return absl::InvalidArgumentError(absl::StrCat(
        "node: \"", spec.node, "\", but the agent at ", spec.address,
        " is node \"", st->node(), "\""));
  }
  absl::StatusOr<int> type = catalog_.IndexOf(st->gpu_type());
  if (!type.ok() || catalog_.type(*type).id != spec.gpu_type) {
    return absl::InvalidArgumentError(absl::StrCat(
        "gpu_type: ", spec.gpu_type, ", but the agent at ", spec.address,
        " (node ", spec.node, ") has ", st->gpu_type(), " GPUs"));
  }
  if (st->gpus() != spec.gpus) {
    return absl::InvalidArgumentError(absl::StrCat(
        "gpus: ", spec.gpus, ", but the agent at ", spec.address, " (node ",
        spec.node, ") has ", st->gpus(), " GPUs"));
  }
  return absl::OkStatus();
}

bool JobController::AgentAnswers(const std::string& node) {
  std::optional<Member> m = membership_.Find(node);
  if (!m.has_value()) return false;
  absl::StatusOr<std::unique_ptr<agent::AgentClient>> client =
      ConnectForCheck(m->spec.address);
  return client.ok() && (*client)->StatusMessage(0).ok();
}

absl::Status JobController::CheckGeneration(int64_t generation,
                                            const char* rpc) const {
  if (generation == 0) return absl::OkStatus();
  const int64_t current = this->generation();
  if (generation == current) return absl::OkStatus();
  return absl::FailedPreconditionError(absl::StrCat(
      "generation: ", rpc, " was sent for generation ", generation,
      ", but the job's current generation is ", current,
      " (read GetStatus again and decide anew)"));
}

absl::StatusOr<v1::HeartbeatResponse> JobController::Heartbeat(
    const v1::HeartbeatRequest& r) {
  if (r.node().empty()) {
    return absl::InvalidArgumentError("node: required, got none");
  }
  if (absl::Status s = CheckNodeName("node", r.node()); !s.ok()) return s;
  if (r.incarnation().empty()) {
    return absl::InvalidArgumentError("incarnation: required, got none");
  }
  if (absl::Status s = CheckIncarnation(r.incarnation()); !s.ok()) return s;
  if (absl::Status s = membership_.Heartbeat(r.node(), r.incarnation());
      !s.ok()) {
    return s;
  }
  v1::HeartbeatResponse out;
  out.set_lease_s(absl::ToDoubleSeconds(config_.job.membership.lease));
  return out;
}

absl::Status JobController::AnnounceJoin(const v1::AnnounceJoinRequest& r) {
  std::vector<std::string> nodes(r.nodes().begin(), r.nodes().end());
  if (nodes.empty()) {
    return absl::InvalidArgumentError("nodes: required, got none");
  }
  if (nodes.size() > static_cast<size_t>(kMaxClusterNodes)) {
    return absl::InvalidArgumentError(
        absl::StrCat("nodes: must be at most ", kMaxClusterNodes,
                     " node names, got ", nodes.size()));
  }
  for (size_t i = 0; i < nodes.size(); ++i) {
    if (absl::Status s = CheckNodeName(absl::StrCat("nodes[", i, "]"), nodes[i]);
        !s.ok()) {
      return s;
    }
  }
  if (absl::Status s =
          CheckSeconds("within_s", r.within_s(), kMaxAnnounceSeconds);
      !s.ok()) {
    return s;
  }
  absl::Status s = membership_.AnnounceJoin(nodes, absl::Seconds(r.within_s()));
  if (s.ok()) {
    Emit("membership", absl::StrCat("announced: ", absl::StrJoin(nodes, ", ")));
  }
  return s;
}

absl::Status JobController::DrainNode(const v1::DrainNodeRequest& r) {
  if (r.node().empty()) {
    return absl::InvalidArgumentError("node: required, got none");
  }
  if (absl::Status s = CheckNodeName("node", r.node()); !s.ok()) return s;
  if (absl::Status s =
          CheckSeconds("deadline_s", r.deadline_s(), kMaxDrainSeconds);
      !s.ok()) {
    return s;
  }
  if (absl::Status s = CheckGeneration(r.generation(), "DrainNode"); !s.ok()) {
    return s;
  }
  absl::Status s = membership_.Drain(r.node(), absl::Seconds(r.deadline_s()));
  if (s.ok()) (void)store_->SaveMembers(membership_.Members());
  return s;
}

absl::Status JobController::RequestReplan(const v1::RequestReplanRequest& r) {
  if (absl::Status s = CheckGeneration(r.generation(), "RequestReplan");
      !s.ok()) {
    return s;
  }
  membership_.RequestReplan(r.reason().empty()
                                ? "requested"
                                : TruncateText(r.reason(), kMaxReasonBytes));
  return absl::OkStatus();
}

absl::StatusOr<v1::GetStatusResponse> JobController::GetStatus() {
  v1::GetStatusResponse out;
  out.set_controller_id(controller_id_);
  const absl::Time now = clock_->Now();
  for (const Member& m : membership_.Members()) {
    v1::Member* pm = out.add_members();
    pm->set_node(m.spec.node);
    pm->set_gpu_type(m.spec.gpu_type);
    pm->set_gpus(m.spec.gpus);
    pm->set_memory_gib(m.spec.memory_gib);
    pm->set_address(m.spec.address);
    pm->set_draining(m.draining);
    pm->set_lease_left_s(absl::ToDoubleSeconds(m.lease_expiry - now));
    pm->set_incarnation(m.spec.incarnation);
    pm->set_since_unix_s(UnixSeconds(m.since));
  }
  {
    absl::MutexLock lock(&mu_);
    out.set_generation(generation_);
    out.set_phase(phase_);
    out.set_iteration(iteration_);
    out.set_loss(loss_);
    out.set_tokens_per_s(tokens_per_s_);
    out.set_error(error_);
    *out.mutable_last_switch() = last_switch_;
    if (generation_ > 0) {
      *out.mutable_cluster() = ClusterToMessage(cluster_, catalog_);
      google::protobuf::util::JsonParseOptions o;
      o.ignore_unknown_fields = true;
      (void)google::protobuf::util::JsonStringToMessage(plan_json_.dump(),
                                                        out.mutable_plan(), o);
    }
  }
  {
    absl::MutexLock lock(&mu_);
    auto current = records_.find(generation_);
    if (current != records_.end()) {
      *out.mutable_measurement() = MeasurementToProto(current->second);
    }
    int shown = 0;
    for (auto it = records_.rbegin(); it != records_.rend() && shown < 20;
         ++it, ++shown) {
      *out.add_generations() = MeasurementToProto(it->second);
    }
    v1::RunCorrectionsInForce* c = out.mutable_corrections();
    if (have_corrections_) {
      for (const auto& [gpu, scale] : corrections_.compute_scale) {
        (*c->mutable_compute_scale())[gpu] = scale;
      }
      if (corrections_.micro_batch_fixed_s) {
        c->set_micro_batch_fixed_s(*corrections_.micro_batch_fixed_s);
      }
      if (corrections_.iteration_fixed_s) {
        c->set_iteration_fixed_s(*corrections_.iteration_fixed_s);
      }
      if (corrections_.context_reserve_gib) {
        c->set_context_reserve_gib(*corrections_.context_reserve_gib);
      }
      if (corrections_.fragmentation) {
        c->set_fragmentation(*corrections_.fragmentation);
      }
      c->set_generations(static_cast<int>(corrections_on_.size()));
      c->set_summary(DescribeCorrections(corrections_));
      if (corrections_fitted_ != absl::InfinitePast()) {
        c->set_fitted_unix_s(UnixSeconds(corrections_fitted_));
      }
    }
    c->set_note(corrections_note_);
  }
  absl::StatusOr<std::vector<DecisionRecord>> decisions =
      store_->RecentDecisions(20);
  if (!decisions.ok()) return decisions.status();
  for (const DecisionRecord& d : *decisions) {
    *out.add_decisions() = DecisionToProto(d);
  }
  FitStatusBudget(&out, kStatusBudgetBytes);
  return out;
}

void FitStatusBudget(v1::GetStatusResponse* status, size_t budget_bytes) {
  // The oldest decisions go first, then the oldest generations: both lists
  // are the most recent first.
  while (status->ByteSizeLong() > budget_bytes && status->decisions_size() > 0) {
    status->mutable_decisions()->RemoveLast();
    status->set_decisions_omitted(status->decisions_omitted() + 1);
  }
  while (status->ByteSizeLong() > budget_bytes &&
         status->generations_size() > 0) {
    status->mutable_generations()->RemoveLast();
    status->set_generations_omitted(status->generations_omitted() + 1);
  }
}

// ---- the reconcile loop ----

void JobController::Loop() {
  while (!stop_) {
    ReconcileOnce();
    absl::SleepFor(config_.tick);
  }
}

void JobController::ReconcileOnce() {
  std::vector<MembershipChange> changes = membership_.Tick();
  for (const MembershipChange& c : changes) {
    Emit("membership", absl::StrCat(ChangeKindName(c.kind), " ", c.node,
                                    c.node.empty() ? "" : ": ", c.detail));
  }
  if (!changes.empty()) (void)store_->SaveMembers(membership_.Members());

  bool retry = false;
  int64_t generation;
  {
    absl::MutexLock lock(&mu_);
    generation = generation_;
    if (retry_at_ && clock_->Now() >= *retry_at_) {
      retry = true;
      retry_at_.reset();
    }
  }
  const bool due = membership_.ReplanDue();
  if (generation == 0) {
    if ((due || retry) &&
        membership_.SchedulableGpus() >= config_.job.min_gpus) {
      std::vector<std::string> what;
      for (const MembershipChange& c : membership_.TakePending()) {
        what.push_back(absl::StrCat(ChangeKindName(c.kind), " ", c.node));
      }
      StartFirstPlan(what.empty() ? "retry"
                                  : TruncateText(absl::StrJoin(what, ", "),
                                                 kMaxRecordTextBytes));
    }
  } else if (due || retry) {
    std::vector<std::string> what;
    for (const MembershipChange& c : membership_.TakePending()) {
      what.push_back(absl::StrCat(ChangeKindName(c.kind),
                                  c.node.empty() ? "" : " ", c.node,
                                  c.kind == ChangeKind::kReplan
                                      ? absl::StrCat(" (", c.detail, ")")
                                      : ""));
    }
    Replan(what.empty()
               ? "retry"
               : TruncateText(absl::StrJoin(what, ", "), kMaxRecordTextBytes));
  }
  PollAgents();
}

PlanQuery JobController::BaseQuery(const ClusterSpec& cluster,
                                   bool* corrected) const {
  PlanQuery q;
  q.model = config_.job.model;
  q.training = config_.job.training;
  {
    absl::MutexLock lock(&mu_);
    if (corrected != nullptr) *corrected = have_corrections_;
    if (have_corrections_) {
      // Memory corrections stay out: the answer's per-stage memory is the
      // raw prediction the generation records keep. A GPU type of the
      // cluster that never ran is searched with its fleet's correction, not
      // raw: raw, it would look as fast as its profile, and every corrected
      // type slower beside it (decision.h, like with like).
      RunCorrections searched = corrections_;
      std::vector<std::string> types;
      for (const v1::Node& n : cluster.nodes()) {
        absl::StatusOr<int> t = catalog_.IndexOf(n.gpu());
        if (t.ok()) types.push_back(catalog_.type(*t).id);
      }
      ImputeUnmeasuredTypes(types, &searched);
      q.training.calibration = CorrectionsToMessage(searched);
      v1::Framework& fw = q.training.framework;
      if (corrections_.micro_batch_fixed_s) {
        fw.set_micro_batch_fixed_ms(*corrections_.micro_batch_fixed_s * 1e3);
      }
      if (corrections_.iteration_fixed_s) {
        fw.set_iteration_fixed_ms(*corrections_.iteration_fixed_s * 1e3);
      }
    }
  }
  q.cluster = cluster;
  q.planner = config_.job.planner;
  q.budget_s = config_.job.planner_budget_s;
  q.max_depth = config_.job.planner_max_depth;
  q.max_templates = config_.job.planner_max_templates;
  q.seed = config_.job.planner_seed;
  // The call may take the budget plus the time to price the migration.
  q.deadline = absl::Now() + absl::Seconds(config_.job.planner_budget_s) +
               absl::Seconds(10);
  q.request_id = "arachne-controller";
  return q;
}

ClusterSpec JobController::ClusterOf(const std::vector<Member>& members) const {
  ClusterSpec spec;
  for (const Member& m : members) {
    v1::Node* n = spec.add_nodes();
    n->set_name(m.spec.node);
    n->set_gpu(m.spec.gpu_type);
    n->set_gpus(m.spec.gpus);
  }
  return spec;
}

void JobController::StartFirstPlan(const std::string& trigger) {
  const std::vector<Member> members = membership_.Schedulable();
  const ClusterSpec spec = ClusterOf(members);
  {
    absl::MutexLock lock(&mu_);
    phase_ = "planning";
  }
  absl::StatusOr<PlanAnswer> answer = planner_->Plan(BaseQuery(spec));
  auto failed = [&](const std::string& why) {
    absl::MutexLock lock(&mu_);
    phase_ = "waiting";
    retry_at_ = clock_->Now() + config_.retry_after_failure;
    error_ = why;
    LOG(WARNING) << why;
  };
  if (!answer.ok()) {
    Emit("error", absl::StrCat("first plan (", trigger, "): planner ",
                               planner_->name(), ": ", answer.status().message()));
    failed(std::string(answer.status().message()));
    return;
  }
  absl::StatusOr<Cluster> cluster = ClusterFromMessage(spec, catalog_, "", "cluster");
  CHECK(cluster.ok()) << cluster.status();  // members carry catalog ids
  absl::StatusOr<Plan> plan = PlanFromJson(answer->plan, *cluster, catalog_, "plan");
  if (!plan.ok()) {
    Emit("error", absl::StrCat("first plan: the planner's answer: ",
                               plan.status().message()));
    failed(std::string(plan.status().message()));
    return;
  }
  // Which planner answered, and why the default fell back when it did
  // (the job names none: learned where a policy serves the model).
  Emit("decision",
       absl::StrFormat("first plan on %d GPUs (%s): %.3f it/s predicted by %s%s",
                       cluster->total_gpus(), trigger, Throughput(answer->plan),
                       answer->planner,
                       answer->planner_fallback_reason.empty()
                           ? ""
                           : absl::StrCat(" (", answer->planner_fallback_reason,
                                          ")")));
  SwitchTarget target;
  {
    absl::MutexLock lock(&mu_);
    target.generation = ++last_attempted_;
  }
  target.job = config_.job.job;
  target.cluster = *cluster;
  target.plan = *plan;
  target.store_address = job_store_->address();
  target.checkpoint_dir = config_.job.checkpoint_dir;
  target.run_until = config_.job.iterations;
  SwitchOutcome out = RunSwitch(target, answer->plan,
                                ClusterToJson(*cluster, catalog_).dump());
  if (!out.committed) failed(std::string(out.status.message()));
}

namespace {

// What a recovery lost, for decisions: "node x left ungracefully", "the
// engine of a:1 died", or both.
std::string LostWhat(const std::set<std::string>& nodes,
                     const std::vector<std::string>& engines) {
  std::vector<std::string> parts;
  if (!nodes.empty()) {
    parts.push_back(absl::StrCat("node ", absl::StrJoin(nodes, ", "),
                                 " left ungracefully"));
  }
  if (!engines.empty()) {
    parts.push_back(
        absl::StrCat("the engine of ", absl::StrJoin(engines, ", "), " died"));
  }
  return absl::StrJoin(parts, " and ");
}

}  // namespace

void JobController::Replan(const std::string& trigger) {
  const absl::Time replan_start = absl::Now();
  // The decision reads the latest measurements: what arrived since the
  // last fit is fitted first.
  MaybeFit(true);
  double planning_s = 0;
  Cluster current_cluster;
  Plan current_plan;
  nlohmann::json current_json;
  int64_t current_generation;
  double fixed_cost;
  {
    absl::MutexLock lock(&mu_);
    current_cluster = cluster_;
    current_plan = plan_;
    current_json = plan_json_;
    current_generation = generation_;
    fixed_cost = cost_model_.FixedCostSeconds();
  }
  // One view of the membership for the whole decision: RPCs go on changing
  // it meanwhile (a node may drain while the planner runs), and a decision
  // mixing two views could count a node twice.
  const std::vector<Member> members = membership_.Members();
  std::vector<Member> schedulable, draining;
  {
    const absl::Time now = clock_->Now();
    for (const Member& m : members) {
      if (m.draining) {
        draining.push_back(m);
      } else if (m.lease_expiry > now) {
        schedulable.push_back(m);
      }
    }
  }
  // The switch's cluster: the new plan's plus the draining nodes still
  // there, which are migration ranks until the switch commits.
  std::vector<Member> switch_members = schedulable;
  switch_members.insert(switch_members.end(), draining.begin(), draining.end());
  std::sort(switch_members.begin(), switch_members.end(),
            [](const Member& a, const Member& b) { return a.spec.node < b.spec.node; });
  auto is_member = [&members](const std::string& node) {
    for (const Member& m : members) {
      if (m.spec.node == node) return true;
    }
    return false;
  };
  // Nodes of the current cluster that are gone hold nothing any more.
  std::vector<migration::GpuId> lost;
  std::set<std::string> lost_nodes;
  for (const Node& n : current_cluster.nodes()) {
    if (is_member(n.name)) continue;
    lost_nodes.insert(n.name);
    for (int g = 0; g < n.num_gpus; ++g) lost.push_back({n.name, g});
  }
  const std::set<std::string> used = NodesUsed(current_plan, current_cluster);
  std::string lost_note;  // how a leave's state is recovered, for the record
  DecisionInput in;
  in.trigger = trigger;
  in.horizon_s = absl::ToDoubleSeconds(config_.job.horizon);
  in.fixed_cost_s = fixed_cost;
  in.min_switch_gain = config_.job.switch_min_gain;
  in.unmeasured_margin = config_.job.unmeasured_type_margin;
  for (const std::string& n : lost_nodes) {
    if (used.count(n) > 0) in.current_lost_gpu = true;
  }
  // GPUs whose engine died on nodes that stay: lost, the node not.
  std::vector<std::string> lost_engines;
  {
    absl::MutexLock lock(&mu_);
    for (const migration::GpuId& g : lost_gpus_) {
      if (lost_nodes.count(g.node) > 0 || !is_member(g.node)) continue;
      lost.push_back(g);
      lost_engines.push_back(migration::GpuIdName(g));
    }
  }
  if (!lost_engines.empty()) {
    const std::set<migration::GpuId> in_plan = GpusUsed(current_plan, current_cluster);
    for (const migration::GpuId& g : lost) {
      if (in_plan.count(g) > 0) in.current_lost_gpu = true;
    }
  }

  const ClusterSpec new_spec = ClusterOf(schedulable);
  bool planned_corrected = false;  // the planner priced with the corrections
  absl::StatusOr<ReplanAnswer> answer = absl::UnavailableError("no members");
  if (!schedulable.empty()) {
    ReplanQuery q;
    q.plan = BaseQuery(new_spec, &planned_corrected);
    q.current_cluster = ClusterToMessage(current_cluster, catalog_);
    q.current_plan = nlohmann::json{{"templates", current_json["templates"]}};
    const absl::Time asked = absl::Now();
    answer = planner_->Replan(q);
    planning_s = absl::ToDoubleSeconds(absl::Now() - asked);
  }
  if (!answer.ok()) {
    in.new_plan_found = false;
    in.new_plan_reason = std::string(answer.status().message());
    // Without an answer the current plan's fate is known only from the
    // membership: a node it uses left or drains.
    for (const Member& m : draining) {
      if (used.count(m.spec.node) > 0) {
        in.current_feasible = false;
        in.current_reason = absl::StrCat("node ", m.spec.node, " drains");
      }
    }
  } else {
    in.current_feasible = answer->current.feasible;
    in.current_reason = answer->current.reason;
    in.old_throughput =
        answer->current.feasible ? Throughput(answer->current.plan) : 0;
    in.new_throughput = Throughput(answer->new_plan.plan);
    in.new_plan_same = answer->current.feasible &&
                       TemplatesOf(answer->current.plan) ==
                           TemplatesOf(answer->new_plan.plan);
    in.migration_available = answer->migration.available;
    in.migration_reason = answer->migration.reason;
    in.migration_estimate_s = answer->migration.makespan_s;
  }
  // A draining node holds its state until the switch commits: it is a
  // source of the migration, which the planner (pricing the move onto the
  // new cluster alone) cannot count. When it found no migration while a
  // node drains, the move is checked on the switch's own cluster.
  if (answer.ok() && !in.migration_available && !draining.empty()) {
    absl::StatusOr<double> makespan = MigrationMakespan(
        current_plan, current_cluster, answer->new_plan.plan, switch_members);
    if (makespan.ok()) {
      in.migration_available = true;
      in.migration_reason.clear();
      in.migration_estimate_s = *makespan;
    } else {
      in.migration_reason = std::string(makespan.status().message());
    }
  }
  // A leave that took state no survivor holds: the planner's migration
  // check says so (the nodes that left are not in the new cluster). Then
  // the state comes from the fallback checkpoint, or training stops.
  std::string restore_from;
  if (!lost_nodes.empty() && answer.ok() && !in.migration_available) {
    const std::string gone = absl::StrJoin(lost_nodes, ", ");
    if (!config_.job.fallback_checkpoint_dir.empty()) {
      restore_from = config_.job.fallback_checkpoint_dir;
      in.migration_available = true;
      in.migration_estimate_s = 0;
      lost_note = absl::StrCat("; node ", gone,
                               " took state no surviving GPU holds (",
                               in.migration_reason,
                               "): restoring from the checkpoint in ",
                               restore_from);
    } else {
      in.migration_reason = absl::StrCat(
          "node ", gone, " left ungracefully and the new plan needs state no "
          "surviving GPU holds (", in.migration_reason,
          "); no fallback_checkpoint_dir is configured to restore it from");
    }
  }
  // The throughputs again with the corrections in force: the verdict is
  // decided on those (decision.h), the raw ones are recorded beside them.
  std::string corrected_note;
  if (answer.ok()) {
    // Both plans priced with the same corrections, the new plan's GPU types
    // that never ran with their fleet's (decision.h, like with like).
    std::vector<const nlohmann::json*> plans = {&answer->new_plan.plan};
    if (answer->current.feasible) plans.push_back(&answer->current.plan);
    const std::optional<RunCorrections> corrections =
        CorrectionsFor(plans, &in.new_unmeasured_types);
    auto corrected = [&](const nlohmann::json& plan)
        -> absl::StatusOr<std::optional<double>> {
      if (!corrections.has_value()) return std::optional<double>();
      absl::StatusOr<double> t = PricedThroughput(new_spec, plan, *corrections);
      if (!t.ok()) return t.status();
      return std::optional<double>(*t);
    };
    absl::StatusOr<std::optional<double>> new_c =
        corrected(answer->new_plan.plan);
    absl::StatusOr<std::optional<double>> old_c =
        answer->current.feasible
            ? corrected(answer->current.plan)
            : absl::StatusOr<std::optional<double>>(std::optional<double>(0.0));
    {
      absl::MutexLock lock(&mu_);
      absl::Duration age;
      in.switch_back_generation =
          LeftWithinHorizon(answer->new_plan.plan, config_.job.horizon, &age);
      in.switch_back_age_s = absl::ToDoubleSeconds(age);
      auto current = records_.find(generation_);
      if (current != records_.end())
        in.measurement_noise = RelativeNoise(current->second.samples);
    }
    // The planner searched on corrected costs: the raw throughputs are
    // priced here, so the record keeps both.
    absl::StatusOr<double> new_raw = in.new_throughput;
    absl::StatusOr<double> old_raw = in.old_throughput;
    if (planned_corrected) {
      new_raw = PricedThroughput(new_spec, answer->new_plan.plan, {});
      if (answer->current.feasible) {
        old_raw = PricedThroughput(new_spec, answer->current.plan, {});
      }
    }
    if (!new_raw.ok() || !old_raw.ok()) {
      corrected_note = absl::StrCat(
          "; the raw predictions could not be priced (",
          (!new_raw.ok() ? new_raw.status() : old_raw.status()).message(),
          "): recorded the corrected ones as raw");
    } else {
      in.new_throughput = *new_raw;
      in.old_throughput = *old_raw;
    }
    if (!new_c.ok() || !old_c.ok()) {
      corrected_note = absl::StrCat(
          "; the corrected predictions could not be priced (",
          (!new_c.ok() ? new_c.status() : old_c.status()).message(),
          "): decided on the raw ones");
    } else if (new_c->has_value() && old_c->has_value()) {
      absl::MutexLock lock(&mu_);
      in.corrected = true;
      in.new_throughput_corrected = **new_c;
      in.old_throughput_corrected = **old_c;
      in.corrections = absl::StrCat(
          DescribeCorrections(corrections_), ", fitted on ",
          corrections_on_.size(),
          corrections_on_.size() == 1 ? " generation" : " generations");
    }
  }
  Decision d = Decide(in);
  d.reason += corrected_note;
  d.reason += lost_note;
  d.planning_s = planning_s;
  d.decision_s = absl::ToDoubleSeconds(absl::Now() - replan_start);
  if (d.verdict != Verdict::kSwitch) {
    if (d.verdict == Verdict::kKeep) {
      // A drained node the kept plan does not use holds nothing of it: it
      // is let go now, as a switch lets go of the nodes it moved off, and
      // before the decision is recorded, so no reader sees the keep with
      // the node still a member.
      bool released = false;
      for (const Member& m : draining) {
        if (used.count(m.spec.node) == 0 && membership_.Remove(m.spec.node)) {
          Emit("membership", absl::StrCat("released ", m.spec.node,
                                          ": the plan does not use it"));
          released = true;
        }
      }
      if (released) (void)store_->SaveMembers(membership_.Members());
    }
    RecordDecision(d, 0);
    if (d.verdict == Verdict::kCannotSwitch) {
      Fail(absl::StrCat("training cannot go on: ", d.reason));
      absl::MutexLock lock(&mu_);
      phase_ = "failed";
    }
    return;
  }

  absl::StatusOr<Cluster> cluster =
      ClusterFromMessage(ClusterOf(switch_members), catalog_, "", "cluster");
  CHECK(cluster.ok()) << cluster.status();
  absl::StatusOr<Plan> plan =
      PlanFromJson(answer->new_plan.plan, *cluster, catalog_, "plan");
  if (!plan.ok()) {
    Decision refused = d;
    refused.verdict = Verdict::kKeep;
    refused.reason = absl::StrCat("the planner's plan does not read back: ",
                                  plan.status().message());
    RecordDecision(refused, 0);
    return;
  }
  // Check before pausing (docs/controller.md): the diff the agents will
  // compute, here, with the GPUs of the nodes that left counted as lost.
  // The planner's migration estimate assumed every old GPU still holds its
  // state; a byte of the new plan that only a lost GPU held means the
  // state must come from the checkpoint, or training stops.
  if (!lost.empty() && restore_from.empty()) {
    std::vector<std::string> nodes;
    for (const Node& n : cluster->nodes()) nodes.push_back(n.name);
    absl::StatusOr<migration::ModelState> state = DescribedState(nodes);
    if (!state.ok()) {
      Decision refused = d;
      refused.verdict = Verdict::kKeep;
      refused.reason = absl::StrCat(
          "the job's training state could not be described: ",
          state.status().message());
      RecordDecision(refused, 0);
      return;
    }
    migration::DiffOptions options;
    for (const migration::GpuId& g : lost) {
      // Only GPUs the new cluster names may be listed; the nodes that left
      // are not in it and so hold nothing anyway.
      for (const Node& n : cluster->nodes()) {
        if (n.name == g.node) options.lost.push_back(g);
      }
    }
    absl::StatusOr<migration::StateDiff> diff = migration::ComputeDiff(
        *state, current_plan, current_cluster, *plan, *cluster,
        migration::MigrationWorld(*cluster, catalog_), options);
    if (!diff.ok()) {
      const std::string gone = LostWhat(lost_nodes, lost_engines);
      if (config_.job.fallback_checkpoint_dir.empty()) {
        d.verdict = Verdict::kCannotSwitch;
        d.reason = absl::StrCat(
            gone, " and the new plan needs state "
            "no surviving GPU holds (", diff.status().message(),
            "); no fallback_checkpoint_dir is configured to restore it from");
        RecordDecision(d, 0);
        Fail(absl::StrCat("training cannot go on: ", d.reason));
        absl::MutexLock lock(&mu_);
        phase_ = "failed";
        return;
      }
      restore_from = config_.job.fallback_checkpoint_dir;
      d.reason = absl::StrCat(d.reason, "; ", gone,
                              ": state no surviving GPU holds (",
                              diff.status().message(),
                              "): restoring from the checkpoint in ",
                              restore_from);
    } else {
      d.reason = absl::StrCat(d.reason, "; every byte of the new plan still "
                              "has a holder: recovering from the surviving "
                              "replicas");
    }
  }
  SwitchTarget target;
  {
    absl::MutexLock lock(&mu_);
    target.generation = ++last_attempted_;
  }
  // The survivors' diff above is part of the decision.
  d.decision_s = absl::ToDoubleSeconds(absl::Now() - replan_start);
  RecordDecision(d, target.generation);
  target.job = config_.job.job;
  target.cluster = *cluster;
  target.plan = *plan;
  target.old_cluster = current_cluster;
  target.old_plan = current_plan;
  target.old_generation = current_generation;
  target.lost = lost;
  target.checkpoint_dir = restore_from;
  target.store_address = job_store_->address();
  target.run_until = config_.job.iterations;
  // A draining node's deadline bounds the switch that moves its state off.
  for (const Member& m : switch_members) {
    if (!m.draining) continue;
    const absl::Time at = absl::Now() + (m.drain_deadline - clock_->Now());
    if (at < target.deadline) {
      target.deadline = at;
      target.deadline_reason =
          absl::StrCat("the drain deadline of node ", m.spec.node);
    }
  }
  // Drained nodes the new plan does not use are let go when it commits.
  std::set<std::string> release;
  const std::set<std::string> now_used = NodesUsed(*plan, *cluster);
  for (const Member& m : switch_members) {
    if (m.draining && now_used.count(m.spec.node) == 0) {
      release.insert(m.spec.node);
    }
  }
  SwitchOutcome out = RunSwitch(target, answer->new_plan.plan,
                                ClusterToJson(*cluster, catalog_).dump(),
                                release);
  if (out.committed) {
    absl::MutexLock lock(&mu_);
    cost_model_.Record(out.timings.downtime_s, in.migration_estimate_s);
  } else {
    absl::MutexLock lock(&mu_);
    retry_at_ = clock_->Now() + config_.retry_after_failure;
  }
  (void)store_->SaveMembers(membership_.Members());
}

absl::StatusOr<double> JobController::MigrationMakespan(
    const Plan& current_plan, const Cluster& current_cluster,
    const nlohmann::json& new_plan_json,
    const std::vector<Member>& members) {
  absl::StatusOr<Cluster> cluster =
      ClusterFromMessage(ClusterOf(members), catalog_, "", "cluster");
  if (!cluster.ok()) return cluster.status();
  absl::StatusOr<Plan> plan =
      PlanFromJson(new_plan_json, *cluster, catalog_, "plan");
  if (!plan.ok()) return plan.status();
  std::vector<std::string> nodes;
  for (const Member& m : members) nodes.push_back(m.spec.node);
  absl::StatusOr<migration::ModelState> state = DescribedState(nodes);
  if (!state.ok()) return state.status();
  const migration::MigrationWorld world(*cluster, catalog_);
  absl::StatusOr<migration::StateDiff> diff = migration::ComputeDiff(
      *state, current_plan, current_cluster, *plan, *cluster, world);
  if (!diff.ok()) return diff.status();
  return migration::BuildSchedule(*diff, world).makespan_s;
}

absl::StatusOr<migration::ModelState> JobController::DescribedState(
    const std::vector<std::string>& nodes) {
  {
    absl::MutexLock lock(&mu_);
    if (described_state_.has_value()) return *described_state_;
  }
  absl::Status last = absl::UnavailableError("no member to ask");
  for (const std::string& node : nodes) {
    agent::AgentClient* agent = AgentFor(node);
    if (agent == nullptr) continue;
    absl::StatusOr<agent::StateDescription> described =
        agent->DescribeState(config_.job.job);
    if (!described.ok()) {
      last = absl::Status(described.status().code(),
                          absl::StrCat("node ", node, ": ",
                                       described.status().message()));
      // An engine that cannot describe the job is an answer; an agent that
      // does not answer is not: ask the next.
      if (absl::IsUnavailable(last) || absl::IsDeadlineExceeded(last)) {
        continue;
      }
      return last;
    }
    LOG(INFO) << "the job's training state, as node " << node << "'s engine ("
              << described->engine << ") describes it: "
              << described->state.num_tensors() << " tensors, "
              << described->state.TotalBytes() << " bytes";
    absl::MutexLock lock(&mu_);
    described_state_ = described->state;
    return *described_state_;
  }
  return last;
}

SwitchOutcome JobController::RunSwitch(
    SwitchTarget target, const nlohmann::json& plan_json,
    const std::string& cluster_json,
    const std::set<std::string>& release_on_commit) {
  const int64_t n = target.generation;
  SwitchInProgress progress;
  progress.generation = n;
  progress.cluster_json = cluster_json;
  progress.plan_json = plan_json.dump();
  progress.started = clock_->Now();
  const absl::Time started = absl::Now();
  auto observer = [&](SwitchPhase phase) {
    progress.phase = SwitchPhaseName(phase);
    // What a restart must know is whether Commit may have been sent: the
    // switch is persisted when it starts (prepare) and before the first
    // Commit, each durably. The phases between are only reported: a
    // restart rolls every one of them back alike, and each durable write
    // inside the downtime cost 10-300 ms (an fsync, or the wait behind a
    // membership write's) under churn.
    if (phase == SwitchPhase::kPrepare || phase == SwitchPhase::kCommit) {
      if (absl::Status s = store_->SaveSwitch(progress); !s.ok()) {
        LOG(ERROR) << "persisting the switch's phase: " << s;
      }
    }
    {
      absl::MutexLock lock(&mu_);
      phase_ = absl::StrCat("switching: ", progress.phase);
    }
    Emit("phase",
         absl::StrFormat("generation %d: %s (%.3f s in)", n, progress.phase,
                         absl::ToDoubleSeconds(absl::Now() - started)),
         n);
    // Only switches between plans: the first plan is no switch to fault.
    if (!config_.hold.phase.empty() && config_.hold.phase == progress.phase &&
        target.old_plan.has_value()) {
      LOG(WARNING) << "failpoint: holding before " << progress.phase << " for "
                   << absl::FormatDuration(config_.hold.hold);
      absl::SleepFor(config_.hold.hold);
    }
  };
  auto lookup = [this](const std::string& node) { return AgentFor(node); };
  SwitchOutcome out = reconfigurer_.Run(target, lookup, observer);
  const std::string outcome =
      out.committed ? "committed"
                    : absl::StrCat("aborted in ", SwitchPhaseName(out.failed_in),
                                   ": ", out.status.message());
  v1::SwitchTimings timings = TimingsToProto(n, outcome, out.timings,
                                             out.timings.estimated_seconds);
  (void)store_->SaveSwitchRecord({n, outcome, ToJson(timings)});
  if (out.committed) {
    if (absl::Status s = store_->CommitSwitch(
            {n, cluster_json, plan_json.dump()});
        !s.ok()) {
      LOG(ERROR) << "persisting the commit of generation " << n << ": " << s;
    }
    // The new plan's iterations count from where the old one paused; a
    // first plan from 0, or, restored from a checkpoint, from the first
    // iteration its ranks report. Recorded before the phase reads
    // "running".
    const int64_t first_iteration =
        target.old_plan.has_value() ? out.timings.paused_at_iteration
        : target.checkpoint_dir.empty() ? 0
                                        : -1;
    StartMeasuring(n, target.cluster, target.plan, plan_json, first_iteration);
    absl::MutexLock lock(&mu_);
    if (generation_ > 0) {
      // Only the last horizon's are looked at (LeftWithinHorizon): older
      // ones go, so a long job's switches do not pile up here.
      const absl::Time now = clock_->Now();
      std::erase_if(left_at_, [&](const auto& e) {
        return now - e.second > config_.job.horizon;
      });
      left_at_[generation_] = now;
    }
    generation_ = n;
    // The GPUs counted lost got their state from the survivors (or hold
    // none in the new plan).
    for (const migration::GpuId& g : target.lost) lost_gpus_.erase(g);
    cluster_ = target.cluster;
    plan_ = target.plan;
    plan_json_ = plan_json;
    phase_ = "running";
    last_switch_ = timings;
    for (const std::string& node : release_on_commit) membership_.Remove(node);
    // A committed generation ends whatever went wrong before it.
    error_ = out.status.ok() ? "" : std::string(out.status.message());
  } else {
    (void)store_->ClearSwitch();
    absl::MutexLock lock(&mu_);
    phase_ = generation_ > 0 ? "running" : "waiting";
    last_switch_ = timings;
    error_ = outcome;
  }
  Emit(out.committed ? "phase" : "error",
       absl::StrFormat("generation %d %s: downtime %.3f s (pause %.3f, stage1 "
                       "%.3f, stage2 %.3f, rebuild %.3f, commit %.3f, resume "
                       "%.3f), total %.3f s",
                       n, outcome, out.timings.downtime_s, out.timings.pause_s,
                       out.timings.stage1_s, out.timings.stage2_s,
                       out.timings.rebuild_s, out.timings.commit_s,
                       out.timings.resume_s, out.timings.total_s),
       n);
  return out;
}

void JobController::RecordDecision(const Decision& d, int64_t generation) {
  DecisionRecord r;
  r.time = clock_->Now();
  r.decision = d;
  r.decision.trigger = TruncateText(d.trigger, kMaxRecordTextBytes);
  r.decision.reason = TruncateText(d.reason, kMaxRecordTextBytes);
  r.generation = generation;
  absl::StatusOr<int64_t> id = store_->AppendDecision(r);
  if (id.ok()) r.id = *id;
  v1::Event e;
  e.set_time_unix_s(UnixSeconds(r.time));
  e.set_kind("decision");
  e.set_message(absl::StrCat(VerdictName(d.verdict), " (", r.decision.trigger,
                             "): ", r.decision.reason));
  e.set_generation(generation);
  *e.mutable_decision() = DecisionToProto(r);
  LOG(INFO) << "decision: " << e.message();
  events_.Add(std::move(e));
}

void JobController::PollAgents() {
  if (poll_.has_value()) {
    if (poll_->wait_for(std::chrono::seconds(0)) != std::future_status::ready) {
      return;  // an agent has not answered yet: nothing waits for it
    }
    const std::vector<PolledNode> polled = poll_->get();
    poll_.reset();
    ReadPoll(poll_generation_, polled);
  }
  std::vector<std::pair<std::string, agent::AgentClient*>> clients;
  int64_t generation;
  {
    absl::MutexLock lock(&mu_);
    if (generation_ == 0) return;
    const absl::Time now = absl::Now();
    // status_poll apart, and 1 ms per node at least: a thousand nodes cost
    // a thousand Status calls a second, not a core (bench/controller_scale).
    const absl::Duration period = std::max(
        config_.status_poll,
        absl::Milliseconds(static_cast<int64_t>(cluster_.nodes().size())));
    if (now - last_poll_ < period) return;
    last_poll_ = now;
    generation = generation_;
    for (const Node& n : cluster_.nodes()) clients.emplace_back(n.name, nullptr);
  }
  // Clients live as long as the controller (a replaced one is retired, not
  // destroyed), so the round may use them after this returns.
  for (auto& [node, client] : clients) client = AgentFor(node);
  poll_generation_ = generation;
  poll_ = std::async(std::launch::async, [clients, generation]() {
    std::vector<PolledNode> polled(clients.size());
    for (size_t i = 0; i < clients.size(); ++i) polled[i].node = clients[i].first;
    // At most kPollThreads calls at once, each worker taking the next node:
    // an agent that does not answer holds one worker for its deadline, not
    // the round's other nodes, and a thousand nodes cost no thousand threads.
    constexpr size_t kPollThreads = 32;
    std::atomic<size_t> next{0};
    auto work = [&]() {
      for (size_t i = next++; i < clients.size(); i = next++) {
        polled[i].status = clients[i].second == nullptr
                               ? absl::UnavailableError("not a member")
                               : clients[i].second->Status(generation);
      }
    };
    std::vector<std::thread> threads;
    for (size_t t = 0; t < std::min(kPollThreads, clients.size()); ++t) {
      threads.emplace_back(work);
    }
    for (std::thread& t : threads) t.join();
    return polled;
  });
}

void JobController::ReadPoll(int64_t generation,
                             const std::vector<PolledNode>& polled) {
  {
    // Answers to a round of an older generation describe another plan.
    absl::MutexLock lock(&mu_);
    if (generation != generation_) return;
  }
  // A node silent for a lease is gone whatever it does: its heartbeats
  // may come from a thread that still runs beside a hung service.
  if (answered_generation_ != generation) {
    answered_.clear();
    answered_generation_ = generation;
  }
  const absl::Time now = clock_->Now();
  const absl::Duration lease = config_.job.membership.lease;
  for (const PolledNode& p : polled) {
    auto [it, first] = answered_.emplace(p.node, now);
    if (p.status.ok()) {
      it->second = now;
    } else if (!first && now - it->second > lease &&
               membership_.LeaveUnresponsive(p.node, lease)) {
      LOG(WARNING) << "node " << p.node << ": no Status answered since "
                   << absl::FormatDuration(now - it->second)
                   << " ago: a leave (" << p.status.status() << ")";
      answered_.erase(it);
    }
  }
  int64_t iteration = -1;
  double loss = 0, tokens = 0;
  std::string rank_error;
  std::vector<NodeReport> reports;
  for (const PolledNode& p : polled) {
    const std::string& node = p.node;
    const absl::StatusOr<agent::NodeStatus>& st = p.status;
    if (!st.ok()) continue;  // silent for a lease: a leave (above)
    // An agent still on another generation (it has not committed this one
    // yet) reports the other plan's iterations.
    const bool current = st->current_generation == generation;
    NodeReport report;
    report.node = node;
    for (const agent::RankStatus& r : st->ranks) {
      if (r.lost) {
        // The engine died with its state; a fresh one stands on the GPU.
        // Recovered as a leave is: a switch that counts the GPU lost.
        bool first_seen;
        {
          absl::MutexLock lock(&mu_);
          first_seen = lost_gpus_.insert({node, r.gpu.index}).second;
        }
        if (first_seen) {
          Emit("membership", absl::StrCat("lost ", node, " GPU ", r.gpu.index,
                                          ": ", r.error));
          membership_.RequestReplan(
              absl::StrCat("engine lost on ", node, " GPU ", r.gpu.index));
        }
        continue;
      }
      if (!r.error.empty() && rank_error.empty()) {
        rank_error = absl::StrCat("node ", node, " GPU ", r.gpu.index, ": ", r.error);
      }
      if (!r.in_plan) continue;
      if (iteration < 0 || r.iteration < iteration) {
        iteration = r.iteration;
        loss = r.loss;
      }
      tokens = std::max(tokens, r.tokens_per_second);
      if (current) {
        ++report.gpus_in_plan;
        // One engine process per rank: the node's peak is their sum; ranks
        // in the agent's process share one peak.
        report.peak_rss_bytes =
            r.engine_pid > 0 ? report.peak_rss_bytes + r.peak_rss_bytes
                             : std::max(report.peak_rss_bytes, r.peak_rss_bytes);
        report.iterations.emplace_back(r.iteration, r.iteration_seconds);
      }
    }
    if (report.gpus_in_plan > 0) reports.push_back(std::move(report));
  }
  if (!rank_error.empty()) Fail(rank_error);
  Measure(generation, reports);
  MaybeFit(false);
  if (iteration < 0) return;
  bool advanced;
  {
    absl::MutexLock lock(&mu_);
    advanced = iteration > iteration_;
    iteration_ = iteration;
    loss_ = loss;
    tokens_per_s_ = tokens;
    if (iteration >= config_.job.iterations && phase_ == "running") {
      phase_ = "finished";
    }
  }
  if (advanced) {
    v1::Event e;
    e.set_time_unix_s(UnixSeconds(clock_->Now()));
    e.set_kind("iteration");
    e.set_generation(generation);
    e.set_iteration(iteration);
    e.set_loss(loss);
    e.set_message(absl::StrFormat("iteration %d loss %.6f", iteration, loss));
    events_.Add(std::move(e));
  }
}

// ---- measured iteration times and corrected predictions ----

absl::Status JobController::RestoreMeasurements() {
  absl::StatusOr<std::vector<GenerationRecord>> records = store_->Generations();
  if (!records.ok()) return records.status();
  absl::StatusOr<CorrectionsRecord> stored = store_->Corrections();
  if (!stored.ok()) return stored.status();
  std::optional<RunCorrections> corrections;
  std::vector<int64_t> fitted_on;
  std::string note = stored->note;
  if (!stored->corrections_json.empty()) {
    absl::StatusOr<RunCorrections> c =
        calibration_->FromJson(stored->corrections_json, &fitted_on);
    if (c.ok()) {
      corrections = *c;
    } else {
      // The fit is redone from the records anyway: nothing is lost but
      // the corrections until then.
      note = absl::StrCat("the stored corrections do not read back (",
                          c.status().message(), "); none in force until the next fit");
      LOG(WARNING) << note;
    }
  }
  std::map<int64_t, std::string> lines;
  std::map<int64_t, RunPrediction> corrected;
  for (const GenerationRecord& r : *records) {
    absl::StatusOr<Cluster> cluster = ParseCluster(
        r.cluster_json, absl::StrCat("generation ", r.generation), catalog_);
    if (cluster.ok()) lines[r.generation] = ClusterLine(*cluster, catalog_);
    if (corrections) {
      absl::StatusOr<RunPrediction> p = calibration_->Predict(r, *corrections);
      if (p.ok()) corrected[r.generation] = *p;
    }
  }
  absl::MutexLock lock(&mu_);
  for (const GenerationRecord& r : *records) {
    records_[r.generation] = r;
    measured_total_ += r.iterations_measured;
  }
  // What was fitted before the restart stays fitted: no refit until a new
  // iteration is measured.
  fitted_total_ = measured_total_;
  cluster_lines_ = std::move(lines);
  corrected_ = std::move(corrected);
  have_corrections_ = corrections.has_value();
  if (corrections) corrections_ = *corrections;
  corrections_note_ = note;
  corrections_fitted_ = stored->fitted;
  corrections_on_ = fitted_on;
  return absl::OkStatus();
}

void JobController::StartMeasuring(int64_t generation, const Cluster& cluster,
                                   const Plan& plan,
                                   const nlohmann::json& plan_json,
                                   int64_t first_iteration) {
  const int warmup = config_.job.measure_warmup;
  const int window = config_.job.measure_window;
  std::optional<RunPrediction> corrected;
  RunCorrections corrections;
  bool have;
  {
    absl::MutexLock lock(&mu_);
    have = have_corrections_;
    corrections = corrections_;
  }
  // With corrections in force the planner priced the plan with them (see
  // BaseQuery): the raw prediction is priced here.
  std::optional<RunPrediction> raw;
  if (have) {
    absl::StatusOr<RunPrediction> r =
        calibration_->Predict(cluster, plan, RunCorrections{});
    if (r.ok()) {
      raw = *r;
    } else {
      LOG(WARNING) << "generation " << generation
                   << ": the raw prediction: " << r.status();
    }
    absl::StatusOr<RunPrediction> p =
        calibration_->Predict(cluster, plan, corrections);
    if (p.ok()) {
      corrected = *p;
    } else {
      LOG(WARNING) << "generation " << generation
                   << ": the corrected prediction: " << p.status();
    }
  }
  GenerationRecord record;
  {
    absl::MutexLock lock(&mu_);
    auto it = records_.find(generation);
    if (it != records_.end()) {
      // Recorded before a restart: the meter resumes where it stood.
      record = it->second;
      meter_.emplace(record.first_iteration, record.warmup, record.window);
      meter_->Restore(record.samples, record.iterations_measured);
    } else {
      record.generation = generation;
      record.cluster_json = ClusterToJson(cluster, catalog_).dump();
      record.plan_json = plan_json.dump();
      record.predicted_iteration_s =
          raw ? raw->iteration_s : JsonNumber(plan_json, "iteration_time_s");
      record.predicted_peak_gib = JsonNumber(plan_json, "max_memory_gib");
      record.first_iteration = first_iteration;
      record.warmup = warmup;
      record.window = window;
      record.memory = PlannedMemory(plan, cluster, plan_json, catalog_);
      records_[generation] = record;
      meter_.emplace(first_iteration, warmup, window);
    }
    meter_generation_ = generation;
    cluster_lines_[generation] = ClusterLine(cluster, catalog_);
    if (corrected) corrected_[generation] = *corrected;
    last_record_save_ = absl::Now();
  }
  if (absl::Status s = store_->SaveGeneration(record); !s.ok()) {
    LOG(ERROR) << "recording generation " << generation << ": " << s;
  }
}

void JobController::Measure(int64_t generation,
                            const std::vector<NodeReport>& reports) {
  std::optional<GenerationRecord> to_save;
  {
    absl::MutexLock lock(&mu_);
    if (!meter_.has_value() || meter_generation_ != generation) return;
    auto it = records_.find(generation);
    if (it == records_.end()) return;
    GenerationRecord& r = it->second;
    if (r.first_iteration < 0) {
      // Started after an unknown iteration: the lowest one its ranks
      // report now is the start (iterations before it are the old plan's
      // or the checkpoint's, or were run before the controller restarted).
      int64_t lowest = -1;
      for (const NodeReport& n : reports) {
        for (const auto& [iteration, seconds] : n.iterations) {
          if (lowest < 0 || iteration < lowest) lowest = iteration;
        }
      }
      if (lowest < 0) return;
      r.first_iteration = lowest;
      meter_.emplace(lowest, r.warmup, r.window);
    }
    bool changed = false;
    const int before = meter_->measured();
    for (const NodeReport& n : reports) {
      for (const auto& [iteration, seconds] : n.iterations) {
        changed |= meter_->Add(iteration, seconds);
      }
      for (NodeMemoryRecord& m : r.memory) {
        if (m.node != n.node) continue;
        if (n.peak_rss_bytes > m.peak_rss_bytes) {
          m.peak_rss_bytes = n.peak_rss_bytes;
          changed = true;
        }
      }
    }
    if (!changed) return;
    const int now_measured = meter_->measured();
    measured_total_ += now_measured - before;
    r.samples = meter_->samples();
    r.iterations_measured = now_measured;
    r.measured_iteration_s = meter_->MedianSeconds();
    // Fitted at once when the generation first counts for the fit and when
    // its window fills; in between at the refit interval.
    const int min_fit = calibration_->min_iterations();
    if ((before < min_fit && now_measured >= min_fit) ||
        (before < r.window && now_measured >= r.window)) {
      fit_due_ = true;
    }
    // Stored at most once a second (each write is an fsync), and at once
    // when the fit is due: a restart then resumes from what was fitted.
    const absl::Time t = absl::Now();
    if (fit_due_ || t - last_record_save_ >= absl::Seconds(1)) {
      last_record_save_ = t;
      to_save = r;
    }
  }
  if (to_save) {
    if (absl::Status s = store_->SaveGeneration(*to_save); !s.ok()) {
      LOG(ERROR) << "recording generation " << to_save->generation << ": " << s;
    }
  }
}

void JobController::MaybeFit(bool force) {
  std::vector<GenerationRecord> records;
  {
    absl::MutexLock lock(&mu_);
    if (measured_total_ == fitted_total_) return;
    if (!force && !fit_due_ && absl::Now() - last_fit_ < config_.refit_interval) {
      return;
    }
    // Nothing to fit on yet (every generation still in its first
    // iterations): not even a refusal to record.
    bool any = false;
    for (const auto& [g, r] : records_) {
      any |= r.iterations_measured >= calibration_->min_iterations();
    }
    if (!any) return;
    fit_due_ = false;
    fitted_total_ = measured_total_;
    last_fit_ = absl::Now();
    for (const auto& [g, r] : records_) records.push_back(r);
  }
  // The records as they are now are what is fitted: stored first, so that
  // a restart finds what the corrections came from.
  for (const GenerationRecord& r : records) {
    if (absl::Status s = store_->SaveGeneration(r); !s.ok()) {
      LOG(ERROR) << "recording generation " << r.generation << ": " << s;
    }
  }
  const absl::Time started = absl::Now();
  CorrectionsFit fit = calibration_->Fit(records);
  const double fit_s = absl::ToDoubleSeconds(absl::Now() - started);
  CorrectionsRecord stored;
  std::map<int64_t, RunPrediction> corrected;
  if (fit.status.ok()) {
    for (size_t i = 0; i < fit.generations.size() && i < fit.after.size(); ++i) {
      corrected[fit.generations[i]] = fit.after[i];
    }
    // The generations not fitted on (too few iterations yet), the current
    // one among them, are priced with the new corrections too.
    for (const GenerationRecord& r : records) {
      if (corrected.count(r.generation) > 0) continue;
      absl::StatusOr<RunPrediction> p = calibration_->Predict(r, fit.corrections);
      if (p.ok()) corrected[r.generation] = *p;
    }
    stored.corrections_json =
        calibration_->ToJson(fit.corrections, fit.generations);
    stored.generations = static_cast<int>(fit.generations.size());
    stored.note = fit.note;
    stored.fitted = clock_->Now();
  }
  std::string message;
  {
    absl::MutexLock lock(&mu_);
    if (fit.status.ok()) {
      have_corrections_ = true;
      corrections_ = fit.corrections;
      corrections_on_ = fit.generations;
      corrections_note_ = fit.note;
      corrections_fitted_ = stored.fitted;
      corrected_ = std::move(corrected);
      message = absl::StrFormat("corrections %s: %s (%.3f s)",
                                DescribeCorrections(corrections_), fit.note,
                                fit_s);
    } else {
      // A refused fit changes nothing that is in force: the last good
      // corrections (or none) stay, and the note says why.
      corrections_note_ =
          have_corrections_
              ? absl::StrCat(fit.note, "; keeping the corrections fitted on ",
                             corrections_on_.size(),
                             corrections_on_.size() == 1 ? " generation"
                                                         : " generations")
              : absl::StrCat(fit.note, "; no corrections in force");
      message = absl::StrCat("corrections: ", corrections_note_);
    }
    if (!fit.status.ok()) {
      stored.corrections_json =
          have_corrections_ ? calibration_->ToJson(corrections_, corrections_on_)
                            : "";
      stored.generations = static_cast<int>(corrections_on_.size());
      stored.fitted = corrections_fitted_;
    }
    stored.note = corrections_note_;
  }
  if (absl::Status s = store_->SaveCorrections(stored); !s.ok()) {
    LOG(ERROR) << "recording the corrections: " << s;
  }
  Emit("calibration", message, generation());
}

std::optional<RunCorrections> JobController::CorrectionsFor(
    const std::vector<const nlohmann::json*>& plans,
    std::vector<std::string>* unmeasured) {
  RunCorrections corrections;
  {
    absl::MutexLock lock(&mu_);
    if (!have_corrections_) return std::nullopt;
    corrections = corrections_;
  }
  std::set<std::string> types;
  for (const nlohmann::json* plan : plans) types.merge(GpuTypesOf(*plan));
  const std::vector<std::string> filled = ImputeUnmeasuredTypes(
      std::vector<std::string>(types.begin(), types.end()), &corrections);
  // Those of the first plan (the new one) count against it.
  const std::set<std::string> in_new = GpuTypesOf(*plans.front());
  unmeasured->clear();
  for (const std::string& type : filled)
    if (in_new.count(type) > 0) unmeasured->push_back(type);
  return corrections;
}

int64_t JobController::LeftWithinHorizon(const nlohmann::json& plan_json,
                                         absl::Duration horizon,
                                         absl::Duration* age) {
  const nlohmann::json templates = TemplatesOf(plan_json);
  const absl::Time now = clock_->Now();
  int64_t found = 0;
  for (const auto& [generation, left] : left_at_) {
    if (generation == generation_ || now - left > horizon) continue;
    auto record = records_.find(generation);
    if (record == records_.end()) continue;
    const nlohmann::json plan =
        nlohmann::json::parse(record->second.plan_json, nullptr, false);
    if (plan.is_discarded() || TemplatesOf(plan) != templates) continue;
    found = generation;  // left_at_ is ordered: the latest wins
    *age = now - left;
  }
  return found;
}

absl::StatusOr<double> JobController::PricedThroughput(
    const ClusterSpec& spec, const nlohmann::json& plan_json,
    const RunCorrections& corrections) {
  absl::StatusOr<Cluster> cluster = ClusterFromMessage(spec, catalog_, "", "cluster");
  if (!cluster.ok()) return cluster.status();
  absl::StatusOr<Plan> plan = PlanFromJson(plan_json, *cluster, catalog_, "plan");
  if (!plan.ok()) return plan.status();
  absl::StatusOr<RunPrediction> p =
      calibration_->Predict(*cluster, *plan, corrections);
  if (!p.ok()) return p.status();
  if (!(p->iteration_s > 0)) {
    return absl::InternalError(absl::StrCat(
        "the predicted iteration time is ", p->iteration_s, " s"));
  }
  return 1.0 / p->iteration_s;
}

v1::GenerationMeasurement JobController::MeasurementToProto(
    const GenerationRecord& r) const {
  v1::GenerationMeasurement m;
  m.set_generation(r.generation);
  auto line = cluster_lines_.find(r.generation);
  if (line != cluster_lines_.end()) m.set_cluster(line->second);
  m.set_first_iteration(std::max<int64_t>(0, r.first_iteration));
  m.set_warmup_iterations(r.warmup);
  m.set_iterations_measured(r.iterations_measured);
  m.set_measured_iteration_s(r.measured_iteration_s);
  m.set_predicted_iteration_s(r.predicted_iteration_s);
  m.set_measured_peak_gib(r.MeasuredPeakGib());
  m.set_predicted_peak_gib(r.predicted_peak_gib);
  if (have_corrections_) {
    auto c = corrected_.find(r.generation);
    if (c != corrected_.end()) {
      m.set_corrected_iteration_s(c->second.iteration_s);
      m.set_corrected_peak_gib(c->second.peak_gib);
    }
  }
  for (const NodeMemoryRecord& n : r.memory) {
    v1::NodeMemory* pm = m.add_memory();
    pm->set_node(n.node);
    pm->set_gpu_type(n.gpu_type);
    pm->set_gpus(n.gpus);
    pm->set_peak_rss_bytes(n.peak_rss_bytes);
    pm->set_predicted_gib(n.predicted_gib);
  }
  return m;
}

}  // namespace arachne::controller
