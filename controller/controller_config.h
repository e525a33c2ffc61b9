// The job file (`--job FILE`, arachne.v1.JobSpec) and the settings of
// `arachne-controller` (flags and `--config FILE`, arachne.v1.ControllerConfig,
// proto/arachne/v1/controller.proto), read with the same strict schema
// reader as every other file (planner_service/io/config_file.h; flags and
// config file through the binaries' shared reader, config/config_reader.h)
// and checked into typed settings. Flags are defined only by
// ControllerFlags; a flag given on the command line overrides the file.
//
// Errors name the setting where the user wrote it ("job.yaml:
// timeouts.phase_s: must be < switch_s (120), got 200", "--state-dir:
// required (or state_dir in the config file), got none"); all are
// InvalidArgument except files that cannot be read (NotFound).
#ifndef ARACHNE_CONTROLLER_CONTROLLER_CONFIG_H_
#define ARACHNE_CONTROLLER_CONTROLLER_CONFIG_H_

#include <cstdint>
#include <map>
#include <optional>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "absl/time/time.h"
#include "arachne/v1/controller.pb.h"
#include "config/config_reader.h"
#include "controller/agent_networks.h"
#include "controller/membership.h"
#include "planner_service/core/model/gpu_catalog.h"
#include "planner_service/core/model/model.h"
#include "planner_service/api/planner_handler.h"
#include "rpc/credentials.h"
#include "worker_agent/engine/engine.h"

namespace arachne::controller {

// A job, resolved and checked.
struct JobSettings {
  ModelRef model;            // as the planner takes it
  TrainingSpec training;     // as the planner takes it
  agent::JobSpec job;        // as the agents take it (model resolved)
  int64_t iterations = 0;
  int min_gpus = 1;
  MembershipConfig membership;  // lease, join window, flapping
  absl::Duration transfer_round = absl::Seconds(15);
  absl::Duration phase = absl::Seconds(30);
  absl::Duration switch_timeout = absl::Seconds(120);
  absl::Duration horizon = absl::Seconds(3600);
  double switch_fixed_cost_s = 2;
  // The keep-or-switch rule's least relative gain and the margin an
  // unmeasured GPU type counts against a switch (controller/decision.h).
  double switch_min_gain = 0.05;
  double unmeasured_type_margin = 0.1;
  // A fit moving a compute scale by more than this factor since the last
  // decision's prices asks for a replan; 0 = never.
  double replan_correction_factor = 2;
  std::string checkpoint_dir;
  // Restore from here when an ungraceful leave took bytes no surviving GPU
  // holds; "" = stop training with an error then.
  std::string fallback_checkpoint_dir;
  // A generation's measured iteration time: the median of its last
  // `measure_window` iterations after the first `measure_warmup` ones.
  int measure_warmup = 3;
  int measure_window = 20;
  // Planner: an empty address is the embedded planner.
  std::string planner_address;
  std::string planner_tls_ca, planner_tls_cert, planner_tls_key;
  std::string planner_token;  // read from token_file
  // "" = the default planner: learned where a policy serves the model, else
  // template-search (planners.h, ChooseDefaultPlanner).
  std::string planner;
  double planner_budget_s = 2;  // learned and template-search stop at 0.9 s
  int planner_max_depth = 0;
  int planner_max_templates = 0;
  uint64_t planner_seed = 0;
  // A remote planner that does not answer: retries, back-off, fallback.
  int planner_retries = 3;
  absl::Duration planner_retry_backoff = absl::Milliseconds(500);
  bool planner_fallback = true;
};

// The --failpoint of the end-to-end tests: every switch waits `hold` after
// entering `phase` (persisted and announced) and before its first RPC.
struct SwitchHold {
  std::string phase;  // SwitchPhaseName's names; "" = none
  absl::Duration hold = absl::ZeroDuration();
};
// "hold-before-<phase>:<seconds>"; InvalidArgument naming what is wrong.
absl::StatusOr<SwitchHold> ParseSwitchHold(absl::string_view text);

// Checks `spec` (read from `source`) against the catalogs.
absl::StatusOr<JobSettings> ResolveJob(const v1::JobSpec& spec,
                                       absl::string_view source,
                                       const GpuCatalog& catalog,
                                       const std::vector<ModelSpec>& models);
// Reads, parses and resolves the job file at `path`.
absl::StatusOr<JobSettings> LoadJobFile(const std::string& path,
                                        const GpuCatalog& catalog,
                                        const std::vector<ModelSpec>& models);

// Who may speak for a node in Register and Heartbeat (docs/controller.md,
// "Agent identity").
struct NodeAuthConfig {
  // --node-tokens-file: a node listed here must send its own token; the
  // shared token does not speak for it.
  std::map<std::string, std::string> node_tokens;
  // --agent-identity: with mutual TLS, the client certificate's name that
  // must be the node's.
  enum class CertName { kNone, kCommonName, kSubjectAltName };
  CertName cert_name = CertName::kNone;
};
// At most this many nodes in --node-tokens-file, a token at most this long.
inline constexpr int kMaxNodeTokens = 100000;
inline constexpr size_t kMaxTokenBytes = 4096;
// JobSettings::replan_correction_factor, when not 0: below 1.05 a fit's
// noise would replan; above 1e4, no correction the fit allows gets there.
inline constexpr double kMinReplanCorrectionFactor = 1.05;
inline constexpr double kMaxReplanCorrectionFactor = 1e4;

// Reads --node-tokens-file: "<node> <token>" per line, '#' comments and
// blank lines skipped. InvalidArgument naming `field`, the line and what is
// wrong (not a node name, no token, a second token for a node, too many);
// NotFound when the file cannot be read.
absl::StatusOr<std::map<std::string, std::string>> ReadNodeTokensFile(
    const std::string& path, absl::string_view field);

struct ControllerSettings {
  std::string listen = "127.0.0.1:0";
  std::string port_file;
  std::string state_dir;
  std::string job_file;
  ServerTlsConfig tls;
  std::string bearer_token;  // callers must send it; "" = none
  ClientTlsConfig agent_tls;
  std::string agent_token;
  std::string store_host = "127.0.0.1";
  std::string profiles_dir;
  absl::Duration grace = absl::Seconds(5);
  SwitchHold hold;  // --failpoint
  // --agent-networks; none: AgentNetworks::Default().
  std::optional<AgentNetworks> agent_networks;
  NodeAuthConfig node_auth;  // --node-tokens-file, --agent-identity
};

// `file` (from `file_source`) with the fields set in `flags` replacing its
// values, checked; token files read.
absl::StatusOr<ControllerSettings> ResolveControllerConfig(
    const v1::ControllerConfig& file, absl::string_view file_source,
    const v1::ControllerConfig& flags);

class ControllerFlags {
 public:
  explicit ControllerFlags(CLI::App& app);
  v1::ControllerConfig Given() const;
  absl::StatusOr<ControllerSettings> Settings() const;

 private:
  ConfigFlags flags_;
};

}  // namespace arachne::controller

#endif  // ARACHNE_CONTROLLER_CONTROLLER_CONFIG_H_
