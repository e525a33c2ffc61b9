// arachne-controller: the job's membership, keep-or-switch decisions and
// live reconfiguration (docs/controller.md). Flags and the config file are
// read by ControllerFlags (controller_config.h); everything else takes typed
// configs.
#include <pthread.h>
#include <signal.h>

#include <iostream>
#include <memory>

#include "CLI/CLI.hpp"
#include "absl/status/statusor.h"
#include "controller/clock.h"
#include "controller/controller.h"
#include "controller/controller_config.h"
#include "controller/controller_service.h"
#include "controller/planning.h"
#include "glog/logging.h"
#include "planner_service/io/gpu_catalog_io.h"
#include "planner_service/io/model_io.h"
#include "worker_agent/agent_config.h"
#include "planner_service/policy/torch_policy.h"

namespace {

int Usage(const absl::Status& s) {
  std::cerr << "arachne-controller: " << s.message() << "\n";
  return 2;
}

}  // namespace

int main(int argc, char** argv) {
  using namespace arachne;
  using namespace arachne::controller;
  CLI::App app{"arachne-controller: membership, replan decisions and live "
               "reconfiguration of one job (arachne.v1.Controller)"};
  ControllerFlags flags(app);
  try {
    app.parse(argc, argv);
  } catch (const CLI::ParseError& e) {
    if (e.get_exit_code() == 0) return app.exit(e);
    std::cerr << "arachne-controller: " << e.what() << "\n";
    return 2;
  }
  // Bad settings, a bad job file or catalogs that cannot be read: exit 2
  // naming the setting before anything starts.
  absl::StatusOr<ControllerSettings> settings = flags.Settings();
  if (!settings.ok()) return Usage(settings.status());
  absl::StatusOr<GpuCatalog> catalog = LoadGpuCatalog(settings->profiles_dir);
  if (!catalog.ok()) return Usage(catalog.status());
  absl::StatusOr<std::vector<ModelSpec>> models =
      LoadModelCatalog(settings->profiles_dir);
  if (!models.ok()) return Usage(models.status());
  absl::StatusOr<JobSettings> job =
      LoadJobFile(settings->job_file, *catalog, *models);
  if (!job.ok()) return Usage(job.status());

  FLAGS_logtostderr = true;
  google::InitGoogleLogging(argv[0]);
  sigset_t stop_signals;
  sigemptyset(&stop_signals);
  sigaddset(&stop_signals, SIGINT);
  sigaddset(&stop_signals, SIGTERM);
  pthread_sigmask(SIG_BLOCK, &stop_signals, nullptr);

  // The embedded planner's learned policies (profiles/policies or
  // $ARACHNE_POLICIES_DIR), as arachne-planner's: a job that names no
  // planner is planned by "learned" where a policy serves its model.
  RegisterTorchPolicy(
      {.policies_dir = "", .profiles_dir = settings->profiles_dir});
  absl::StatusOr<std::unique_ptr<PlanSource>> planner =
      MakeEmbeddedPlanSource(settings->profiles_dir);
  if (!planner.ok()) return Usage(planner.status());
  if (!job->planner_address.empty()) {
    // The remote planner, retried while it does not answer, then the
    // embedded one (unless the job says no fallback).
    absl::StatusOr<std::unique_ptr<PlanSource>> remote =
        MakeRemotePlanSource({.address = job->planner_address,
                              .token = job->planner_token,
                              .tls_ca_file = job->planner_tls_ca,
                              .tls_cert_file = job->planner_tls_cert,
                              .tls_key_file = job->planner_tls_key});
    if (!remote.ok()) return Usage(remote.status());
    planner = MakeRetryingPlanSource(
        *std::move(remote),
        job->planner_fallback ? *std::move(planner) : nullptr,
        PlannerRetryConfig{.retries = job->planner_retries,
                           .backoff = job->planner_retry_backoff});
  }

  JobControllerConfig config;
  config.job = *job;
  config.state_dir = settings->state_dir;
  config.store_host = settings->store_host;
  config.agent_client.token = settings->agent_token;
  config.agent_client.tls = settings->agent_tls;
  config.hold = settings->hold;
  config.agent_networks = settings->agent_networks;
  // The corrected predictions are priced on the embedded planner's profiles.
  config.profiles_dir = settings->profiles_dir;
  arachne::controller::RealClock real_clock;
  absl::StatusOr<std::unique_ptr<JobController>> controller =
      JobController::Create(config, *catalog, *std::move(planner), &real_clock);
  if (!controller.ok()) return Usage(controller.status());
  ControllerService service(controller->get(), settings->bearer_token,
                            settings->node_auth);
  absl::StatusOr<std::unique_ptr<ControllerServer>> server =
      ControllerServer::Start(&service,
                              {.listen = settings->listen, .tls = settings->tls});
  if (!server.ok()) return Usage(server.status());
  if (!settings->port_file.empty()) {
    if (absl::Status s =
            agent::WritePortFile(settings->port_file, (*server)->port());
        !s.ok()) {
      return Usage(s);
    }
  }
  int signal = 0;
  sigwait(&stop_signals, &signal);
  LOG(INFO) << "signal " << signal << " received";
  // The agents train on while the controller is down; a switch in flight
  // finishes (or aborts) before the reconcile thread stops.
  (*server)->Shutdown(settings->grace);
  (*controller)->Stop();
  return 0;
}
