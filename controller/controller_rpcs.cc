// The JobController's RPC handlers (Register, Heartbeat, AnnounceJoin,
// DrainNode, RequestReplan, GetStatus) with the checks of what they accept
// (docs/errors.md, "Input bounds") and of the agent a Register names
// (AgentAnswers, the same one-off check, serves the reconfigurer too).
// Separate because these run on the gRPC threads, beside the reconcile
// thread, and never plan or switch: they validate, record membership and
// read state.
#include "controller/controller.h"

#include <cmath>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "controller/controller_internal.h"
#include "google/protobuf/util/json_util.h"
#include "planner_service/io/cluster_io.h"
#include "planner_service/io/input_bounds.h"
#include "planner_service/io/json_yaml.h"

namespace arachne::controller {

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

}  // namespace arachne::controller
