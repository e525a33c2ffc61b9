// The JobController's side of the calibration loop (online_corrections.h):
// every generation's record of measured iteration times and memory, the fits of
// the corrections and the corrected predictions, and reading all of them back
// from the store at start. Separate because it is the one concern with its own
// state (records_, meter_, corrections_ ...) and store tables; the reconcile
// loop calls into it (StartMeasuring on a commit, MaybeFit, CorrectionsFor and
// PricedThroughput for a decision).
#include "controller/controller.h"

#include <algorithm>
#include <map>
#include <optional>
#include <set>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "controller/controller_internal.h"
#include "glog/logging.h"
#include "planner_service/io/cluster_io.h"
#include "planner_service/io/plan_io.h"

namespace arachne::controller {
namespace {

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

// "a: 2 x A6000, b: 1 x A6000".
std::string ClusterLine(const Cluster& cluster, const GpuCatalog& catalog) {
  std::vector<std::string> parts;
  for (const Node& n : cluster.nodes()) {
    parts.push_back(absl::StrCat(n.name, ": ", n.num_gpus, " x ",
                                 catalog.type(n.gpu_type).id));
  }
  return absl::StrJoin(parts, ", ");
}

// The first GPU type whose compute scale in `now` is more than `factor`
// times (either way) that in `decided` (1 where absent), as
// "compute_scale[A6000] 1 -> 1993"; "" when none is, or factor is 0.
std::string MovedComputeScale(const std::map<std::string, double>& decided,
                              const std::map<std::string, double>& now,
                              double factor) {
  if (factor <= 0) return "";
  std::set<std::string> types;
  for (const auto& [t, s] : decided) types.insert(t);
  for (const auto& [t, s] : now) types.insert(t);
  auto scale = [](const std::map<std::string, double>& m,
                  const std::string& t) {
    auto it = m.find(t);
    return it == m.end() ? 1.0 : it->second;
  };
  for (const std::string& t : types) {
    const double from = scale(decided, t), to = scale(now, t);
    if (to > from * factor || from > to * factor) {
      return absl::StrFormat("compute_scale[%s] %.4g -> %.4g", t, from, to);
    }
  }
  return "";
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
  // The plan running was decided on these (or on none).
  decided_compute_scale_ = corrections_.compute_scale;
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

void JobController::MaybeFit(bool force, bool replanning) {
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
  std::string moved;  // a compute scale beyond the replan factor, if any
  {
    absl::MutexLock lock(&mu_);
    if (fit.status.ok()) {
      have_corrections_ = true;
      corrections_ = fit.corrections;
      if (!replanning) {
        moved = MovedComputeScale(decided_compute_scale_,
                                  corrections_.compute_scale,
                                  config_.job.replan_correction_factor);
      }
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
  if (!moved.empty()) {
    membership_.RequestReplan(absl::StrCat("corrections moved ", moved));
  }
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
  // Those of the first plan (the new one) that the second (the current
  // one, when it still fits) does not run count against the switch.
  *unmeasured = UnmeasuredTypesAgainstSwitch(
      filled, GpuTypesOf(*plans.front()),
      plans.size() > 1 ? GpuTypesOf(*plans[1]) : std::set<std::string>());
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
