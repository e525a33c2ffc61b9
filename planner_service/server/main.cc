// arachne-planner: the long-running gRPC planning service. Its flags and
// config file are read by ServerFlags (server_config.h); everything else
// takes typed configs.
#include <pthread.h>
#include <signal.h>

#include <iostream>

#include "CLI/CLI.hpp"
#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "glog/logging.h"
#include "planner_service/api/planner_handler_impl.h"
#include "planner_service/server/planner_server.h"
#include "planner_service/server/server_config.h"
#include "planner_service/policy/torch_policy.h"

int main(int argc, char** argv) {
  CLI::App app{"arachne-planner: gRPC planning service (arachne.v1.Planner)"};
  arachne::ServerFlags flags(app);
  CLI11_PARSE(app, argc, argv);
  // Bad settings (file or flags) are a usage error: exit 2 with the
  // message naming the field and the value, before anything starts.
  absl::StatusOr<arachne::ServerSettings> settings = flags.Settings();
  if (!settings.ok()) {
    std::cerr << "arachne-planner: " << settings.status().message() << "\n";
    return 2;
  }

  FLAGS_logtostderr = true;
  google::InitGoogleLogging(argv[0]);

  // Block the stop signals in every thread (gRPC's included, which inherit
  // this mask) so that only sigwait below receives them.
  sigset_t stop_signals;
  sigemptyset(&stop_signals);
  sigaddset(&stop_signals, SIGINT);
  sigaddset(&stop_signals, SIGTERM);
  pthread_sigmask(SIG_BLOCK, &stop_signals, nullptr);

  // The learned planner's policies; loaded per model on first use.
  arachne::RegisterTorchPolicy({.policies_dir = settings->policies_dir,
                                .profiles_dir = settings->handler.profiles_dir});
  auto impl = arachne::PlannerHandlerImpl::Create(settings->handler);
  if (!impl.ok()) {
    std::cerr << "arachne-planner: " << impl.status().message() << "\n";
    return 2;
  }
  auto running = arachne::PlannerServer::Start(impl->get(), settings->server);
  if (!running.ok()) {
    std::cerr << "arachne-planner: " << running.status().message() << "\n";
    return 2;
  }
  int signal = 0;
  sigwait(&stop_signals, &signal);
  LOG(INFO) << "signal " << signal << " received";
  (*running)->Shutdown(settings->grace);
  running->reset();
  return 0;
}
