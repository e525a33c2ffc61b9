#include "planner_service/server/server_config.h"

#include <cmath>

#include "CLI/CLI.hpp"
#include "absl/algorithm/container.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "planner_service/io/config_file.h"
#include "planner_service/server/planner_server.h"
#include "rpc/credentials.h"

namespace arachne {
namespace {

constexpr absl::string_view kCommandLine = "command line";

// "<source>: <field>: <message>", or "<field>: <message>" without a source.
// On the command line the field is named as the user typed it, as a flag
// (max_budget_s -> --max-budget-s).
absl::Status ValueError(absl::string_view source, absl::string_view field,
                        absl::string_view message) {
  std::string name(field);
  if (source == kCommandLine) {
    absl::c_replace(name, '_', '-');
    name = absl::StrCat("--", name);
  }
  return absl::InvalidArgumentError(
      source.empty() ? absl::StrCat(name, ": ", message)
                     : absl::StrCat(source, ": ", name, ": ", message));
}

// Seconds: finite and > 0, or >= 0 when `zero_ok`. The protobuf JSON
// mapping accepts "NaN" and "Infinity" for doubles, hence the finite check.
absl::Status CheckSeconds(absl::string_view source, absl::string_view field,
                          double value, bool zero_ok) {
  if (std::isfinite(value) && (zero_ok ? value >= 0 : value > 0)) {
    return absl::OkStatus();
  }
  return ValueError(source, field,
                    absl::StrCat(zero_ok ? "must be >= 0" : "must be > 0",
                                 ", got ", value));
}

absl::Status CheckAtLeastOne(absl::string_view source, absl::string_view field,
                             int value) {
  if (value >= 1) return absl::OkStatus();
  return ValueError(source, field,
                    absl::StrCat("must be an integer >= 1, got ", value));
}

}  // namespace

absl::Status CheckServerConfigValues(const v1::ServerConfig& config,
                                     absl::string_view source) {
  // gRPC reads what it cannot parse its own way (port 99999 as another
  // port, "host:" as 443), so the address is checked here, naming its
  // source.
  if (config.has_listen()) {
    if (absl::Status s = CheckListenAddress(config.listen()); !s.ok()) {
      return ValueError(source, "listen", s.message());
    }
  }
  if (config.has_health_listen() && !config.health_listen().empty()) {
    if (absl::Status s = CheckListenAddress(config.health_listen()); !s.ok()) {
      return ValueError(source, "health_listen", s.message());
    }
  }
  if (config.has_workers()) {
    if (absl::Status s = CheckAtLeastOne(source, "workers", config.workers());
        !s.ok()) {
      return s;
    }
  }
  if (config.has_max_in_flight()) {
    if (absl::Status s =
            CheckAtLeastOne(source, "max_in_flight", config.max_in_flight());
        !s.ok()) {
      return s;
    }
  }
  if (config.has_default_budget_s()) {
    if (absl::Status s = CheckSeconds(source, "default_budget_s",
                                      config.default_budget_s(), false);
        !s.ok()) {
      return s;
    }
  }
  if (config.has_max_budget_s()) {
    if (absl::Status s = CheckSeconds(source, "max_budget_s",
                                      config.max_budget_s(), false);
        !s.ok()) {
      return s;
    }
  }
  if (config.has_grace_s()) {
    if (absl::Status s =
            CheckSeconds(source, "grace_s", config.grace_s(), true);
        !s.ok()) {
      return s;
    }
  }
  return absl::OkStatus();
}

absl::StatusOr<v1::ServerConfig> ParseServerConfig(absl::string_view text,
                                                   absl::string_view source) {
  v1::ServerConfig config;
  if (absl::Status s = ParseConfigText(text, source, &config); !s.ok()) {
    return s;
  }
  if (absl::Status s = CheckServerConfigValues(config, source); !s.ok()) {
    return s;
  }
  return config;
}

absl::StatusOr<v1::ServerConfig> LoadServerConfigFile(const std::string& path) {
  v1::ServerConfig config;
  if (absl::Status s = LoadConfigFile(path, &config); !s.ok()) return s;
  if (absl::Status s = CheckServerConfigValues(config, path); !s.ok()) {
    return s;
  }
  return config;
}

v1::ServerConfig MergeServerConfig(const v1::ServerConfig& file,
                                   const v1::ServerConfig& flags) {
  v1::ServerConfig merged = file;
  // Every field is `optional`: MergeFrom copies exactly the fields set in
  // `flags`, i.e. the flags given on the command line.
  merged.MergeFrom(flags);
  return merged;
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
    return ValueError("", "max_in_flight",
                      absl::StrCat("must be >= workers (",
                                   server.service.workers, "), got ",
                                   server.service.max_in_flight));
  }
  if (server.tls.cert_file.empty() &&
      (!server.tls.key_file.empty() || !server.tls.client_ca_file.empty())) {
    return ValueError("", "tls_cert",
                      absl::StrCat("required with ",
                                   server.tls.key_file.empty() ? "tls_client_ca"
                                                               : "tls_key",
                                   ", got none"));
  }
  if (!server.tls.cert_file.empty() && server.tls.key_file.empty()) {
    return ValueError("", "tls_key", "required with tls_cert, got none");
  }
  // The same fixed port twice cannot both bind; say which setting clashes
  // rather than a bind failure.
  if (!server.health_listen.empty() && server.health_listen == server.listen &&
      !absl::EndsWith(server.listen, ":0")) {
    return ValueError("", "health_listen",
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

ServerFlags::ServerFlags(CLI::App& app) {
  // The defaults shown in --help are those of the config structs; a flag
  // not given never overrides (see Given), so they are only shown here.
  const ServerSettings defaults;
  listen_ = defaults.server.listen;
  workers_ = defaults.server.service.workers;
  max_in_flight_ = defaults.server.service.max_in_flight;
  default_budget_s_ = absl::ToDoubleSeconds(defaults.handler.default_budget);
  max_budget_s_ = absl::ToDoubleSeconds(defaults.handler.max_budget);
  grace_s_ = absl::ToDoubleSeconds(defaults.grace);

  app.add_option("--config", config_file_,
                 "settings file (YAML or JSON, arachne.v1.ServerConfig: the "
                 "flags below with '-' written '_'); flags given here "
                 "override it");
  listen_opt_ = app.add_option("--listen", listen_,
                               "host:port to serve on (port 0 picks one)")
                    ->capture_default_str();
  health_listen_opt_ = app.add_option(
      "--health-listen", health_listen_,
      "host:port of a plaintext port serving only grpc.health.v1.Health, "
      "for probes that cannot speak TLS (default: none)");
  profiles_dir_opt_ = app.add_option(
      "--profiles-dir", profiles_dir_,
      "directory of gpus.yaml, models.yaml and profiles (default: built-in "
      "data)");
  policies_dir_opt_ = app.add_option(
      "--policies-dir", policies_dir_,
      "directory of the learned planner's <model>.pt checkpoints (default: "
      "$ARACHNE_POLICIES_DIR, else the shipped profiles/policies)");
  workers_opt_ = app.add_option("--workers", workers_,
                                "threads running Plan/Evaluate/Replan")
                     ->capture_default_str();
  max_in_flight_opt_ =
      app.add_option("--max-in-flight", max_in_flight_,
                     "Plan/Evaluate/Replan calls admitted at once; more "
                     "answer RESOURCE_EXHAUSTED")
          ->capture_default_str();
  default_budget_s_opt_ =
      app.add_option("--default-budget-s", default_budget_s_,
                     "search budget when a request gives none, for the "
                     "search planners (learned, template-search and the "
                     "default planner take 0.9 s)")
          ->capture_default_str();
  max_budget_s_opt_ = app.add_option("--max-budget-s", max_budget_s_,
                                     "cap on any request's budget")
                          ->capture_default_str();
  grace_s_opt_ =
      app.add_option("--grace-s", grace_s_,
                     "on SIGTERM/SIGINT, time calls in flight get to finish")
          ->capture_default_str();
  tls_cert_opt_ = app.add_option("--tls-cert", tls_cert_,
                                 "server certificate chain (PEM); enables TLS");
  tls_key_opt_ = app.add_option("--tls-key", tls_key_,
                                "private key of --tls-cert (PEM)");
  tls_client_ca_opt_ = app.add_option(
      "--tls-client-ca", tls_client_ca_,
      "CA certificates (PEM) that client certificates must chain to; "
      "enables mutual TLS");
  token_file_opt_ = app.add_option(
      "--token-file", token_file_,
      "file holding the bearer token clients must send as 'authorization: "
      "Bearer <token>' (a file, not a flag value, so it stays out of the "
      "process list)");
}

v1::ServerConfig ServerFlags::Given() const {
  v1::ServerConfig given;
  if (listen_opt_->count() > 0) given.set_listen(listen_);
  if (health_listen_opt_->count() > 0) given.set_health_listen(health_listen_);
  if (profiles_dir_opt_->count() > 0) given.set_profiles_dir(profiles_dir_);
  if (policies_dir_opt_->count() > 0) given.set_policies_dir(policies_dir_);
  if (workers_opt_->count() > 0) given.set_workers(workers_);
  if (max_in_flight_opt_->count() > 0) given.set_max_in_flight(max_in_flight_);
  if (default_budget_s_opt_->count() > 0) {
    given.set_default_budget_s(default_budget_s_);
  }
  if (max_budget_s_opt_->count() > 0) given.set_max_budget_s(max_budget_s_);
  if (grace_s_opt_->count() > 0) given.set_grace_s(grace_s_);
  if (tls_cert_opt_->count() > 0) given.set_tls_cert(tls_cert_);
  if (tls_key_opt_->count() > 0) given.set_tls_key(tls_key_);
  if (tls_client_ca_opt_->count() > 0) given.set_tls_client_ca(tls_client_ca_);
  if (token_file_opt_->count() > 0) given.set_token_file(token_file_);
  return given;
}

absl::StatusOr<ServerSettings> ServerFlags::Settings() const {
  v1::ServerConfig file;
  if (!config_file_.empty()) {
    absl::StatusOr<v1::ServerConfig> loaded = LoadServerConfigFile(config_file_);
    if (!loaded.ok()) return loaded.status();
    file = *std::move(loaded);
  }
  const v1::ServerConfig given = Given();
  if (absl::Status s = CheckServerConfigValues(given, kCommandLine);
      !s.ok()) {
    return s;
  }
  return ResolveServerConfig(MergeServerConfig(file, given));
}

}  // namespace arachne
