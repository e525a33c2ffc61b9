// A fleet of lightweight agents for the controller's scale bench
// (controller_scale_bench.cc): one process serving the real Agent gRPC
// service for --count nodes, each on a port of its own, and registering and
// heartbeating each with the controller as arachne-agent does (Register
// once its service listens, Heartbeat every lease/3 on a connection of its
// own, Register again on NOT_FOUND).
//
// What it does not do: train. Status answers the node's name, GPU type and
// count with no ranks; the switch RPCs (Prepare, Pause, Migrate, Rebuild,
// Commit, Resume, Abort) are acknowledged at once and move no state, so the
// bench measures the controller's own work at a thousand nodes, not
// migration (the end-to-end tests switch real agents).
//
//   agent_fleet --controller HOST:PORT --count N [--prefix fleet]
//               [--first 0] [--gpu-type A6000] [--gpus 1]
//               --ready-file F --latency-file L
//
// Writes F (the first node's port) once every node has registered, and on
// SIGTERM the latency of every Register and Heartbeat call to L, one
// "register|heartbeat <unix seconds at the start> <ms>" line each, then
// exits 0.
#include <signal.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdio>
#include <fstream>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "CLI/CLI.hpp"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/time/clock.h"
#include "absl/time/time.h"
#include "arachne/v1/agent.grpc.pb.h"
#include "arachne/v1/controller.grpc.pb.h"
#include "grpcpp/grpcpp.h"

namespace {

namespace v1 = arachne::v1;

std::atomic<bool> g_stop{false};
void OnSignal(int) { g_stop = true; }

// One node's Agent service: its own identity, every switch phase accepted.
class FleetAgent final : public v1::Agent::CallbackService {
 public:
  FleetAgent(std::string node, std::string gpu_type, int gpus)
      : node_(std::move(node)), gpu_type_(std::move(gpu_type)), gpus_(gpus) {}

  grpc::ServerUnaryReactor* Status(grpc::CallbackServerContext* ctx,
                                   const v1::StatusRequest*,
                                   v1::StatusResponse* out) override {
    out->set_node(node_);
    out->set_gpu_type(gpu_type_);
    out->set_gpus(gpus_);
    out->set_virtual_gpus(true);
    out->set_current_generation(current_.load());
    out->set_prepared_generation(prepared_.load());
    out->set_phase(current_.load() > 0 ? v1::PHASE_RUNNING : v1::PHASE_IDLE);
    return Done(ctx);
  }
  grpc::ServerUnaryReactor* Prepare(grpc::CallbackServerContext* ctx,
                                    const v1::PrepareRequest* r,
                                    v1::PrepareResponse*) override {
    prepared_ = r->generation();
    return Done(ctx);
  }
  grpc::ServerUnaryReactor* Pause(grpc::CallbackServerContext* ctx,
                                  const v1::PauseRequest*,
                                  v1::PauseResponse* out) override {
    out->set_iteration(0);
    return Done(ctx);
  }
  grpc::ServerUnaryReactor* Migrate(grpc::CallbackServerContext* ctx,
                                    const v1::MigrateRequest*,
                                    v1::MigrateResponse*) override {
    return Done(ctx);
  }
  grpc::ServerUnaryReactor* Rebuild(grpc::CallbackServerContext* ctx,
                                    const v1::RebuildRequest*,
                                    v1::RebuildResponse*) override {
    return Done(ctx);
  }
  grpc::ServerUnaryReactor* Commit(grpc::CallbackServerContext* ctx,
                                   const v1::CommitRequest* r,
                                   v1::CommitResponse*) override {
    current_ = r->generation();
    prepared_ = 0;
    return Done(ctx);
  }
  grpc::ServerUnaryReactor* Resume(grpc::CallbackServerContext* ctx,
                                   const v1::ResumeRequest*,
                                   v1::ResumeResponse*) override {
    return Done(ctx);
  }
  grpc::ServerUnaryReactor* Abort(grpc::CallbackServerContext* ctx,
                                  const v1::AbortRequest*,
                                  v1::AbortResponse*) override {
    prepared_ = 0;
    return Done(ctx);
  }

 private:
  static grpc::ServerUnaryReactor* Done(grpc::CallbackServerContext* ctx) {
    grpc::ServerUnaryReactor* r = ctx->DefaultReactor();
    r->Finish(grpc::Status::OK);
    return r;
  }
  const std::string node_, gpu_type_;
  const int gpus_;
  std::atomic<int64_t> current_{0}, prepared_{0};
};

struct Node {
  std::string name;
  std::string incarnation;
  std::string address;
  std::unique_ptr<FleetAgent> service;
  std::unique_ptr<grpc::Server> server;
  std::unique_ptr<v1::Controller::Stub> controller;
  absl::Time next_heartbeat = absl::InfinitePast();
  absl::Duration interval = absl::Seconds(1);
  bool registered = false;
};

struct Latencies {
  std::mutex mu;
  struct Sample {
    const char* call;
    absl::Time start;
    double ms;
  };
  std::vector<Sample> samples;
  void Add(const char* call, absl::Time start) {
    const double ms = absl::ToDoubleMilliseconds(absl::Now() - start);
    std::lock_guard<std::mutex> lock(mu);
    samples.push_back({call, start, ms});
  }
};

}  // namespace

int main(int argc, char** argv) {
  CLI::App app{"A fleet of lightweight agents for the controller's scale bench"};
  std::string controller, prefix = "fleet", gpu_type = "A6000", ready_file,
                          latency_file;
  int count = 0, first = 0, gpus = 1, threads = 4;
  app.add_option("--controller", controller, "the controller's host:port")->required();
  app.add_option("--count", count, "nodes")->required()->check(CLI::Range(1, 4096));
  app.add_option("--first", first, "the first node's index")->check(CLI::Range(0, 1000000));
  app.add_option("--prefix", prefix, "node names: <prefix>-<index>");
  app.add_option("--gpu-type", gpu_type, "every node's GPU type");
  app.add_option("--gpus", gpus, "GPUs per node")->check(CLI::Range(1, 64));
  app.add_option("--threads", threads, "heartbeat threads")->check(CLI::Range(1, 64));
  app.add_option("--ready-file", ready_file, "written once every node registered")->required();
  app.add_option("--latency-file", latency_file, "call latencies, written on SIGTERM")->required();
  CLI11_PARSE(app, argc, argv);
  signal(SIGTERM, OnSignal);
  signal(SIGINT, OnSignal);

  std::vector<Node> nodes(count);
  for (int i = 0; i < count; ++i) {
    Node& n = nodes[i];
    n.name = absl::StrFormat("%s-%04d", prefix, first + i);
    n.incarnation = absl::StrFormat("fleet%d-%d", getpid(), first + i);
    n.service = std::make_unique<FleetAgent>(n.name, gpu_type, gpus);
    grpc::ServerBuilder builder;
    int port = 0;
    builder.AddListeningPort("127.0.0.1:0", grpc::InsecureServerCredentials(), &port);
    builder.RegisterService(n.service.get());
    n.server = builder.BuildAndStart();
    if (n.server == nullptr || port == 0) {
      std::fprintf(stderr, "agent_fleet: node %s: cannot listen\n", n.name.c_str());
      return 1;
    }
    n.address = absl::StrCat("127.0.0.1:", port);
    // A connection of its own per node, as separate agents would have.
    grpc::ChannelArguments args;
    args.SetInt(GRPC_ARG_USE_LOCAL_SUBCHANNEL_POOL, 1);
    n.controller = v1::Controller::NewStub(grpc::CreateCustomChannel(
        controller, grpc::InsecureChannelCredentials(), args));
  }

  Latencies latencies;
  auto call_register = [&](Node& n) {
    v1::RegisterRequest r;
    r.set_node(n.name);
    r.set_gpu_type(gpu_type);
    r.set_gpus(gpus);
    r.set_address(n.address);
    r.set_incarnation(n.incarnation);
    v1::RegisterResponse out;
    grpc::ClientContext ctx;
    ctx.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(10));
    const absl::Time t0 = absl::Now();
    grpc::Status s = n.controller->Register(&ctx, r, &out);
    latencies.Add("register", t0);
    if (s.ok()) {
      n.registered = true;
      n.interval = absl::Seconds(out.lease_s() / 3);
    } else {
      std::fprintf(stderr, "agent_fleet: Register %s: %s\n", n.name.c_str(),
                   s.error_message().c_str());
    }
    return s.ok();
  };

  // Each thread registers, then heartbeats, its share of the nodes, the
  // first heartbeats spread over one interval.
  std::atomic<int> registered{0};
  std::vector<std::thread> workers;
  threads = std::min(threads, count);  // each has a node at least
  for (int t = 0; t < threads; ++t) {
    workers.emplace_back([&, t]() {
      std::vector<Node*> mine;
      for (int i = t; i < count; i += threads) mine.push_back(&nodes[i]);
      for (size_t k = 0; k < mine.size() && !g_stop; ++k) {
        Node& n = *mine[k];
        while (!g_stop && !call_register(n)) absl::SleepFor(absl::Milliseconds(200));
        n.next_heartbeat =
            absl::Now() + n.interval * (static_cast<double>(k + 1) / mine.size());
        ++registered;
      }
      while (!g_stop) {
        Node* due = *std::min_element(mine.begin(), mine.end(),
                                      [](const Node* a, const Node* b) {
                                        return a->next_heartbeat < b->next_heartbeat;
                                      });
        const absl::Duration wait = due->next_heartbeat - absl::Now();
        if (wait > absl::ZeroDuration()) {
          absl::SleepFor(std::min(wait, absl::Milliseconds(100)));
          continue;
        }
        v1::HeartbeatRequest r;
        r.set_node(due->name);
        r.set_incarnation(due->incarnation);
        v1::HeartbeatResponse out;
        grpc::ClientContext ctx;
        ctx.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(10));
        const absl::Time t0 = absl::Now();
        grpc::Status s = due->controller->Heartbeat(&ctx, r, &out);
        latencies.Add("heartbeat", t0);
        due->next_heartbeat = absl::Now() + due->interval;
        if (s.error_code() == grpc::StatusCode::NOT_FOUND) {
          call_register(*due);
        } else if (!s.ok()) {
          std::fprintf(stderr, "agent_fleet: Heartbeat %s: %s\n", due->name.c_str(),
                       s.error_message().c_str());
        }
      }
    });
  }
  while (!g_stop && registered.load() < count) absl::SleepFor(absl::Milliseconds(20));
  if (!g_stop) {
    std::ofstream(ready_file) << nodes[0].address.substr(nodes[0].address.rfind(':') + 1)
                              << "\n";
  }
  while (!g_stop) absl::SleepFor(absl::Milliseconds(50));
  for (std::thread& w : workers) w.join();
  {
    std::ofstream out(latency_file);
    std::lock_guard<std::mutex> lock(latencies.mu);
    for (const Latencies::Sample& s : latencies.samples) {
      out << s.call << " " << absl::StrFormat("%.6f", absl::ToUnixMicros(s.start) / 1e6)
          << " " << s.ms << "\n";
    }
  }
  for (Node& n : nodes) n.server->Shutdown(std::chrono::system_clock::now());
  return 0;
}
