// docs/architecture.md's timeout table states the default of every timeout
// and retry setting of the controller, the agent client, the agent and the
// engine supervisor. Here each row is read from the doc and compared with the
// value the code runs with: the job file's settings resolved from a job that
// sets none of them, and the compiled-in settings structs' defaults (issue
// 37, item 6). A row the test does not know fails, so a new row comes with
// its check; a row that goes missing fails too.
#include <algorithm>
#include <fstream>
#include <map>
#include <sstream>
#include <string>
#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/str_split.h"
#include "absl/strings/strip.h"
#include "absl/time/time.h"
#include "arachne/v1/controller.pb.h"
#include "controller/controller.h"
#include "controller/controller_config.h"
#include "controller/membership.h"
#include "gtest/gtest.h"
#include "planner_service/io/gpu_catalog_io.h"
#include "planner_service/io/model_io.h"
#include "worker_agent/agent_client.h"
#include "worker_agent/agent_proto_convert.h"
#include "worker_agent/engine_supervisor.h"
#include "worker_agent/node_ranks.h"
#include "worker_agent/registration.h"

namespace arachne {
namespace {

struct Row {
  std::string name;     // first cell, backticks removed
  std::string default_;  // second cell
};

// The rows of the table headed "| level | default | set by | governs |", in
// order (a name may stand twice, under two components).
std::vector<Row> TimeoutTableRows() {
  std::ifstream in(std::string(ARACHNE_SOURCE_DIR) + "/docs/architecture.md");
  EXPECT_TRUE(in.good());
  std::vector<Row> rows;
  bool in_table = false;
  std::string line;
  while (std::getline(in, line)) {
    if (absl::StartsWith(line, "| level | default | set by | governs |")) {
      in_table = true;
      continue;
    }
    if (!in_table) continue;
    if (!absl::StartsWith(line, "|")) break;
    std::vector<std::string> cells = absl::StrSplit(line, '|');
    if (cells.size() < 4) continue;
    std::string first(absl::StripAsciiWhitespace(cells[1]));
    if (absl::StartsWith(first, "---") || absl::StartsWith(first, "**")) {
      continue;
    }
    first.erase(std::remove(first.begin(), first.end(), '`'), first.end());
    rows.push_back({first, std::string(absl::StripAsciiWhitespace(cells[2]))});
  }
  return rows;
}

// "10 s", "50 ms", "5 min", "0.5 s", "3": each comma-separated value's
// leading number and unit, as a duration (a bare number: as seconds, for
// counts compared with absl::Seconds(count)). Words after the unit ("10 s,
// at most lease_s / 2"; "0.2 s doubled up to 10 s") are ignored but for
// "up to", which starts the next value.
std::vector<absl::Duration> ParseDefaults(std::string cell) {
  std::vector<absl::Duration> out;
  for (absl::string_view part :
       absl::StrSplit(cell, absl::ByAnyChar(",;"), absl::SkipEmpty())) {
    std::vector<std::string> pieces = absl::StrSplit(part, " up to ");
    for (const std::string& piece : pieces) {
      std::istringstream words{std::string(piece)};
      double value;
      if (!(words >> value)) continue;
      std::string unit;
      words >> unit;
      if (unit == "ms") {
        out.push_back(absl::Milliseconds(value));
      } else if (unit == "min") {
        out.push_back(absl::Minutes(value));
      } else {
        out.push_back(absl::Seconds(value));  // "s", or a count
      }
    }
  }
  return out;
}

absl::Duration Count(int n) { return absl::Seconds(n); }

TEST(DocDefaults, TheTimeoutTableStatesTheValuesTheCodeRunsWith) {
  absl::StatusOr<GpuCatalog> catalog = LoadGpuCatalog("");
  ASSERT_TRUE(catalog.ok()) << catalog.status();
  absl::StatusOr<std::vector<ModelSpec>> models = LoadModelCatalog("");
  ASSERT_TRUE(models.ok()) << models.status();
  v1::JobSpec spec;
  spec.mutable_model()->set_name("tiny-gpt");
  spec.mutable_training()->set_seq_len(32);
  spec.mutable_training()->set_global_batch(8);
  spec.set_iterations(10);
  absl::StatusOr<controller::JobSettings> job =
      controller::ResolveJob(spec, "job.yaml", *catalog, *models);
  ASSERT_TRUE(job.ok()) << job.status();

  const controller::JobControllerConfig controller_config;
  const agent::AgentClientConfig client;
  const agent::EngineSupervisorConfig supervisor;
  const agent::RegistrationConfig registration;
  const agent::NodeGpus node_gpus;

  // Row -> the values the code runs with, in the row's order; a name that
  // stands twice has one entry per row, in the table's order (the agent
  // client's call_timeout and status_timeout, then the supervisor's). An
  // empty entry is a row known here whose default is checked elsewhere
  // (the flags, by test/docs/doc_flag_tables_test.py) or has no number
  // ("the phase's timeout"). A cell's words after its numbers ("10 s, at
  // most lease_s / 2") are not compared.
  using Values = std::vector<absl::Duration>;
  const std::map<std::string, std::vector<Values>> code = {
      {"timeouts.lease_s", {{job->membership.lease}}},
      {"timeouts.transfer_round_s", {{job->transfer_round}}},
      {"timeouts.phase_s", {{job->phase}}},
      {"timeouts.switch_s", {{job->switch_timeout}}},
      {"join_window_s", {{job->membership.join_window}}},
      {"flap_leaves, flap_window_s, flap_backoff_s",
       {{Count(job->membership.flap_leaves), job->membership.flap_window,
         job->membership.flap_backoff}}},
      {"planner.budget_s", {{absl::Seconds(job->planner_budget_s)}}},
      {"planner.retries, planner.retry_backoff_s",
       {{Count(job->planner_retries), job->planner_retry_backoff}}},
      {"tick, status_poll",
       {{controller_config.tick, controller_config.status_poll}}},
      {"retry_after_failure", {{controller_config.retry_after_failure}}},
      {"register_check_timeout", {{controller_config.register_check_timeout}}},
      {"refit_interval", {{controller_config.refit_interval}}},
      {"call_timeout", {{client.call_timeout}, {supervisor.call_timeout}}},
      {"status_timeout",
       {{client.status_timeout}, {supervisor.status_timeout}}},
      {"phase_deadline_margin", {{client.phase_deadline_margin}}},
      {"phase timeout_s = 0", {{agent::kDefaultPhaseTimeout}}},
      {"round_timeout_s = 0", {{}}},
      {"collective_timeout", {{node_gpus.collective_timeout}}},
      {"registration back-off",
       {{registration.initial_backoff, registration.max_backoff}}},
      {"start_timeout", {{supervisor.start_timeout}}},
      {"hang_timeout", {{supervisor.hang_timeout}}},
      {"phase_margin", {{supervisor.phase_margin}}},
      {"stop_grace", {{supervisor.stop_grace}}},
      {"--grace-s", {{}, {}, {}}},
      {"--default-budget-s", {{}}},
      {"--max-budget-s", {{}}},
  };

  const std::vector<Row> rows = TimeoutTableRows();
  ASSERT_GE(rows.size(), 20u) << "the timeout table was not found";
  std::map<std::string, size_t> seen;  // rows of each name so far
  for (const Row& row : rows) {
    auto it = code.find(row.name);
    if (it == code.end()) {
      ADD_FAILURE() << "docs/architecture.md: row \"" << row.name << "\" ("
                    << row.default_ << ") is not checked against the code here";
      continue;
    }
    const size_t n = seen[row.name]++;
    if (n >= it->second.size()) {
      ADD_FAILURE() << "docs/architecture.md: row \"" << row.name
                    << "\" stands more often than the " << it->second.size()
                    << " known here";
      continue;
    }
    const Values& values = it->second[n];
    if (values.empty()) continue;
    EXPECT_EQ(ParseDefaults(row.default_), values) << "docs/architecture.md: row \"" << row.name
                              << "\" states \"" << row.default_ << "\"";
  }
  for (const auto& [name, values] : code) {
    EXPECT_EQ(seen[name], values.size())
        << "docs/architecture.md's timeout table: row " << name
        << " stands " << seen[name] << " times, expected " << values.size();
  }
}

}  // namespace
}  // namespace arachne
