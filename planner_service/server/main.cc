// arachne-planner: the long-running gRPC planning service. Flags are defined
// here only; everything else takes typed configs.
#include <pthread.h>
#include <signal.h>

#include <fstream>
#include <iostream>
#include <sstream>
#include <string>

#include "CLI/CLI.hpp"
#include "absl/strings/ascii.h"
#include "absl/time/time.h"
#include "glog/logging.h"
#include "planner_service/server/planner_handler_impl.h"
#include "planner_service/server/planner_server.h"

int main(int argc, char** argv) {
  CLI::App app{"arachne-planner: gRPC planning service (arachne.v1.Planner)"};
  arachne::PlannerServerConfig server;
  arachne::PlannerHandlerConfig handler;
  double default_budget_s = 10, max_budget_s = 60, grace_s = 10;
  app.add_option("--listen", server.listen,
                 "host:port to serve on (port 0 picks one)")
      ->capture_default_str();
  app.add_option("--health-listen", server.health_listen,
                 "host:port of a plaintext port serving only "
                 "grpc.health.v1.Health, for probes that cannot speak TLS "
                 "(default: none)");
  app.add_option("--profiles-dir", handler.profiles_dir,
                 "directory of gpus.yaml, models.yaml and profiles (default: "
                 "built-in data)");
  app.add_option("--workers", server.service.workers,
                 "threads running Plan/Evaluate/Replan")
      ->capture_default_str()
      ->check(CLI::PositiveNumber);
  app.add_option("--max-in-flight", server.service.max_in_flight,
                 "Plan/Evaluate/Replan calls admitted at once; more answer "
                 "RESOURCE_EXHAUSTED")
      ->capture_default_str()
      ->check(CLI::PositiveNumber);
  app.add_option("--default-budget-s", default_budget_s,
                 "search budget when a request gives none")
      ->capture_default_str()
      ->check(CLI::PositiveNumber);
  app.add_option("--max-budget-s", max_budget_s, "cap on any request's budget")
      ->capture_default_str()
      ->check(CLI::PositiveNumber);
  app.add_option("--grace-s", grace_s,
                 "on SIGTERM/SIGINT, time calls in flight get to finish")
      ->capture_default_str()
      ->check(CLI::NonNegativeNumber);
  app.add_option("--tls-cert", server.tls.cert_file,
                 "server certificate chain (PEM); enables TLS");
  app.add_option("--tls-key", server.tls.key_file,
                 "private key of --tls-cert (PEM)");
  app.add_option("--tls-client-ca", server.tls.client_ca_file,
                 "CA certificates (PEM) that client certificates must chain "
                 "to; enables mutual TLS");
  std::string token_file;
  app.add_option("--token-file", token_file,
                 "file holding the bearer token clients must send as "
                 "'authorization: Bearer <token>' (a file, not a flag value, "
                 "so it stays out of the process list)");
  CLI11_PARSE(app, argc, argv);

  if (!token_file.empty()) {
    std::ifstream in(token_file);
    std::stringstream buffer;
    buffer << in.rdbuf();
    std::string token(absl::StripAsciiWhitespace(buffer.str()));
    if (!in || token.empty()) {
      std::cerr << "arachne-planner: --token-file: cannot read a token from \""
                << token_file << "\"\n";
      return 2;
    }
    server.service.bearer_token = std::move(token);
  }

  FLAGS_logtostderr = true;
  google::InitGoogleLogging(argv[0]);
  handler.default_budget = absl::Seconds(default_budget_s);
  handler.max_budget = absl::Seconds(max_budget_s);

  // Block the stop signals in every thread (gRPC's included, which inherit
  // this mask) so that only sigwait below receives them.
  sigset_t stop_signals;
  sigemptyset(&stop_signals);
  sigaddset(&stop_signals, SIGINT);
  sigaddset(&stop_signals, SIGTERM);
  pthread_sigmask(SIG_BLOCK, &stop_signals, nullptr);

  auto impl = arachne::PlannerHandlerImpl::Create(handler);
  if (!impl.ok()) {
    std::cerr << "arachne-planner: " << impl.status().message() << "\n";
    return 2;
  }
  auto running = arachne::PlannerServer::Start(impl->get(), server);
  if (!running.ok()) {
    std::cerr << "arachne-planner: " << running.status().message() << "\n";
    return 2;
  }
  int signal = 0;
  sigwait(&stop_signals, &signal);
  LOG(INFO) << "signal " << signal << " received";
  (*running)->Shutdown(absl::Seconds(grace_s));
  running->reset();
  return 0;
}
