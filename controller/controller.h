// The job's controller (docs/controller.md): membership in, plans from the
// planner, keep-or-switch decisions, and the live switch of the agents,
// with everything that must survive a restart in the state store. The RPC
// glue (controller_service.h) only converts and authenticates; this class
// has no gRPC server in it.
//
// Level-triggered: one reconcile thread looks at what is (members, the
// current plan, pending changes) and does the next step — the first plan
// once min_gpus registered, a replan when membership says one is due — so
// after a restart it recomputes what to do from the state database instead of
// replaying events. The reconcile thread runs every switch itself, so at
// most one is in flight; RPCs (Register, Heartbeat, ...) keep being answered
// meanwhile.
//
// Generations: generation g names one plan and every RPC and store prefix
// of it carries g. An aborted switch burns its generation (the next attempt
// takes a new one), so no key an aborted attempt left in the job's store is
// ever read again.
#ifndef ARACHNE_CONTROLLER_CONTROLLER_H_
#define ARACHNE_CONTROLLER_CONTROLLER_H_

#include <atomic>
#include <cstdint>
#include <deque>
#include <map>
#include <memory>
#include <optional>
#include <set>
#include <future>
#include <string>
#include <thread>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "arachne/v1/controller.pb.h"
#include "controller/clock.h"
#include "controller/controller_config.h"
#include "controller/decision.h"
#include "controller/event_log.h"
#include "controller/measurement.h"
#include "controller/membership.h"
#include "controller/online_corrections.h"
#include "controller/planning.h"
#include "controller/reconfigurer.h"
#include "controller/state_database.h"
#include "nlohmann/json.hpp"
#include "planner_service/core/model/cluster.h"
#include "planner_service/core/model/gpu_catalog.h"
#include "planner_service/core/model/plan.h"
#include "worker_agent/agent_client.h"
#include "worker_agent/job_store.h"

namespace arachne::controller {

struct JobControllerConfig {
  JobSettings job;
  std::string state_dir;
  std::string store_host = "127.0.0.1";  // where the job's TCPStore listens
  // Token and TLS of the calls to the agents (the address is each agent's).
  agent::AgentClientConfig agent_client;
  absl::Duration tick = absl::Milliseconds(50);
  absl::Duration status_poll = absl::Milliseconds(100);
  // After a failed first plan or switch, the next attempt waits this long.
  absl::Duration retry_after_failure = absl::Seconds(5);
  // Test fault injection (--failpoint): every switch waits here.
  SwitchHold hold;
  // Register asks the agent at the registered address for its GPUs with
  // this deadline.
  absl::Duration register_check_timeout = absl::Seconds(3);
  // Where Register may point the controller at agents; none:
  // AgentNetworks::Default().
  std::optional<AgentNetworks> agent_networks;
  // The profiles the corrected predictions are priced on ("" = built in):
  // the embedded planner's.
  std::string profiles_dir;
  // Between two fits while measurements arrive (a generation reaching its
  // first fit-worthy count or a full window is fitted at once, and so is
  // anything new before a replan decides).
  absl::Duration refit_interval = absl::Seconds(10);
};

// Bounds on what the RPCs accept (docs/errors.md, "Input bounds"); node
// names, reasons and UTF-8 follow planner_service/io/input_bounds.h.
//
// AnnounceJoin.within_s: a replan waits at most this long for announced
// nodes (an hour: any machine that is coming arrives well within it).
inline constexpr double kMaxAnnounceSeconds = 3600;
// DrainNode.deadline_s: a day.
inline constexpr double kMaxDrainSeconds = 86400;
// Register.memory_gib (per GPU): above any GPU made.
inline constexpr double kMaxMemoryGibPerGpu = 1024;
// Register.address: host:port.
inline constexpr size_t kMaxAddressBytes = 512;
// GetStatus: the response is cut to this size (oldest decisions first, then
// the oldest generations), well inside gRPC's default 4 MiB message limit.
inline constexpr size_t kStatusBudgetBytes = size_t{3} << 20;

// The definitions are split by concern, each group of private members
// below naming its file: controller.cc (Create, Stop, the event log, the
// agent clients), controller_recovery.cc (the state database read back at
// start), controller_rpcs.cc (the RPCs), controller_reconcile.cc (the reconcile
// loop and switch driving), controller_agent_polling.cc (the agents'
// Status polls) and controller_measurements.cc (the calibration loop).
class JobController {
 public:
  // Opens the state database, reads back membership and the current plan,
  // finishes or rolls back a switch found in progress, starts the job's
  // TCPStore and the reconcile thread. Errors: the state database's (DataLoss
  // for a torn database), the TCPStore's.
  static absl::StatusOr<std::unique_ptr<JobController>> Create(
      JobControllerConfig config, GpuCatalog catalog,
      std::unique_ptr<PlanSource> planner, const Clock* clock);
  ~JobController();
  // Stops the reconcile thread (a switch in flight finishes first). The
  // agents train on.
  void Stop();

  // The RPCs, in messages; errors as Membership's (InvalidArgument naming
  // the request field, NotFound, Unavailable for a backed-off node).
  absl::StatusOr<v1::RegisterResponse> Register(const v1::RegisterRequest& r);
  absl::StatusOr<v1::HeartbeatResponse> Heartbeat(const v1::HeartbeatRequest& r);
  absl::Status AnnounceJoin(const v1::AnnounceJoinRequest& r);
  absl::Status DrainNode(const v1::DrainNodeRequest& r);
  absl::Status RequestReplan(const v1::RequestReplanRequest& r);
  absl::StatusOr<v1::GetStatusResponse> GetStatus();
  const EventLog& events() const { return events_; }

  int64_t generation() const;

 private:
  JobController(JobControllerConfig config, GpuCatalog catalog,
                std::unique_ptr<PlanSource> planner, const Clock* clock,
                std::unique_ptr<StateDatabase> store);

  // ---- the core (controller.cc): the event log and the agent clients ----
  void Emit(const std::string& kind, const std::string& message,
            int64_t generation = 0);
  void Fail(const std::string& message);
  agent::AgentClient* AgentFor(const std::string& node);
  void EnsureClient(const MemberSpec& spec);

  // ---- recovery at start (controller_recovery.cc) ----
  absl::Status Recover();

  // ---- the checks behind the RPCs (controller_rpcs.cc) ----
  // A client for a one-off check of the agent at `address`: every call,
  // Status included, bounded by register_check_timeout.
  absl::StatusOr<std::unique_ptr<agent::AgentClient>> ConnectForCheck(
      const std::string& address) const;
  // The agent at spec.address is the node it claims, with those GPUs.
  absl::Status CheckAgent(const MemberSpec& spec);
  // A short Status call to the node's agent answered.
  bool AgentAnswers(const std::string& node);
  // FailedPrecondition unless `generation` is 0 or the current one.
  absl::Status CheckGeneration(int64_t generation, const char* rpc) const;

  // ---- the reconcile loop and switch driving (controller_reconcile.cc) ----
  void Loop();
  void ReconcileOnce();
  void StartFirstPlan(const std::string& trigger);
  void Replan(const std::string& trigger);
  // The estimated makespan of moving the state of `current_plan` to the
  // planner's new plan placed on the cluster of `members` (sorted by node,
  // as the switch's cluster is), every member's GPUs a holder;
  // FailedPrecondition when a byte has no holder there.
  absl::StatusOr<double> MigrationMakespan(
      const Plan& current_plan, const Cluster& current_cluster,
      const nlohmann::json& new_plan_json,
      const std::vector<Member>& members);
  // The job's training state as its engines describe it (the Agent
  // service's DescribeState), asked of the first of `nodes` whose agent
  // answers and then kept: it depends on the job alone. Diffs and
  // schedules are computed from it, so the controller needs no engine's
  // code and works with any engine.
  absl::StatusOr<migration::ModelState> DescribedState(
      const std::vector<std::string>& nodes);
  // Runs `target`; on commit makes it current and removes the members
  // named in `release_on_commit` in the same step, so no status read sees
  // the new generation running with a drained node still a member.
  // Returns the outcome.
  SwitchOutcome RunSwitch(SwitchTarget target, const nlohmann::json& plan_json,
                          const std::string& cluster_json,
                          const std::set<std::string>& release_on_commit = {});
  void RecordDecision(const Decision& d, int64_t generation);
  // The planner query for `cluster`. With corrections in force it carries
  // their time terms (the scales, and the fixed costs as framework
  // overrides), so the planner searches on corrected costs; its answer's
  // predictions are then corrected, and the raw ones are priced here
  // (`*corrected` says which).
  PlanQuery BaseQuery(const ClusterSpec& cluster,
                      bool* corrected = nullptr) const;
  // The cluster message of `members` (by name, GPU types by canonical id).
  ClusterSpec ClusterOf(const std::vector<Member>& members) const;

  // ---- polling the agents (controller_agent_polling.cc) ----
  // Polls the agents of the current plan without waiting on any: a round
  // of Status calls (in parallel, each with less than a lease, see
  // AgentClientConfig::status_timeout) runs in the background, and its
  // answers are read by a later tick. So a stopped agent delays neither
  // the leases' expiry nor any decision (docs/controller.md).
  void PollAgents();
  struct PolledNode {
    std::string node;
    absl::StatusOr<agent::NodeStatus> status;
  };
  void ReadPoll(int64_t generation, const std::vector<PolledNode>& polled);

  // ---- measured iteration times and corrected predictions
  // (controller_measurements.cc) ----
  // Reads the recorded generations and the corrections in force back from
  // the state database; the current generation's meter resumes from its record.
  absl::Status RestoreMeasurements();
  // Generation `generation` became current on `cluster` with `plan`: its
  // record (plan, raw prediction) starts and is stored. `first_iteration`:
  // the iteration it started after; -1 = the first one its ranks report
  // (a restart, a checkpoint).
  void StartMeasuring(int64_t generation, const Cluster& cluster,
                      const Plan& plan, const nlohmann::json& plan_json,
                      int64_t first_iteration);
  // One poll's reports of the current generation's ranks: (iteration,
  // seconds) of each rank of the plan, and per node the agent's peak RSS
  // and the plan's GPUs there.
  struct NodeReport {
    std::string node;
    int gpus_in_plan = 0;
    int64_t peak_rss_bytes = 0;
    std::vector<std::pair<int64_t, double>> iterations;
  };
  void Measure(int64_t generation, const std::vector<NodeReport>& reports);
  // Fits the corrections on every measured generation when something new
  // was measured since the last fit and `force` or the refit interval
  // passed; a refused fit keeps the corrections in force. Outside a replan
  // (`replanning` false), a fit that moves a compute scale by more than
  // the job's replan_correction_factor from decided_compute_scale_ asks for
  // one.
  void MaybeFit(bool force, bool replanning = false);
  // The corrections in force, those of the GPU types of `plans` that never
  // ran imputed (ImputeUnmeasuredTypes; `unmeasured` receives them);
  // nullopt when none are in force.
  std::optional<RunCorrections> CorrectionsFor(
      const std::vector<const nlohmann::json*>& plans,
      std::vector<std::string>* unmeasured);
  // The generation whose plan has the templates of `plan_json` and which
  // the job left less than `horizon` ago (the latest such), 0 for none;
  // `age` receives how long ago.
  int64_t LeftWithinHorizon(const nlohmann::json& plan_json,
                            absl::Duration horizon, absl::Duration* age)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // The throughput of `plan_json` on the cluster of `spec` with
  // `corrections` (none: the raw prediction), priced here.
  absl::StatusOr<double> PricedThroughput(const ClusterSpec& spec,
                                          const nlohmann::json& plan_json,
                                          const RunCorrections& corrections);
  v1::GenerationMeasurement MeasurementToProto(const GenerationRecord& r) const
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);

  const JobControllerConfig config_;
  const GpuCatalog catalog_;
  const std::unique_ptr<PlanSource> planner_;
  const Clock* const clock_;
  const std::unique_ptr<StateDatabase> store_;
  std::string controller_id_;  // set by Create, then constant
  Membership membership_;
  Reconfigurer reconfigurer_;
  std::unique_ptr<agent::JobStoreServer> job_store_;
  EventLog events_;

  mutable absl::Mutex mu_;
  // Agent clients by node; a replaced client is kept (retired_) so that a
  // switch holding a pointer to it never sees it freed.
  std::map<std::string, std::unique_ptr<agent::AgentClient>> clients_
      ABSL_GUARDED_BY(mu_);
  std::vector<std::unique_ptr<agent::AgentClient>> retired_
      ABSL_GUARDED_BY(mu_);
  std::optional<migration::ModelState> described_state_ ABSL_GUARDED_BY(mu_);
  int64_t generation_ ABSL_GUARDED_BY(mu_) = 0;
  int64_t last_attempted_ ABSL_GUARDED_BY(mu_) = 0;  // burnt generations
  Cluster cluster_ ABSL_GUARDED_BY(mu_);
  Plan plan_ ABSL_GUARDED_BY(mu_);
  nlohmann::json plan_json_ ABSL_GUARDED_BY(mu_);  // with its prediction
  std::string phase_ ABSL_GUARDED_BY(mu_) = "waiting";
  std::string error_ ABSL_GUARDED_BY(mu_);
  int64_t iteration_ ABSL_GUARDED_BY(mu_) = 0;
  double loss_ ABSL_GUARDED_BY(mu_) = 0;
  double tokens_per_s_ ABSL_GUARDED_BY(mu_) = 0;
  v1::SwitchTimings last_switch_ ABSL_GUARDED_BY(mu_);
  std::optional<absl::Time> retry_at_ ABSL_GUARDED_BY(mu_);
  // GPUs of member nodes whose engine process died (the agent reports the
  // rank lost and has started a fresh engine there): their state is gone
  // until a switch that counts them lost commits.
  std::set<migration::GpuId> lost_gpus_ ABSL_GUARDED_BY(mu_);
  SwitchCostModel cost_model_ ABSL_GUARDED_BY(mu_);
  absl::Time last_poll_ ABSL_GUARDED_BY(mu_) = absl::InfinitePast();

  // The calibration loop (online_corrections.h): every generation's record,
  // the current one's meter, the corrections in force and the corrected
  // prediction of each generation with them.
  std::unique_ptr<OnlineCorrections> calibration_;  // set by Create
  std::map<int64_t, GenerationRecord> records_ ABSL_GUARDED_BY(mu_);
  // When each generation was switched away from within the last horizon
  // (this process's switches; the hysteresis of decision.h).
  std::map<int64_t, absl::Time> left_at_ ABSL_GUARDED_BY(mu_);
  std::map<int64_t, std::string> cluster_lines_ ABSL_GUARDED_BY(mu_);
  std::optional<IterationMeter> meter_ ABSL_GUARDED_BY(mu_);  // of generation_
  int64_t meter_generation_ ABSL_GUARDED_BY(mu_) = 0;
  bool have_corrections_ ABSL_GUARDED_BY(mu_) = false;
  RunCorrections corrections_ ABSL_GUARDED_BY(mu_);
  // The compute scales in force when the current plan was last decided on
  // (MaybeFit compares a new fit with them).
  std::map<std::string, double> decided_compute_scale_ ABSL_GUARDED_BY(mu_);
  std::vector<int64_t> corrections_on_ ABSL_GUARDED_BY(mu_);
  std::string corrections_note_ ABSL_GUARDED_BY(mu_);
  absl::Time corrections_fitted_ ABSL_GUARDED_BY(mu_) = absl::InfinitePast();
  std::map<int64_t, RunPrediction> corrected_ ABSL_GUARDED_BY(mu_);
  // Iterations measured over all generations at the last fit, and when.
  int64_t measured_total_ ABSL_GUARDED_BY(mu_) = 0;
  int64_t fitted_total_ ABSL_GUARDED_BY(mu_) = 0;
  bool fit_due_ ABSL_GUARDED_BY(mu_) = false;  // a milestone was reached
  absl::Time last_fit_ ABSL_GUARDED_BY(mu_) = absl::InfinitePast();
  absl::Time last_record_save_ ABSL_GUARDED_BY(mu_) = absl::InfinitePast();

  // The poll round in flight and the generation it was started for
  // (touched by the reconcile thread only).
  std::optional<std::future<std::vector<PolledNode>>> poll_;
  int64_t poll_generation_ = 0;
  // When each node of generation `answered_generation_`'s cluster last
  // answered a poll (or was first polled): silent for a lease, it is a
  // leave even while its heartbeats go on (reconcile thread only).
  std::map<std::string, absl::Time> answered_;
  int64_t answered_generation_ = 0;

  std::atomic<bool> stop_{false};
  std::thread loop_;
};

// The message of a decision record.
v1::Decision DecisionToProto(const DecisionRecord& record);

// Drops the oldest decisions, then the oldest generations, of `status` until
// its serialized size is at most `budget_bytes` (or none is left), counting
// them in decisions_omitted and generations_omitted.
void FitStatusBudget(v1::GetStatusResponse* status, size_t budget_bytes);

}  // namespace arachne::controller

#endif  // ARACHNE_CONTROLLER_CONTROLLER_H_
