// One arachne-controller against a thousand agents (issue 36, scale): a
// real controller process (embedded planner) and --nodes lightweight agents
// in --fleets agent_fleet processes (bench/agent_fleet.cc: the real Agent
// service and the agent's registration loop, no training), every agent
// heartbeating at a third of the lease on a connection of its own.
//
// Measures, in one run:
//   * registration: the wall time until every node is a member, and the
//     first plan's decision over all of them;
//   * a steady window (--seconds): the latency of every Heartbeat (the
//     fleets time their own calls) and of GetStatus, called every 100 ms
//     by this bench, p50 / p99 / max; the controller's CPU (utime + stime
//     over the window, from /proc) and its RSS (now and peak);
//   * a join: one more node registers; the time from its membership event
//     to the decision on it (both the controller's own timestamps), and
//     from its Register call to that decision.
//
// Writes <out>/controller_scale.md and prints it.
//
//   build/bench/controller_scale_bench [--nodes 1000] [--fleets 4]
//                                      [--seconds 30] [--out DIR]
#include <signal.h>
#include <sys/resource.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <cstdio>
#include <fstream>
#include <sstream>
#include <string>
#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/str_format.h"
#include "test/controller/controller_harness.h"
#include "test/port_file_process.h"

namespace arachne::controller::bench {
namespace {

using testing::ControllerProcess;

double Percentile(std::vector<double> v, double p) {
  if (v.empty()) return 0;
  std::sort(v.begin(), v.end());
  const size_t i = std::min(v.size() - 1, static_cast<size_t>(p * (v.size() - 1) + 0.5));
  return v[i];
}

// utime + stime of `pid`, in seconds.
double CpuSeconds(pid_t pid) {
  std::ifstream f(absl::StrCat("/proc/", pid, "/stat"));
  std::string text((std::istreambuf_iterator<char>(f)), std::istreambuf_iterator<char>());
  const size_t close = text.rfind(')');
  if (close == std::string::npos) return 0;
  std::istringstream rest(text.substr(close + 2));
  std::string field;
  double utime = 0, stime = 0;
  // Fields 3.. after the command: utime is field 14, stime 15.
  for (int i = 3; i <= 15 && rest >> field; ++i) {
    if (i == 14) utime = std::stod(field);
    if (i == 15) stime = std::stod(field);
  }
  return (utime + stime) / static_cast<double>(sysconf(_SC_CLK_TCK));
}

// VmRSS / VmHWM of `pid`, in MiB.
double MemoryMiB(pid_t pid, const std::string& key) {
  std::ifstream f(absl::StrCat("/proc/", pid, "/status"));
  std::string line;
  while (std::getline(f, line)) {
    if (absl::StartsWith(line, key + ":")) {
      return std::stod(line.substr(key.size() + 1)) / 1024.0;
    }
  }
  return 0;
}

struct Fleet {
  pid_t pid = -1;
  std::string ready, latencies, log;
};

absl::StatusOr<Fleet> SpawnFleet(const std::string& dir, const std::string& controller,
                                 const std::string& prefix, int first, int count) {
  Fleet f;
  f.ready = absl::StrCat(dir, "/", prefix, first, ".ready");
  f.latencies = absl::StrCat(dir, "/", prefix, first, ".latencies");
  f.log = absl::StrCat(dir, "/", prefix, first, ".log");
  f.pid = arachne::testing::SpawnWithPortFile(
      {std::string(ARACHNE_BINARY_DIR) + "/bench/agent_fleet", "--controller",
       controller, "--count", std::to_string(count), "--first",
       std::to_string(first), "--prefix", prefix, "--ready-file", f.ready,
       "--latency-file", f.latencies},
      f.log, f.ready);
  return f;
}

// SIGTERM, then the latencies it wrote, in ms: every Register, and the
// Heartbeats started inside [from, to) (unix seconds).
void StopFleet(const Fleet& f, double from, double to, std::vector<double>* reg,
               std::vector<double>* hb) {
  kill(f.pid, SIGTERM);
  waitpid(f.pid, nullptr, 0);
  std::ifstream in(f.latencies);
  std::string call;
  double start, ms;
  while (in >> call >> start >> ms) {
    if (call == "register") {
      reg->push_back(ms);
    } else if (start >= from && start < to) {
      hb->push_back(ms);
    }
  }
}

std::string Row(const std::string& what, const std::vector<double>& ms) {
  return absl::StrFormat("| %s | %d | %.2f | %.2f | %.2f |\n", what, ms.size(),
                         Percentile(ms, 0.5), Percentile(ms, 0.99),
                         ms.empty() ? 0.0 : *std::max_element(ms.begin(), ms.end()));
}

absl::Status Run(int nodes, int fleets, double seconds, const std::string& out_dir) {
  // Two connections per agent in the controller: allow them.
  rlimit nofile;
  getrlimit(RLIMIT_NOFILE, &nofile);
  nofile.rlim_cur = nofile.rlim_max;
  setrlimit(RLIMIT_NOFILE, &nofile);

  const std::string dir = testing::TempDir("controller-scale");
  ControllerProcess controller(dir);
  const std::string job = absl::StrCat(
      "model: {name: tiny-gpt}\n"
      "training: {seq_len: 16, global_batch: 1024}\n"
      "engine: {learning_rate: 0.001, data_seed: 7, init_seed: 11}\n"
      "iterations: 1000000\n"
      "min_gpus: ", nodes, "\n"
      // No coalescing window: the join-to-decision time is the decision's own.
      "join_window_s: 0\n"
      "timeouts: {lease_s: 10, transfer_round_s: 15, phase_s: 30, switch_s: 120}\n"
      "planner: {planner: template-search, budget_s: 2}\n");
  if (absl::Status s = controller.Start(job); !s.ok()) return s;
  const pid_t cpid = controller.pid();

  // Registration.
  const absl::Time t_start = absl::Now();
  std::vector<Fleet> fleet;
  for (int k = 0; k < fleets; ++k) {
    const int first = k * nodes / fleets, last = (k + 1) * nodes / fleets;
    absl::StatusOr<Fleet> f = SpawnFleet(dir, controller.address(), "fleet", first, last - first);
    if (!f.ok()) return f.status();
    fleet.push_back(*f);
  }
  for (const Fleet& f : fleet) {
    absl::StatusOr<arachne::testing::StartedProcess> p = arachne::testing::AwaitPortFile(
        f.pid, f.log, f.ready, "agent_fleet", absl::Seconds(300));
    if (!p.ok()) return p.status();
  }
  const double registration_s = absl::ToDoubleSeconds(absl::Now() - t_start);
  absl::StatusOr<v1::GetStatusResponse> st = testing::WaitFor(
      controller,
      [&](const v1::GetStatusResponse& s) {
        return s.members_size() == nodes && s.generation() >= 1 &&
               s.phase() == "running";
      },
      absl::Seconds(300), "the first plan over every node");
  if (!st.ok()) return st.status();
  const double first_plan_s = absl::ToDoubleSeconds(absl::Now() - t_start);

  // The steady window.
  absl::SleepFor(absl::Seconds(2));
  const double cpu0 = CpuSeconds(cpid);
  const absl::Time w0 = absl::Now();
  std::vector<double> status_ms;
  while (absl::Now() - w0 < absl::Seconds(seconds)) {
    const absl::Time t0 = absl::Now();
    st = controller.Status();
    status_ms.push_back(absl::ToDoubleMilliseconds(absl::Now() - t0));
    if (!st.ok()) return st.status();
    absl::SleepFor(absl::Milliseconds(100) - (absl::Now() - t0));
  }
  const double window_s = absl::ToDoubleSeconds(absl::Now() - w0);
  const double from = absl::ToUnixMicros(w0) / 1e6, to = from + window_s;
  const double cpu_pct = 100.0 * (CpuSeconds(cpid) - cpu0) / window_s;
  const double rss = MemoryMiB(cpid, "VmRSS");
  const int members = st->members_size();
  const size_t status_bytes = st->ByteSizeLong();

  // A join.
  int64_t seen = 0;
  for (const v1::Event& e : controller.Events()) seen = std::max(seen, e.sequence());
  const absl::Time j0 = absl::Now();
  absl::StatusOr<Fleet> joiner = SpawnFleet(dir, controller.address(), "joiner", 0, 1);
  if (!joiner.ok()) return joiner.status();
  if (absl::StatusOr<arachne::testing::StartedProcess> p = arachne::testing::AwaitPortFile(
          joiner->pid, joiner->log, joiner->ready, "agent_fleet (joiner)");
      !p.ok()) {
    return p.status();
  }
  const double register_done = absl::ToDoubleSeconds(absl::Now() - absl::UnixEpoch());
  double join_event = 0, decision_event = 0;
  std::string decision;
  const absl::Time jd = absl::Now() + absl::Seconds(60);
  while (decision_event == 0 && absl::Now() < jd) {
    for (const v1::Event& e : controller.Events(seen)) {
      seen = std::max(seen, e.sequence());
      if (e.kind() == "membership" && absl::StrContains(e.message(), "join joiner-0000")) {
        join_event = e.time_unix_s();
      }
      if (e.kind() == "decision" && join_event > 0 && decision_event == 0) {
        decision_event = e.time_unix_s();
        decision = e.message().substr(0, 160);
      }
    }
  }
  if (decision_event == 0) return absl::DeadlineExceededError("no decision on the join");
  const double join_register_s = register_done - absl::ToDoubleSeconds(j0 - absl::UnixEpoch());

  std::vector<double> register_ms, heartbeat_ms, unused;
  for (const Fleet& f : fleet) StopFleet(f, from, to, &register_ms, &heartbeat_ms);
  StopFleet(*joiner, from, to, &unused, &unused);
  const double peak = MemoryMiB(cpid, "VmHWM");
  controller.Stop();

  std::string md = absl::StrFormat(
      "# One controller, %d agents\n\n"
      "`build/bench/controller_scale_bench --nodes %d --fleets %d --seconds %.0f`: one "
      "`arachne-controller` (embedded template-search planner; tiny-gpt, sequence 16, global batch 1024; lease 10 s) and %d lightweight agents "
      "(bench/agent_fleet.cc: the real Agent service and registration loop, no "
      "training) in %d processes on 127.0.0.1, each heartbeating every lease/3 on a "
      "connection of its own; the controller polls every node's Status. All on one "
      "2-core machine, so the fleets and this bench share the controller's cores.\n\n"
      "| call | samples | p50 ms | p99 ms | max ms |\n|---|---|---|---|---|\n",
      nodes, nodes, fleets, seconds, nodes, fleets);
  md += Row("Register (while all join)", register_ms);
  md += Row(absl::StrFormat("Heartbeat (the %.0f s window, %d members)", window_s, members),
            heartbeat_ms);
  md += Row(absl::StrFormat("GetStatus (%.0f s window, %zu-byte answer)", window_s,
                            status_bytes),
            status_ms);
  md += absl::StrFormat(
      "\n| figure | value |\n|---|---|\n"
      "| all %d registered | %.1f s |\n"
      "| first plan running over all (from the first Register) | %.1f s |\n"
      "| controller CPU in the window | %.1f %% of one core |\n"
      "| controller RSS at the window's end / peak | %.1f / %.1f MiB |\n"
      "| a join: membership event to its decision (join_window_s 0) | %.3f s |\n"
      "| a join: Register answered (from the joiner's start) | %.3f s |\n"
      "| that decision | %s |\n",
      nodes, registration_s, first_plan_s, cpu_pct, rss, peak,
      decision_event - join_event, join_register_s, decision);
  std::filesystem::create_directories(out_dir);
  std::ofstream(out_dir + "/controller_scale.md") << md;
  std::printf("%s", md.c_str());
  return absl::OkStatus();
}

}  // namespace
}  // namespace arachne::controller::bench

int main(int argc, char** argv) {
  int nodes = 1000, fleets = 4;
  double seconds = 30;
  std::string out = std::string(ARACHNE_SOURCE_DIR) + "/bench/results";
  for (int i = 1; i + 1 < argc; i += 2) {
    const std::string flag = argv[i], value = argv[i + 1];
    if (flag == "--nodes") nodes = std::stoi(value);
    else if (flag == "--fleets") fleets = std::stoi(value);
    else if (flag == "--seconds") seconds = std::stod(value);
    else if (flag == "--out") out = value;
    else {
      std::fprintf(stderr, "controller_scale_bench: unknown flag %s\n", flag.c_str());
      return 2;
    }
  }
  if (nodes < 1 || nodes > 4096 || fleets < 1 || fleets > nodes || !(seconds > 0)) {
    std::fprintf(stderr,
                 "controller_scale_bench: need --nodes in 1..4096, --fleets in "
                 "1..nodes, --seconds > 0\n");
    return 2;
  }
  absl::Status s = arachne::controller::bench::Run(nodes, fleets, seconds, out);
  if (!s.ok()) {
    std::fprintf(stderr, "controller_scale_bench: %s\n", std::string(s.message()).c_str());
    return 1;
  }
  return 0;
}
