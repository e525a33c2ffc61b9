#include "planner_service/cli/controller_status_text.h"

#include <algorithm>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "google/protobuf/util/json_util.h"

namespace arachne {
namespace {

std::string Clock(double unix_s, absl::TimeZone zone) {
  if (unix_s <= 0) return "-";
  return absl::FormatTime("%H:%M:%E3S", absl::FromUnixMicros(static_cast<int64_t>(unix_s * 1e6)), zone);
}

std::string Json(const google::protobuf::Message& m, bool all_fields) {
  google::protobuf::util::JsonPrintOptions o;
  o.preserve_proto_field_names = true;
  o.always_print_primitive_fields = all_fields;
  std::string out;
  // Serialising a well-formed message cannot fail.
  (void)google::protobuf::util::MessageToJsonString(m, &out, o);
  return out;
}

std::string Bytes(int64_t n) {
  if (n >= (int64_t{1} << 30)) return absl::StrFormat("%.2f GiB", n / double(1 << 30));
  if (n >= (int64_t{1} << 20)) return absl::StrFormat("%.2f MiB", n / double(1 << 20));
  if (n >= 1024) return absl::StrFormat("%.1f KiB", n / 1024.0);
  return absl::StrCat(n, " B");
}

// "0-4" for the half-open range [0, 4), as the plan table prints it.
std::string Layers(const v1::Stage& s) {
  if (s.layers_size() != 2) return "?";
  return absl::StrCat(s.layers(0), "-", s.layers(1));
}

// The nodes (and local GPUs) of stage `stage` over all replicas.
std::string StageNodes(const v1::Template& t, int stage) {
  std::vector<std::string> out;
  for (const v1::ReplicaPlacement& r : t.placement()) {
    if (stage >= r.stages_size()) continue;
    const v1::StagePlacement& p = r.stages(stage);
    out.push_back(absl::StrCat(p.node(), "[", absl::StrJoin(p.gpus(), ","), "]"));
  }
  return out.empty() ? "-" : absl::StrJoin(out, " ");
}

void RenderPlan(const v1::PlanDocument& plan, std::string* out) {
  int gpus = 0;
  for (const v1::Template& t : plan.templates()) {
    for (const v1::Stage& s : t.stages()) gpus += t.replicas() * s.tp();
  }
  absl::StrAppendFormat(
      out,
      "plan: %d templates on %d GPUs (%d unused): %.3f it/s, %.0f tokens/s, "
      "iteration %.4f s predicted\n",
      plan.templates_size(), gpus, plan.unused_gpus(),
      plan.throughput_iters_per_s(), plan.tokens_per_s(),
      plan.iteration_time_s());
  for (int i = 0; i < plan.templates_size(); ++i) {
    const v1::Template& t = plan.templates(i);
    absl::StrAppendFormat(
        out, "  template %d: %d replica%s x %d stage%s, micro-batch %d, %d "
             "micro-batches per replica\n",
        i + 1, t.replicas(), t.replicas() == 1 ? "" : "s", t.stages_size(),
        t.stages_size() == 1 ? "" : "s", t.micro_batch_size(),
        t.micro_batches());
    absl::StrAppendFormat(out, "    %-5s %-13s %3s  %-7s %9s  %s\n", "stage",
                          "gpu", "tp", "layers", "mem/GPU",
                          "nodes[gpus] (replica 1..n)");
    for (int s = 0; s < t.stages_size(); ++s) {
      const v1::Stage& st = t.stages(s);
      absl::StrAppendFormat(out, "    %-5d %-13s %3d  %-7s %5.1f GiB  %s\n", s,
                            st.gpu_type(), st.tp(), Layers(st),
                            st.memory_gib(), StageNodes(t, s));
    }
  }
}

void RenderSwitch(const v1::SwitchTimings& t, std::string* out) {
  absl::StrAppendFormat(
      out,
      "last switch: generation %d %s, paused after iteration %d\n"
      "  downtime %.3f s (pause %.3f, stage1 %.3f, stage2 %.3f, rebuild %.3f, "
      "commit %.3f, resume %.3f); prepare %.3f s before it, total %.3f s\n"
      "  moved %s (stage1 %s, stage2 %s; estimate %.3f s); slowest agent: "
      "pause %.3f, stage1 %.3f, stage2 %.3f, rebuild %.3f, resume %.3f s\n",
      t.generation(), t.outcome(), t.paused_at_iteration(), t.downtime_s(),
      t.pause_s(), t.stage1_s(), t.stage2_s(), t.rebuild_s(), t.commit_s(),
      t.resume_s(), t.prepare_s(), t.total_s(), Bytes(t.bytes_moved()),
      Bytes(t.bytes_stage1()), Bytes(t.bytes_stage2()), t.migration_estimate_s(), t.agent_pause_s(), t.agent_stage1_s(),
      t.agent_stage2_s(), t.agent_rebuild_s(), t.agent_resume_s());
}

// The corrections in force in one parenthesis: "(compute_scale A6000
// 412.300, fitted on 2 generations)"; "(raw: no corrections in force)".
std::string CorrectionsNote(const v1::RunCorrectionsInForce& c) {
  if (c.summary().empty()) return "(raw: no corrections in force)";
  return absl::StrFormat("(%s, fitted on %d generation%s)", c.summary(),
                         c.generations(), c.generations() == 1 ? "" : "s");
}

// "0.840 s" or "-" when not known.
std::string Seconds(double s) {
  return s > 0 ? absl::StrFormat("%.4g s", s) : std::string("-");
}
std::string Gib(double g) {
  return g > 0 ? absl::StrFormat("%.3g GiB", g) : std::string("-");
}

// The current generation's measured iteration time and peak memory beside
// the raw and corrected predictions, the corrections in force and every
// recorded generation.
void RenderMeasurements(const v1::GetStatusResponse& s, std::string* out) {
  const v1::GenerationMeasurement& m = s.measurement();
  if (m.generation() > 0) {
    absl::StrAppendFormat(
        out,
        "iteration: measured %s (median of %d after %d warm-up), predicted "
        "%s raw / %s corrected %s\n",
        m.iterations_measured() > 0 ? Seconds(m.measured_iteration_s())
                                    : std::string("- (none yet)"),
        m.iterations_measured(), m.warmup_iterations(),
        Seconds(m.predicted_iteration_s()), Seconds(m.corrected_iteration_s()),
        CorrectionsNote(s.corrections()));
    absl::StrAppendFormat(
        out,
        "memory per GPU: measured %s (agent peak RSS / its GPUs of the plan), "
        "predicted %s raw / %s corrected\n",
        Gib(m.measured_peak_gib()), Gib(m.predicted_peak_gib()),
        Gib(m.corrected_peak_gib()));
  }
  if (!s.corrections().note().empty()) {
    absl::StrAppend(out, "corrections: ", s.corrections().note(), "\n");
  }
  if (s.generations_size() > 0) {
    absl::StrAppendFormat(out, "  %-4s %-10s %10s %10s %10s  %10s %10s %10s  %s\n",
                          "gen", "iterations", "measured", "raw",
                          "corrected", "mem meas", "mem raw", "mem corr",
                          "cluster");
    for (const v1::GenerationMeasurement& g : s.generations()) {
      absl::StrAppendFormat(
          out, "  %-4d %-10d %10s %10s %10s  %10s %10s %10s  %s\n",
          g.generation(), g.iterations_measured(),
          Seconds(g.measured_iteration_s()), Seconds(g.predicted_iteration_s()),
          Seconds(g.corrected_iteration_s()), Gib(g.measured_peak_gib()),
          Gib(g.predicted_peak_gib()), Gib(g.corrected_peak_gib()),
          g.cluster());
    }
  }
  if (s.generations_omitted() > 0) {
    absl::StrAppendFormat(out,
                          "  (%d older generation%s left out of this status "
                          "to keep it within its size budget)\n",
                          s.generations_omitted(),
                          s.generations_omitted() == 1 ? "" : "s");
  }
}

}  // namespace

std::string DecisionNumbers(const v1::Decision& d) {
  // Corrected throughputs decided: the raw ones are named beside them.
  const std::string basis =
      d.corrections().empty()
          ? std::string(" (raw)")
          : absl::StrFormat(" corrected (raw %.3f -> %.3f it/s; %s)",
                            d.old_throughput_raw(), d.new_throughput_raw(),
                            d.corrections());
  return absl::StrFormat(
      "old %.3f -> new %.3f it/s%s, gain %.3f s over %.0f s vs downtime %.3f s "
      "(migration %.3f + fixed %.3f); decided in %.3f s (planner %.3f s)",
      d.old_throughput(), d.new_throughput(), basis, d.gain_s(), d.horizon_s(),
      d.downtime_estimate_s(), d.migration_estimate_s(), d.fixed_cost_s(),
      d.decision_s(), d.planning_s());
}

std::string RenderControllerStatus(const v1::GetStatusResponse& s,
                                   const std::string& address,
                                   absl::TimeZone zone) {
  std::string out;
  absl::StrAppendFormat(&out, "controller %s: generation %d, %s", address,
                        s.generation(), s.phase().empty() ? "-" : s.phase());
  if (s.generation() > 0) {
    absl::StrAppendFormat(&out, ", iteration %d, loss %.6f, %.0f tokens/s",
                          s.iteration(), s.loss(), s.tokens_per_s());
  }
  out += "\n";
  if (!s.error().empty()) absl::StrAppend(&out, "error: ", s.error(), "\n");

  int gpus = 0;
  for (const v1::Member& m : s.members()) gpus += m.gpus();
  absl::StrAppendFormat(&out, "\nmembers: %d nodes, %d GPUs\n",
                        s.members_size(), gpus);
  if (s.members_size() > 0) {
    absl::StrAppendFormat(&out, "  %-16s %-13s %4s %8s  %-22s %8s  %s\n",
                          "node", "gpu", "gpus", "mem GiB", "address", "lease",
                          "state");
    for (const v1::Member& m : s.members()) {
      absl::StrAppendFormat(&out, "  %-16s %-13s %4d %8.0f  %-22s %6.1f s  %s\n",
                            m.node(), m.gpu_type(), m.gpus(), m.memory_gib(),
                            m.address(), std::max(0.0, m.lease_left_s()),
                            m.draining() ? "draining" : "member");
    }
  }

  out += "\n";
  if (s.plan().templates_size() == 0) {
    out += "plan: none yet\n";
  } else {
    RenderPlan(s.plan(), &out);
    RenderMeasurements(s, &out);
  }
  if (s.last_switch().generation() > 0) {
    out += "\n";
    RenderSwitch(s.last_switch(), &out);
  }

  absl::StrAppendFormat(&out, "\ndecisions: %d (most recent first)\n",
                        s.decisions_size());
  if (s.decisions_omitted() > 0) {
    // The controller kept GetStatus within its size budget.
    absl::StrAppendFormat(&out,
                          "  (%d older decision%s left out of this status to "
                          "keep it within its size budget)\n",
                          s.decisions_omitted(),
                          s.decisions_omitted() == 1 ? "" : "s");
  }
  for (const v1::Decision& d : s.decisions()) {
    absl::StrAppendFormat(&out, "  #%d %s %s (%s)%s\n    %s\n    %s\n", d.id(),
                          Clock(d.time_unix_s(), zone), d.verdict(),
                          d.trigger(),
                          d.generation() > 0
                              ? absl::StrCat(" -> generation ", d.generation())
                              : "",
                          DecisionNumbers(d), d.reason());
  }
  return out;
}

std::string ControllerStatusJson(const v1::GetStatusResponse& status) {
  return Json(status, /*all_fields=*/true);
}

std::string RenderEvent(const v1::Event& e, absl::TimeZone zone) {
  std::string line = absl::StrFormat("%s #%-5d %-10s g%-3d %s",
                                     Clock(e.time_unix_s(), zone), e.sequence(),
                                     e.kind(), e.generation(), e.message());
  if (e.kind() == "decision" && e.has_decision()) {
    absl::StrAppend(&line, " [", DecisionNumbers(e.decision()), "]");
  }
  return line;
}

std::string EventJson(const v1::Event& event) {
  return Json(event, /*all_fields=*/false);
}

}  // namespace arachne
