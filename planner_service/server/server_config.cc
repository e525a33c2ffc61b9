#include "planner_service/server/server_config.h"

#include "CLI/CLI.hpp"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "planner_service/server/planner_server.h"
#include "rpc/credentials.h"

namespace arachne {
namespace {

constexpr absl::string_view kCommandLine = "command line";

// How errors name a field read from `source`: "<source>: <field>", or the
// bare field without a source. On the command line the field is named as
// the user typed it, as a flag (max_budget_s -> --max-budget-s).
std::string FieldName(absl::string_view source, absl::string_view field) {
  const std::string name =
      source == kCommandLine ? ConfigFlagName(field) : std::string(field);
  return source.empty() ? name : absl::StrCat(source, ": ", name);
}

}  // namespace

absl::Status CheckServerConfigValues(const v1::ServerConfig& config,
                                     absl::string_view source) {
  // gRPC reads what it cannot parse its own way (port 99999 as another
  // port, "host:" as 443), so the address is checked here, naming its
  // source.
  if (config.has_listen()) {
    if (absl::Status s = CheckListenAddress(config.listen()); !s.ok()) {
      return SettingError(FieldName(source, "listen"), s.message());
    }
  }
  if (config.has_health_listen() && !config.health_listen().empty()) {
    if (absl::Status s = CheckListenAddress(config.health_listen()); !s.ok()) {
      return SettingError(FieldName(source, "health_listen"), s.message());
    }
  }
  if (config.has_workers()) {
    if (absl::Status s = CheckIntegerSetting(FieldName(source, "workers"),
                                             config.workers(), 1);
        !s.ok()) {
      return s;
    }
  }
  if (config.has_max_in_flight()) {
    if (absl::Status s = CheckIntegerSetting(FieldName(source, "max_in_flight"),
                                             config.max_in_flight(), 1);
        !s.ok()) {
      return s;
    }
  }
  if (config.has_default_budget_s()) {
    if (absl::Status s =
            CheckSecondsSetting(FieldName(source, "default_budget_s"),
                                config.default_budget_s(), false);
        !s.ok()) {
      return s;
    }
  }
  if (config.has_max_budget_s()) {
    if (absl::Status s = CheckSecondsSetting(FieldName(source, "max_budget_s"),
                                             config.max_budget_s(), false);
        !s.ok()) {
      return s;
    }
  }
  if (config.has_grace_s()) {
    if (absl::Status s = CheckSecondsSetting(FieldName(source, "grace_s"),
                                             config.grace_s(), true);
        !s.ok()) {
      return s;
    }
  }
  return absl::OkStatus();
}

absl::StatusOr<v1::ServerConfig> ParseServerConfig(absl::string_view text,
                                                   absl::string_view source) {
  return ReadConfigText<v1::ServerConfig>(text, source,
                                          CheckServerConfigValues);
}

absl::StatusOr<v1::ServerConfig> LoadServerConfigFile(const std::string& path) {
  return ReadConfigFile<v1::ServerConfig>(path, CheckServerConfigValues);
}

absl::StatusOr<ServerSettings> ResolveServerConfig(
    const v1::ServerConfig& config) {
  ServerSettings settings;
  PlannerServerConfig& server = settings.server;
  if (config.has_listen()) server.listen = config.listen();
  server.health_listen = config.health_listen();
  settings.handler.profiles_dir = config.profiles_dir();
  settings.policies_dir = config.policies_dir();
  if (config.has_workers()) server.service.workers = config.workers();
  if (config.has_max_in_flight()) {
    server.service.max_in_flight = config.max_in_flight();
  }
  if (config.has_default_budget_s()) {
    settings.handler.default_budget = absl::Seconds(config.default_budget_s());
  }
  if (config.has_max_budget_s()) {
    settings.handler.max_budget = absl::Seconds(config.max_budget_s());
  }
  if (config.has_grace_s()) settings.grace = absl::Seconds(config.grace_s());
  server.tls.cert_file = config.tls_cert();
  server.tls.key_file = config.tls_key();
  server.tls.client_ca_file = config.tls_client_ca();

  // The checks PlannerServer::Start would also make, here in the names of
  // the flags and fields the user wrote.
  if (server.service.max_in_flight < server.service.workers) {
    return SettingError(
        "max_in_flight",
        absl::StrCat("must be >= workers (", server.service.workers, "), got ",
                     server.service.max_in_flight));
  }
  if (absl::Status s = CheckServerTlsSettings(
          server.tls.cert_file, server.tls.key_file, server.tls.client_ca_file,
          [](absl::string_view field) { return std::string(field); });
      !s.ok()) {
    return s;
  }
  // The same fixed port twice cannot both bind; say which setting clashes
  // rather than a bind failure.
  if (!server.health_listen.empty() && server.health_listen == server.listen &&
      !absl::EndsWith(server.listen, ":0")) {
    return SettingError("health_listen",
                        absl::StrCat("must differ from listen, got \"",
                                     server.health_listen, "\""));
  }

  if (config.has_token_file() && !config.token_file().empty()) {
    absl::StatusOr<std::string> token =
        ReadBearerTokenFile(config.token_file(), "token_file");
    if (!token.ok()) return token.status();
    server.service.bearer_token = *std::move(token);
  }
  return settings;
}

ServerFlags::ServerFlags(CLI::App& app)
    : flags_(app, *v1::ServerConfig::descriptor()) {
  // The defaults shown in --help are those of the config structs; a flag
  // not given never overrides (see Given), so they are only shown here.
  const ServerSettings defaults;
  flags_.Add("listen", "host:port to serve on (port 0 picks one)",
             defaults.server.listen);
  flags_.Add("health_listen",
             "host:port of a plaintext port serving only "
             "grpc.health.v1.Health, for probes that cannot speak TLS "
             "(default: none)");
  flags_.Add("profiles_dir",
             "directory of gpus.yaml, models.yaml and profiles (default: "
             "built-in data)");
  flags_.Add("policies_dir",
             "directory of the learned planner's <model>.pt checkpoints "
             "(default: $ARACHNE_POLICIES_DIR, else the shipped "
             "profiles/policies)");
  flags_.Add("workers", "threads running Plan/Evaluate/Replan",
             defaults.server.service.workers);
  flags_.Add("max_in_flight",
             "Plan/Evaluate/Replan calls admitted at once; more answer "
             "RESOURCE_EXHAUSTED",
             defaults.server.service.max_in_flight);
  flags_.Add("default_budget_s",
             "search budget when a request gives none, for the search "
             "planners (learned, template-search and the default planner "
             "take 0.9 s)",
             absl::ToDoubleSeconds(defaults.handler.default_budget));
  flags_.Add("max_budget_s", "cap on any request's budget",
             absl::ToDoubleSeconds(defaults.handler.max_budget));
  flags_.Add("grace_s", "on SIGTERM/SIGINT, time calls in flight get to finish",
             absl::ToDoubleSeconds(defaults.grace));
  AddServerSecurityFlags(flags_);
}

v1::ServerConfig ServerFlags::Given() const {
  return flags_.Given<v1::ServerConfig>();
}

absl::StatusOr<ServerSettings> ServerFlags::Settings() const {
  absl::StatusOr<v1::ServerConfig> file =
      flags_.File<v1::ServerConfig>(CheckServerConfigValues);
  if (!file.ok()) return file.status();
  const v1::ServerConfig given = Given();
  if (absl::Status s = CheckServerConfigValues(given, kCommandLine);
      !s.ok()) {
    return s;
  }
  return ResolveServerConfig(MergeFlagsOverFile(*file, given));
}

}  // namespace arachne
