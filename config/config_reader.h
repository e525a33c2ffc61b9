// The settings reader that arachne-planner, arachne-agent and
// arachne-controller share: command-line flags and an optional `--config
// FILE` (YAML or JSON) read into one config message (arachne.v1.ServerConfig,
// AgentConfig, ControllerConfig) whose fields are all `optional`, so that a
// setting given (even as 0 or "") is told apart from one left out. Every flag
// is the field of the same name with '_' written '-'; a flag given on the
// command line overrides the file's field, a field set in neither keeps the
// binary's default.
//
// Here is what is the same for the three: the file read strictly through the
// protobuf JSON mapping (planner_service/io/config_file.h: unknown fields,
// wrong types and out-of-range integers are InvalidArgument
// "<source>: <field>: <what>, got <value>"; a file that cannot be read is
// NotFound "config: cannot read \"<path>\""), the flags registered from the
// schema, the merge by field presence, the names errors give a setting, and
// the checks whose wording all three use. Each binary keeps its own fields'
// help, defaults, checks and the resolution into its typed settings
// (planner_service/server/server_config.h, worker_agent/agent_config.h,
// controller/controller_config.h).
#ifndef ARACHNE_CONFIG_CONFIG_READER_H_
#define ARACHNE_CONFIG_CONFIG_READER_H_

#include <cstdint>
#include <deque>
#include <optional>
#include <string>
#include <variant>

#include "absl/functional/function_ref.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "google/protobuf/descriptor.h"
#include "google/protobuf/message.h"
#include "planner_service/io/config_file.h"

namespace CLI {
class App;
class Option;
}  // namespace CLI

namespace arachne {

// The checks a binary makes of each value a config message gives, naming the
// fields after `source` (the file's path, or how the binary names its
// command line). Only the fields set are checked: one left unset keeps a
// valid default.
template <typename Config>
using ConfigCheck = absl::FunctionRef<absl::Status(const Config& config,
                                                   absl::string_view source)>;

// `text` (YAML or JSON, read from `source`) parsed into a Config, then
// `check`ed. Errors as ParseConfigText, then as `check`.
template <typename Config>
absl::StatusOr<Config> ReadConfigText(absl::string_view text,
                                      absl::string_view source,
                                      ConfigCheck<Config> check) {
  Config config;
  if (absl::Status s = ParseConfigText(text, source, &config); !s.ok()) {
    return s;
  }
  if (absl::Status s = check(config, source); !s.ok()) return s;
  return config;
}

// The same for the file at `path`, named by its path. Errors as
// LoadConfigFile (NotFound when it cannot be read), then as `check`.
template <typename Config>
absl::StatusOr<Config> ReadConfigFile(const std::string& path,
                                      ConfigCheck<Config> check) {
  Config config;
  if (absl::Status s = LoadConfigFile(path, &config); !s.ok()) return s;
  if (absl::Status s = check(config, path); !s.ok()) return s;
  return config;
}

// `file` with every field set in `flags` replacing the file's value. The
// config messages' fields are all `optional` (ConfigFlags::Add insists), so
// MergeFrom copies exactly the fields set in `flags`: the flags given.
template <typename Config>
Config MergeFlagsOverFile(const Config& file, const Config& flags) {
  Config merged = file;
  merged.MergeFrom(flags);
  return merged;
}

// The flag of a config field: "max_budget_s" -> "--max-budget-s".
std::string ConfigFlagName(absl::string_view field);

// Whether `field` is set in `config`. The field must be one of its schema's
// (a misspelt name is a bug, not a setting left out: CHECK).
bool HasConfigField(const google::protobuf::Message& config,
                    absl::string_view field);

// InvalidArgument "<name>: <message>", `name` naming the setting where the
// user wrote it (e.g. "--grace-s", "agent.yaml: grace_s").
absl::Status SettingError(absl::string_view name, absl::string_view message);

// InvalidArgument for a setting given nowhere, named as its flag, the first
// place to give it: "--node: required (or node in the config file), got
// none".
absl::Status RequiredSettingError(absl::string_view field);

// How errors name a setting: where the user wrote it, the flag winning as
// in the merge ("--gpu-type"), else the file's field ("agent.yaml:
// gpu_type"), and as the flag when it was written nowhere, since the flag is
// the first place to give it.
class SettingNames {
 public:
  // `file` was read from `file_source` ("": a file without a name, whose
  // fields are named bare, "gpu_type"); `flags` holds the flags given.
  // Either may be null (nothing written there); both must outlive this
  // object.
  SettingNames(absl::string_view file_source,
               const google::protobuf::Message* file,
               const google::protobuf::Message* flags)
      : file_source_(file_source), file_(file), flags_(flags) {}

  std::string operator()(absl::string_view field) const;

  // SettingError naming `field`.
  absl::Status Error(absl::string_view field, absl::string_view message) const;

 private:
  std::string file_source_;
  const google::protobuf::Message* file_;
  const google::protobuf::Message* flags_;
};

// Names a config field in an error (a SettingNames, or a binary's own rule).
using SettingNamer = absl::FunctionRef<std::string(absl::string_view field)>;

// A seconds setting named `name`: finite and > 0, or >= 0 when `zero_ok`.
// The protobuf JSON mapping accepts "NaN" and "Infinity" for doubles, hence
// the finite check. InvalidArgument "<name>: must be > 0, got -3" or
// "<name>: must be >= 0, got nan".
absl::Status CheckSecondsSetting(absl::string_view name, double value,
                                 bool zero_ok);

// An integer setting named `name`: at least `min`, and at most `max` when
// given. InvalidArgument "<name>: must be an integer >= 1, got 0", or with a
// maximum "<name>: must be an integer in 1..64, got 65".
absl::Status CheckIntegerSetting(absl::string_view name, int64_t value,
                                 int64_t min,
                                 std::optional<int64_t> max = std::nullopt);

// The pairing of a gRPC server's TLS files, the config fields tls_cert,
// tls_key and tls_client_ca (their values here; "" = not given), checked
// before MakeServerCredentials would, in the names the user wrote: a key or
// a client CA needs a certificate ("<tls_cert>: required with <tls_key>, got
// none"), a certificate needs its key ("<tls_key>: required with <tls_cert>,
// got none"). Each field named by `name`.
absl::Status CheckServerTlsSettings(absl::string_view cert,
                                    absl::string_view key,
                                    absl::string_view client_ca,
                                    SettingNamer name);

// A binary's command line: --config and one flag per config field it adds.
// Values are read by CLI11 into this object and become a config message in
// Given(); only the flags given are set there, so a flag not given never
// overrides the file.
class ConfigFlags {
 public:
  // A flag's value as CLI11 reads it, of its field's type.
  using Value = std::variant<std::string, int32_t, double, bool>;

  // Adds --config to `app` for a settings file of `schema` (e.g.
  // arachne.v1.ServerConfig). `app` must outlive this object's use.
  ConfigFlags(CLI::App& app, const google::protobuf::Descriptor& schema);
  // CLI11 holds pointers to the values held here.
  ConfigFlags(const ConfigFlags&) = delete;
  ConfigFlags& operator=(const ConfigFlags&) = delete;

  // Adds the flag of config field `field` ("max_budget_s": --max-budget-s),
  // typed as the field: text, an integer, a number, or for a bool field a
  // flag without a value. With `shown`, --help shows it as the default (a
  // flag not given still sets nothing: the binary's default is the one that
  // counts). The field must be the schema's, `optional`, and `shown` of its
  // type (CHECK).
  void Add(absl::string_view field, std::string help,
           std::optional<Value> shown = std::nullopt);

  // After app.parse(): the --config path ("" when not given).
  const std::string& config_file() const { return config_file_; }

  // After app.parse(): the flags given on the command line as a Config
  // (the schema's message type), every flag not given unset.
  template <typename Config>
  Config Given() const {
    Config given;
    SetGiven(&given);
    return given;
  }

  // After app.parse(): the --config file read and `check`ed
  // (ReadConfigFile), or an empty Config (all defaults) without --config.
  template <typename Config>
  absl::StatusOr<Config> File(ConfigCheck<Config> check) const {
    if (config_file_.empty()) return Config();
    return ReadConfigFile<Config>(config_file_, check);
  }

 private:
  struct Flag {
    const google::protobuf::FieldDescriptor* field;
    CLI::Option* option;
    Value value;  // CLI11 writes the flag's value here
  };

  void SetGiven(google::protobuf::Message* given) const;

  CLI::App& app_;
  const google::protobuf::Descriptor& schema_;
  std::string config_file_;
  // A deque never moves its elements, so the values CLI11 points into stay
  // put as flags are added.
  std::deque<Flag> flags_;
};

// --tls-cert, --tls-key, --tls-client-ca and --token-file, as arachne-planner
// and arachne-agent describe them: a gRPC server's TLS files (paired by
// CheckServerTlsSettings) and the file of the bearer token its callers must
// send, config fields of the same names.
void AddServerSecurityFlags(ConfigFlags& flags);

}  // namespace arachne

#endif  // ARACHNE_CONFIG_CONFIG_READER_H_
