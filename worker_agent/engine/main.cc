// arachne-engine: the reference engine as a process of its own, training
// one GPU's rank and serving arachne.v1.Engine to its node's agent on a
// Unix socket (docs/engines.md). The agent starts one per GPU and tells it
// everything through the environment (worker_agent/engine_launch.h); it
// takes no flags.
#include <pthread.h>
#include <signal.h>
#include <unistd.h>

#include <cstdlib>
#include <iostream>
#include <memory>
#include <optional>
#include <string>

#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "glog/logging.h"
#include "grpcpp/grpcpp.h"
#include "planner_service/io/gpu_catalog_io.h"
#include "planner_service/io/model_io.h"
#include "worker_agent/engine/engine_service.h"
#include "worker_agent/engine_launch.h"
#include "worker_agent/node_runtime.h"

namespace {

int Usage(const char* why) {
  std::cerr << "arachne-engine: " << why << "\n"
            << "arachne-engine is started by arachne-agent (one per GPU) and "
               "reads its settings from the environment: "
               "ARACHNE_ENGINE_SOCKET, ARACHNE_NODE, ARACHNE_GPU_TYPE, "
               "ARACHNE_NODE_GPUS, LOCAL_RANK, ARACHNE_HOST, "
               "ARACHNE_VIRTUAL_GPUS, ARACHNE_VIRTUAL_GPU_SPEED, "
               "ARACHNE_MIGRATION_STAGING_MIB, ARACHNE_PROFILES_DIR, "
               "ARACHNE_FAILPOINT (docs/engines.md)\n";
  return 2;
}

}  // namespace

int main(int argc, char** argv) {
  if (argc > 1) {
    const std::string a = argv[1];
    if (a == "--help" || a == "-h") {
      Usage("the reference training engine, one GPU's rank");
      return 0;
    }
    return Usage(absl::StrCat("takes no arguments, got \"", a, "\"").c_str());
  }
  absl::StatusOr<arachne::agent::EngineEnvironment> env =
      arachne::agent::ReadEngineEnvironment(
          [](const char* name) -> std::optional<std::string> {
            const char* v = std::getenv(name);
            if (v == nullptr) return std::nullopt;
            return std::string(v);
          });
  if (!env.ok()) return Usage(std::string(env.status().message()).c_str());
  absl::StatusOr<arachne::GpuCatalog> catalog =
      arachne::LoadGpuCatalog(env->profiles_dir);
  if (!catalog.ok()) {
    return Usage(
        absl::StrCat("ARACHNE_PROFILES_DIR: ", catalog.status().message())
            .c_str());
  }
  absl::StatusOr<std::vector<arachne::ModelSpec>> models =
      arachne::LoadModelCatalog(env->profiles_dir);
  if (!models.ok()) {
    return Usage(
        absl::StrCat("ARACHNE_PROFILES_DIR: ", models.status().message())
            .c_str());
  }
  absl::StatusOr<int> type = catalog->IndexOf(env->gpu_type);
  if (!type.ok()) {
    return Usage(
        absl::StrCat("ARACHNE_GPU_TYPE: ", type.status().message()).c_str());
  }
  if (!env->failpoint.empty() &&
      env->failpoint != "corrupt-migration-stage-1" &&
      env->failpoint != "corrupt-migration-stage-2") {
    return Usage(absl::StrCat("ARACHNE_FAILPOINT: must be "
                              "corrupt-migration-stage-1 or -2, got \"",
                              env->failpoint, "\"")
                     .c_str());
  }

  FLAGS_logtostderr = true;
  google::InitGoogleLogging(argv[0]);
  // Only sigwait below receives the stop signals (gRPC's and the rank's
  // threads inherit this mask).
  sigset_t stop_signals;
  sigemptyset(&stop_signals);
  sigaddset(&stop_signals, SIGINT);
  sigaddset(&stop_signals, SIGTERM);
  pthread_sigmask(SIG_BLOCK, &stop_signals, nullptr);

  auto runtime = std::make_unique<arachne::agent::NodeRuntime>(
      arachne::agent::NodeGpus{.node = env->node,
                               .gpu_type = *type,
                               .count = env->node_gpus,
                               .virtual_gpus = env->virtual_gpus,
                               .virtual_gpu_speed = env->virtual_gpu_speed,
                               .host = env->host,
                               .failpoint = env->failpoint,
                               .local_rank = env->local_rank,
                               .staging_bytes = env->migration_staging_mib *
                                                arachne::agent::kMiB},
      *catalog);
  arachne::agent::EngineService service(runtime.get(), *catalog, *models);
  // A socket left by an engine that died is in the way of this one.
  unlink(env->socket.c_str());
  grpc::ServerBuilder builder;
  builder.AddListeningPort("unix:" + env->socket,
                           grpc::InsecureServerCredentials());
  builder.RegisterService(&service);
  std::unique_ptr<grpc::Server> server = builder.BuildAndStart();
  if (server == nullptr) {
    return Usage(absl::StrCat("ARACHNE_ENGINE_SOCKET: cannot listen on \"",
                              env->socket, "\"")
                     .c_str());
  }
  LOG(INFO) << "arachne-engine pid " << getpid() << ": node " << env->node
            << " GPU " << env->local_rank << " of " << env->node_gpus
            << (env->virtual_gpus ? " (CPU rank)" : "") << ", serving on "
            << env->socket;
  int signal = 0;
  sigwait(&stop_signals, &signal);
  LOG(INFO) << "signal " << signal << " received";
  server->Shutdown(absl::ToChronoTime(absl::Now() + absl::Seconds(2)));
  server.reset();
  runtime.reset();
  unlink(env->socket.c_str());
  return 0;
}
