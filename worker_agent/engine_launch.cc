#include "worker_agent/engine_launch.h"

#include <cmath>
#include <string>
#include <vector>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"

namespace arachne::agent {
namespace {

absl::Status Bad(const char* name, const std::string& value,
                 const std::string& what) {
  return absl::InvalidArgumentError(
      absl::StrCat(name, ": ", what, ", got \"", value, "\""));
}

}  // namespace

std::vector<std::string> EngineEnvironmentVariables(
    const EngineEnvironment& env) {
  std::vector<std::string> vars = {
      absl::StrCat("ARACHNE_ENGINE_SOCKET=", env.socket),
      absl::StrCat("ARACHNE_NODE=", env.node),
      absl::StrCat("ARACHNE_GPU_TYPE=", env.gpu_type),
      absl::StrCat("ARACHNE_NODE_GPUS=", env.node_gpus),
      absl::StrCat("LOCAL_RANK=", env.local_rank),
      absl::StrCat("ARACHNE_HOST=", env.host),
      absl::StrCat("ARACHNE_VIRTUAL_GPUS=", env.virtual_gpus ? "1" : "0"),
  };
  if (!env.virtual_gpus) {
    vars.push_back(absl::StrCat("CUDA_VISIBLE_DEVICES=", env.local_rank));
  }
  if (env.virtual_gpu_speed != 1) {
    vars.push_back(absl::StrCat("ARACHNE_VIRTUAL_GPU_SPEED=",
                                absl::StrFormat("%.17g", env.virtual_gpu_speed)));
  }
  if (env.migration_staging_mib != kDefaultMigrationStagingMib) {
    vars.push_back(absl::StrCat("ARACHNE_MIGRATION_STAGING_MIB=",
                                env.migration_staging_mib));
  }
  if (!env.profiles_dir.empty()) {
    vars.push_back(absl::StrCat("ARACHNE_PROFILES_DIR=", env.profiles_dir));
  }
  if (!env.failpoint.empty()) {
    vars.push_back(absl::StrCat("ARACHNE_FAILPOINT=", env.failpoint));
  }
  return vars;
}

absl::StatusOr<EngineEnvironment> ReadEngineEnvironment(
    const std::function<std::optional<std::string>(const char*)>& get) {
  EngineEnvironment env;
  auto required = [&](const char* name, std::string* out) -> absl::Status {
    std::optional<std::string> v = get(name);
    if (!v.has_value() || v->empty()) {
      return absl::InvalidArgumentError(absl::StrCat(
          name,
          ": required (the agent sets it when it starts the engine), "
          "got none"));
    }
    if (v->size() > 4096) {
      return absl::InvalidArgumentError(
          absl::StrCat(name, ": at most 4096 characters, got ", v->size()));
    }
    *out = *v;
    return absl::OkStatus();
  };
  auto integer = [&](const char* name, int lo, int hi,
                     int* out) -> absl::Status {
    std::string v;
    if (absl::Status s = required(name, &v); !s.ok()) return s;
    if (!absl::SimpleAtoi(v, out) || *out < lo || *out > hi) {
      return Bad(name, v, absl::StrCat("must be an integer in ", lo, "..", hi));
    }
    return absl::OkStatus();
  };
  if (absl::Status s = required("ARACHNE_ENGINE_SOCKET", &env.socket);
      !s.ok()) {
    return s;
  }
  if (env.socket.size() > kMaxSocketPath) {
    return Bad("ARACHNE_ENGINE_SOCKET", env.socket,
               absl::StrCat("a Unix socket path has at most ", kMaxSocketPath,
                            " characters"));
  }
  if (absl::Status s = required("ARACHNE_NODE", &env.node); !s.ok()) return s;
  if (absl::Status s = required("ARACHNE_GPU_TYPE", &env.gpu_type); !s.ok()) {
    return s;
  }
  if (absl::Status s = integer("ARACHNE_NODE_GPUS", 1, 64, &env.node_gpus);
      !s.ok()) {
    return s;
  }
  if (absl::Status s =
          integer("LOCAL_RANK", 0, env.node_gpus - 1, &env.local_rank);
      !s.ok()) {
    return s;
  }
  if (std::optional<std::string> h = get("ARACHNE_HOST"); h && !h->empty()) {
    env.host = *h;
  }
  std::optional<std::string> v = get("ARACHNE_VIRTUAL_GPUS");
  if (v.has_value() && *v != "0" && *v != "1") {
    return Bad("ARACHNE_VIRTUAL_GPUS", *v, "must be 0 or 1");
  }
  env.virtual_gpus = !v.has_value() || *v == "1";
  if (std::optional<std::string> s = get("ARACHNE_VIRTUAL_GPU_SPEED")) {
    double speed = 0;
    if (!absl::SimpleAtod(*s, &speed) || !std::isfinite(speed) ||
        !(speed > 0 && speed <= 1)) {
      return Bad("ARACHNE_VIRTUAL_GPU_SPEED", *s, "must be a number in (0, 1]");
    }
    if (!env.virtual_gpus) {
      return Bad("ARACHNE_VIRTUAL_GPU_SPEED", *s,
                 "only with ARACHNE_VIRTUAL_GPUS=1");
    }
    env.virtual_gpu_speed = speed;
  }
  if (std::optional<std::string> m = get("ARACHNE_MIGRATION_STAGING_MIB")) {
    if (!absl::SimpleAtoi(*m, &env.migration_staging_mib) ||
        env.migration_staging_mib < kMinMigrationStagingMib ||
        env.migration_staging_mib > kMaxMigrationStagingMib) {
      return Bad("ARACHNE_MIGRATION_STAGING_MIB", *m,
                 absl::StrCat("must be an integer in ", kMinMigrationStagingMib,
                              "..", kMaxMigrationStagingMib));
    }
  }
  if (std::optional<std::string> p = get("ARACHNE_PROFILES_DIR")) {
    env.profiles_dir = *p;
  }
  if (std::optional<std::string> f = get("ARACHNE_FAILPOINT")) {
    env.failpoint = *f;
  }
  return env;
}

}  // namespace arachne::agent
