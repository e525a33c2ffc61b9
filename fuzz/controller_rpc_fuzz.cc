// The controller's RPCs (controller/controller.h, JobController): any bytes
// are a sequence of Register / Heartbeat / AnnounceJoin / DrainNode /
// RequestReplan / GetStatus calls and clock advances, applied to a real
// JobController (fresh state directory, fake clock, a planner that never
// answers, so no agent is ever driven). Three agents answer Status in
// this process, as nodes "a", "b" and "c" with 2 A6000 each, so a Register
// that names one of them at its address is checked and recorded (and the
// membership rules, incarnations among them, are exercised); the other
// addresses are loopback ports nobody listens on, or malformed, and fail
// fast. After each call: every error has a short, non-empty message and a
// code a caller can act on (never INTERNAL or UNKNOWN); GetStatus answers
// and serialises within kStatusBudgetBytes; there are never more members
// than distinct nodes that ever registered.
//
// Input: a list of ops, each one byte (op = byte % 7) then its operands,
// each drawn from the bytes that follow (a missing byte reads as 0):
//   0 Register(node, gpu_type, gpus, memory_gib, address, incarnation)
//   1 Heartbeat(node, incarnation)
//   2 AnnounceJoin(n names, within_s)      3 DrainNode(node, deadline_s, gen)
//   4 RequestReplan(reason, generation)    5 GetStatus
//   6 advance the fake clock by a byte's worth of seconds
// A string operand is one byte b: b < 0xF0 picks from a small table of valid
// and edge values; otherwise the next byte is a length and that many raw
// bytes follow (bytes not UTF-8, NUL, '/', ...). At most 64 ops per input.
#include <stdlib.h>
#include <unistd.h>

#include <cstddef>
#include <cstdint>
#include <filesystem>
#include <limits>
#include <memory>
#include <set>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "arachne/v1/agent.grpc.pb.h"
#include "grpcpp/grpcpp.h"
#include "absl/strings/str_cat.h"
#include "arachne/v1/controller.pb.h"
#include "controller/clock.h"
#include "controller/controller.h"
#include "controller/controller_config.h"
#include "controller/planning.h"
#include "fuzz/fuzz_checks.h"
#include "glog/logging.h"
#include "google/protobuf/stubs/logging.h"
#include "planner_service/io/config_file.h"
#include "planner_service/io/gpu_catalog_io.h"
#include "planner_service/io/model_io.h"

namespace {

using arachne::fuzz::Fail;

// A planner that never answers: the controller stays without a plan, so it
// never calls an agent beyond Register's check.
class NoPlanner final : public arachne::controller::PlanSource {
 public:
  absl::StatusOr<arachne::PlanAnswer> Plan(
      const arachne::PlanQuery&) override {
    return absl::UnavailableError("fuzz: no planner");
  }
  absl::StatusOr<arachne::ReplanAnswer> Replan(
      const arachne::ReplanQuery&) override {
    return absl::UnavailableError("fuzz: no planner");
  }
  std::string name() const override { return "fuzz"; }
};

const arachne::GpuCatalog& Catalog() {
  static const auto* const catalog =
      new arachne::GpuCatalog(*arachne::LoadGpuCatalog());
  return *catalog;
}

const arachne::controller::JobSettings& Job() {
  static const auto* const job = [] {
    arachne::v1::JobSpec spec;
    CHECK(arachne::ParseConfigText(
        "model: {name: tiny-gpt}\n"
        "training: {seq_len: 32, global_batch: 32}\n"
        "engine: {learning_rate: 0.001, data_seed: 7, init_seed: 11}\n"
        "iterations: 10\nmin_gpus: 1000\njoin_window_s: 1\n"
        "timeouts: {lease_s: 10}\n",
        "job.yaml", &spec).ok());
    auto models = *arachne::LoadModelCatalog();
    return new arachne::controller::JobSettings(
        *arachne::controller::ResolveJob(spec, "job.yaml", Catalog(), models));
  }();
  return *job;
}

class Reader {
 public:
  Reader(const uint8_t* data, size_t size) : data_(data), size_(size) {}
  bool done() const { return at_ >= size_; }
  uint8_t Byte() { return at_ < size_ ? data_[at_++] : 0; }
  std::string Raw() {
    const size_t n = Byte();
    std::string s;
    for (size_t i = 0; i < n && at_ < size_; ++i) s += static_cast<char>(data_[at_++]);
    return s;
  }
  // From `table` (valid and edge values), or raw bytes.
  std::string Pick(const std::vector<std::string>& table) {
    const uint8_t b = Byte();
    if (b >= 0xF0) return Raw();
    return table[b % table.size()];
  }
  double Seconds() {
    static const double kTable[] = {0,   -1,   0.5, 1,    10,  3600,
                                    3601, 86400, 86401, 1e300, -0.0};
    const uint8_t b = Byte();
    if (b < 11) return kTable[b];
    if (b == 11) return std::numeric_limits<double>::quiet_NaN();
    if (b == 12) return std::numeric_limits<double>::infinity();
    return b * 0.25;
  }

 private:
  const uint8_t* data_;
  size_t size_;
  size_t at_ = 0;
};

const std::vector<std::string> kNodes = {
    "a", "b", "c", "node-1", "n.example", "", "-bad", "a/b", "..",
    std::string(254, 'x'), "Node_2"};
const std::vector<std::string> kTypes = {"A6000", "H100-80GB", "", "B300",
                                         "a6000"};
// A node's agent as far as Register's check goes: it answers Status.
class StatusOnlyAgent final : public arachne::v1::Agent::Service {
 public:
  explicit StatusOnlyAgent(std::string node) : node_(std::move(node)) {}
  grpc::Status Status(grpc::ServerContext*, const arachne::v1::StatusRequest*,
                      arachne::v1::StatusResponse* out) override {
    out->set_node(node_);
    out->set_gpu_type("A6000");
    out->set_gpus(2);
    out->set_virtual_gpus(true);
    out->set_phase(arachne::v1::PHASE_IDLE);
    return grpc::Status::OK;
  }

 private:
  const std::string node_;
};

// The addresses of the agents of a, b and c, started once per process.
const std::vector<std::string>& AgentAddresses() {
  static const auto* const addresses = [] {
    auto* out = new std::vector<std::string>;
    for (const char* node : {"a", "b", "c"}) {
      auto* service = new StatusOnlyAgent(node);  // lives as long as the process
      grpc::ServerBuilder builder;
      int port = 0;
      builder.AddListeningPort("127.0.0.1:0", grpc::InsecureServerCredentials(), &port);
      builder.RegisterService(service);
      grpc::Server* server = builder.BuildAndStart().release();
      CHECK(server != nullptr && port > 0) << "cannot start the agent of " << node;
      out->push_back(absl::StrCat("127.0.0.1:", port));
    }
    return out;
  }();
  return *addresses;
}

const std::vector<std::string> kAddresses = {
    "127.0.0.1:1", "127.0.0.1:9", "", "no-port", "127.0.0.1:", "[::1]:1",
    std::string(600, 'h') + ":1"};
const std::vector<std::string> kIncarnations = {
    "i1", "i2", "", "bad incarnation", std::string(65, 'i'), "x_y-Z9"};
const std::vector<std::string> kReasons = {"", "operator", std::string(2000, 'r')};

// The agents' addresses first (a Register naming one of them at the right
// node is recorded), then the ones nobody listens at or that are malformed.
const std::vector<std::string>& Addresses() {
  static const auto* const all = [] {
    auto* out = new std::vector<std::string>(AgentAddresses());
    out->insert(out->end(), kAddresses.begin(), kAddresses.end());
    return out;
  }();
  return *all;
}

void CheckError(const absl::Status& s, const char* rpc) {
  if (s.ok()) return;
  if (s.message().empty()) Fail(absl::StrCat(rpc, ": empty message"), s);
  if (s.message().size() > arachne::fuzz::kMaxErrorBytes) {
    Fail(absl::StrCat(rpc, ": message too long"), s);
  }
  if (s.code() == absl::StatusCode::kInternal ||
      s.code() == absl::StatusCode::kUnknown) {
    Fail(absl::StrCat(rpc, ": unexpected code"), s);
  }
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  static const bool quiet = [] {
    google::protobuf::SetLogHandler(
        [](google::protobuf::LogLevel, const char*, int, const std::string&) {});
    FLAGS_minloglevel = 2;  // the controller logs every refused call
    return true;
  }();
  (void)quiet;
  char dir_template[] = "/tmp/arachne-controller-rpc-fuzz-XXXXXX";
  const char* dir = mkdtemp(dir_template);
  if (dir == nullptr) return 0;
  arachne::controller::FakeClock clock;
  arachne::controller::JobControllerConfig config;
  config.job = Job();
  config.state_dir = dir;
  config.register_check_timeout = absl::Milliseconds(50);
  config.tick = absl::Milliseconds(20);
  {
    absl::StatusOr<std::unique_ptr<arachne::controller::JobController>> c =
        arachne::controller::JobController::Create(
            config, Catalog(), std::make_unique<NoPlanner>(), &clock);
    if (!c.ok()) Fail("JobController::Create", c.status());
    arachne::controller::JobController& controller = **c;
    std::set<std::string> registered;
    Reader in(data, size);
    for (int op = 0; op < 64 && !in.done(); ++op) {
      switch (in.Byte() % 7) {
        case 0: {
          arachne::v1::RegisterRequest r;
          r.set_node(in.Pick(kNodes));
          r.set_gpu_type(in.Pick(kTypes));
          const uint8_t g = in.Byte();
          r.set_gpus(g < 0x80 ? g : -static_cast<int>(g));
          r.set_memory_gib(in.Seconds());
          r.set_address(in.Pick(Addresses()));
          r.set_incarnation(in.Pick(kIncarnations));
          auto answer = controller.Register(r);
          CheckError(answer.status(), "Register");
          if (answer.ok()) registered.insert(r.node());
          break;
        }
        case 1: {
          arachne::v1::HeartbeatRequest r;
          r.set_node(in.Pick(kNodes));
          r.set_incarnation(in.Pick(kIncarnations));
          CheckError(controller.Heartbeat(r).status(), "Heartbeat");
          break;
        }
        case 2: {
          arachne::v1::AnnounceJoinRequest r;
          const int n = in.Byte() % 5;
          for (int i = 0; i < n; ++i) r.add_nodes(in.Pick(kNodes));
          r.set_within_s(in.Seconds());
          CheckError(controller.AnnounceJoin(r), "AnnounceJoin");
          break;
        }
        case 3: {
          arachne::v1::DrainNodeRequest r;
          r.set_node(in.Pick(kNodes));
          r.set_deadline_s(in.Seconds());
          r.set_generation(static_cast<int8_t>(in.Byte()));
          CheckError(controller.DrainNode(r), "DrainNode");
          break;
        }
        case 4: {
          arachne::v1::RequestReplanRequest r;
          r.set_reason(in.Pick(kReasons));
          r.set_generation(static_cast<int8_t>(in.Byte()));
          CheckError(controller.RequestReplan(r), "RequestReplan");
          break;
        }
        case 5:
          break;  // GetStatus: below, after every op
        case 6:
          clock.Advance(absl::Seconds(in.Byte()));
          break;
      }
      absl::StatusOr<arachne::v1::GetStatusResponse> st = controller.GetStatus();
      if (!st.ok()) Fail("GetStatus", st.status());
      if (st->ByteSizeLong() > arachne::controller::kStatusBudgetBytes) {
        Fail(absl::StrCat("GetStatus: ", st->ByteSizeLong(),
                          " bytes, over the budget"),
             absl::OkStatus());
      }
      if (static_cast<size_t>(st->members_size()) > registered.size()) {
        Fail(absl::StrCat("GetStatus: ", st->members_size(), " members but ",
                          registered.size(), " nodes ever registered"),
             absl::OkStatus());
      }
      for (const auto& m : st->members()) {
        if (!registered.contains(m.node())) {
          Fail(absl::StrCat("GetStatus: member \"", m.node(),
                            "\" never registered"),
               absl::OkStatus());
        }
      }
    }
    controller.Stop();
  }
  std::error_code ec;
  std::filesystem::remove_all(dir, ec);
  return 0;
}
