// How an agent starts an engine process and what the process is told
// (docs/engines.md, "Launch"): the engine command's own argv, plus these
// environment variables, the one contract every engine reads (the C++
// reference engine here, the PyTorch engine in python/):
//
//   ARACHNE_ENGINE_SOCKET  Unix socket path to serve arachne.v1.Engine on
//   ARACHNE_NODE           the node's name, as clusters name it
//   ARACHNE_GPU_TYPE       the node's GPU type (canonical catalog id)
//   ARACHNE_NODE_GPUS      GPUs of the node (1..64)
//   LOCAL_RANK             this engine's GPU on the node (0..GPUS-1), as
//                          torchrun sets it
//   ARACHNE_HOST           address other nodes reach this node's ranks at
//   ARACHNE_VIRTUAL_GPUS   "1": a CPU rank standing in for the GPU; "0": a
//                          CUDA GPU, the only one CUDA_VISIBLE_DEVICES
//                          leaves visible (device 0 in the process)
//   CUDA_VISIBLE_DEVICES   LOCAL_RANK on a CUDA node; unset for CPU ranks
//   ARACHNE_MIGRATION_STAGING_MIB  NodeGpus::staging_bytes in MiB, the
//                          agent's --migration-staging-mib (optional: set
//                          when not the default)
//   ARACHNE_PROFILES_DIR   the agent's --profiles-dir (optional)
//   ARACHNE_FAILPOINT      fault injection (optional; agent_config.proto)
#ifndef ARACHNE_WORKER_AGENT_ENGINE_LAUNCH_H_
#define ARACHNE_WORKER_AGENT_ENGINE_LAUNCH_H_

#include <cstdint>
#include <functional>
#include <optional>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "migration/core/executor.h"

namespace arachne::agent {

// A migration's staging memory per GPU in MiB (NodeGpus::staging_bytes >>
// 20): the agent's setting migration_staging_mib and the engine's
// ARACHNE_MIGRATION_STAGING_MIB, in kMinMigrationStagingMib..
// kMaxMigrationStagingMib. The default and the least are the executor's
// (migration::ExecutorOptions).
inline constexpr int64_t kMiB = int64_t{1} << 20;
inline constexpr int kDefaultMigrationStagingMib = static_cast<int>(
    migration::ExecutorOptions::kDefaultStagingBytes / kMiB);
inline constexpr int kMinMigrationStagingMib =
    static_cast<int>(migration::ExecutorOptions::kMinStagingBytes / kMiB);
inline constexpr int kMaxMigrationStagingMib = 65536;  // 64 GiB
static_assert(migration::ExecutorOptions::kDefaultStagingBytes % kMiB == 0 &&
              migration::ExecutorOptions::kMinStagingBytes % kMiB == 0 &&
              kMinMigrationStagingMib >= 1);

struct EngineEnvironment {
  std::string socket;
  std::string node;
  std::string gpu_type;
  int node_gpus = 0;
  int local_rank = 0;
  std::string host = "127.0.0.1";
  bool virtual_gpus = true;
  double virtual_gpu_speed = 1;  // NodeGpus::virtual_gpu_speed
  // NodeGpus::staging_bytes in MiB.
  int migration_staging_mib = kDefaultMigrationStagingMib;
  std::string profiles_dir;
  std::string failpoint;
};

// The variables above, "NAME=value" (the failpoint and profiles dir only
// when set, ARACHNE_VIRTUAL_GPU_SPEED only when not 1,
// ARACHNE_MIGRATION_STAGING_MIB only when not the default).
std::vector<std::string> EngineEnvironmentVariables(
    const EngineEnvironment& env);

// Reads the variables through `get` (getenv's answer: nullopt when unset).
// InvalidArgument naming the variable and its value for a missing required
// one, a number out of range or a path too long for a Unix socket.
absl::StatusOr<EngineEnvironment> ReadEngineEnvironment(
    const std::function<std::optional<std::string>(const char*)>& get);

// The version of the engine protocol (proto/arachne/v1/engine.proto) this
// build's agent and engine speak.
inline constexpr uint32_t kEngineProtocolVersion = 1;

// Longest Unix socket path (sun_path less its terminating NUL).
inline constexpr size_t kMaxSocketPath = 107;

}  // namespace arachne::agent

#endif  // ARACHNE_WORKER_AGENT_ENGINE_LAUNCH_H_
