// Load on one arachne-planner: N concurrent clients (each its own gRPC
// connection) send Plan requests back to back for T seconds against one
// in-process server on 127.0.0.1:0. Reports, per cluster and client count,
// requests/s, p50/p99 latency and the process's peak RSS (VmHWM of
// /proc/self/status; server and clients share the process, so it bounds the
// server's). The requests are the exact planner on LLaMA-3-8B with a fixed
// max_evaluations, so one request is a fixed amount of work (~10-100 ms).
//
// requests/s counts the answers that came within the T seconds; the
// latencies are those of every answer, including the requests still queued
// at the end (they finish after the window).
//
// Run (docs/api.md "Capacity"):
//   build/bench/service_load_bench --seconds 5 --clients 1,8,64
// Not a Google Benchmark: the figures are a table of its own.
#include <algorithm>
#include <atomic>
#include <cstdint>
#include <fstream>
#include <iostream>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "CLI/CLI.hpp"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/time/clock.h"
#include "absl/time/time.h"
#include "arachne/v1/planner.grpc.pb.h"
#include "glog/logging.h"
#include "google/protobuf/util/json_util.h"
#include "grpcpp/grpcpp.h"
#include "planner_service/io/cluster_io.h"
#include "planner_service/io/gpu_catalog_io.h"
#include "planner_service/api/planner_handler_impl.h"
#include "planner_service/server/planner_server.h"

namespace arachne {
namespace {

// Peak resident set of this process so far, MiB (0 when unreadable).
double PeakRssMiB() {
  std::ifstream status("/proc/self/status");
  std::string key;
  while (status >> key) {
    if (key == "VmHWM:") {
      double kib = 0;
      status >> kib;
      return kib / 1024;
    }
    std::string rest;
    std::getline(status, rest);
  }
  return 0;
}

v1::Cluster ClusterMessage(const std::string& path, const GpuCatalog& catalog,
                           int* gpus) {
  absl::StatusOr<Cluster> cluster = LoadClusterFile(path, catalog);
  CHECK(cluster.ok()) << cluster.status();
  *gpus = cluster->total_gpus();
  return ClusterToMessage(*cluster, catalog);
}

struct ClientResult {
  std::vector<double> latencies_s;  // OK answers only
  int64_t ok_before_stop = 0;       // OK answers that came within the window
  int64_t rejected = 0;             // RESOURCE_EXHAUSTED
  int64_t failed = 0;               // any other error
  std::string first_error;
};

// One client: its own connection (a local subchannel pool, so clients do not
// share a TCP connection), requests back to back until `stop`.
void RunClient(const std::string& address, const v1::PlanRequest& request,
               absl::Time stop, ClientResult* result) {
  grpc::ChannelArguments args;
  args.SetInt(GRPC_ARG_USE_LOCAL_SUBCHANNEL_POOL, 1);
  auto stub = v1::Planner::NewStub(grpc::CreateCustomChannel(
      address, grpc::InsecureChannelCredentials(), args));
  while (absl::Now() < stop) {
    grpc::ClientContext ctx;
    ctx.set_deadline(absl::ToChronoTime(absl::Now() + absl::Seconds(60)));
    v1::PlanResponse response;
    const absl::Time t0 = absl::Now();
    grpc::Status s = stub->Plan(&ctx, request, &response);
    const double latency = absl::ToDoubleSeconds(absl::Now() - t0);
    if (s.ok()) {
      result->latencies_s.push_back(latency);
      if (absl::Now() <= stop) ++result->ok_before_stop;
    } else if (s.error_code() == grpc::StatusCode::RESOURCE_EXHAUSTED) {
      ++result->rejected;
    } else {
      if (result->failed++ == 0) result->first_error = s.error_message();
    }
  }
}

double Percentile(std::vector<double> v, double q) {
  if (v.empty()) return 0;
  std::sort(v.begin(), v.end());
  const size_t i = std::min(v.size() - 1, static_cast<size_t>(q * v.size()));
  return v[i];
}

}  // namespace
}  // namespace arachne

int main(int argc, char** argv) {
  CLI::App app{
      "N concurrent Plan clients against one in-process arachne-planner"};
  double seconds = 5;
  std::vector<int> clients = {1, 8, 64};
  std::vector<std::string> clusters = {"examples/a100-h100-64.yaml",
                                       "examples/paper-512.yaml"};
  int64_t max_evaluations = 10000;
  int workers = 4;
  int max_in_flight = 128;
  app.add_option("--seconds", seconds, "load duration per row")
      ->capture_default_str();
  app.add_option("--clients", clients, "client counts")
      ->delimiter(',')
      ->capture_default_str();
  app.add_option("--clusters", clusters,
                 "cluster files, relative to the source tree or absolute")
      ->delimiter(',')
      ->capture_default_str();
  app.add_option("--max-evaluations", max_evaluations,
                 "exact-planner evaluations per request")
      ->capture_default_str();
  app.add_option("--workers", workers, "server worker threads")
      ->capture_default_str();
  app.add_option("--max-in-flight", max_in_flight,
                 "server admission limit (above the largest client count, "
                 "so no request is rejected)")
      ->capture_default_str();
  CLI11_PARSE(app, argc, argv);
  google::InitGoogleLogging(argv[0]);
  FLAGS_minloglevel = 2;  // the server logs every call; keep the table clean

  auto catalog = arachne::LoadGpuCatalog();
  CHECK(catalog.ok()) << catalog.status();
  auto handler = arachne::PlannerHandlerImpl::Create({});
  CHECK(handler.ok()) << handler.status();
  arachne::PlannerServerConfig config;
  config.listen = "127.0.0.1:0";
  config.service.workers = workers;
  config.service.max_in_flight = max_in_flight;
  auto server = arachne::PlannerServer::Start(handler->get(), config);
  CHECK(server.ok()) << server.status();
  const std::string address = absl::StrCat("127.0.0.1:", (*server)->port());

  std::cout << absl::StrFormat(
      "arachne-planner load: %d workers, %d hardware threads, %.0f s per row, "
      "exact planner on llama3-8b, max_evaluations %d\n\n",
      workers, std::thread::hardware_concurrency(), seconds, max_evaluations);
  std::cout << "| cluster | GPUs | clients | requests OK | rejected | failed "
               "| requests/s | p50 ms | p99 ms | peak RSS MiB |\n"
               "|---|---|---|---|---|---|---|---|---|---|\n";
  for (const std::string& file : clusters) {
    const std::string path = file.front() == '/'
                                 ? file
                                 : std::string(ARACHNE_SOURCE_DIR) + "/" + file;
    int gpus = 0;
    arachne::v1::PlanRequest request;
    request.mutable_model()->set_name("llama3-8b");
    *request.mutable_cluster() = arachne::ClusterMessage(path, *catalog, &gpus);
    request.mutable_options()->set_planner("exact");
    request.mutable_options()->set_max_evaluations(max_evaluations);
    request.mutable_options()->set_budget_s(60);
    for (int n : clients) {
      std::vector<arachne::ClientResult> results(n);
      std::vector<std::thread> threads;
      const absl::Time start = absl::Now();
      const absl::Time stop = start + absl::Seconds(seconds);
      for (int i = 0; i < n; ++i) {
        threads.emplace_back(arachne::RunClient, address, std::cref(request),
                             stop, &results[i]);
      }
      for (std::thread& t : threads) t.join();
      std::vector<double> latencies;
      int64_t rejected = 0, failed = 0, ok_in_window = 0;
      std::string first_error;
      for (const arachne::ClientResult& r : results) {
        latencies.insert(latencies.end(), r.latencies_s.begin(),
                         r.latencies_s.end());
        rejected += r.rejected;
        ok_in_window += r.ok_before_stop;
        failed += r.failed;
        if (first_error.empty()) first_error = r.first_error;
      }
      std::cout << absl::StrFormat(
                       "| %s | %d | %d | %d | %d | %d | %.1f | %.1f | %.1f | "
                       "%.0f |",
                       file.substr(file.find_last_of('/') + 1), gpus, n,
                       latencies.size(), rejected, failed,
                       ok_in_window / seconds,
                       1e3 * arachne::Percentile(latencies, 0.50),
                       1e3 * arachne::Percentile(latencies, 0.99),
                       arachne::PeakRssMiB())
                << std::endl;
      if (!first_error.empty())
        std::cerr << "first error: " << first_error << "\n";
    }
  }
  (*server)->Shutdown(absl::Seconds(1));
  return 0;
}
