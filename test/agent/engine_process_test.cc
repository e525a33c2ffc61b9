// Engines as processes (docs/engines.md), end to end on 127.0.0.1:
//   - the engine protocol's conformance suite, run against an
//     arachne-engine process over its Unix socket: Describe, every phase in
//     order, calls out of order or for a stale generation, another protocol
//     version;
//   - faults of one engine process under a real arachne-agent: kill -9
//     while the ranks are stopped, mid-iteration, and in each phase of a
//     switch, and SIGSTOP past the hang timeout. Each time the agent stays
//     up, reports exactly that rank lost, and a recovery switch rebuilds its
//     state from the surviving replica, bit for bit.
#include <fcntl.h>
#include <signal.h>
#include <spawn.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cmath>
#include <filesystem>
#include <memory>
#include <string>
#include <vector>

#include "arachne/v1/engine.grpc.pb.h"
#include "gmock/gmock.h"
#include "grpcpp/grpcpp.h"
#include "gtest/gtest.h"
#include "planner_service/io/plan_io.h"
#include "test/agent/agent_harness.h"
#include "worker_agent/agent_proto_convert.h"
#include "worker_agent/engine_launch.h"

extern char** environ;

namespace arachne::agent {
namespace {

using testing::Driver;
using ::testing::HasSubstr;
using testing::MakeTemplate;
using testing::NamedCluster;
using testing::RunPlan;
using testing::SwitchStep;
using testing::TinyJob;

std::string TempDir(const std::string& name) {
  // Short: a Unix socket path has at most 107 characters.
  std::string d = absl::StrCat("/tmp/arachne-ep-", name, "-", getpid());
  std::filesystem::remove_all(d);
  std::filesystem::create_directories(d);
  return d;
}

std::string EngineBinary() {
  return std::string(ARACHNE_BINARY_DIR) + "/worker_agent/arachne-engine";
}

// ---- the protocol, against one arachne-engine process ----

class EngineConformance : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = TempDir("conf");
    socket_ = dir_ + "/e.sock";
    EngineEnvironment env;
    env.socket = socket_;
    env.node = "n0";
    env.gpu_type = "A6000";
    env.node_gpus = 1;
    env.local_rank = 0;
    std::vector<std::string> vars = EngineEnvironmentVariables(env);
    for (char** e = environ; *e != nullptr; ++e) vars.push_back(*e);
    std::vector<char*> envp;
    for (std::string& v : vars) envp.push_back(v.data());
    envp.push_back(nullptr);
    std::string bin = EngineBinary();
    char* argv[] = {bin.data(), nullptr};
    posix_spawn_file_actions_t fa;
    posix_spawn_file_actions_init(&fa);
    const std::string log = dir_ + "/engine.log";
    posix_spawn_file_actions_addopen(&fa, 1, log.c_str(),
                                     O_WRONLY | O_CREAT | O_TRUNC, 0644);
    posix_spawn_file_actions_adddup2(&fa, 1, 2);
    ASSERT_EQ(posix_spawn(&pid_, bin.c_str(), &fa, nullptr, argv, envp.data()),
              0);
    posix_spawn_file_actions_destroy(&fa);
    stub_ = v1::Engine::NewStub(grpc::CreateChannel(
        "unix:" + socket_, grpc::InsecureChannelCredentials()));
    grpc::ClientContext ctx;
    ctx.set_wait_for_ready(true);
    ctx.set_deadline(std::chrono::system_clock::now() +
                     std::chrono::seconds(30));
    v1::DescribeRequest req;
    req.set_protocol_version(1);
    v1::DescribeResponse resp;
    grpc::Status st = stub_->Describe(&ctx, req, &resp);
    ASSERT_TRUE(st.ok()) << st.error_message();
  }
  void TearDown() override {
    if (pid_ > 0) {
      kill(pid_, SIGTERM);
      int status = 0;
      waitpid(pid_, &status, 0);
      EXPECT_TRUE(WIFEXITED(status) && WEXITSTATUS(status) == 0)
          << "arachne-engine did not stop cleanly on SIGTERM: " << status;
    }
    std::filesystem::remove_all(dir_);
  }

  template <typename Method, typename Request, typename Response>
  grpc::Status Call(Method method, const Request& request, Response* response) {
    grpc::ClientContext ctx;
    ctx.set_deadline(std::chrono::system_clock::now() +
                     std::chrono::seconds(60));
    return ((*stub_).*method)(&ctx, request, response);
  }

  // Generation `g` of a one-GPU plan on node n0.
  v1::PrepareRequest Prepare(int64_t g, bool with_old) {
    PrepareArgs args;
    args.generation = g;
    args.job = TinyJob();
    args.cluster = NamedCluster({{"n0", 1}});
    int next = 0;
    args.plan = Plan{
        {MakeTemplate({{1, 0, args.job.model.num_layers}}, 1, 4, 4, 0, &next)}};
    if (with_old) {
      args.old_cluster = args.cluster;
      args.old_plan = args.plan;
    }
    args.store_address = store_->address();
    return PrepareRequestFromArgs(args, testing::Catalog());
  }

  std::string dir_, socket_;
  pid_t pid_ = -1;
  std::unique_ptr<v1::Engine::Stub> stub_;
  std::unique_ptr<JobStoreServer> store_ =
      *JobStoreServer::Start("127.0.0.1", 0);
};

TEST_F(EngineConformance, DescribeAnswersItsVersionDeviceAndTheJobsLayout) {
  v1::DescribeRequest req;
  req.set_protocol_version(1);
  v1::DescribeResponse resp;
  ASSERT_TRUE(Call(&v1::Engine::Stub::Describe, req, &resp).ok());
  EXPECT_EQ(resp.protocol_version(), 1u);
  EXPECT_EQ(resp.node(), "n0");
  EXPECT_EQ(resp.local_rank(), 0);
  EXPECT_EQ(resp.node_gpus(), 1);
  EXPECT_EQ(resp.device(), "cpu");
  EXPECT_EQ(resp.pid(), pid_);
  EXPECT_GT(resp.memory_used_bytes(), 0);
  EXPECT_GT(resp.memory_free_bytes(), 0);
  EXPECT_EQ(resp.tensors_size(), 0);  // no job named

  // With a job: its state in the canonical layout, tensor for tensor.
  const PrepareArgs args =
      *PrepareArgsFromProto(Prepare(1, false), testing::Catalog(), {});
  *req.mutable_model_spec() = Prepare(1, false).model_spec();
  *req.mutable_training() = Prepare(1, false).training();
  *req.mutable_engine() = Prepare(1, false).engine();
  ASSERT_TRUE(Call(&v1::Engine::Stub::Describe, req, &resp).ok());
  const migration::ModelState state = *ReferenceModelState(args.job);
  ASSERT_EQ(resp.tensors_size(), state.num_tensors());
  for (int i = 0; i < state.num_tensors(); ++i) {
    const migration::TensorSpec& t = state.tensor(i);
    const v1::TensorDescription& d = resp.tensors(i);
    EXPECT_EQ(d.name(), t.name);
    EXPECT_EQ(d.kind(), migration::StateKindName(t.kind));
    EXPECT_EQ(d.bytes_per_element(), migration::BytesPerElement(t.kind));
    EXPECT_EQ(d.layer(), t.layer);
    EXPECT_EQ(d.expert(), t.expert);
    EXPECT_EQ(std::vector<int64_t>(d.shape().begin(), d.shape().end()),
              t.shape);
  }
  EXPECT_EQ(resp.tensors(0).tp_split(), "column");  // the embedding's rows
  EXPECT_EQ(resp.tensors(state.num_tensors() - 1).name(),
            "train_state:scalars");
}

TEST_F(EngineConformance, AnotherProtocolVersionIsRefusedNamingBoth) {
  for (uint32_t v : {0u, 2u}) {
    v1::DescribeRequest req;
    req.set_protocol_version(v);
    v1::DescribeResponse resp;
    grpc::Status st = Call(&v1::Engine::Stub::Describe, req, &resp);
    EXPECT_EQ(st.error_code(), grpc::StatusCode::FAILED_PRECONDITION);
    EXPECT_EQ(st.error_message(),
              absl::StrCat("protocol_version: the caller speaks engine "
                           "protocol version ",
                           v, ", this engine (arachne-engine) speaks 1"));
    EXPECT_EQ(resp.protocol_version(), 0u);
  }
}

TEST_F(EngineConformance, EveryPhaseInOrderTrainsAndCheckpoints) {
  v1::PrepareResponse prepared;
  ASSERT_TRUE(
      Call(&v1::Engine::Stub::Prepare, Prepare(1, false), &prepared).ok());
  v1::RebuildRequest rebuild;
  rebuild.set_generation(1);
  v1::RebuildResponse rebuilt;
  ASSERT_TRUE(Call(&v1::Engine::Stub::Rebuild, rebuild, &rebuilt).ok());
  v1::CommitRequest commit;
  commit.set_generation(1);
  v1::CommitResponse committed;
  ASSERT_TRUE(Call(&v1::Engine::Stub::Commit, commit, &committed).ok());
  // Train (Resume) two iterations.
  v1::ResumeRequest resume;
  resume.set_generation(1);
  resume.set_run_until(2);
  v1::ResumeResponse resumed;
  ASSERT_TRUE(Call(&v1::Engine::Stub::Resume, resume, &resumed).ok());
  v1::StatusResponse st;
  const absl::Time deadline = absl::Now() + absl::Seconds(30);
  do {
    ASSERT_TRUE(Call(&v1::Engine::Stub::Status, v1::StatusRequest(), &st).ok());
    if (st.iteration() >= 2) break;
    absl::SleepFor(absl::Milliseconds(20));
  } while (absl::Now() < deadline);
  EXPECT_EQ(st.current_generation(), 1);
  EXPECT_EQ(st.iteration(), 2);
  ASSERT_EQ(st.ranks_size(), 1);
  EXPECT_TRUE(st.ranks(0).in_plan());
  EXPECT_EQ(st.ranks(0).error(), "");
  // The same losses as the reference engine in this process.
  auto reference =
      RunPlan(TinyJob(),
              *PlanFromMessage(Prepare(1, false).plan().templates(),
                               NamedCluster({{"n0", 1}}), testing::Catalog(),
                               "", "plan"),
              NamedCluster({{"n0", 1}}), 2);
  ASSERT_TRUE(reference.ok()) << reference.status();
  EXPECT_EQ(st.loss(), reference->losses[1]);
  // Checkpoint save, in the canonical layout: the reference's state.
  v1::SaveCheckpointRequest save;
  save.set_generation(1);
  save.set_dir(dir_ + "/ckpt");
  v1::SaveCheckpointResponse saved;
  ASSERT_TRUE(Call(&v1::Engine::Stub::SaveCheckpoint, save, &saved).ok());
  absl::StatusOr<FullState> ckpt =
      ReadCheckpoint(dir_ + "/ckpt", *ReferenceModelState(TinyJob()));
  ASSERT_TRUE(ckpt.ok()) << ckpt.status();
  EXPECT_TRUE(*ckpt == reference->state);
}

TEST_F(EngineConformance, OutOfOrderAndStaleCallsAreRefusedWithTheirCode) {
  auto code = [](const grpc::Status& s) { return s.error_code(); };
  v1::PauseRequest pause;
  pause.set_generation(1);
  v1::PauseResponse paused;
  grpc::Status s = Call(&v1::Engine::Stub::Pause, pause, &paused);
  EXPECT_EQ(code(s), grpc::StatusCode::FAILED_PRECONDITION);
  EXPECT_EQ(s.error_message(),
            "generation 1 is not prepared on node n0 (current 0, prepared 0)");
  v1::MigrateRequest migrate;
  migrate.set_generation(1);
  migrate.set_stage(1);
  v1::MigrateResponse migrated;
  EXPECT_EQ(code(Call(&v1::Engine::Stub::Migrate, migrate, &migrated)),
            grpc::StatusCode::FAILED_PRECONDITION);
  v1::CommitRequest commit;
  commit.set_generation(1);
  v1::CommitResponse committed;
  EXPECT_EQ(code(Call(&v1::Engine::Stub::Commit, commit, &committed)),
            grpc::StatusCode::FAILED_PRECONDITION);
  v1::ResumeRequest resume;
  resume.set_generation(1);
  v1::ResumeResponse resumed;
  s = Call(&v1::Engine::Stub::Resume, resume, &resumed);
  EXPECT_EQ(code(s), grpc::StatusCode::FAILED_PRECONDITION);
  EXPECT_EQ(s.error_message(),
            "generation 1 is not current on node n0 (current 0)");

  // Prepared: committing before rebuilding is out of order.
  v1::PrepareResponse prepared;
  ASSERT_TRUE(
      Call(&v1::Engine::Stub::Prepare, Prepare(1, false), &prepared).ok());
  s = Call(&v1::Engine::Stub::Commit, commit, &committed);
  EXPECT_EQ(code(s), grpc::StatusCode::FAILED_PRECONDITION);
  EXPECT_EQ(s.error_message(),
            "node n0: generation 1 is not rebuilt (phase prepared)");
  // Another generation while 1 is prepared.
  s = Call(&v1::Engine::Stub::Prepare, Prepare(2, true), &prepared);
  EXPECT_EQ(code(s), grpc::StatusCode::FAILED_PRECONDITION);
  EXPECT_EQ(s.error_message(),
            "generation 1 is being prepared on node n0; abort it before "
            "preparing generation 2");
  v1::RebuildRequest rebuild;
  rebuild.set_generation(1);
  v1::RebuildResponse rebuilt;
  ASSERT_TRUE(Call(&v1::Engine::Stub::Rebuild, rebuild, &rebuilt).ok());
  ASSERT_TRUE(Call(&v1::Engine::Stub::Commit, commit, &committed).ok());
  // Stale: generation 1 again, once it is current.
  s = Call(&v1::Engine::Stub::Prepare, Prepare(1, false), &prepared);
  EXPECT_EQ(code(s), grpc::StatusCode::FAILED_PRECONDITION);
  EXPECT_EQ(s.error_message(),
            "generation 1 is not newer than node n0's current generation 1 "
            "(last aborted 0)");
  // A malformed request is INVALID_ARGUMENT naming the field.
  migrate.set_stage(3);
  s = Call(&v1::Engine::Stub::Migrate, migrate, &migrated);
  EXPECT_EQ(code(s), grpc::StatusCode::INVALID_ARGUMENT);
  EXPECT_EQ(s.error_message(), "stage: must be 1 or 2, got 3");
}

// ---- faults of one engine under arachne-agent ----

// PP 2 x DP 2 on nodes a, b (2 GPUs each): stage 0 on a, stage 1 on b;
// replica r on GPU r of each node, so every GPU's state has a replica.
Template PlaceAB() {
  int next = 0;
  Template t = MakeTemplate({{1, 0, 2}, {1, 2, 4}}, 2, 2, 8, 0, &next);
  const std::vector<std::pair<int, int>> slots = {
      {0, 0}, {1, 0}, {0, 1}, {1, 1}};
  for (size_t k = 0; k < t.placement.size(); ++k) {
    t.placement[k].node = slots[k].first;
    t.placement[k].gpus = {slots[k].second};
  }
  return t;
}

// The status of GPU `index` of `agent`.
absl::StatusOr<RankStatus> Rank(testing::AgentProcess& agent, int index) {
  absl::StatusOr<NodeStatus> st = agent.client().Status();
  if (!st.ok()) return st.status();
  for (const RankStatus& r : st->ranks) {
    if (r.gpu.index == index) return r;
  }
  return absl::NotFoundError("no such rank");
}

// Waits until GPU `index` of `agent` is reported lost; its status then.
absl::StatusOr<RankStatus> AwaitLost(testing::AgentProcess& agent, int index,
                                     absl::Duration within) {
  const absl::Time deadline = absl::Now() + within;
  while (absl::Now() < deadline) {
    absl::StatusOr<RankStatus> r = Rank(agent, index);
    if (r.ok() && r->lost) return r;
    absl::SleepFor(absl::Milliseconds(50));
  }
  return absl::DeadlineExceededError("the rank was not reported lost");
}

bool Alive(pid_t pid) { return kill(pid, 0) == 0; }

class EngineFault : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = TempDir(
        ::testing::UnitTest::GetInstance()->current_test_info()->name());
    d_ = std::make_unique<Driver>(TinyJob(), dir_);
    std::vector<std::string> a_args = {"--log-dir", dir_ + "/a-engines"};
    std::vector<std::string> b_args = {"--log-dir", dir_ + "/b-engines"};
    for (const std::string& arg : EngineArgs()) {
      a_args.push_back(arg);
      b_args.push_back(arg);
    }
    a_ = d_->Agent("a", 2, a_args);
    d_->Agent("b", 2, b_args);
    ASSERT_TRUE(d_->Start(plan_, ab_).ok());
  }
  void TearDown() override {
    d_.reset();
    std::filesystem::remove_all(dir_);
  }
  // The agents' engine: arachne-engine (the default) unless overridden.
  virtual std::vector<std::string> EngineArgs() const { return {}; }

  // GPU a:1's engine killed while the job is stopped: the recovery switch
  // rebuilds its state from its replica bit for bit, and training goes on
  // as the reference engine's within `loss_tolerance` (relative; 0: equal).
  void KilledWhileStoppedRecovers(double loss_tolerance) {
    ASSERT_TRUE(d_->TrainUntil(2).ok());
    absl::StatusOr<FullState> before = d_->Gather("before");
    ASSERT_TRUE(before.ok()) << before.status();
    KillEngineA1();
    absl::Status s = Recover();
    ASSERT_TRUE(s.ok()) << s;
    absl::StatusOr<RankStatus> a1 = Rank(*a_, 1);
    ASSERT_TRUE(a1.ok());
    EXPECT_FALSE(a1->lost);
    EXPECT_EQ(a1->error, "");
    EXPECT_TRUE(a1->in_plan);
    absl::StatusOr<FullState> after = d_->Gather("after");
    ASSERT_TRUE(after.ok()) << after.status();
    EXPECT_TRUE(*before == *after)
        << FirstDifference(*ReferenceModelState(TinyJob()), *before, *after);
    ASSERT_TRUE(d_->TrainUntil(4).ok());
    auto reference = RunPlan(TinyJob(), plan_, ab_, 4);
    ASSERT_TRUE(reference.ok()) << reference.status();
    for (const auto& [i, loss] : d_->losses()) {
      EXPECT_NEAR(loss, reference->losses[i - 1],
                  loss_tolerance * std::abs(loss))
          << "iteration " << i;
    }
  }

  // The engine of a:1 killed at `step` of a switch to TP 2 on each node:
  // the switch aborts, the rank is reported lost, and switching again with
  // it counted lost rebuilds its state from its replica bit for bit.
  void KilledInPhaseAbortsThenRecovers(SwitchStep step) {
    ASSERT_TRUE(d_->TrainUntil(2).ok());
    absl::StatusOr<FullState> before = d_->Gather("before");
    ASSERT_TRUE(before.ok()) << before.status();
    // A switch to TP 2 on each node; a's GPU 1 engine dies inside it.
    int next = 0;
    Template tp2 = MakeTemplate({{2, 0, 2}, {2, 2, 4}}, 1, 2, 8, 0, &next);
    tp2.placement[0] = StagePlacement{.node = 0, .gpus = {0, 1}};
    tp2.placement[1] = StagePlacement{.node = 1, .gpus = {0, 1}};
    const Plan target{{tp2}};
    pid_t killed = 0;
    absl::Status s = d_->Switch(target, ab_, step, [&]() {
      absl::StatusOr<RankStatus> r = Rank(*a_, 1);
      CHECK(r.ok());
      killed = static_cast<pid_t>(r->engine_pid);
      kill(killed, SIGKILL);
    });
    ASSERT_FALSE(s.ok());
    EXPECT_EQ(d_->generation(), 1);
    absl::StatusOr<RankStatus> lost = AwaitLost(*a_, 1, absl::Seconds(5));
    ASSERT_TRUE(lost.ok()) << lost.status();
    EXPECT_THAT(lost->error, HasSubstr(absl::StrCat("engine process ", killed)));
    EXPECT_TRUE(Alive(a_->pid()));
    // Switching again with the GPU counted lost takes its state from a:0.
    s = d_->Switch(target, ab_, SwitchStep::kNone, nullptr, "",
                   {migration::GpuId{"a", 1}});
    ASSERT_TRUE(s.ok()) << s;
    absl::StatusOr<FullState> after = d_->Gather("after");
    ASSERT_TRUE(after.ok()) << after.status();
    EXPECT_TRUE(*before == *after)
        << FirstDifference(*ReferenceModelState(TinyJob()), *before, *after);
  }

  // GPU a:1's engine stopped (SIGSTOP) past the hang timeout: killed,
  // counted lost, and its state rebuilt from its replica bit for bit.
  void StoppedPastTheHangTimeoutRecovers() {
    ASSERT_TRUE(d_->TrainUntil(2).ok());
    absl::StatusOr<FullState> before = d_->Gather("before");
    ASSERT_TRUE(before.ok()) << before.status();
    KillEngineA1(SIGSTOP);
    absl::Status s = Recover();
    ASSERT_TRUE(s.ok()) << s;
    absl::StatusOr<FullState> after = d_->Gather("after");
    ASSERT_TRUE(after.ok()) << after.status();
    EXPECT_TRUE(*before == *after);
  }

  // Kills GPU 1's engine on node a; checks the agent stays up and reports
  // exactly that rank lost, and that a fresh engine took its place.
  void KillEngineA1(int sig = SIGKILL) {
    absl::StatusOr<RankStatus> before = Rank(*a_, 1);
    ASSERT_TRUE(before.ok()) << before.status();
    ASSERT_GT(before->engine_pid, 0);
    ASSERT_EQ(kill(static_cast<pid_t>(before->engine_pid), sig), 0);
    absl::StatusOr<RankStatus> lost = AwaitLost(
        *a_, 1, sig == SIGKILL ? absl::Seconds(5) : absl::Seconds(25));
    ASSERT_TRUE(lost.ok()) << lost.status();
    EXPECT_THAT(lost->error,
                HasSubstr(absl::StrCat("engine process ", before->engine_pid,
                                       " (GPU 1) ")));
    if (sig == SIGKILL) {
      EXPECT_THAT(lost->error, HasSubstr("was killed by signal 9"));
    } else {
      EXPECT_THAT(lost->error, HasSubstr("did not answer for"));
    }
    EXPECT_THAT(lost->error, HasSubstr(dir_ + "/a-engines/engine-1.log"));
    EXPECT_FALSE(lost->in_plan);
    EXPECT_TRUE(Alive(a_->pid())) << "the agent died with its engine";
    // A fresh engine is started on the GPU.
    const absl::Time deadline = absl::Now() + absl::Seconds(30);
    int64_t fresh = 0;
    while (absl::Now() < deadline && fresh == 0) {
      absl::StatusOr<RankStatus> r = Rank(*a_, 1);
      if (r.ok() && r->engine_pid > 0 && r->engine_pid != before->engine_pid) {
        fresh = r->engine_pid;
      }
      absl::SleepFor(absl::Milliseconds(50));
    }
    EXPECT_GT(fresh, 0);
    // The other engine of the node is the one it was.
    absl::StatusOr<RankStatus> other = Rank(*a_, 0);
    ASSERT_TRUE(other.ok());
    EXPECT_FALSE(other->lost);
  }

  // The recovery switch: the same plan, a:1 counted lost, its state rebuilt
  // from its replica a:0.
  absl::Status Recover() {
    return d_->Switch(plan_, ab_, SwitchStep::kNone, nullptr, "",
                      {migration::GpuId{"a", 1}});
  }

  std::string dir_;
  const Cluster ab_ = NamedCluster({{"a", 2}, {"b", 2}});
  const Plan plan_{{PlaceAB()}};
  std::unique_ptr<Driver> d_;
  testing::AgentProcess* a_ = nullptr;
};

TEST_F(EngineFault, KilledWhileStoppedIsLostAndRecoveredFromItsReplica) {
  KilledWhileStoppedRecovers(/*loss_tolerance=*/0);
}

TEST_F(EngineFault, KilledMidIterationRecoversTheLastCompletedIteration) {
  ASSERT_TRUE(d_->TrainUntil(1).ok());
  // Train on without end, and kill the engine while it computes.
  ASSERT_TRUE(d_->Resume().ok());
  absl::SleepFor(absl::Milliseconds(300));
  KillEngineA1();
  // The survivors' collectives fail on the dead peer within the collective
  // timeout; the recovery switch pauses them where they stopped.
  absl::Status s = Recover();
  ASSERT_TRUE(s.ok()) << s;
  absl::StatusOr<NodeStatus> st = a_->client().Status();
  ASSERT_TRUE(st.ok());
  const int64_t it = st->iteration;
  EXPECT_GE(it, 1);
  absl::StatusOr<FullState> after = d_->Gather("after");
  ASSERT_TRUE(after.ok()) << after.status();
  auto reference = RunPlan(TinyJob(), plan_, ab_, static_cast<int>(it));
  ASSERT_TRUE(reference.ok()) << reference.status();
  EXPECT_TRUE(*after == reference->state)
      << "iteration " << it << ": "
      << FirstDifference(*ReferenceModelState(TinyJob()), reference->state,
                         *after);
}

TEST_F(EngineFault, StoppedPastTheHangTimeoutIsKilledAndRecovered) {
  StoppedPastTheHangTimeoutRecovers();
}

// The same faults with the PyTorch engine (python/arachne_torch): its
// losses follow the reference engine's within 1e-4 (TorchEngine tests).
class TorchEngineFault : public EngineFault {
 protected:
  std::vector<std::string> EngineArgs() const override {
    return {"--engine-command",
            std::string(ARACHNE_BINARY_DIR) + "/python/arachne-torch-engine"};
  }
};

TEST_F(TorchEngineFault, KilledWhileStoppedIsLostAndRecoveredFromItsReplica) {
  KilledWhileStoppedRecovers(/*loss_tolerance=*/1e-4);
}

TEST_F(TorchEngineFault, StoppedPastTheHangTimeoutIsKilledAndRecovered) {
  StoppedPastTheHangTimeoutRecovers();
}

TEST_F(EngineFault, TheAgentDescribesTheJobsStateAsItsEnginesDo) {
  absl::StatusOr<StateDescription> described =
      a_->client().DescribeState(TinyJob());
  ASSERT_TRUE(described.ok()) << described.status();
  EXPECT_EQ(described->engine,
            "arachne-engine (reference engine, LibTorch CPU)");
  const migration::ModelState reference = *ReferenceModelState(TinyJob());
  ASSERT_EQ(described->state.num_tensors(), reference.num_tensors());
  for (int i = 0; i < reference.num_tensors(); ++i) {
    EXPECT_EQ(described->state.tensor(i).name, reference.tensor(i).name);
    EXPECT_EQ(described->state.tensor(i).shape, reference.tensor(i).shape);
    EXPECT_EQ(described->state.tensor(i).split, reference.tensor(i).split);
  }
  // A job the engine cannot describe is refused naming the field.
  JobSpec bad = TinyJob();
  bad.model.hidden = 0;
  absl::StatusOr<StateDescription> refused = a_->client().DescribeState(bad);
  EXPECT_EQ(refused.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(refused.status().message(), HasSubstr("hidden"));
}

class EngineKilledInPhase : public EngineFault,
                            public ::testing::WithParamInterface<SwitchStep> {};

TEST_P(EngineKilledInPhase, AbortsThenRecoversFromTheReplica) {
  KilledInPhaseAbortsThenRecovers(GetParam());
}

class TorchEngineKilledInPhase
    : public TorchEngineFault,
      public ::testing::WithParamInterface<SwitchStep> {};

TEST_P(TorchEngineKilledInPhase, AbortsThenRecoversFromTheReplica) {
  KilledInPhaseAbortsThenRecovers(GetParam());
}

std::string StepName(const ::testing::TestParamInfo<SwitchStep>& info) {
  switch (info.param) {
    case SwitchStep::kBeforeStage1:
      return "InStage1";
    case SwitchStep::kBeforeStage2:
      return "InStage2";
    default:
      return "InRebuild";
  }
}

INSTANTIATE_TEST_SUITE_P(Steps, EngineKilledInPhase,
                         ::testing::Values(SwitchStep::kBeforeStage1,
                                           SwitchStep::kBeforeStage2,
                                           SwitchStep::kBeforeRebuild),
                         StepName);
INSTANTIATE_TEST_SUITE_P(Steps, TorchEngineKilledInPhase,
                         ::testing::Values(SwitchStep::kBeforeStage1,
                                           SwitchStep::kBeforeStage2,
                                           SwitchStep::kBeforeRebuild),
                         StepName);

}  // namespace
}  // namespace arachne::agent
