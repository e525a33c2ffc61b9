// The settings of `arachne-agent` from its command line and an optional
// configuration file (`--config FILE`, YAML or JSON, schema
// arachne.v1.AgentConfig in proto/arachne/v1/agent_config.proto). Every flag
// is a field of the same name ('-' written '_'); a flag given on the command
// line overrides the file, a field in neither keeps its default.
//
// Errors name the setting where the user wrote it: "--gpu-type: unknown GPU
// type \"B300\"; known: ..." for a flag, "agent.yaml: gpu_type: ..." for a
// file field, and the flag for a setting given nowhere ("--node: required
// (or node in the config file), got none"). All are InvalidArgument except
// files that cannot be read (NotFound naming the setting and the path).
//
// Reading and merging are the shared reader's (config/config_reader.h); the
// fields, defaults and checks are here. Kept apart from main.cc and from the
// training runtime (target arachne_agent_config needs neither LibTorch nor
// the runtime) so that reading, merging and checking are tested
// (test/agent/agent_config_test.cc).
#ifndef ARACHNE_WORKER_AGENT_AGENT_CONFIG_H_
#define ARACHNE_WORKER_AGENT_AGENT_CONFIG_H_

#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "absl/time/time.h"
#include "arachne/v1/agent_config.pb.h"
#include "config/config_reader.h"
#include "planner_service/core/model/gpu_catalog.h"
#include "planner_service/core/model/model.h"
#include "rpc/credentials.h"
#include "worker_agent/engine_launch.h"

namespace arachne::agent {

// The agent's failpoint "hang-status-while:<absolute path>": while the file
// exists the Agent service's Status answers nothing (it waits out the
// caller's deadline, its connection open) though the agent heartbeats on,
// as a hung service beside a live registration thread (controller tests).
inline constexpr char kHangStatusWhile[] = "hang-status-while:";

// Everything main.cc needs to run the agent, resolved and checked.
struct AgentSettings {
  std::string listen = "127.0.0.1:0";  // port 0 picks a free one
  std::string node;
  // Where other nodes reach this node's ranks (NodeGpus::host).
  std::string host = "127.0.0.1";
  std::string failpoint;  // NodeGpus::failpoint
  int gpu_type = -1;  // index into `catalog`
  int gpu_count = 0;
  bool virtual_gpus = true;       // CPU ranks standing in for GPUs
  double virtual_gpu_speed = 1;   // NodeGpus::virtual_gpu_speed
  // NodeGpus::staging_bytes in MiB, in kMinMigrationStagingMib..
  // kMaxMigrationStagingMib (engine_launch.h).
  int migration_staging_mib = kDefaultMigrationStagingMib;
  std::string profiles_dir;       // "" = built-in data
  GpuCatalog catalog;             // from profiles_dir
  std::vector<ModelSpec> models;  // the model catalog, from profiles_dir
  ServerTlsConfig tls;
  std::string bearer_token;  // read from token_file; "" = none
  std::string port_file;     // "" = none
  absl::Duration grace = absl::Seconds(10);
  // Self-registration (worker_agent/registration.h); "" = none.
  std::string controller;
  std::string controller_token;  // read from controller_token_file
  ClientTlsConfig controller_tls;
  // The engine processes (engine_supervisor.h): argv of the engine; empty
  // = arachne-engine beside the agent binary.
  std::vector<std::string> engine_command;
  std::string log_dir;            // "" = the engines' socket directory
  bool in_process_ranks = false;  // ranks as threads, no engine processes
  // Every checkpoint path must lie in this directory (CheckCheckpointDir):
  // absolute, created by ResolveAgentConfig and with its symlinks resolved.
  // "" = none: the agent writes and reads no checkpoints.
  std::string checkpoint_root;
};

// A checkpoint directory `dir` the agent was given in request field `field`
// ("dir", "checkpoint_dir"), checked against the agent's `root` (a resolved
// absolute path, AgentSettings::checkpoint_root). Answers the path to use:
// `dir` lexically normalised ("." and ".." folded) with the symlinks of its
// longest existing prefix resolved, which is what the check was made on, so
// the caller must read and write that path and no other. Errors, each naming
// the field and quoting the value (at most kMaxQuotedBytes of it):
//   FailedPrecondition "<field>: this agent has no --checkpoint-root ..."
//     when `root` is empty;
//   InvalidArgument "<field>: must be an absolute path ..., got \"rel\"";
//   InvalidArgument "<field>: must be inside the checkpoint root \"/r\", got
//     \"/r/a/../../x\" (resolved to \"/x\")" for a path that leaves it,
//     through ".." or through a symlink;
//   the code of CheckpointIoCode (checkpoint_io.h) when the existing prefix cannot be
//     examined (a component that is not a directory, no permission, ...).
absl::StatusOr<std::string> CheckCheckpointDir(absl::string_view root,
                                               absl::string_view field,
                                               absl::string_view dir);


// Parses `text` (YAML or JSON) read from `source` and checks each value it
// gives, naming "<source>: <field>". Unknown fields, wrong types and
// out-of-range integers are errors too.
absl::StatusOr<v1::AgentConfig> ParseAgentConfig(absl::string_view text,
                                                 absl::string_view source);
// ParseAgentConfig of the file at `path`; NotFound when it cannot be read.
absl::StatusOr<v1::AgentConfig> LoadAgentConfigFile(const std::string& path);

// `file` (read from `file_source`, "" for none) with every field set in
// `flags` replacing the file's value, then checked and resolved: the GPU
// type in the catalog of profiles_dir, the bearer token read from
// token_file, TLS files paired. `cuda_devices` is the number of CUDA GPUs
// this machine has (0 without CUDA): with no virtual_gpus the agent uses
// all of them, and with none virtual_gpus is required.
absl::StatusOr<AgentSettings> ResolveAgentConfig(const v1::AgentConfig& file,
                                                 absl::string_view file_source,
                                                 const v1::AgentConfig& flags,
                                                 int cuda_devices);

// Writes `port` (decimal and a newline) to `path` through a temporary file
// renamed into place, so a reader polling for the file never reads a
// partial one. Unavailable "port_file: ..." naming the path on failure.
absl::Status WritePortFile(const std::string& path, int port);

// The command line of arachne-agent: --config plus one flag per AgentConfig
// field. Values are checked by Settings(), not by CLI11, so that every bad
// value is reported in the same words (main.cc exits 2 with them).
class AgentFlags {
 public:
  // Adds the flags to `app`, which must outlive this object's use.
  explicit AgentFlags(CLI::App& app);

  // After app.parse(): the --config path ("" when not given) and the flags
  // given on the command line (flags not given are unset there, so they do
  // not override the file).
  const std::string& config_file() const { return flags_.config_file(); }
  v1::AgentConfig Given() const;

  // Config file (if any) merged with the flags given, resolved
  // (ResolveAgentConfig).
  absl::StatusOr<AgentSettings> Settings(int cuda_devices) const;

 private:
  ConfigFlags flags_;
};

}  // namespace arachne::agent

#endif  // ARACHNE_WORKER_AGENT_AGENT_CONFIG_H_
