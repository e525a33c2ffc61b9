// The launch environment of an engine process (worker_agent/engine_launch.h):
// what the agent sets reads back the same, and every bad or missing
// variable is refused naming it and its value.
#include "worker_agent/engine_launch.h"

#include <map>
#include <optional>
#include <string>

#include "gtest/gtest.h"

namespace arachne::agent {
namespace {

using Vars = std::map<std::string, std::string>;

absl::StatusOr<EngineEnvironment> Read(const Vars& vars) {
  return ReadEngineEnvironment(
      [&](const char* name) -> std::optional<std::string> {
        auto it = vars.find(name);
        if (it == vars.end()) return std::nullopt;
        return it->second;
      });
}

Vars AsMap(const std::vector<std::string>& vars) {
  Vars m;
  for (const std::string& v : vars) {
    const size_t eq = v.find('=');
    m[v.substr(0, eq)] = v.substr(eq + 1);
  }
  return m;
}

TEST(EngineLaunch, WhatTheAgentSetsReadsBack) {
  EngineEnvironment env;
  env.socket = "/tmp/arachne-engines-x/engine-3.sock";
  env.node = "gpu-box-3";
  env.gpu_type = "H100-SXM";
  env.node_gpus = 8;
  env.local_rank = 3;
  env.host = "10.0.0.3";
  env.virtual_gpus = false;
  env.profiles_dir = "/etc/arachne/profiles";
  env.failpoint = "corrupt-migration-stage-2";
  const Vars vars = AsMap(EngineEnvironmentVariables(env));
  EXPECT_EQ(vars.at("CUDA_VISIBLE_DEVICES"), "3");
  EXPECT_EQ(vars.at("LOCAL_RANK"), "3");
  EXPECT_EQ(vars.at("ARACHNE_VIRTUAL_GPUS"), "0");
  absl::StatusOr<EngineEnvironment> back = Read(vars);
  ASSERT_TRUE(back.ok()) << back.status();
  EXPECT_EQ(back->socket, env.socket);
  EXPECT_EQ(back->node, env.node);
  EXPECT_EQ(back->gpu_type, env.gpu_type);
  EXPECT_EQ(back->node_gpus, 8);
  EXPECT_EQ(back->local_rank, 3);
  EXPECT_EQ(back->host, env.host);
  EXPECT_FALSE(back->virtual_gpus);
  EXPECT_EQ(back->profiles_dir, env.profiles_dir);
  EXPECT_EQ(back->failpoint, env.failpoint);
  EXPECT_EQ(back->migration_staging_mib, 256);  // the default, not set
  EXPECT_EQ(vars.count("ARACHNE_MIGRATION_STAGING_MIB"), 0u);
  EXPECT_EQ(int64_t{back->migration_staging_mib} << 20,
            migration::ExecutorOptions::kDefaultStagingBytes);

  // CPU ranks: no CUDA device named, no optional variables.
  env.virtual_gpus = true;
  env.profiles_dir.clear();
  env.failpoint.clear();
  const Vars cpu = AsMap(EngineEnvironmentVariables(env));
  EXPECT_EQ(cpu.count("CUDA_VISIBLE_DEVICES"), 0u);
  EXPECT_EQ(cpu.count("ARACHNE_PROFILES_DIR"), 0u);
  EXPECT_EQ(cpu.count("ARACHNE_FAILPOINT"), 0u);
  EXPECT_EQ(cpu.count("ARACHNE_VIRTUAL_GPU_SPEED"), 0u);  // speed 1
  EXPECT_TRUE(Read(cpu)->virtual_gpus);
  EXPECT_EQ(Read(cpu)->virtual_gpu_speed, 1.0);

  // A virtual GPU slower than its CPU rank.
  env.virtual_gpu_speed = 0.35;
  const Vars slow = AsMap(EngineEnvironmentVariables(env));
  EXPECT_EQ(slow.at("ARACHNE_VIRTUAL_GPU_SPEED"), "0.34999999999999998");
  EXPECT_EQ(Read(slow)->virtual_gpu_speed, 0.35);

  // A migration staging size other than the default (issue 34), both ends
  // of its range.
  for (int mib : {64, 1, 65536}) {
    env.migration_staging_mib = mib;
    const Vars staged = AsMap(EngineEnvironmentVariables(env));
    EXPECT_EQ(staged.at("ARACHNE_MIGRATION_STAGING_MIB"), std::to_string(mib));
    absl::StatusOr<EngineEnvironment> r = Read(staged);
    ASSERT_TRUE(r.ok()) << r.status();
    EXPECT_EQ(r->migration_staging_mib, mib);
  }
}

TEST(EngineLaunch, BadOrMissingVariablesNameThemselves) {
  const Vars good = {{"ARACHNE_ENGINE_SOCKET", "/tmp/e.sock"},
                     {"ARACHNE_NODE", "n0"},
                     {"ARACHNE_GPU_TYPE", "A6000"},
                     {"ARACHNE_NODE_GPUS", "2"},
                     {"LOCAL_RANK", "1"}};
  ASSERT_TRUE(Read(good).ok());
  struct Case {
    std::string name, value, error;
  };
  const std::vector<Case> cases = {
      {"ARACHNE_NODE", "",
       "ARACHNE_NODE: required (the agent sets it when it starts the engine), "
       "got none"},
      {"ARACHNE_NODE_GPUS", "0",
       "ARACHNE_NODE_GPUS: must be an integer in 1..64, got \"0\""},
      {"ARACHNE_NODE_GPUS", "two",
       "ARACHNE_NODE_GPUS: must be an integer in 1..64, got \"two\""},
      {"LOCAL_RANK", "2", "LOCAL_RANK: must be an integer in 0..1, got \"2\""},
      {"LOCAL_RANK", "-1",
       "LOCAL_RANK: must be an integer in 0..1, got \"-1\""},
      {"ARACHNE_VIRTUAL_GPUS", "yes",
       "ARACHNE_VIRTUAL_GPUS: must be 0 or 1, got \"yes\""},
      {"ARACHNE_VIRTUAL_GPU_SPEED", "0",
       "ARACHNE_VIRTUAL_GPU_SPEED: must be a number in (0, 1], got \"0\""},
      {"ARACHNE_VIRTUAL_GPU_SPEED", "1.5",
       "ARACHNE_VIRTUAL_GPU_SPEED: must be a number in (0, 1], got \"1.5\""},
      {"ARACHNE_VIRTUAL_GPU_SPEED", "nan",
       "ARACHNE_VIRTUAL_GPU_SPEED: must be a number in (0, 1], got \"nan\""},
      {"ARACHNE_MIGRATION_STAGING_MIB", "0",
       "ARACHNE_MIGRATION_STAGING_MIB: must be an integer in 1..65536, got "
       "\"0\""},
      {"ARACHNE_MIGRATION_STAGING_MIB", "65537",
       "ARACHNE_MIGRATION_STAGING_MIB: must be an integer in 1..65536, got "
       "\"65537\""},
      {"ARACHNE_MIGRATION_STAGING_MIB", "-1",
       "ARACHNE_MIGRATION_STAGING_MIB: must be an integer in 1..65536, got "
       "\"-1\""},
      {"ARACHNE_MIGRATION_STAGING_MIB", "256MiB",
       "ARACHNE_MIGRATION_STAGING_MIB: must be an integer in 1..65536, got "
       "\"256MiB\""},
      {"ARACHNE_MIGRATION_STAGING_MIB", "",
       "ARACHNE_MIGRATION_STAGING_MIB: must be an integer in 1..65536, got "
       "\"\""},
      {"ARACHNE_ENGINE_SOCKET", "/tmp/" + std::string(110, 's'),
       "ARACHNE_ENGINE_SOCKET: a Unix socket path has at most 107 characters, "
       "got \"/tmp/" +
           std::string(110, 's') + "\""},
  };
  for (const Case& c : cases) {
    Vars v = good;
    v[c.name] = c.value;
    absl::StatusOr<EngineEnvironment> r = Read(v);
    ASSERT_FALSE(r.ok()) << c.name << "=" << c.value;
    EXPECT_EQ(r.status().code(), absl::StatusCode::kInvalidArgument);
    EXPECT_EQ(r.status().message(), c.error);
  }
  Vars missing = good;
  missing.erase("ARACHNE_ENGINE_SOCKET");
  EXPECT_EQ(Read(missing).status().message(),
            "ARACHNE_ENGINE_SOCKET: required (the agent sets it when it "
            "starts the engine), got none");
}

}  // namespace
}  // namespace arachne::agent
