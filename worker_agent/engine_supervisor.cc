#include "worker_agent/engine_supervisor.h"

#include <fcntl.h>
#include <signal.h>
#include <sys/prctl.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <functional>
#include <optional>
#include <set>
#include <string_view>
#include <thread>
#include <utility>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/clock.h"
#include "arachne/v1/engine.grpc.pb.h"
#include "glog/logging.h"
#include "grpcpp/grpcpp.h"
#include "rpc/grpc_status.h"
#include "worker_agent/agent_proto_convert.h"
#include "worker_agent/engine_launch.h"

extern char** environ;

namespace arachne::agent {

struct EngineSupervisor::Engine {
  int index = 0;
  std::string socket;
  std::string log;
  std::thread keeper;

  mutable absl::Mutex mu;
  pid_t pid ABSL_GUARDED_BY(mu) = 0;
  std::shared_ptr<v1::Engine::Stub> stub ABSL_GUARDED_BY(mu);
  // Holds no generation: started and not yet part of a committed one.
  bool fresh ABSL_GUARDED_BY(mu) = true;
  // The generation it was prepared for since its start (0: none).
  int64_t prepared ABSL_GUARDED_BY(mu) = 0;
  // A predecessor that held state died; cleared when a generation commits.
  bool lost ABSL_GUARDED_BY(mu) = false;
  std::string lost_error ABSL_GUARDED_BY(mu);
  // Why the supervisor killed it, if it did ("" otherwise).
  std::string kill_reason ABSL_GUARDED_BY(mu);
  std::string start_error ABSL_GUARDED_BY(mu);  // the last failed start
  absl::Time last_answer ABSL_GUARDED_BY(mu);
  int starts ABSL_GUARDED_BY(mu) = 0;
};

struct EngineSupervisor::Shared {
  absl::Mutex mu;
  bool stopping ABSL_GUARDED_BY(mu) = false;
  std::thread liveness;
};

namespace {

// The last `lines` lines of a log, for error messages.
std::string LogTail(const std::string& path, int lines = 5) {
  std::ifstream in(path);
  std::vector<std::string> all;
  std::string line;
  while (std::getline(in, line)) all.push_back(line);
  const size_t from =
      all.size() > static_cast<size_t>(lines) ? all.size() - lines : 0;
  std::vector<std::string> tail(all.begin() + from, all.end());
  return absl::StrJoin(tail, " | ");
}

std::string DescribeExit(int status) {
  if (WIFEXITED(status))
    return absl::StrCat("exited with code ", WEXITSTATUS(status));
  if (WIFSIGNALED(status)) {
    const int sig = WTERMSIG(status);
    return absl::StrCat("was killed by signal ", sig, " (", strsignal(sig),
                        ")");
  }
  return absl::StrCat("ended with wait status ", status);
}

// fork + exec with the launch environment, output appended to `log`. The
// child dies with this thread's process (PR_SET_PDEATHSIG) and gets the
// default signal mask back (the agent blocks SIGTERM in every thread).
absl::StatusOr<pid_t> Spawn(const std::vector<std::string>& argv,
                            const std::vector<std::string>& vars,
                            const std::string& log) {
  std::set<std::string> names;
  for (const std::string& v : vars) names.insert(v.substr(0, v.find('=')));
  std::vector<std::string> env_strings;
  for (char** e = environ; *e != nullptr; ++e) {
    const std::string s = *e;
    if (names.count(s.substr(0, s.find('='))) == 0) env_strings.push_back(s);
  }
  env_strings.insert(env_strings.end(), vars.begin(), vars.end());
  std::vector<char*> envp, args;
  for (std::string& s : env_strings) envp.push_back(s.data());
  envp.push_back(nullptr);
  std::vector<std::string> argv_copy = argv;
  for (std::string& s : argv_copy) args.push_back(s.data());
  args.push_back(nullptr);
  const int fd =
      open(log.c_str(), O_WRONLY | O_CREAT | O_APPEND | O_CLOEXEC, 0644);
  if (fd < 0) {
    return absl::UnavailableError(
        absl::StrCat("log_dir: cannot open \"", log, "\": ", strerror(errno)));
  }
  const pid_t parent = getpid();
  const pid_t pid = fork();
  if (pid < 0) {
    close(fd);
    return absl::ResourceExhaustedError(
        absl::StrCat("fork: ", strerror(errno)));
  }
  if (pid == 0) {
    prctl(PR_SET_PDEATHSIG, SIGKILL);
    if (getppid() != parent) _exit(1);
    sigset_t none;
    sigemptyset(&none);
    sigprocmask(SIG_SETMASK, &none, nullptr);
    setpgid(0, 0);  // a terminal's ^C goes to the agent, which stops us
    dup2(fd, STDOUT_FILENO);
    dup2(fd, STDERR_FILENO);
    execve(args[0], args.data(), envp.data());
    const char* msg = "arachne-agent: exec of the engine command failed\n";
    (void)!write(STDERR_FILENO, msg, strlen(msg));
    _exit(127);
  }
  close(fd);
  return pid;
}

// Runs fn(i) on one thread per engine and returns the root cause of a
// failure: the first error that is not a consequence of another's (a
// timeout or a vanished peer), else the first.
absl::Status OnEngines(const std::vector<int>& which,
                       const std::function<absl::Status(int)>& fn) {
  std::vector<absl::Status> st(which.size());
  std::vector<std::thread> threads;
  for (size_t k = 0; k < which.size(); ++k) {
    threads.emplace_back([&, k]() { st[k] = fn(which[k]); });
  }
  for (std::thread& t : threads) t.join();
  int first = -1;
  auto consequence = [](const absl::Status& s) {
    return absl::IsDeadlineExceeded(s) || absl::IsUnavailable(s) ||
           absl::IsAborted(s);
  };
  for (size_t k = 0; k < st.size(); ++k) {
    if (st[k].ok()) continue;
    if (first < 0 || (!consequence(st[k]) && consequence(st[first]))) {
      first = static_cast<int>(k);
    }
  }
  return first < 0 ? absl::OkStatus() : st[first];
}

}  // namespace

EngineSupervisor::EngineSupervisor(NodeGpus gpus, GpuCatalog catalog,
                                   EngineSupervisorConfig config)
    : gpus_(std::move(gpus)),
      catalog_(std::move(catalog)),
      config_(std::move(config)),
      shared_(std::make_unique<Shared>()) {}

absl::StatusOr<std::unique_ptr<EngineSupervisor>> EngineSupervisor::Start(
    NodeGpus gpus, GpuCatalog catalog, EngineSupervisorConfig config) {
  CHECK_GT(gpus.count, 0);
  // The engines are told it in whole MiB (ARACHNE_MIGRATION_STAGING_MIB).
  if (gpus.staging_bytes % kMiB != 0 ||
      gpus.staging_bytes < kMinMigrationStagingMib * kMiB ||
      gpus.staging_bytes > kMaxMigrationStagingMib * kMiB) {
    return absl::InvalidArgumentError(absl::StrCat(
        "migration_staging_mib: engine processes take a whole number of MiB "
        "in ",
        kMinMigrationStagingMib, "..", kMaxMigrationStagingMib, ", got ",
        gpus.staging_bytes, " bytes"));
  }
  if (config.command.empty() || config.command[0].empty()) {
    return absl::InvalidArgumentError("engine_command: required, got none");
  }
  if (access(config.command[0].c_str(), X_OK) != 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("engine_command: cannot execute \"", config.command[0],
                     "\": ", strerror(errno)));
  }
  std::unique_ptr<EngineSupervisor> s(new EngineSupervisor(
      std::move(gpus), std::move(catalog), std::move(config)));
  std::string socket_dir = s->config_.socket_dir;
  if (socket_dir.empty()) {
    const char* tmp = std::getenv("TMPDIR");
    std::string pattern = absl::StrCat(tmp != nullptr && *tmp ? tmp : "/tmp",
                                       "/arachne-engines-XXXXXX");
    if (mkdtemp(pattern.data()) == nullptr) {
      return absl::UnavailableError(
          absl::StrCat("cannot create the engines' socket directory ", pattern,
                       ": ", strerror(errno)));
    }
    socket_dir = pattern;
    s->config_.socket_dir = socket_dir;
    s->own_socket_dir_ = true;
  } else {
    std::error_code ec;
    std::filesystem::create_directories(socket_dir, ec);
    if (ec) {
      return absl::UnavailableError(absl::StrCat(
          "engine socket directory \"", socket_dir, "\": ", ec.message()));
    }
    chmod(socket_dir.c_str(), 0700);
  }
  s->log_dir_ = s->config_.log_dir.empty() ? socket_dir : s->config_.log_dir;
  {
    std::error_code ec;
    std::filesystem::create_directories(s->log_dir_, ec);
    if (ec) {
      return absl::UnavailableError(absl::StrCat(
          "log_dir: cannot create \"", s->log_dir_, "\": ", ec.message()));
    }
  }
  for (int i = 0; i < s->gpus_.count; ++i) {
    auto e = std::make_unique<Engine>();
    e->index = i;
    e->socket = absl::StrCat(socket_dir, "/engine-", i, ".sock");
    e->log = absl::StrCat(s->log_dir_, "/engine-", i, ".log");
    if (e->socket.size() > kMaxSocketPath) {
      return absl::InvalidArgumentError(
          absl::StrCat("engine socket path \"", e->socket,
                       "\" is longer than a Unix "
                       "socket allows (",
                       kMaxSocketPath, " characters)"));
    }
    s->engines_.push_back(std::move(e));
  }
  for (auto& e : s->engines_) {
    Engine* raw = e.get();
    e->keeper = std::thread([s = s.get(), raw]() { s->Keep(raw); });
  }
  // Every engine answers, or the first that cannot start says why.
  const absl::Time deadline =
      absl::Now() + s->config_.start_timeout + absl::Seconds(1);
  for (auto& e : s->engines_) {
    absl::MutexLock l(&e->mu);
    auto settled = [&e]() ABSL_SHARED_LOCKS_REQUIRED(e->mu) {
      return e->stub != nullptr || !e->start_error.empty();
    };
    e->mu.AwaitWithDeadline(absl::Condition(&settled), deadline);
    if (e->stub == nullptr) {
      return absl::UnavailableError(
          absl::StrCat("GPU ", e->index, "'s engine did not start: ",
                       e->start_error.empty() ? "no answer" : e->start_error));
    }
  }
  s->shared_->liveness = std::thread([s = s.get()]() { s->WatchLiveness(); });
  LOG(INFO) << "node " << s->gpus_.node << ": " << s->gpus_.count
            << " engine processes (" << s->config_.command[0] << "), logs in "
            << s->log_dir_;
  return s;
}

absl::Status EngineSupervisor::StartOnce(Engine* e) {
  EngineEnvironment env;
  env.socket = e->socket;
  env.node = gpus_.node;
  env.gpu_type = catalog_.type(gpus_.gpu_type).id;
  env.node_gpus = gpus_.count;
  env.local_rank = e->index;
  env.host = gpus_.host;
  env.virtual_gpus = gpus_.virtual_gpus;
  env.virtual_gpu_speed = gpus_.virtual_gpu_speed;
  env.migration_staging_mib = static_cast<int>(gpus_.staging_bytes / kMiB);
  env.profiles_dir = config_.profiles_dir;
  // The engines' own failpoints (the migration's); the agent keeps its own
  // (hang-status-while:, agent_config.h).
  if (absl::StartsWith(gpus_.failpoint, "corrupt-migration-")) {
    env.failpoint = gpus_.failpoint;
  }
  {
    std::ofstream log(e->log, std::ios::app);
    log << "--- arachne-agent: starting the engine of GPU " << e->index
        << " at " << absl::FormatTime(absl::Now()) << "\n";
  }
  absl::StatusOr<pid_t> pid =
      Spawn(config_.command, EngineEnvironmentVariables(env), e->log);
  if (!pid.ok()) return pid.status();
  auto channel = grpc::CreateChannel("unix:" + e->socket,
                                     grpc::InsecureChannelCredentials());
  auto stub = std::make_shared<v1::Engine::Stub>(channel);
  const absl::Time deadline = absl::Now() + config_.start_timeout;
  absl::Status why = absl::DeadlineExceededError(
      absl::StrCat("no answer to Describe within ",
                   absl::FormatDuration(config_.start_timeout)));
  while (absl::Now() < deadline) {
    int status = 0;
    if (waitpid(*pid, &status, WNOHANG) == *pid) {
      return absl::UnavailableError(absl::StrCat(
          "engine process ", *pid, " ", DescribeExit(status),
          " while starting; its log (", e->log, "): ", LogTail(e->log)));
    }
    grpc::ClientContext ctx;
    ctx.set_wait_for_ready(true);
    ctx.set_deadline(absl::ToChronoTime(absl::Now() + absl::Milliseconds(500)));
    v1::DescribeRequest req;
    req.set_protocol_version(kEngineProtocolVersion);
    v1::DescribeResponse resp;
    grpc::Status st = stub->Describe(&ctx, req, &resp);
    if (st.ok() && resp.protocol_version() == kEngineProtocolVersion) {
      absl::MutexLock l(&e->mu);
      e->pid = *pid;
      e->stub = std::move(stub);
      e->fresh = true;
      e->prepared = 0;
      e->kill_reason.clear();
      e->start_error.clear();
      e->last_answer = absl::Now();
      ++e->starts;
      LOG(INFO) << "node " << gpus_.node << " GPU " << e->index
                << ": engine pid " << *pid << " (" << resp.engine() << ", "
                << resp.device() << ") ready";
      return absl::OkStatus();
    }
    if (st.ok() || st.error_code() == grpc::StatusCode::FAILED_PRECONDITION) {
      why = st.ok() ? absl::FailedPreconditionError(
                          absl::StrCat("the engine speaks protocol version ",
                                       resp.protocol_version(), ", this agent ",
                                       kEngineProtocolVersion))
                    : FromGrpcStatus(st);
      break;
    }
  }
  kill(*pid, SIGKILL);
  waitpid(*pid, nullptr, 0);
  return absl::Status(
      why.code(), absl::StrCat("engine process ", *pid, ": ", why.message()));
}

void EngineSupervisor::Keep(Engine* e) {
  absl::Duration backoff = absl::Milliseconds(200);
  for (;;) {
    {
      absl::MutexLock l(&shared_->mu);
      if (shared_->stopping) return;
    }
    if (absl::Status s = StartOnce(e); !s.ok()) {
      LOG(ERROR) << "node " << gpus_.node << " GPU " << e->index << ": " << s;
      {
        absl::MutexLock l(&e->mu);
        e->start_error = std::string(s.message());
      }
      absl::MutexLock l(&shared_->mu);
      auto stopping = [this]() ABSL_SHARED_LOCKS_REQUIRED(shared_->mu) {
        return shared_->stopping;
      };
      shared_->mu.AwaitWithTimeout(absl::Condition(&stopping), backoff);
      backoff = std::min(backoff * 2, absl::Seconds(10));
      continue;
    }
    backoff = absl::Milliseconds(200);
    pid_t pid;
    {
      absl::MutexLock l(&e->mu);
      pid = e->pid;
    }
    int status = 0;
    while (waitpid(pid, &status, 0) < 0 && errno == EINTR) {
    }
    bool stopping;
    {
      absl::MutexLock l(&shared_->mu);
      stopping = shared_->stopping;
    }
    absl::MutexLock l(&e->mu);
    const std::string how =
        e->kill_reason.empty()
            ? DescribeExit(status)
            : absl::StrCat(e->kill_reason, ", and so was killed by the agent");
    e->pid = 0;
    e->stub.reset();
    e->prepared = 0;  // what it prepared died with it
    if (stopping) return;
    // Its state is gone. An engine that held none (it never joined a
    // committed generation) loses nothing, but its GPU's state is still
    // what an earlier death left.
    if (!e->fresh) e->lost = true;
    e->lost_error = absl::StrCat("engine process ", pid, " (GPU ", e->index,
                                 ") ", how, "; its log: ", e->log);
    LOG(ERROR) << "node " << gpus_.node << ": " << e->lost_error
               << "; starting a fresh engine";
  }
}

void EngineSupervisor::WatchLiveness() {
  for (;;) {
    {
      absl::MutexLock l(&shared_->mu);
      auto stopping = [this]() ABSL_SHARED_LOCKS_REQUIRED(shared_->mu) {
        return shared_->stopping;
      };
      if (shared_->mu.AwaitWithTimeout(absl::Condition(&stopping),
                                       absl::Seconds(1))) {
        return;
      }
    }
    for (auto& e : engines_) {
      std::shared_ptr<v1::Engine::Stub> stub;
      {
        absl::MutexLock l(&e->mu);
        stub = e->stub;
      }
      if (stub == nullptr) continue;
      grpc::ClientContext ctx;
      ctx.set_deadline(
          absl::ToChronoTime(absl::Now() + config_.status_timeout));
      v1::StatusResponse resp;
      const grpc::Status st = stub->Status(&ctx, v1::StatusRequest(), &resp);
      absl::MutexLock l(&e->mu);
      if (e->stub != stub) continue;  // restarted meanwhile
      const absl::Time now = absl::Now();
      if (st.ok()) {
        e->last_answer = now;
      } else if (now - e->last_answer > config_.hang_timeout && e->pid > 0 &&
                 e->kill_reason.empty()) {
        e->kill_reason =
            absl::StrCat("did not answer for ",
                         absl::FormatDuration(absl::Trunc(now - e->last_answer,
                                                          absl::Seconds(1))));
        LOG(ERROR) << "node " << gpus_.node << " GPU " << e->index
                   << ": engine pid " << e->pid << " " << e->kill_reason
                   << ": killing it";
        kill(e->pid, SIGKILL);
      }
    }
  }
}

EngineSupervisor::~EngineSupervisor() {
  {
    absl::MutexLock l(&shared_->mu);
    shared_->stopping = true;
  }
  if (shared_->liveness.joinable()) shared_->liveness.join();
  for (auto& e : engines_) {
    absl::MutexLock l(&e->mu);
    if (e->pid > 0) kill(e->pid, SIGTERM);
  }
  // The keepers reap them; past the grace period they are killed.
  const absl::Time deadline = absl::Now() + config_.stop_grace;
  for (auto& e : engines_) {
    absl::MutexLock l(&e->mu);
    auto gone = [&e]()
                    ABSL_SHARED_LOCKS_REQUIRED(e->mu) { return e->pid == 0; };
    if (!e->mu.AwaitWithDeadline(absl::Condition(&gone), deadline) &&
        e->pid > 0) {
      LOG(WARNING) << "GPU " << e->index << "'s engine pid " << e->pid
                   << " did not stop within "
                   << absl::FormatDuration(config_.stop_grace)
                   << ": killing it";
      kill(e->pid, SIGKILL);
    }
  }
  for (auto& e : engines_) {
    if (e->keeper.joinable()) e->keeper.join();
  }
  if (own_socket_dir_) {
    std::error_code ec;
    for (auto& e : engines_) std::filesystem::remove(e->socket, ec);
    std::filesystem::remove(config_.socket_dir, ec);
  }
}

int64_t EngineSupervisor::EnginePid(int index) const {
  CHECK_GE(index, 0);
  CHECK_LT(index, static_cast<int>(engines_.size()));
  absl::MutexLock l(&engines_[index]->mu);
  return engines_[index]->pid;
}

template <typename Method, typename Request, typename Response>
absl::Status EngineSupervisor::Call(Engine& e, const char* name, Method method,
                                    const Request& request, Response* response,
                                    absl::Duration deadline) const {
  std::shared_ptr<v1::Engine::Stub> stub;
  std::string unavailable;
  {
    absl::MutexLock l(&e.mu);
    if (e.stub == nullptr && std::string_view(name) != "Status") {
      // Being restarted (its predecessor died moments ago): a phase waits
      // for the fresh engine, which takes part as a joiner, rather than
      // fail the whole switch; Status answers at once.
      auto running = [&e]() ABSL_SHARED_LOCKS_REQUIRED(e.mu) {
        return e.stub != nullptr;
      };
      e.mu.AwaitWithTimeout(absl::Condition(&running),
                            std::min(deadline, config_.start_timeout));
    }
    stub = e.stub;
    unavailable = e.lost_error.empty() ? e.start_error : e.lost_error;
  }
  if (stub == nullptr) {
    return absl::UnavailableError(absl::StrCat(
        "GPU ", e.index, ": no engine running (", unavailable, ")"));
  }
  grpc::ClientContext ctx;
  const absl::Time until = absl::Now() + deadline;
  ctx.set_deadline(absl::ToChronoTime(until));
  const grpc::Status st = ((*stub).*method)(&ctx, request, response);
  if (st.error_code() == grpc::StatusCode::DEADLINE_EXCEEDED &&
      absl::Now() >= until && std::string_view(name) != "Status") {
    // Our deadline, not the engine's answer: it hung in the call.
    absl::MutexLock l(&e.mu);
    if (e.stub == stub && e.pid > 0 && e.kill_reason.empty()) {
      e.kill_reason = absl::StrCat("hung in ", name, " past its deadline (",
                                   absl::FormatDuration(deadline), ")");
      LOG(ERROR) << "node " << gpus_.node << " GPU " << e.index
                 << ": engine pid " << e.pid << " " << e.kill_reason
                 << ": killing it";
      kill(e.pid, SIGKILL);
    }
  }
  return FromGrpcStatus(st, absl::StrCat("GPU ", e.index));
}

std::vector<int> EngineSupervisor::AllEngines() const {
  std::vector<int> all(engines_.size());
  for (size_t i = 0; i < all.size(); ++i) all[i] = static_cast<int>(i);
  return all;
}

std::vector<int> EngineSupervisor::Holders() const {
  std::vector<int> holders;
  for (const auto& e : engines_) {
    absl::MutexLock l(&e->mu);
    if (!e->fresh) holders.push_back(e->index);
  }
  return holders;
}

absl::StatusOr<PrepareResult> EngineSupervisor::Prepare(
    const PrepareArgs& args) {
  v1::PrepareRequest request = PrepareRequestFromArgs(args, catalog_);
  // The plan's layout for the engines (PrepareRequest.layout), from the
  // state they describe, so an engine need not compute layouts.
  absl::StatusOr<StateDescription> described = DescribeState(args.job);
  if (!described.ok()) return described.status();
  absl::StatusOr<migration::PlanLayout> layout =
      migration::PlanLayout::Create(described->state, args.plan, args.cluster);
  if (!layout.ok()) return layout.status();
  PlanLayoutToProto(*layout, request.mutable_layout());
  // The migration, computed once here and sent to each engine as its share
  // (PrepareRequest.migration), so an engine need not compute diffs or
  // schedules; the same deterministic diff and schedule every rank of the
  // switch computes.
  std::optional<migration::MigrationWorld> world;
  std::optional<migration::StateDiff> diff;
  std::optional<migration::MigrationSchedule> schedule;
  if (args.old_plan.has_value() && args.checkpoint_dir.empty()) {
    world.emplace(args.cluster, catalog_);
    migration::DiffOptions options;
    options.lost = args.lost;
    absl::StatusOr<migration::StateDiff> d = migration::ComputeDiff(
        described->state, *args.old_plan, *args.old_cluster, args.plan,
        args.cluster, *world, options);
    if (!d.ok()) return d.status();  // a byte without a holder
    diff = *std::move(d);
    schedule = migration::BuildSchedule(*diff, *world);
  }
  std::vector<v1::PrepareResponse> answers(engines_.size());
  const std::vector<int> all = AllEngines();
  absl::Status s = OnEngines(all, [&](int i) {
    Engine& e = *engines_[i];
    v1::PrepareRequest mine;
    const v1::PrepareRequest* to_send = &request;
    if (diff.has_value()) {
      const int rank = world->RankOf({gpus_.node, e.index});
      if (rank >= 0) {
        mine = request;
        RankMigrationToProto(*diff, *schedule, rank, mine.mutable_migration());
        to_send = &mine;
      }
    }
    absl::Status st = Call(e, "Prepare", &v1::Engine::Stub::Prepare, *to_send,
                           &answers[i], config_.call_timeout);
    if (st.ok()) {
      absl::MutexLock l(&e.mu);
      e.prepared = args.generation;
    }
    return st;
  });
  if (!s.ok()) return s;
  PrepareResult result;
  for (const v1::PrepareResponse& a : answers) {
    const PrepareResult r = PrepareResultFromProto(a);
    result.bytes_to_receive += r.bytes_to_receive;
    result.bytes_to_send += r.bytes_to_send;
    result.bytes_kept += r.bytes_kept;
    result.estimated_seconds =
        std::max(result.estimated_seconds, r.estimated_seconds);
  }
  // The schedule computed here is the estimate whatever an engine answers
  // (an engine given its share need not price it; arachne_torch does not).
  if (schedule.has_value()) {
    result.estimated_seconds =
        std::max(result.estimated_seconds, schedule->makespan_s);
  }
  return result;
}

absl::StatusOr<int64_t> EngineSupervisor::Pause(int64_t generation,
                                                int64_t at_iteration,
                                                absl::Duration timeout) {
  // Only engines with a current generation have something to pause.
  const std::vector<int> holders = Holders();
  if (holders.empty()) {
    // Every engine is fresh (their predecessors died): nothing trains here,
    // so the node is paused; the iteration comes from the plan's other
    // ranks (0, as for a node outside the current plan).
    return 0;
  }
  v1::PauseRequest request;
  request.set_generation(generation);
  request.set_at_iteration(at_iteration);
  request.set_timeout_s(absl::ToDoubleSeconds(timeout));
  std::vector<v1::PauseResponse> answers(engines_.size());
  absl::Status s = OnEngines(holders, [&](int i) {
    return Call(*engines_[i], "Pause", &v1::Engine::Stub::Pause, request,
                &answers[i], timeout + config_.phase_margin);
  });
  if (!s.ok()) return s;
  // Engines outside the current plan answer 0; the plan's must agree.
  int64_t it = -1;
  for (int i : holders) {
    v1::StatusResponse st;
    if (absl::Status q = Call(*engines_[i], "Status", &v1::Engine::Stub::Status,
                              v1::StatusRequest(), &st, config_.status_timeout);
        !q.ok()) {
      return q;
    }
    if (st.ranks_size() != 1 || !st.ranks(0).in_plan()) continue;
    if (it >= 0 && answers[i].iteration() != it) {
      return absl::FailedPreconditionError(
          absl::StrCat("node ", gpus_.node, ": ranks stopped at iterations ",
                       it, " and ", answers[i].iteration(),
                       "; their states do not belong to one iteration"));
    }
    it = answers[i].iteration();
  }
  return std::max<int64_t>(it, 0);
}

absl::Status EngineSupervisor::Migrate(int64_t generation, int stage,
                                       absl::Duration timeout,
                                       absl::Duration round_timeout) {
  v1::MigrateRequest request;
  request.set_generation(generation);
  request.set_stage(stage);
  request.set_timeout_s(absl::ToDoubleSeconds(timeout));
  request.set_round_timeout_s(absl::ToDoubleSeconds(round_timeout));
  const std::vector<int> all = AllEngines();
  return OnEngines(all, [&](int i) {
    v1::MigrateResponse r;
    return Call(*engines_[i], "Migrate", &v1::Engine::Stub::Migrate, request,
                &r, timeout + config_.phase_margin);
  });
}

absl::Status EngineSupervisor::Rebuild(int64_t generation,
                                       absl::Duration timeout) {
  v1::RebuildRequest request;
  request.set_generation(generation);
  request.set_timeout_s(absl::ToDoubleSeconds(timeout));
  const std::vector<int> all = AllEngines();
  return OnEngines(all, [&](int i) {
    v1::RebuildResponse r;
    return Call(*engines_[i], "Rebuild", &v1::Engine::Stub::Rebuild, request,
                &r, timeout + config_.phase_margin);
  });
}

absl::Status EngineSupervisor::Commit(int64_t generation) {
  v1::CommitRequest request;
  request.set_generation(generation);
  const std::vector<int> all = AllEngines();
  return OnEngines(all, [&](int i) {
    Engine& e = *engines_[i];
    v1::CommitResponse r;
    absl::Status st = Call(e, "Commit", &v1::Engine::Stub::Commit, request, &r,
                           config_.call_timeout);
    if (st.ok()) {
      // It holds the committed generation (or, outside its plan, nothing
      // that a later switch could miss): no longer fresh, no longer lost.
      absl::MutexLock l(&e.mu);
      e.fresh = false;
      e.prepared = 0;
      e.lost = false;
      e.lost_error.clear();
    }
    return st;
  });
}

absl::Status EngineSupervisor::Resume(int64_t generation, int64_t run_until) {
  v1::ResumeRequest request;
  request.set_generation(generation);
  request.set_run_until(run_until);
  const std::vector<int> holders = Holders();
  if (holders.empty()) {
    return absl::FailedPreconditionError(
        absl::StrCat("generation ", generation, " is not current on node ",
                     gpus_.node, " (no engine holds a generation)"));
  }
  return OnEngines(holders, [&](int i) {
    v1::ResumeResponse r;
    return Call(*engines_[i], "Resume", &v1::Engine::Stub::Resume, request, &r,
                config_.call_timeout);
  });
}

absl::Status EngineSupervisor::Abort(int64_t generation) {
  v1::AbortRequest request;
  request.set_generation(generation);
  const std::vector<int> all = AllEngines();
  absl::Status s = OnEngines(all, [&](int i) {
    Engine& e = *engines_[i];
    v1::AbortResponse r;
    absl::Status one = Call(e, "Abort", &v1::Engine::Stub::Abort, request, &r,
                            config_.call_timeout);
    absl::MutexLock l(&e.mu);
    // An engine started since the Prepare (its predecessor died) never
    // saw this generation, and one that is dead (its socket refuses) or
    // was just killed for hanging took it along: nothing to drop there.
    if (!one.ok() &&
        (absl::IsUnavailable(one) || absl::IsDeadlineExceeded(one) ||
         (absl::IsFailedPrecondition(one) && e.prepared != generation))) {
      LOG(WARNING) << "node " << gpus_.node << ": Abort(g" << generation
                   << ") on GPU " << e.index
                   << " found nothing to drop: " << one;
      return absl::OkStatus();
    }
    if (one.ok()) e.prepared = 0;
    return one;
  });
  return s;
}

absl::Status EngineSupervisor::SaveCheckpoint(int64_t generation,
                                              const std::string& dir) {
  v1::SaveCheckpointRequest request;
  request.set_generation(generation);
  request.set_dir(dir);
  const std::vector<int> holders = Holders();
  return OnEngines(holders, [&](int i) {
    v1::SaveCheckpointResponse r;
    return Call(*engines_[i], "SaveCheckpoint",
                &v1::Engine::Stub::SaveCheckpoint, request, &r,
                config_.call_timeout);
  });
}

absl::StatusOr<StateDescription> EngineSupervisor::DescribeState(
    const JobSpec& job) const {
  v1::DescribeRequest request;
  request.set_protocol_version(kEngineProtocolVersion);
  SetJob(job, &request);
  absl::Status last = absl::UnavailableError("no engine");
  for (const auto& e : engines_) {
    v1::DescribeResponse response;
    last = Call(*e, "Describe", &v1::Engine::Stub::Describe, request, &response,
                config_.call_timeout);
    if (absl::IsUnavailable(last)) continue;  // being restarted: the next
    if (!last.ok()) return last;
    absl::StatusOr<migration::ModelState> state =
        ModelStateFromProto(job.model, response.tensors());
    if (!state.ok()) {
      return absl::Status(state.status().code(),
                          absl::StrCat("GPU ", e->index, "'s engine (",
                                       response.engine(), ") described ",
                                       state.status().message()));
    }
    return StateDescription{.engine = response.engine(),
                            .state = *std::move(state)};
  }
  return last;
}

NodeStatus EngineSupervisor::Status() const {
  const int n = static_cast<int>(engines_.size());
  std::vector<absl::StatusOr<NodeStatus>> answers(n, absl::UnknownError(""));
  std::vector<int64_t> pids(n, 0);
  (void)OnEngines(AllEngines(), [&](int i) {
    Engine& e = *engines_[i];
    v1::StatusResponse resp;
    v1::StatusRequest req;
    {
      absl::MutexLock l(&e.mu);
      pids[i] = e.pid;
    }
    const absl::Status st = Call(e, "Status", &v1::Engine::Stub::Status, req,
                                 &resp, config_.status_timeout);
    answers[i] =
        st.ok() ? NodeStatusFromProto(resp) : absl::StatusOr<NodeStatus>(st);
    return absl::OkStatus();
  });
  NodeStatus out;
  bool any_failed = false;
  std::optional<Phase> holder_phase, any_phase;
  for (int i = 0; i < n; ++i) {
    Engine& e = *engines_[i];
    bool fresh, lost;
    std::string lost_error;
    {
      absl::MutexLock l(&e.mu);
      fresh = e.fresh;
      lost = e.lost;
      lost_error = e.lost_error;
    }
    RankStatus rank;
    rank.gpu = {gpus_.node, i};
    if (answers[i].ok() && answers[i]->ranks.size() == 1) {
      const NodeStatus& st = *answers[i];
      rank = st.ranks[0];
      out.current_generation =
          std::max(out.current_generation, st.current_generation);
      out.prepared_generation =
          std::max(out.prepared_generation, st.prepared_generation);
      if (!fresh && rank.in_plan && rank.iteration >= out.iteration) {
        out.iteration = rank.iteration;
        out.loss = rank.loss;
      }
      if (st.phase == Phase::kFailed) any_failed = true;
      if (!any_phase) any_phase = st.phase;
      if (!fresh && !holder_phase) holder_phase = st.phase;
      auto merge = [](PhaseTiming& into, const PhaseTiming& t) {
        into.seconds = std::max(into.seconds, t.seconds);
        into.bytes_sent += t.bytes_sent;
        into.bytes_received += t.bytes_received;
      };
      merge(out.pause, st.pause);
      merge(out.stage1, st.stage1);
      merge(out.stage2, st.stage2);
      merge(out.rebuild_groups, st.rebuild_groups);
      merge(out.rebuild_engines, st.rebuild_engines);
      merge(out.resume, st.resume);
    } else {
      any_failed = true;
      rank.error = answers[i].ok()
                       ? absl::StrCat("GPU ", i, ": the engine reported ",
                                      answers[i]->ranks.size(), " ranks, not 1")
                       : std::string(answers[i].status().message());
    }
    rank.engine_pid = pids[i];
    if (lost) {
      rank.lost = true;
      rank.in_plan = false;
      rank.error = lost_error;
      any_failed = true;
    }
    out.ranks.push_back(std::move(rank));
  }
  out.phase = any_failed && out.prepared_generation == 0
                  ? Phase::kFailed
                  : holder_phase.value_or(any_phase.value_or(Phase::kFailed));
  return out;
}

}  // namespace arachne::agent
