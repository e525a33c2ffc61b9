// The JobController's level-triggered reconcile loop (Loop, ReconcileOnce):
// the first plan once enough GPUs registered, a replan and its keep-or-
// switch decision when membership says one is due, and the driving of the
// switch itself (RunSwitch over the reconfigurer), with the decision
// records. Separate because this is the reconcile thread's own work: at
// most one switch in flight, while the RPCs go on being answered.
#include "controller/controller.h"

#include <algorithm>
#include <optional>
#include <set>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "controller/controller_internal.h"
#include "glog/logging.h"
#include "google/protobuf/util/json_util.h"
#include "migration/core/diff.h"
#include "migration/core/schedule.h"
#include "planner_service/io/cluster_io.h"
#include "planner_service/io/input_bounds.h"
#include "planner_service/io/plan_io.h"
#include "planner_service/io/run_corrections_io.h"

namespace arachne::controller {
namespace {

double Throughput(const nlohmann::json& plan) {
  auto it = plan.find("throughput_iters_per_s");
  return it != plan.end() && it->is_number() ? it->get<double>() : 0.0;
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

}  // namespace

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
  // last fit is fitted first, and is what this decision is priced with.
  MaybeFit(true, /*replanning=*/true);
  {
    absl::MutexLock lock(&mu_);
    decided_compute_scale_ = corrections_.compute_scale;
  }
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

}  // namespace arachne::controller
