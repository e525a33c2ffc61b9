// The settings of `arachne-planner` from its command line and an optional
// configuration file (`--config FILE`, YAML or JSON, schema
// arachne.v1.ServerConfig in proto/arachne/v1/server_config.proto). Every
// flag is a field of the same name ('-' written '_'); a flag given on the
// command line overrides the file, a field in neither keeps its default.
// Reading and merging are the shared reader's (config/config_reader.h); the
// fields, defaults and checks are here. Kept apart from main.cc so that
// reading, merging and checking are tested
// (test/server/server_config_test.cc).
#ifndef ARACHNE_PLANNER_SERVICE_SERVER_SERVER_CONFIG_H_
#define ARACHNE_PLANNER_SERVICE_SERVER_SERVER_CONFIG_H_

#include <string>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "absl/time/time.h"
#include "arachne/v1/server_config.pb.h"
#include "config/config_reader.h"
#include "planner_service/api/planner_handler_impl.h"
#include "planner_service/server/planner_server.h"

namespace arachne {

// Everything main.cc needs to run the service.
struct ServerSettings {
  PlannerServerConfig server;  // bearer token already read from token_file
  PlannerHandlerConfig handler;
  absl::Duration grace = absl::Seconds(10);
  std::string policies_dir;  // "" = DefaultPoliciesDir() (torch_policy.h)
};

// Parses `text` (YAML or JSON) read from `source` and checks each value it
// gives. InvalidArgument "<source>: <field>: <what>, got <value>" for an
// unknown field, a wrong type or a value out of range (e.g.
// "planner.yaml: max_budget_s: must be > 0, got -3").
absl::StatusOr<v1::ServerConfig> ParseServerConfig(absl::string_view text,
                                                   absl::string_view source);
// ParseServerConfig of the file at `path` (named by its path in errors);
// NotFound when it cannot be read.
absl::StatusOr<v1::ServerConfig> LoadServerConfigFile(const std::string& path);

// The checks of ParseServerConfig on the fields set in `config` (a field
// left unset keeps a valid default and is not checked).
absl::Status CheckServerConfigValues(const v1::ServerConfig& config,
                                     absl::string_view source);

// Defaults for unset fields, the checks that involve two fields (which may
// come from different places, so errors name the fields without a source:
// "max_in_flight: must be >= workers (8), got 4"), and the bearer token read
// from token_file (NotFound / InvalidArgument naming token_file and the
// path).
absl::StatusOr<ServerSettings> ResolveServerConfig(
    const v1::ServerConfig& config);

// The command line of arachne-planner: --config plus one flag per
// ServerConfig field, defaults shown in --help.
class ServerFlags {
 public:
  // Adds the flags to `app`, which must outlive this object's use.
  explicit ServerFlags(CLI::App& app);

  // After app.parse(): the --config path ("" when not given) and the flags
  // given on the command line as a ServerConfig (flags not given are unset
  // there, so they do not override the file).
  const std::string& config_file() const { return flags_.config_file(); }
  v1::ServerConfig Given() const;

  // Config file (if any) merged with the flags given, resolved. Errors as
  // LoadServerConfigFile / CheckServerConfigValues (source "command line")
  // / ResolveServerConfig.
  absl::StatusOr<ServerSettings> Settings() const;

 private:
  ConfigFlags flags_;
};

}  // namespace arachne

#endif  // ARACHNE_PLANNER_SERVICE_SERVER_SERVER_CONFIG_H_
