#include "bench/harness/bench_runner.h"

#include <algorithm>
#include <atomic>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <set>
#include <system_error>
#include <thread>
#include <utility>

#include "absl/status/status.h"
#include "absl/strings/ascii.h"
#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_replace.h"
#include "absl/strings/str_split.h"
#include "absl/time/clock.h"
#include "absl/time/time.h"
#include "nlohmann/json.hpp"
#include "planner_service/core/learned/learned_planner.h"
#include "planner_service/core/cost/plan_validation.h"
#include "planner_service/core/planners.h"
#include "planner_service/core/planners/random_planner.h"
#include "planner_service/io/gpu_catalog_io.h"
#include "planner_service/io/planning_context.h"
#include "planner_service/io/python_plots.h"
#include "planner_service/policy/torch_policy.h"

namespace arachne {
namespace {

// Runs fn(0..n-1) on `jobs` threads, each taking the next index when free, so
// long and short runs interleave without a static split.
void ParallelFor(int n, int jobs, const std::function<void(int)>& fn) {
  std::atomic<int> next{0};
  auto worker = [&] {
    for (int i = next++; i < n; i = next++) fn(i);
  };
  const int threads = std::max(1, std::min(jobs, n));
  std::vector<std::thread> pool;
  for (int t = 1; t < threads; ++t) pool.emplace_back(worker);
  worker();
  for (std::thread& t : pool) t.join();
}

absl::Status CheckOptions(const BenchOptions& o) {
  if (!(o.budget_s > 0)) {
    return absl::InvalidArgumentError(
        absl::StrCat("--budget: must be > 0 seconds, got ", o.budget_s));
  }
  if (o.max_evaluations < 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("--max-evaluations: must be >= 0 (0: no limit), got ",
                     o.max_evaluations));
  }
  if (o.jobs < 0) {
    return absl::InvalidArgumentError(absl::StrCat(
        "--jobs: must be >= 0 (0: one per hardware thread), got ", o.jobs));
  }
  if (o.max_depth < 1) {
    return absl::InvalidArgumentError(
        absl::StrCat("--max-depth: must be >= 1, got ", o.max_depth));
  }
  if (o.max_templates < 1) {
    return absl::InvalidArgumentError(
        absl::StrCat("--max-templates: must be >= 1, got ", o.max_templates));
  }
  return absl::OkStatus();
}

// The planners to run, canonical (lower-case) names in the order given, or
// every registered planner. "learned" without a registered policy factory
// (a build without LibTorch) is left out with a note in `skipped` rather
// than refused: the same command line then works in every build.
absl::StatusOr<std::vector<std::string>> ResolvePlanners(
    const std::vector<std::string>& requested,
    std::vector<BenchSkip>* skipped) {
  if (requested.empty()) return PlannerNames();
  const std::vector<std::string> known = KnownPlannerNames();
  std::vector<std::string> planners;
  std::set<std::string> seen;
  for (const std::string& name : requested) {
    const std::string lower = absl::AsciiStrToLower(name);
    if (!seen.insert(lower).second) {
      return absl::InvalidArgumentError(
          absl::StrCat("--planners: \"", name, "\" is listed twice"));
    }
    if (lower == kLearnedPlannerName && !HasLearnedPolicyFactory()) {
      skipped->push_back({-1, lower,
                          "no learned policy in this build (it needs LibTorch: "
                          "-DARACHNE_WITH_TORCH=ON)"});
      continue;
    }
    if (std::find(known.begin(), known.end(), lower) == known.end()) {
      return absl::InvalidArgumentError(
          absl::StrCat("--planners: unknown planner \"", name,
                       "\"; known: ", absl::StrJoin(known, ", ")));
    }
    planners.push_back(lower);
  }
  if (planners.empty()) {
    return absl::InvalidArgumentError(absl::StrCat(
        "--planners: no planner left to run (", skipped->back().planner, ": ",
        skipped->back().reason, ")"));
  }
  return planners;
}

// Where the learned planner's checkpoints are when the options do not say:
// where the registered policy factory looks by default.
std::string DefaultBenchPoliciesDir() { return DefaultPoliciesDir(); }

// Whether a learned-planner error says there is no policy for the model
// (NoPolicyMessage), as opposed to a policy that found no plan.
bool IsNoPolicyError(const absl::Status& status, const std::string& model) {
  if (status.code() != absl::StatusCode::kFailedPrecondition) return false;
  const std::string full = NoPolicyMessage(model, "");
  const std::string prefix = full.substr(0, full.find("\": ") + 3);
  return absl::StartsWith(status.message(), prefix);
}

// Episodes and seconds of a training curve CSV (`arachne train`): its last
// row's `episodes` and `elapsed_s`.
absl::StatusOr<std::pair<int64_t, double>> CurveTotals(
    const std::filesystem::path& path) {
  std::ifstream f(path);
  std::string header, line, last;
  if (!std::getline(f, header)) {
    return absl::InvalidArgumentError(
        absl::StrCat(path.string(), ": empty training curve"));
  }
  while (std::getline(f, line)) {
    if (!line.empty()) last = line;
  }
  const std::vector<std::string> names = absl::StrSplit(header, ',');
  const std::vector<std::string> values = absl::StrSplit(last, ',');
  int64_t episodes = -1;
  double elapsed = -1;
  for (size_t i = 0; i < names.size() && i < values.size(); ++i) {
    if (names[i] == "episodes" && !absl::SimpleAtoi(values[i], &episodes))
      episodes = -1;
    if (names[i] == "elapsed_s" && !absl::SimpleAtod(values[i], &elapsed))
      elapsed = -1;
  }
  if (episodes < 0 || elapsed < 0) {
    return absl::InvalidArgumentError(absl::StrCat(
        path.string(), ": no episodes and elapsed_s in its last row"));
  }
  return std::make_pair(episodes, elapsed);
}

int DeepestTemplate(const Plan& plan) {
  int depth = 0;
  for (const Template& t : plan.templates) depth = std::max(depth, t.depth());
  return depth;
}

std::string CsvField(const std::string& s) {
  if (s.find_first_of(",\"\n\r") == std::string::npos) return s;
  return absl::StrCat("\"", absl::StrReplaceAll(s, {{"\"", "\"\""}}), "\"");
}

std::string Num(double v) { return absl::StrFormat("%.6g", v); }

// Markdown table cells must not contain a bare '|'.
std::string MdCell(const std::string& s) {
  return absl::StrReplaceAll(s, {{"|", "\\|"}, {"\n", " "}});
}

std::string Seconds(double s) {
  if (s < 1) return absl::StrFormat("%.2f s", s);
  if (s < 100) return absl::StrFormat("%.1f s", s);
  return absl::StrFormat("%.0f s", s);
}

// The figure a panel belongs to: "7a" -> "7", "10b" -> "10"; names without
// a leading number stay as they are.
std::string FigureOf(const std::string& panel) {
  size_t i = 0;
  while (i < panel.size() && absl::ascii_isdigit(panel[i])) ++i;
  return i == 0 ? panel : panel.substr(0, i);
}

// "7a" -> "Figure 7(a)", "11" -> "Figure 11"; a name such as "testbed"
// stays as it is.
std::string PanelTitle(const std::string& panel) {
  const std::string figure = FigureOf(panel);
  if (figure == panel) {
    return absl::ascii_isdigit(panel[0]) ? "Figure " + panel : panel;
  }
  return absl::StrCat("Figure ", figure, "(", panel.substr(figure.size()), ")");
}

// Figures in numeric order, then named ones alphabetically.
bool FigureLess(const std::string& a, const std::string& b) {
  const bool na = !a.empty() && absl::ascii_isdigit(a[0]);
  const bool nb = !b.empty() && absl::ascii_isdigit(b[0]);
  if (na != nb) return na;
  if (na) return std::stoi(a) < std::stoi(b);
  return a < b;
}

// Time since the bench started, for progress lines: "7m05s".
std::string Elapsed(absl::Time start) {
  const int64_t s = absl::ToInt64Seconds(absl::Now() - start);
  return absl::StrFormat("%dm%02ds", s / 60, s % 60);
}

// Best-so-far throughput after `evaluations` plan evaluations, from the
// improvements a run recorded (0 before its first feasible plan).
double BestAfter(const std::vector<ProgressPoint>& progress,
                 int64_t evaluations) {
  double best = 0;
  for (const ProgressPoint& p : progress) {
    if (p.evaluations > evaluations) break;
    best = std::max(best, p.throughput_iters_per_s);
  }
  return best;
}

// The runs of one composition, in planner order.
std::vector<const BenchRun*> RunsOf(const BenchResults& r, int scenario,
                                    int composition) {
  std::vector<const BenchRun*> runs;
  for (const BenchRun& run : r.runs) {
    if (run.scenario == scenario && run.composition == composition) {
      runs.push_back(&run);
    }
  }
  return runs;
}

void AppendCompareTable(const BenchResults& r, int si, std::string* md) {
  const Scenario& s = r.scenarios[si];
  const std::vector<std::string>& planners = r.options.planners;
  absl::StrAppend(md, "| composition | GPUs |");
  for (const std::string& p : planners) absl::StrAppend(md, " ", p, " |");
  absl::StrAppend(md, " best | best iter/s |\n|---|---:|");
  for (size_t i = 0; i < planners.size(); ++i) absl::StrAppend(md, "---:|");
  absl::StrAppend(md, "---|---:|\n");
  for (int ci = 0; ci < static_cast<int>(s.compositions.size()); ++ci) {
    const std::vector<const BenchRun*> runs = RunsOf(r, si, ci);
    const BenchRun* best = nullptr;
    for (const BenchRun* run : runs) {
      if (run->status == RunStatus::kOk &&
          (best == nullptr || run->prediction.throughput_iters_per_s >
                                  best->prediction.throughput_iters_per_s)) {
        best = run;
      }
    }
    absl::StrAppend(md, "| ", MdCell(s.compositions[ci].label), " | ",
                    s.compositions[ci].gpus, " |");
    for (const std::string& planner : planners) {
      const auto it = std::find_if(
          runs.begin(), runs.end(),
          [&](const BenchRun* run) { return run->planner == planner; });
      if (it == runs.end()) {  // skipped here (see the note under the table)
        absl::StrAppend(md, " - |");
        continue;
      }
      const BenchRun* run = *it;
      const std::string time = Seconds(run->planning_time_s);
      if (run->status == RunStatus::kOk) {
        const double rel = run->prediction.throughput_iters_per_s /
                           best->prediction.throughput_iters_per_s;
        const std::string cell = absl::StrFormat("%.3f", rel);
        absl::StrAppend(md, " ", run == best ? "**" + cell + "**" : cell, " (",
                        time, ") |");
      } else {
        absl::StrAppend(md, " ", RunStatusName(run->status), " (", time, ") |");
      }
    }
    if (best == nullptr) {
      absl::StrAppend(md, " none | - |\n");
    } else {
      absl::StrAppend(
          md, " ", best->planner, " | ",
          absl::StrFormat("%.4f", best->prediction.throughput_iters_per_s),
          " |\n");
    }
  }
}

// The planner other runs are measured against in summaries: the exact
// planner when it ran.
constexpr char kReferencePlanner[] = "exact";

// One paragraph per figure: how often each planner wins, the exact
// planner's lead over the best other planner (min / median / max over the
// compositions where both found a plan), and every composition where
// another planner beats it (which the issue asks to explain).
void AppendFigureSummary(const BenchResults& r, const std::vector<int>& panels,
                         std::string* md) {
  const std::vector<std::string>& planners = r.options.planners;
  const bool has_reference = std::find(planners.begin(), planners.end(),
                                       kReferencePlanner) != planners.end();
  std::map<std::string, int> wins;
  std::vector<double> leads;
  std::vector<std::string> beaten, only_reference, reference_failed;
  int compositions = 0;
  for (int si : panels) {
    const Scenario& s = r.scenarios[si];
    for (int ci = 0; ci < static_cast<int>(s.compositions.size()); ++ci) {
      ++compositions;
      const std::string where =
          absl::StrCat(s.name, " ", s.compositions[ci].label);
      const BenchRun* best = nullptr;
      const BenchRun* reference = nullptr;
      const BenchRun* best_other = nullptr;
      for (const BenchRun* run : RunsOf(r, si, ci)) {
        if (run->status != RunStatus::kOk) continue;
        const double t = run->prediction.throughput_iters_per_s;
        if (best == nullptr || t > best->prediction.throughput_iters_per_s) {
          best = run;
        }
        if (run->planner == kReferencePlanner) {
          reference = run;
        } else if (best_other == nullptr ||
                   t > best_other->prediction.throughput_iters_per_s) {
          best_other = run;
        }
      }
      if (best != nullptr) ++wins[best->planner];
      if (!has_reference) continue;
      if (reference == nullptr) {
        if (best_other != nullptr) reference_failed.push_back(where);
        continue;
      }
      if (best_other == nullptr) {
        only_reference.push_back(where);
        continue;
      }
      const double lead = reference->prediction.throughput_iters_per_s /
                              best_other->prediction.throughput_iters_per_s -
                          1;
      leads.push_back(lead);
      if (lead < 0) {
        // How much faster the baseline's plan is, not the (negative) lead.
        beaten.push_back(absl::StrFormat(
            "%s: %s %+.1f%%", where, best_other->planner,
            100 * (best_other->prediction.throughput_iters_per_s /
                       reference->prediction.throughput_iters_per_s -
                   1)));
      }
    }
  }
  std::vector<std::string> win_parts;
  for (const std::string& p : planners) {
    if (wins.count(p)) win_parts.push_back(absl::StrCat(p, " ", wins[p]));
  }
  absl::StrAppendFormat(
      md, "\n**Summary** (%d compositions). Best plan: %s.", compositions,
      win_parts.empty() ? "none" : absl::StrJoin(win_parts, ", "));
  if (!has_reference) {
    absl::StrAppend(md, "\n");
    return;
  }
  if (!leads.empty()) {
    std::sort(leads.begin(), leads.end());
    const size_t n = leads.size();
    const double median =
        n % 2 == 1 ? leads[n / 2] : (leads[n / 2 - 1] + leads[n / 2]) / 2;
    absl::StrAppendFormat(
        md,
        " The %s planner's lead over the best other planner: min %+.1f%%, "
        "median %+.1f%%, max %+.1f%%.",
        kReferencePlanner, 100 * leads.front(), 100 * median,
        100 * leads.back());
  }
  absl::StrAppendFormat(md, " Ahead of %s: %s.", kReferencePlanner,
                        beaten.empty() ? "none" : absl::StrJoin(beaten, "; "));
  if (!only_reference.empty()) {
    absl::StrAppendFormat(md, " Only %s found a plan: %s.", kReferencePlanner,
                          absl::StrJoin(only_reference, "; "));
  }
  if (!reference_failed.empty()) {
    absl::StrAppendFormat(md, " %s found no plan where another did: %s.",
                          kReferencePlanner,
                          absl::StrJoin(reference_failed, "; "));
  }
  absl::StrAppend(md, "\n");
}

void AppendCurveTable(const BenchResults& r, int si, std::string* md) {
  const Scenario& s = r.scenarios[si];
  for (int ci = 0; ci < static_cast<int>(s.compositions.size()); ++ci) {
    const std::vector<const BenchRun*> runs = RunsOf(r, si, ci);
    int64_t most = 1;
    for (const BenchRun* run : runs)
      most = std::max(most, run->stats.evaluations);
    std::vector<int64_t> checkpoints;
    for (int64_t n = 1; n <= most; n *= 10) checkpoints.push_back(n);
    absl::StrAppendFormat(
        md,
        "\nBest-so-far throughput (iter/s) after N plan evaluations, %s:\n\n"
        "| planner |",
        MdCell(s.compositions[ci].label));
    for (int64_t n : checkpoints) absl::StrAppend(md, " ", n, " |");
    absl::StrAppend(md, " evaluations |\n|---|");
    for (size_t i = 0; i <= checkpoints.size(); ++i)
      absl::StrAppend(md, "---:|");
    absl::StrAppend(md, "\n");
    for (const BenchRun* run : runs) {
      absl::StrAppend(md, "| ", run->planner, " |");
      for (int64_t n : checkpoints) {
        const double best =
            run->status == RunStatus::kOk && n <= run->stats.evaluations
                ? BestAfter(run->stats.progress, n)
                : 0;
        absl::StrAppend(md, " ", best > 0 ? absl::StrFormat("%.4f", best) : "-",
                        " |");
      }
      absl::StrAppend(md, " ", run->stats.evaluations, " |\n");
    }
    // The learned planner's evaluations above are only those at planning
    // time; its policy scored plans in offline training before that.
    for (const BenchRun* run : runs) {
      if (run->planner != kLearnedPlannerName ||
          run->status != RunStatus::kOk) {
        continue;
      }
      const BenchPolicy* policy = nullptr;
      for (const BenchPolicy& p : r.policies) {
        if (p.model == s.model) policy = &p;
      }
      if (policy == nullptr) {
        absl::StrAppend(md,
                        "\nlearned: planning time only; the training behind "
                        "its policy is not known (no checkpoint metadata "
                        "found).\n");
      } else {
        absl::StrAppendFormat(
            md,
            "\nlearned: planning time only. Its policy (%s) was trained "
            "offline before: %d rollouts (one candidate plan built and scored "
            "each) in %s over %d run%s, on generated compositions (none of "
            "this suite).\n",
            policy->checkpoint, policy->training_rollouts,
            Seconds(policy->training_wall_s), policy->training_runs,
            policy->training_runs == 1 ? "" : "s");
      }
    }
  }
}

void AppendScatterTable(const BenchResults& r, int si, std::string* md) {
  const Scenario& s = r.scenarios[si];
  for (int ci = 0; ci < static_cast<int>(s.compositions.size()); ++ci) {
    std::vector<double> sampled;
    for (const BenchSample& x : r.samples) {
      if (x.scenario == si && x.composition == ci) {
        sampled.push_back(x.throughput_iters_per_s);
      }
    }
    const std::vector<const BenchRun*> runs = RunsOf(r, si, ci);
    double best =
        sampled.empty() ? 0 : *std::max_element(sampled.begin(), sampled.end());
    for (const BenchRun* run : runs) {
      if (run->status == RunStatus::kOk) {
        best = std::max(best, run->prediction.throughput_iters_per_s);
      }
    }
    absl::StrAppendFormat(
        md,
        "\n%s: %d of %d random plan structures feasible. Throughput relative "
        "to the best plan found (samples and planners):\n\n"
        "| planner | relative throughput | pipeline depth | samples it beats "
        "|\n|---|---:|---:|---:|\n",
        MdCell(s.compositions[ci].label), sampled.size(), s.samples);
    for (const BenchRun* run : runs) {
      if (run->status != RunStatus::kOk) {
        absl::StrAppend(md, "| ", run->planner, " | ",
                        RunStatusName(run->status), " | - | - |\n");
        continue;
      }
      const double t = run->prediction.throughput_iters_per_s;
      const int64_t beaten = std::count_if(sampled.begin(), sampled.end(),
                                           [t](double x) { return x < t; });
      absl::StrAppendFormat(
          md, "| %s | %.3f | %d | %s |\n", run->planner,
          best > 0 ? t / best : 0, run->max_depth,
          sampled.empty()
              ? std::string("-")
              : absl::StrFormat("%.1f%%", 100.0 * beaten / sampled.size()));
    }
  }
}

absl::Status WriteFile(const std::string& path, const std::string& text) {
  std::ofstream f(path, std::ios::binary);
  f << text;
  f.close();
  if (!f) {
    return absl::PermissionDeniedError(
        absl::StrCat("--out: cannot write ", path));
  }
  return absl::OkStatus();
}


constexpr char kResultsCsvHeader[] =
    "scenario,figure,kind,model,composition,gpus,planner,status,"
    "throughput_iters_per_s,tokens_per_s,iteration_time_s,planning_time_s,"
    "evaluations,exhaustive,gpus_used,max_depth,templates,plan,message\n";

// One line of results.csv (with its newline).
std::string ResultsCsvRow(const std::vector<Scenario>& scenarios,
                          const BenchRun& run) {
  const Scenario& s = scenarios[run.scenario];
  const Composition& c = s.compositions[run.composition];
  const bool ok = run.status == RunStatus::kOk;
  const std::vector<std::string> fields = {
      CsvField(s.name),
      CsvField(s.figure),
      std::string(ScenarioKindName(s.kind)),
      CsvField(s.model),
      CsvField(c.label),
      absl::StrCat(c.gpus),
      run.planner,
      RunStatusName(run.status),
      ok ? Num(run.prediction.throughput_iters_per_s) : "",
      ok ? Num(run.prediction.tokens_per_s) : "",
      ok ? Num(run.prediction.iteration_time_s) : "",
      Num(run.planning_time_s),
      absl::StrCat(run.stats.evaluations),
      run.stats.exhaustive ? "true" : "false",
      ok ? absl::StrCat(run.gpus_used) : "",
      ok ? absl::StrCat(run.max_depth) : "",
      ok ? absl::StrCat(run.templates) : "",
      CsvField(run.plan_summary),
      CsvField(run.message)};
  return absl::StrCat(absl::StrJoin(fields, ","), "\n");
}

}  // namespace

const char* RunStatusName(RunStatus status) {
  switch (status) {
    case RunStatus::kOk:
      return "ok";
    case RunStatus::kNoPlan:
      return "no_plan";
    case RunStatus::kError:
      return "error";
  }
  return "error";
}

std::string PlanSummary(const Plan& plan, const GpuCatalog& catalog) {
  std::vector<std::string> templates;
  for (size_t i = 0; i < plan.templates.size(); ++i) {
    const Template& t = plan.templates[i];
    std::vector<std::string> stages;
    for (const Stage& s : t.stages) {
      std::string stage =
          absl::StrCat(catalog.type(s.gpu_type).id, " tp", s.tp);
      if (!(s.tiling == ExpertTiling{})) {
        absl::StrAppend(&stage, " ep", s.tiling.ep, "/etp", s.tiling.etp,
                        "/edp", s.tiling.edp);
      }
      absl::StrAppend(&stage, " L", s.layer_begin, "-", s.layer_end);
      stages.push_back(std::move(stage));
    }
    templates.push_back(absl::StrCat("T", i + 1, ": ", t.replicas, "x mbs",
                                     t.micro_batch_size, " [",
                                     absl::StrJoin(stages, " > "), "]"));
  }
  return absl::StrJoin(templates, "; ");
}

absl::StatusOr<BenchResults> RunBench(const BenchOptions& options,
                                      std::ostream& log) {
  if (absl::Status s = CheckOptions(options); !s.ok()) return s;
  BenchResults results;
  results.options = options;
  absl::StatusOr<std::vector<std::string>> planners =
      ResolvePlanners(options.planners, &results.skipped);
  if (!planners.ok()) return planners.status();
  results.options.planners = *planners;
  if (results.options.policies_dir.empty()) {
    results.options.policies_dir = DefaultBenchPoliciesDir();
  }
  if (results.options.jobs == 0) {
    results.options.jobs =
        std::max(1, static_cast<int>(std::thread::hardware_concurrency()));
  }
  const int jobs = results.options.jobs;

  absl::StatusOr<GpuCatalog> catalog = LoadGpuCatalog(options.profiles_dir);
  if (!catalog.ok()) return catalog.status();
  absl::StatusOr<std::vector<Scenario>> scenarios =
      LoadScenarioSuite(options.suite_dir, options.scenario_patterns, *catalog,
                        options.profiles_dir);
  if (!scenarios.ok()) return scenarios.status();
  results.scenarios = *std::move(scenarios);

  // One context per composition, built in parallel (profile synthesis is the
  // slow part).
  struct CompositionRef {
    int scenario;
    int composition;
  };
  std::vector<CompositionRef> compositions;
  for (int s = 0; s < static_cast<int>(results.scenarios.size()); ++s) {
    for (int c = 0;
         c < static_cast<int>(results.scenarios[s].compositions.size()); ++c) {
      compositions.push_back({s, c});
    }
  }
  std::vector<std::unique_ptr<PlanningContext>> contexts(compositions.size());
  std::vector<absl::Status> context_errors(compositions.size());
  ParallelFor(static_cast<int>(compositions.size()), jobs, [&](int i) {
    const Scenario& s = results.scenarios[compositions[i].scenario];
    const Composition& c = s.compositions[compositions[i].composition];
    TrainingConfig training = s.training;
    CostParams params;
    ApplyCorrections(options.calibration, &training, &params);
    absl::StatusOr<std::unique_ptr<PlanningContext>> ctx =
        PlanningContext::Create(*catalog, s.model_spec, training, c.cluster,
                                options.profiles_dir, params);
    if (ctx.ok()) {
      contexts[i] = *std::move(ctx);
    } else {
      context_errors[i] = absl::Status(
          ctx.status().code(),
          absl::StrCat(s.source, ": compositions[", compositions[i].composition,
                       "] (", c.label, "): ", ctx.status().message()));
    }
  });
  for (const absl::Status& s : context_errors) {
    if (!s.ok()) return s;
  }

  // The learned planner only plans models with a policy (their own
  // checkpoint or a declared relative's). One greedy rollout on each
  // scenario's first composition asks the factory; a scenario whose model
  // has none leaves the planner out with a note instead of a column of
  // failures.
  const std::vector<std::string>& names = results.options.planners;
  std::vector<bool> learned_skipped(results.scenarios.size(), false);
  if (std::find(names.begin(), names.end(), kLearnedPlannerName) !=
      names.end()) {
    std::vector<int> first_context(results.scenarios.size(), -1);
    for (int i = static_cast<int>(compositions.size()) - 1; i >= 0; --i) {
      first_context[compositions[i].scenario] = i;
    }
    std::vector<absl::Status> probes(results.scenarios.size());
    ParallelFor(static_cast<int>(results.scenarios.size()), jobs, [&](int si) {
      if (first_context[si] < 0) return;
      LearnedPlannerConfig probe_config;
      probe_config.sampled_rollouts = 0;
      probe_config.refinement_passes = 0;
      LearnedPlanner probe(probe_config);
      PlannerOptions po;
      po.max_depth = options.max_depth;
      po.max_templates = options.max_templates;
      po.budget = absl::ZeroDuration();  // the greedy rollout still runs
      probes[si] =
          probe.Run(contexts[first_context[si]]->cost_model(), po).status();
    });
    for (int si = 0; si < static_cast<int>(results.scenarios.size()); ++si) {
      const Scenario& s = results.scenarios[si];
      if (!IsNoPolicyError(probes[si], s.model_spec.name)) continue;
      learned_skipped[si] = true;
      results.skipped.push_back(
          {si, kLearnedPlannerName, std::string(probes[si].message())});
    }
  }
  for (const BenchSkip& skip : results.skipped) {
    log << "bench: note: " << skip.planner << " skipped"
        << (skip.scenario < 0
                ? std::string()
                : absl::StrCat(" on ", results.scenarios[skip.scenario].name))
        << ": " << skip.reason << "\n";
  }

  // Every planner on every composition, scenario-major; run_context[k] is
  // the context of results.runs[k].
  std::vector<int> run_context;
  for (size_t i = 0; i < compositions.size(); ++i) {
    for (const std::string& planner : names) {
      if (planner == kLearnedPlannerName &&
          learned_skipped[compositions[i].scenario]) {
        continue;
      }
      BenchRun run;
      run.scenario = compositions[i].scenario;
      run.composition = compositions[i].composition;
      run.planner = planner;
      results.runs.push_back(std::move(run));
      run_context.push_back(static_cast<int>(i));
    }
  }
  const int num_planners = static_cast<int>(names.size());
  // Scatter scenarios also draw random plan structures per composition; one
  // job each, after the planner runs.
  std::vector<int> sampled_compositions;
  for (size_t i = 0; i < compositions.size(); ++i) {
    if (results.scenarios[compositions[i].scenario].kind ==
        ScenarioKind::kScatter) {
      sampled_compositions.push_back(static_cast<int>(i));
    }
  }
  std::vector<std::vector<PlanSample>> samples(sampled_compositions.size());
  std::mutex log_mu;
  int done = 0;
  const int num_runs = static_cast<int>(results.runs.size());
  const int total = num_runs + static_cast<int>(sampled_compositions.size());
  log << absl::StrFormat(
      "bench: %d scenarios, %d compositions, %d planners: %d runs%s on %d "
      "threads, budget %s per run\n",
      results.scenarios.size(), compositions.size(), num_planners, num_runs,
      sampled_compositions.empty()
          ? ""
          : absl::StrCat(" + ", sampled_compositions.size(),
                         " random-structure samplings"),
      jobs, Seconds(options.budget_s));
  const absl::Time bench_start = absl::Now();
  // Rows as runs finish, so a bench killed or crashed midway keeps what it
  // measured.
  std::ofstream partial;
  if (!options.partial_csv.empty()) {
    std::error_code ec;
    const std::filesystem::path parent =
        std::filesystem::path(options.partial_csv).parent_path();
    if (!parent.empty()) std::filesystem::create_directories(parent, ec);
    partial.open(options.partial_csv, std::ios::binary | std::ios::trunc);
    partial << kResultsCsvHeader;
    partial.flush();
    if (ec || !partial) {
      return absl::PermissionDeniedError(
          absl::StrCat("--out: cannot write ", options.partial_csv));
    }
  }
  const int count_width = static_cast<int>(absl::StrCat(total).size());
  ParallelFor(total, jobs, [&](int i) {
    if (i >= num_runs) {
      const int k = i - num_runs;
      const CompositionRef& ref = compositions[sampled_compositions[k]];
      const Scenario& s = results.scenarios[ref.scenario];
      const absl::Time start = absl::Now();
      samples[k] =
          SamplePlanStructures(contexts[sampled_compositions[k]]->cost_model(),
                               s.samples, options.seed, options.max_depth);
      std::lock_guard<std::mutex> lock(log_mu);
      ++done;
      log << absl::StrFormat(
          "[%*d/%d] %s | %s | random structures: %d of %d feasible (%s) "
          "[%s]\n",
          count_width, done, total, s.name,
          s.compositions[ref.composition].label, samples[k].size(), s.samples,
          Seconds(absl::ToDoubleSeconds(absl::Now() - start)),
          Elapsed(bench_start));
      log.flush();
      return;
    }
    BenchRun& run = results.runs[i];
    const Scenario& s = results.scenarios[run.scenario];
    const Composition& c = s.compositions[run.composition];
    const CostModel& cm = contexts[run_context[i]]->cost_model();
    PlannerOptions po;
    po.budget = absl::Seconds(options.budget_s);
    po.max_evaluations = options.max_evaluations;
    if (s.kind == ScenarioKind::kSearchCurve && s.max_evaluations > 0) {
      po.max_evaluations = s.max_evaluations;
    }
    po.max_depth = options.max_depth;
    po.max_templates = options.max_templates;
    po.seed = options.seed;
    absl::StatusOr<std::unique_ptr<Planner>> planner = MakePlanner(run.planner);
    const absl::Time start = absl::Now();
    absl::StatusOr<PlanResult> result =
        planner.ok() ? (*planner)->Run(cm, po)
                     : absl::StatusOr<PlanResult>(planner.status());
    run.planning_time_s = absl::ToDoubleSeconds(absl::Now() - start);
    if (result.ok()) {
      // A baseline's plan is scored only if it is one the cost model
      // accepts; anything else is a planner bug, reported as such.
      if (absl::Status v = ValidatePlan(result->plan, cm); !v.ok()) {
        run.status = RunStatus::kError;
        run.message =
            absl::StrCat("returned plan fails validation: ", v.message());
      } else {
        run.status = RunStatus::kOk;
        run.prediction = result->prediction;
        run.gpus_used = result->plan.used_gpus();
        run.max_depth = DeepestTemplate(result->plan);
        run.templates = static_cast<int>(result->plan.templates.size());
        run.plan_summary = PlanSummary(result->plan, cm.catalog());
      }
      run.stats = std::move(result->stats);
    } else {
      // No plan is a result, not a bug, whether nothing fits or the run's
      // budget or evaluation limit stopped it first.
      const absl::StatusCode code = result.status().code();
      run.status = code == absl::StatusCode::kFailedPrecondition ||
                           code == absl::StatusCode::kDeadlineExceeded ||
                           code == absl::StatusCode::kResourceExhausted
                       ? RunStatus::kNoPlan
                       : RunStatus::kError;
      run.message = std::string(result.status().message());
    }
    std::lock_guard<std::mutex> lock(log_mu);
    if (partial.is_open()) {
      partial << ResultsCsvRow(results.scenarios, run);
      partial.flush();
    }
    ++done;
    std::string outcome =
        run.status == RunStatus::kOk
            ? absl::StrFormat("%.4f iter/s",
                              run.prediction.throughput_iters_per_s)
            : absl::StrCat(RunStatusName(run.status), ": ",
                           run.message.size() > 160
                               ? run.message.substr(0, 157) + "..."
                               : run.message);
    log << absl::StrFormat(
        "[%*d/%d] %s | %s | %s: %s (%s, %d evaluations) [%s]\n", count_width,
        done, total, s.name, c.label, run.planner, outcome,
        Seconds(run.planning_time_s), run.stats.evaluations,
        Elapsed(bench_start));
    log.flush();
  });
  results.wall_s = absl::ToDoubleSeconds(absl::Now() - bench_start);
  // The offline training behind each policy the learned planner used.
  std::set<std::string> learned_models;
  for (const BenchRun& run : results.runs) {
    if (run.planner == kLearnedPlannerName && run.status == RunStatus::kOk) {
      learned_models.insert(results.scenarios[run.scenario].model);
    }
  }
  for (const std::string& model : learned_models) {
    const Scenario* scenario = nullptr;
    for (const Scenario& s : results.scenarios) {
      if (s.model == model) scenario = &s;
    }
    absl::StatusOr<BenchPolicy> policy =
        FindPolicyTraining(results.options.policies_dir, scenario->model_spec);
    if (policy.ok()) {
      policy->model = model;
      results.policies.push_back(*std::move(policy));
    } else {
      log << "bench: note: the learned planner's training is not reported "
             "for "
          << model << ": " << policy.status().message() << "\n";
    }
  }
  for (size_t k = 0; k < sampled_compositions.size(); ++k) {
    const CompositionRef& ref = compositions[sampled_compositions[k]];
    for (const PlanSample& p : samples[k]) {
      results.samples.push_back(BenchSample{ref.scenario, ref.composition,
                                            p.max_depth, p.templates,
                                            p.throughput_iters_per_s});
    }
  }
  return results;
}

std::string ResultsCsv(const BenchResults& r) {
  std::string csv = kResultsCsvHeader;
  for (const BenchRun& run : r.runs) {
    absl::StrAppend(&csv, ResultsCsvRow(r.scenarios, run));
  }
  return csv;
}

std::string ProgressCsv(const BenchResults& r) {
  std::string csv =
      "scenario,figure,composition,gpus,planner,evaluations,wall_s,"
      "best_throughput_iters_per_s\n";
  for (const BenchRun& run : r.runs) {
    const Scenario& s = r.scenarios[run.scenario];
    if (s.kind != ScenarioKind::kSearchCurve || run.status != RunStatus::kOk) {
      continue;
    }
    const Composition& c = s.compositions[run.composition];
    const std::string prefix =
        absl::StrCat(CsvField(s.name), ",", CsvField(s.figure), ",",
                     CsvField(c.label), ",", c.gpus, ",", run.planner, ",");
    double best = 0;
    for (const ProgressPoint& p : run.stats.progress) {
      best = std::max(best, p.throughput_iters_per_s);
      absl::StrAppend(&csv, prefix, p.evaluations, ",", Num(p.wall_s), ",",
                      Num(best), "\n");
    }
    // Close the curve where the search stopped, so a plot draws the plateau
    // out to the evaluations actually spent.
    if (run.stats.progress.empty() ||
        run.stats.progress.back().evaluations < run.stats.evaluations) {
      absl::StrAppend(
          &csv, prefix, run.stats.evaluations, ",", Num(run.planning_time_s),
          ",", Num(std::max(best, run.prediction.throughput_iters_per_s)),
          "\n");
    }
  }
  return csv;
}

std::string SamplesCsv(const BenchResults& r) {
  std::string csv =
      "scenario,figure,model,composition,gpus,max_depth,templates,"
      "throughput_iters_per_s\n";
  for (const BenchSample& x : r.samples) {
    const Scenario& s = r.scenarios[x.scenario];
    const Composition& c = s.compositions[x.composition];
    absl::StrAppend(&csv, CsvField(s.name), ",", CsvField(s.figure), ",",
                    CsvField(s.model), ",", CsvField(c.label), ",", c.gpus, ",",
                    x.max_depth, ",", x.templates, ",",
                    Num(x.throughput_iters_per_s), "\n");
  }
  return csv;
}

std::string PoliciesCsv(const BenchResults& r) {
  std::string csv =
      "model,policy,checkpoint,training_runs,training_rollouts,"
      "training_wall_s\n";
  for (const BenchPolicy& p : r.policies) {
    absl::StrAppend(&csv, CsvField(p.model), ",", CsvField(p.policy), ",",
                    CsvField(p.checkpoint), ",", p.training_runs, ",",
                    p.training_rollouts, ",", Num(p.training_wall_s), "\n");
  }
  return csv;
}

absl::StatusOr<BenchPolicy> FindPolicyTraining(const std::string& policies_dir,
                                               const ModelSpec& model) {
  std::vector<std::string> names = {model.name};
  if (!model.policy_relative.empty() && model.policy_relative != model.name) {
    names.push_back(model.policy_relative);
  }
  const std::filesystem::path dir(policies_dir);
  std::error_code ec;
  for (const std::string& name : names) {
    const std::filesystem::path pt = dir / (name + ".pt");
    const std::filesystem::path meta = dir / (name + ".json");
    if (!std::filesystem::is_regular_file(pt, ec) ||
        !std::filesystem::is_regular_file(meta, ec)) {
      continue;
    }
    std::ifstream f(meta);
    const nlohmann::json j = nlohmann::json::parse(f, nullptr,
                                                   /*allow_exceptions=*/false);
    const auto bad = [&](const std::string& what) {
      return absl::InvalidArgumentError(
          absl::StrCat(meta.string(), ": ", what));
    };
    if (j.is_discarded() || !j.is_object()) return bad("not a JSON object");
    if (!j.contains("model") || !j["model"].is_string()) {
      return bad("no \"model\" string");
    }
    if (j["model"].get<std::string>() != name) continue;
    if (!j.contains("training") || !j["training"].is_object()) {
      return bad("no \"training\" object");
    }
    const nlohmann::json& t = j["training"];
    if (!t.contains("episodes") || !t["episodes"].is_number_integer() ||
        !t.contains("wall_s") || !t["wall_s"].is_number()) {
      return bad("training: needs integer \"episodes\" and number \"wall_s\"");
    }
    BenchPolicy policy;
    policy.model = model.name;
    policy.policy = name;
    policy.checkpoint = pt.string();
    policy.training_runs = 1;
    policy.training_rollouts = t["episodes"].get<int64_t>();
    policy.training_wall_s = t["wall_s"].get<double>();
    // A checkpoint trained in stages (--init) carries only its last run's
    // figures; the earlier runs' curves are kept as <name>.<stage>.curve.csv
    // (docs/learned-policy.md), and their rollouts count as well.
    const std::string prefix = name + ".";
    const std::string suffix = ".curve.csv";
    std::vector<std::filesystem::path> stages;
    for (const auto& entry : std::filesystem::directory_iterator(dir, ec)) {
      const std::string file = entry.path().filename().string();
      if (file.size() <= prefix.size() + suffix.size() ||
          !absl::StartsWith(file, prefix) || !absl::EndsWith(file, suffix)) {
        continue;
      }
      const std::string stage = file.substr(
          prefix.size(), file.size() - prefix.size() - suffix.size());
      if (stage.find('.') == std::string::npos) stages.push_back(entry.path());
    }
    std::sort(stages.begin(), stages.end());
    for (const std::filesystem::path& stage : stages) {
      absl::StatusOr<std::pair<int64_t, double>> totals = CurveTotals(stage);
      if (!totals.ok()) return totals.status();
      ++policy.training_runs;
      policy.training_rollouts += totals->first;
      policy.training_wall_s += totals->second;
    }
    return policy;
  }
  return absl::NotFoundError(absl::StrCat(
      "no checkpoint with metadata for ", absl::StrJoin(names, " or "), " in ",
      policies_dir.empty() ? std::string("(no policies directory)")
                           : policies_dir));
}

std::string ResultsMarkdown(const BenchResults& r) {
  const BenchOptions& o = r.options;
  std::string md = absl::StrFormat(
      "# Arachne bench results\n\n"
      "Planners: %s. Budget %s per run%s, max depth %d, at most %d "
      "templates, seed %d; %d threads, %s in all.\n\n"
      "Each cell is the plan's throughput relative to the best planner on "
      "that composition (**1.000** = best), with the planning time in "
      "parentheses; `no_plan` means the planner found no plan that fits, "
      "`error` that it failed (see results.csv).\n",
      absl::StrJoin(o.planners, ", "), Seconds(o.budget_s),
      o.max_evaluations > 0
          ? absl::StrCat(", at most ", o.max_evaluations, " evaluations")
          : "",
      o.max_depth, o.max_templates, o.seed, o.jobs, Seconds(r.wall_s));
  for (const BenchSkip& skip : r.skipped) {
    if (skip.scenario < 0) {
      absl::StrAppend(&md, "\n", skip.planner,
                      " skipped: ", MdCell(skip.reason), ".\n");
    }
  }
  std::map<std::string, std::vector<int>, decltype(&FigureLess)> by_figure(
      &FigureLess);
  for (int i = 0; i < static_cast<int>(r.scenarios.size()); ++i) {
    by_figure[FigureOf(r.scenarios[i].figure)].push_back(i);
  }
  for (const auto& [figure, indices] : by_figure) {
    const bool numbered = absl::ascii_isdigit(figure[0]);
    absl::StrAppend(&md, "\n## ", numbered ? "Figure " : "", figure, "\n");
    for (int si : indices) {
      const Scenario& s = r.scenarios[si];
      absl::StrAppendFormat(&md, "\n### %s: %s (%s)\n\n%s%s",
                            PanelTitle(s.figure), s.name, s.model,
                            s.description, s.description.empty() ? "" : "\n\n");
      AppendCompareTable(r, si, &md);
      for (const BenchSkip& skip : r.skipped) {
        if (skip.scenario == si) {
          absl::StrAppend(&md, "\n", skip.planner,
                          " skipped: ", MdCell(skip.reason), "\n");
        }
      }
      if (s.kind == ScenarioKind::kSearchCurve) AppendCurveTable(r, si, &md);
      if (s.kind == ScenarioKind::kScatter) AppendScatterTable(r, si, &md);
    }
    AppendFigureSummary(r, indices, &md);
  }
  return md;
}

absl::Status WriteBenchOutputs(const BenchResults& results,
                               const std::string& out_dir) {
  std::error_code ec;
  std::filesystem::create_directories(out_dir, ec);
  if (ec) {
    return absl::PermissionDeniedError(
        absl::StrCat("--out: cannot create ", out_dir, ": ", ec.message()));
  }
  const std::filesystem::path dir(out_dir);
  if (absl::Status s =
          WriteFile((dir / "results.csv").string(), ResultsCsv(results));
      !s.ok()) {
    return s;
  }
  if (absl::Status s =
          WriteFile((dir / "results.md").string(), ResultsMarkdown(results));
      !s.ok()) {
    return s;
  }
  bool curves = false, scatter = false;
  for (const Scenario& s : results.scenarios) {
    curves |= s.kind == ScenarioKind::kSearchCurve;
    scatter |= s.kind == ScenarioKind::kScatter;
  }
  if (curves) {
    if (absl::Status s =
            WriteFile((dir / "progress.csv").string(), ProgressCsv(results));
        !s.ok()) {
      return s;
    }
  }
  if (scatter) {
    if (absl::Status s =
            WriteFile((dir / "fig4_samples.csv").string(), SamplesCsv(results));
        !s.ok()) {
      return s;
    }
  }
  const std::vector<std::string>& planners = results.options.planners;
  if (std::find(planners.begin(), planners.end(), kLearnedPlannerName) !=
      planners.end()) {
    if (absl::Status s = WriteFile((dir / "learned_policies.csv").string(),
                                   PoliciesCsv(results));
        !s.ok()) {
      return s;
    }
  }
  return absl::OkStatus();
}

bool DrawPlots(const std::string& plot_script, const std::string& out_dir,
               std::ostream& log) {
  const std::string later = absl::StrCat(
      "python3 ",
      ShellQuote(plot_script.empty() ? "bench/plot_results.py" : plot_script),
      " ", ShellQuote(out_dir));
  std::error_code ec;
  if (plot_script.empty() ||
      !std::filesystem::is_regular_file(plot_script, ec)) {
    log << "bench: plots skipped: plot script "
        << (plot_script.empty() ? std::string("(none)") : plot_script)
        << " not found; draw them with: " << later << "\n";
    return false;
  }
  const std::string python = PythonWithMatplotlib();
  if (python.empty()) {
    log << "bench: plots skipped: no python3 with matplotlib (install "
           "python3-matplotlib, e.g. with scripts/setup); the CSV and "
           "Markdown results are written. Draw the plots later with: "
        << later << "\n";
    return false;
  }
  const std::string command = absl::StrCat(python, " ", ShellQuote(plot_script),
                                           " ", ShellQuote(out_dir));
  log << "bench: drawing plots: " << command << "\n";
  log.flush();
  const int rc = std::system(command.c_str());
  if (rc != 0) {
    log << "bench: plotting failed (exit status " << rc
        << "); the CSV and Markdown results are written\n";
    return false;
  }
  return true;
}

}  // namespace arachne
