// arachne-agent: one node's training ranks behind the arachne.v1.Agent gRPC
// service (docs/agent.md), as one engine process per GPU under its
// supervision (docs/engines.md) or, with --in-process-ranks, as threads.
// Its flags and config file are read by AgentFlags (agent_config.h);
// everything else takes typed configs.
#include <pthread.h>
#include <signal.h>

#include <filesystem>
#include <iostream>
#include <memory>
#include <string>

#include "CLI/CLI.hpp"
#include "absl/status/statusor.h"
#include "absl/strings/str_cat.h"
#include "glog/logging.h"
#include "worker_agent/agent_config.h"
#include "worker_agent/agent_service.h"
#include "worker_agent/engine_supervisor.h"
#include "worker_agent/node_runtime.h"
#include "worker_agent/registration.h"
#ifdef ARACHNE_AGENT_HAVE_CUDA
#include <cuda_runtime_api.h>
#endif

namespace {

// CUDA GPUs this process can use; 0 in a build without CUDA or on a
// machine without a driver or device (then --virtual-gpus is required).
int VisibleCudaDevices() {
#ifdef ARACHNE_AGENT_HAVE_CUDA
  int count = 0;
  if (cudaGetDeviceCount(&count) != cudaSuccess) return 0;
  return count;
#else
  return 0;
#endif
}

// arachne-engine in the directory of this executable.
std::string DefaultEngineCommand() {
  std::error_code ec;
  const std::filesystem::path self =
      std::filesystem::read_symlink("/proc/self/exe", ec);
  if (ec) return "arachne-engine";
  return (self.parent_path() / "arachne-engine").string();
}

}  // namespace

int main(int argc, char** argv) {
  CLI::App app{"arachne-agent: one node's training ranks (arachne.v1.Agent)"};
  arachne::agent::AgentFlags flags(app);
  try {
    app.parse(argc, argv);
  } catch (const CLI::ParseError& e) {
    // --help answers 0; every other parse error is a usage error like a
    // bad value below.
    if (e.get_exit_code() == 0) return app.exit(e);
    std::cerr << "arachne-agent: " << e.what() << "\n";
    return 2;
  }
  // Bad settings (file or flags) are a usage error: exit 2 with the message
  // naming the setting and the value, before anything starts.
  absl::StatusOr<arachne::agent::AgentSettings> settings =
      flags.Settings(VisibleCudaDevices());
  if (!settings.ok()) {
    std::cerr << "arachne-agent: " << settings.status().message() << "\n";
    return 2;
  }

  FLAGS_logtostderr = true;
  google::InitGoogleLogging(argv[0]);

  // Block the stop signals in every thread (gRPC's and the ranks', which
  // inherit this mask) so that only sigwait below receives them.
  sigset_t stop_signals;
  sigemptyset(&stop_signals);
  sigaddset(&stop_signals, SIGINT);
  sigaddset(&stop_signals, SIGTERM);
  pthread_sigmask(SIG_BLOCK, &stop_signals, nullptr);

  const arachne::agent::NodeGpus gpus{.node = settings->node,
                                      .gpu_type = settings->gpu_type,
                                      .count = settings->gpu_count,
                                      .virtual_gpus = settings->virtual_gpus,
                                      .virtual_gpu_speed =
                                          settings->virtual_gpu_speed,
                                      .host = settings->host,
                                      .failpoint = settings->failpoint,
                                      .staging_bytes =
                                          settings->migration_staging_mib *
                                          arachne::agent::kMiB};
  std::unique_ptr<arachne::agent::NodeRanks> runtime;
  if (settings->in_process_ranks) {
    runtime = std::make_unique<arachne::agent::NodeRuntime>(gpus,
                                                            settings->catalog);
  } else {
    arachne::agent::EngineSupervisorConfig engines;
    engines.command = settings->engine_command;
    if (engines.command.empty()) engines.command = {DefaultEngineCommand()};
    engines.log_dir = settings->log_dir;
    engines.profiles_dir = settings->profiles_dir;
    absl::StatusOr<std::unique_ptr<arachne::agent::EngineSupervisor>> s =
        arachne::agent::EngineSupervisor::Start(gpus, settings->catalog,
                                                std::move(engines));
    if (!s.ok()) {
      std::cerr << "arachne-agent: " << s.status().message() << "\n";
      return 2;
    }
    runtime = *std::move(s);
  }
  arachne::agent::AgentService service(
      runtime.get(), settings->catalog, settings->models,
      {.bearer_token = settings->bearer_token,
       .require_controller = !settings->controller.empty(),
       .controller_address = settings->controller,
       .checkpoint_root = settings->checkpoint_root});
  auto server = arachne::agent::AgentServer::Start(
      &service, {.listen = settings->listen, .tls = settings->tls});
  if (!server.ok()) {
    std::cerr << "arachne-agent: " << server.status().message() << "\n";
    return 2;
  }
  LOG(INFO) << "node " << settings->node << ": " << settings->gpu_count << " "
            << (settings->virtual_gpus ? "virtual " : "")
            << settings->catalog.type(settings->gpu_type).id << " GPUs"
            << (settings->bearer_token.empty() ? "" : ", bearer token");
  if (!settings->port_file.empty()) {
    if (absl::Status s = arachne::agent::WritePortFile(settings->port_file,
                                                       (*server)->port());
        !s.ok()) {
      std::cerr << "arachne-agent: " << s.message() << "\n";
      return 2;
    }
  }
  // Registration starts once the service answers, so the controller can
  // reach the address it is given. It runs beside training and never
  // blocks it: an unreachable controller is retried with back-off.
  std::unique_ptr<arachne::agent::ControllerRegistration> registration;
  if (!settings->controller.empty()) {
    const arachne::GpuType& type = settings->catalog.type(settings->gpu_type);
    arachne::agent::RegistrationConfig config;
    config.controller = settings->controller;
    config.token = settings->controller_token;
    config.tls = settings->controller_tls;
    config.node = settings->node;
    config.gpu_type = type.id;
    config.gpus = settings->gpu_count;
    config.memory_gib = type.memory_gib;
    config.address = absl::StrCat(settings->host, ":", (*server)->port());
    config.on_registered = [&service](const std::string& controller_id) {
      service.BindController(controller_id);
    };
    absl::StatusOr<std::unique_ptr<arachne::agent::ControllerRegistration>> r =
        arachne::agent::ControllerRegistration::Start(std::move(config));
    if (!r.ok()) {
      std::cerr << "arachne-agent: --controller " << settings->controller
                << ": " << r.status().message() << "\n";
      return 2;
    }
    registration = *std::move(r);
  }
  int signal = 0;
  sigwait(&stop_signals, &signal);
  LOG(INFO) << "signal " << signal << " received";
  // No more heartbeats: the controller sees the lease run out (there is no
  // deregistration; a drain is the graceful way out).
  registration.reset();
  // Calls in flight get the grace period; phase calls end by their own
  // timeouts at the latest. Only then are the ranks stopped.
  (*server)->Shutdown(settings->grace);
  server->reset();
  runtime.reset();
  return 0;
}
