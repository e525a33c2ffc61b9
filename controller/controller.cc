// The JobController's core: construction (Create opens the state database,
// starts the job's TCPStore and the reconcile thread), Stop, the event log
// (Emit, Fail) and the agent clients by node. The rest of the class is
// defined by concern beside it: controller_recovery.cc (reading the state
// database back at start), controller_rpcs.cc (the RPC handlers),
// controller_reconcile.cc (the reconcile loop and switch driving),
// controller_agent_polling.cc (the agents' Status polls) and
// controller_measurements.cc (measured iteration times and corrections).
#include "controller/controller.h"

#include <algorithm>
#include <set>

#include "controller/controller_internal.h"
#include "glog/logging.h"
#include "planner_service/io/input_bounds.h"

namespace arachne::controller {

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
                             std::unique_ptr<StateDatabase> store)
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
  absl::StatusOr<std::unique_ptr<StateDatabase>> store =
      StateDatabase::Open(config.state_dir);
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
  c->calibration_ = std::make_unique<OnlineCorrections>(
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

}  // namespace arachne::controller
