#include "controller/controller_config.h"

#include <cmath>
#include <fstream>
#include <initializer_list>
#include <map>
#include <string>
#include <utility>
#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "absl/strings/strip.h"
#include "planner_service/io/config_file.h"
#include "planner_service/io/input_bounds.h"
#include "planner_service/io/json_yaml.h"
#include "planner_service/api/planner_handler_impl.h"
#include "planner_service/api/proto_convert.h"
#include "worker_agent/agent_proto_convert.h"

namespace arachne::controller {
namespace {

absl::Status FieldError(absl::string_view source, absl::string_view field,
                        absl::string_view message) {
  return absl::InvalidArgumentError(
      source.empty() ? absl::StrCat(field, ": ", message)
                     : absl::StrCat(source, ": ", field, ": ", message));
}

// Every duration of the job file and the settings is at most this (30
// days): 1e308 would be an infinite absl::Duration.
constexpr double kMaxSettingSeconds = 30 * 86400;

absl::Status AtMostMaxSeconds(double v, absl::string_view source,
                              absl::string_view field) {
  if (v <= kMaxSettingSeconds) return absl::OkStatus();
  return FieldError(source, field,
                    absl::StrCat("must be at most ", kMaxSettingSeconds,
                                 " seconds (30 days), got ", v));
}

// A seconds value: finite and > 0 (the JSON mapping accepts "NaN"), at most
// kMaxSettingSeconds.
absl::StatusOr<absl::Duration> PositiveSeconds(double v, absl::string_view source,
                                               absl::string_view field) {
  if (!(std::isfinite(v) && v > 0)) {
    return FieldError(source, field, absl::StrCat("must be > 0 seconds, got ", v));
  }
  if (absl::Status s = AtMostMaxSeconds(v, source, field); !s.ok()) return s;
  return absl::Seconds(v);
}

}  // namespace

absl::StatusOr<JobSettings> ResolveJob(const v1::JobSpec& spec,
                                       absl::string_view source,
                                       const GpuCatalog& catalog,
                                       const std::vector<ModelSpec>& models) {
  (void)catalog;
  JobSettings j;
  if (spec.model().name().empty() && spec.model().hf_config_json().empty()) {
    return FieldError(source, "model",
                      "required (model.name: a catalog model, or "
                      "model.hf_config_json), got none");
  }
  j.model = ModelRefFromProto(spec.model());
  absl::StatusOr<ModelSpec> model = ResolveModelRef(j.model, models);
  if (!model.ok()) {
    return absl::Status(
        model.status().code(),
        source.empty() ? std::string(model.status().message())
                       : absl::StrCat(source, ": ", model.status().message()));
  }
  j.training = TrainingFromProto(spec.training());
  absl::StatusOr<TrainingConfig> training = ResolveTraining(j.training);
  if (!training.ok()) {
    return absl::InvalidArgumentError(
        source.empty() ? std::string(training.status().message())
                       : absl::StrCat(source, ": ", training.status().message()));
  }
  j.job.model = *model;
  j.job.training = *training;
  j.job.engine = agent::EngineConfigFromProto(spec.engine());
  if (absl::Status s = j.job.engine.Validate(); !s.ok()) {
    return FieldError(source, "engine", s.message());
  }
  if (spec.iterations() < 1) {
    return FieldError(source, "iterations",
                      absl::StrCat("must be an integer >= 1, got ",
                                   spec.iterations()));
  }
  j.iterations = spec.iterations();
  if (spec.min_gpus() < 0) {
    return FieldError(source, "min_gpus",
                      absl::StrCat("must be >= 1 (or 0 for 1), got ",
                                   spec.min_gpus()));
  }
  j.min_gpus = spec.min_gpus() == 0 ? 1 : spec.min_gpus();
  if (spec.has_join_window_s()) {
    if (!(std::isfinite(spec.join_window_s()) && spec.join_window_s() >= 0)) {
      return FieldError(source, "join_window_s",
                        absl::StrCat("must be >= 0 seconds, got ",
                                     spec.join_window_s()));
    }
    if (absl::Status s =
            AtMostMaxSeconds(spec.join_window_s(), source, "join_window_s");
        !s.ok()) {
      return s;
    }
    j.membership.join_window = absl::Seconds(spec.join_window_s());
  }
  if (spec.has_switch_horizon_s()) {
    absl::StatusOr<absl::Duration> d =
        PositiveSeconds(spec.switch_horizon_s(), source, "switch_horizon_s");
    if (!d.ok()) return d.status();
    j.horizon = *d;
  }
  if (spec.has_switch_fixed_cost_s()) {
    if (!(std::isfinite(spec.switch_fixed_cost_s()) &&
          spec.switch_fixed_cost_s() >= 0)) {
      return FieldError(source, "switch_fixed_cost_s",
                        absl::StrCat("must be >= 0 seconds, got ",
                                     spec.switch_fixed_cost_s()));
    }
    if (absl::Status s = AtMostMaxSeconds(spec.switch_fixed_cost_s(), source,
                                          "switch_fixed_cost_s");
        !s.ok()) {
      return s;
    }
    j.switch_fixed_cost_s = spec.switch_fixed_cost_s();
  }
  // Fractions in [0, 1]: a gain or margin of more than 100% is a typo.
  for (auto [present, value, name, field] :
       {std::tuple{spec.has_switch_min_gain(), spec.switch_min_gain(),
                   "switch_min_gain", &j.switch_min_gain},
        std::tuple{spec.has_unmeasured_type_margin(),
                   spec.unmeasured_type_margin(), "unmeasured_type_margin",
                   &j.unmeasured_type_margin}}) {
    if (!present) continue;
    if (!(value >= 0 && value <= 1)) {
      return FieldError(source, name,
                        absl::StrCat("must be in [0, 1], got ", value));
    }
    *field = value;
  }
  if (spec.has_replan_correction_factor()) {
    const double f = spec.replan_correction_factor();
    if (!(f == 0 || (f >= kMinReplanCorrectionFactor &&
                     f <= kMaxReplanCorrectionFactor))) {
      return FieldError(source, "replan_correction_factor",
                        absl::StrCat("must be 0 (never) or in [",
                                     kMinReplanCorrectionFactor, ", ",
                                     kMaxReplanCorrectionFactor, "], got ", f));
    }
    j.replan_correction_factor = f;
  }
  if (spec.has_flap_leaves()) {
    if (spec.flap_leaves() < 1) {
      return FieldError(source, "flap_leaves",
                        absl::StrCat("must be >= 1, got ", spec.flap_leaves()));
    }
    j.membership.flap_leaves = spec.flap_leaves();
  }
  if (spec.has_flap_window_s()) {
    absl::StatusOr<absl::Duration> d =
        PositiveSeconds(spec.flap_window_s(), source, "flap_window_s");
    if (!d.ok()) return d.status();
    j.membership.flap_window = *d;
  }
  if (spec.has_flap_backoff_s()) {
    absl::StatusOr<absl::Duration> d =
        PositiveSeconds(spec.flap_backoff_s(), source, "flap_backoff_s");
    if (!d.ok()) return d.status();
    j.membership.flap_backoff = *d;
  }
  j.checkpoint_dir = spec.checkpoint_dir();
  j.fallback_checkpoint_dir = spec.fallback_checkpoint_dir();
  if (spec.has_measure_warmup_iterations()) {
    if (spec.measure_warmup_iterations() < 0) {
      return FieldError(source, "measure_warmup_iterations",
                        absl::StrCat("must be >= 0, got ",
                                     spec.measure_warmup_iterations()));
    }
    j.measure_warmup = spec.measure_warmup_iterations();
  }
  if (spec.has_measure_window()) {
    if (spec.measure_window() < 1) {
      return FieldError(source, "measure_window",
                        absl::StrCat("must be >= 1, got ",
                                     spec.measure_window()));
    }
    j.measure_window = spec.measure_window();
  }

  // The timeout hierarchy: each level must fit inside the next, or an outer
  // timeout fires before the inner one it is meant to back up.
  const v1::JobTimeouts& t = spec.timeouts();
  struct Level {
    const char* field;
    bool has;
    double value;
    absl::Duration* out;
  };
  Level levels[] = {
      {"timeouts.lease_s", t.has_lease_s(), t.lease_s(), &j.membership.lease},
      {"timeouts.transfer_round_s", t.has_transfer_round_s(),
       t.transfer_round_s(), &j.transfer_round},
      {"timeouts.phase_s", t.has_phase_s(), t.phase_s(), &j.phase},
      {"timeouts.switch_s", t.has_switch_s(), t.switch_s(), &j.switch_timeout},
  };
  for (Level& l : levels) {
    if (!l.has) continue;
    absl::StatusOr<absl::Duration> d = PositiveSeconds(l.value, source, l.field);
    if (!d.ok()) return d.status();
    *l.out = *d;
  }
  for (int i = 0; i + 1 < 4; ++i) {
    if (*levels[i].out >= *levels[i + 1].out) {
      return FieldError(
          source, levels[i].field,
          absl::StrCat("must be < ", levels[i + 1].field, " (",
                       absl::ToDoubleSeconds(*levels[i + 1].out), "), got ",
                       absl::ToDoubleSeconds(*levels[i].out),
                       " (the hierarchy is lease_s < transfer_round_s < "
                       "phase_s < switch_s)"));
    }
  }

  const v1::JobPlanner& p = spec.planner();
  j.planner_address = p.address();
  if (!p.address().empty() && p.address().find(':') == std::string::npos) {
    return FieldError(source, "planner.address",
                      absl::StrCat("must be host:port, got \"", p.address(), "\""));
  }
  if (p.address().empty() && (!p.tls_ca().empty() || !p.tls_cert().empty() ||
                              !p.token_file().empty())) {
    return FieldError(source, "planner.address",
                      "required with planner TLS or token settings (without "
                      "an address the planner runs in process), got none");
  }
  j.planner_tls_ca = p.tls_ca();
  j.planner_tls_cert = p.tls_cert();
  j.planner_tls_key = p.tls_key();
  if (!p.token_file().empty()) {
    absl::StatusOr<std::string> token = ReadBearerTokenFile(
        p.token_file(),
        source.empty() ? "planner.token_file"
                       : absl::StrCat(source, ": planner.token_file"));
    if (!token.ok()) return token.status();
    j.planner_token = *token;
  }
  j.planner = p.planner();
  // The planning service's own maximum (docs/api.md, options.budget_s).
  if (p.budget_s() < 0 || !std::isfinite(p.budget_s()) ||
      p.budget_s() > 86400) {
    return FieldError(
        source, "planner.budget_s",
        absl::StrCat("must be in (0, 86400] (or 0 for 2), got ", p.budget_s()));
  }
  if (p.budget_s() > 0) j.planner_budget_s = p.budget_s();
  j.planner_max_depth = p.max_depth();
  j.planner_max_templates = p.max_templates();
  j.planner_seed = p.seed();
  if (p.has_retries()) {
    if (p.retries() < 0 || p.retries() > 100) {
      return FieldError(source, "planner.retries",
                        absl::StrCat("must be in 0..100, got ", p.retries()));
    }
    j.planner_retries = p.retries();
  }
  if (p.has_retry_backoff_s()) {
    absl::StatusOr<absl::Duration> d = PositiveSeconds(
        p.retry_backoff_s(), source, "planner.retry_backoff_s");
    if (!d.ok()) return d.status();
    j.planner_retry_backoff = *d;
  }
  if (p.has_embedded_fallback()) j.planner_fallback = p.embedded_fallback();
  if (p.address().empty() &&
      (p.has_retries() || p.has_retry_backoff_s() || p.has_embedded_fallback())) {
    return FieldError(source, "planner.address",
                      "required with planner.retries, retry_backoff_s or "
                      "embedded_fallback (the embedded planner is never "
                      "unreachable), got none");
  }
  return j;
}

absl::StatusOr<SwitchHold> ParseSwitchHold(absl::string_view text) {
  static constexpr absl::string_view kPrefix = "hold-before-";
  static constexpr const char* kPhases[] = {
      "prepare", "pause", "migrate1", "migrate2", "rebuild", "commit", "resume"};
  const size_t colon = text.find(':');
  double seconds = 0;
  if (!absl::StartsWith(text, kPrefix) || colon == absl::string_view::npos ||
      !absl::SimpleAtod(text.substr(colon + 1), &seconds) ||
      !std::isfinite(seconds) || seconds <= 0 ||
      seconds > kMaxSettingSeconds) {
    return absl::InvalidArgumentError(absl::StrCat(
        "must be hold-before-<phase>:<seconds in (0, 2592000]>, got \"", text,
        "\""));
  }
  const absl::string_view phase =
      text.substr(kPrefix.size(), colon - kPrefix.size());
  for (const char* p : kPhases) {
    if (phase == p) return SwitchHold{std::string(phase), absl::Seconds(seconds)};
  }
  return absl::InvalidArgumentError(absl::StrCat(
      "unknown phase \"", phase, "\" in \"", text,
      "\" (one of prepare, pause, migrate1, migrate2, rebuild, commit, resume)"));
}

absl::StatusOr<JobSettings> LoadJobFile(const std::string& path,
                                        const GpuCatalog& catalog,
                                        const std::vector<ModelSpec>& models) {
  v1::JobSpec spec;
  if (absl::Status s = LoadConfigFile(path, &spec); !s.ok()) {
    if (s.code() == absl::StatusCode::kNotFound) {
      return absl::NotFoundError(
          absl::StrCat("job: cannot read \"", path, "\""));
    }
    return s;
  }
  return ResolveJob(spec, path, catalog, models);
}

absl::StatusOr<ControllerSettings> ResolveControllerConfig(
    const v1::ControllerConfig& file, absl::string_view file_source,
    const v1::ControllerConfig& flags) {
  const v1::ControllerConfig c = MergeFlagsOverFile(file, flags);
  // Where the user wrote a setting; a file without a source names its
  // fields as their flags.
  const SettingNames names(file_source, file_source.empty() ? nullptr : &file,
                           &flags);
  ControllerSettings s;
  if (c.has_listen()) {
    if (c.listen().find(':') == std::string::npos) {
      return names.Error("listen", absl::StrCat("must be host:port, got \"",
                                                c.listen(), "\""));
    }
    s.listen = c.listen();
  }
  s.port_file = c.port_file();
  if (c.state_dir().empty()) return RequiredSettingError("state_dir");
  s.state_dir = c.state_dir();
  if (c.job().empty()) return RequiredSettingError("job");
  s.job_file = c.job();
  s.tls.cert_file = c.tls_cert();
  s.tls.key_file = c.tls_key();
  s.tls.client_ca_file = c.tls_client_ca();
  if (absl::Status status = CheckServerTlsSettings(
          s.tls.cert_file, s.tls.key_file, s.tls.client_ca_file, names);
      !status.ok()) {
    return status;
  }
  if (!c.token_file().empty()) {
    absl::StatusOr<std::string> t =
        ReadBearerTokenFile(c.token_file(), names("token_file"));
    if (!t.ok()) return t.status();
    s.bearer_token = *t;
  }
  s.agent_tls.ca_file = c.agent_tls_ca();
  s.agent_tls.cert_file = c.agent_tls_cert();
  s.agent_tls.key_file = c.agent_tls_key();
  if (s.agent_tls.cert_file.empty() != s.agent_tls.key_file.empty()) {
    return absl::InvalidArgumentError(absl::StrCat(names("agent_tls_cert"),
                                                   ", ", names("agent_tls_key"),
                                                   ": give both or neither"));
  }
  if (!s.agent_tls.cert_file.empty() && s.agent_tls.ca_file.empty()) {
    return names.Error(
        "agent_tls_ca",
        absl::StrCat("required with ", names("agent_tls_cert"), ", got none"));
  }
  if (!c.agent_token_file().empty()) {
    absl::StatusOr<std::string> t =
        ReadBearerTokenFile(c.agent_token_file(), names("agent_token_file"));
    if (!t.ok()) return t.status();
    s.agent_token = *t;
  }
  if (c.has_store_host()) {
    if (c.store_host().empty()) {
      return names.Error("store_host",
                         "must be a host name or address, got \"\"");
    }
    s.store_host = c.store_host();
  }
  s.profiles_dir = c.profiles_dir();
  if (c.has_grace_s()) {
    if (!(std::isfinite(c.grace_s()) && c.grace_s() >= 0 &&
          c.grace_s() <= kMaxSettingSeconds)) {
      return names.Error("grace_s",
                         absl::StrCat("must be in [0, ", kMaxSettingSeconds,
                                      "] seconds, got ", c.grace_s()));
    }
    s.grace = absl::Seconds(c.grace_s());
  }
  if (!c.node_tokens_file().empty()) {
    absl::StatusOr<std::map<std::string, std::string>> tokens =
        ReadNodeTokensFile(c.node_tokens_file(), names("node_tokens_file"));
    if (!tokens.ok()) return tokens.status();
    s.node_auth.node_tokens = *std::move(tokens);
  }
  if (c.has_agent_identity()) {
    using CertName = NodeAuthConfig::CertName;
    if (c.agent_identity() == "cn") {
      s.node_auth.cert_name = CertName::kCommonName;
    } else if (c.agent_identity() == "san") {
      s.node_auth.cert_name = CertName::kSubjectAltName;
    } else if (c.agent_identity() != "none") {
      return names.Error("agent_identity",
                         absl::StrCat("must be cn, san or none, got ",
                                      QuoteForMessage(c.agent_identity())));
    }
    if (s.node_auth.cert_name != CertName::kNone &&
        s.tls.client_ca_file.empty()) {
      return names.Error(
          "agent_identity",
          absl::StrCat(c.agent_identity(), " needs mutual TLS: ",
                       names("tls_client_ca"), " is required with it"));
    }
  }
  if (c.has_agent_networks()) {
    absl::StatusOr<AgentNetworks> networks =
        AgentNetworks::Parse(c.agent_networks(), names("agent_networks"));
    if (!networks.ok()) return networks.status();
    s.agent_networks = *std::move(networks);
  }
  if (!c.failpoint().empty()) {
    absl::StatusOr<SwitchHold> hold = ParseSwitchHold(c.failpoint());
    if (!hold.ok()) return names.Error("failpoint", hold.status().message());
    s.hold = *hold;
  }
  return s;
}

absl::StatusOr<std::map<std::string, std::string>> ReadNodeTokensFile(
    const std::string& path, absl::string_view field) {
  std::ifstream in(path);
  if (!in) {
    return absl::NotFoundError(absl::StrCat(field, ": cannot read \"", path, "\""));
  }
  std::map<std::string, std::string> tokens;
  std::string line;
  for (int number = 1; std::getline(in, line); ++number) {
    auto bad = [&](absl::string_view why) {
      return absl::InvalidArgumentError(
          absl::StrCat(field, ": ", path, " line ", number, ": ", why));
    };
    const absl::string_view text =
        absl::StripAsciiWhitespace(absl::string_view(line).substr(0, line.find('#')));
    if (text.empty()) continue;
    const std::vector<absl::string_view> words =
        absl::StrSplit(text, absl::ByAnyChar(" \t"), absl::SkipEmpty());
    if (words.size() != 2) {
      return bad(absl::StrCat("must be \"<node> <token>\", got ", words.size(),
                              words.size() == 1 ? " word" : " words"));
    }
    if (absl::Status s = CheckNodeName("node", words[0]); !s.ok()) {
      return bad(s.message());
    }
    if (words[1].size() > kMaxTokenBytes) {
      return bad(absl::StrCat("the token is ", words[1].size(),
                              " bytes, at most ", kMaxTokenBytes));
    }
    if (static_cast<int>(tokens.size()) == kMaxNodeTokens) {
      return bad(absl::StrCat("more than ", kMaxNodeTokens, " nodes"));
    }
    if (!tokens.emplace(std::string(words[0]), std::string(words[1])).second) {
      return bad(absl::StrCat("a second token for node \"", words[0], "\""));
    }
  }
  if (in.bad()) {
    return absl::NotFoundError(absl::StrCat(field, ": cannot read \"", path, "\""));
  }
  return tokens;
}

ControllerFlags::ControllerFlags(CLI::App& app)
    : flags_(app, *v1::ControllerConfig::descriptor()) {
  for (const auto& [field, help] :
       std::initializer_list<std::pair<const char*, const char*>>{
           {"listen",
            "host:port to serve arachne.v1.Controller on (port 0 picks one; "
            "see --port-file); default 127.0.0.1:0"},
           {"port_file", "after listening, write the bound port to this file"},
           {"state_dir",
            "directory of the controller's SQLite database (required)"},
           {"job", "the job file, YAML or JSON (arachne.v1.JobSpec; required)"},
           {"tls_cert", "server certificate chain (PEM); enables TLS"},
           {"tls_key", "private key of --tls-cert (PEM)"},
           {"tls_client_ca",
            "CA (PEM) client certificates must chain to; enables mutual TLS"},
           {"token_file", "file holding the bearer token callers must send"},
           {"agent_tls_ca",
            "CA (PEM) of the agents' certificates; TLS to the agents"},
           {"agent_tls_cert",
            "client certificate (PEM) for the agents (mutual TLS)"},
           {"agent_tls_key", "its private key (PEM)"},
           {"agent_token_file",
            "file holding the bearer token the agents require"},
           {"store_host",
            "address the job's TCPStore listens on; default 127.0.0.1"},
           {"profiles_dir",
            "directory of gpus.yaml and models.yaml (default: built-in data)"},
           {"agent_networks",
            "CIDR blocks (comma-separated) agent addresses must be in; "
            "default: loopback and this machine's networks"},
           {"node_tokens_file",
            "file of '<node> <token>' lines: those nodes must register and "
            "heartbeat with their own token"},
           {"agent_identity",
            "with mutual TLS: cn or san, the client certificate name that must "
            "be the registering node's; default none"},
           {"failpoint",
            "fault injection for tests: hold-before-<phase>:<seconds> waits "
            "there in every switch"},
           {"grace_s",
            "on SIGTERM/SIGINT, seconds calls in flight get to finish; default "
            "5"},
       }) {
    flags_.Add(field, help);
  }
}

v1::ControllerConfig ControllerFlags::Given() const {
  return flags_.Given<v1::ControllerConfig>();
}

absl::StatusOr<ControllerSettings> ControllerFlags::Settings() const {
  // The file's values are checked by ResolveControllerConfig, with the
  // flags', where it is known which of the two gave each.
  absl::StatusOr<v1::ControllerConfig> file = flags_.File<v1::ControllerConfig>(
      [](const v1::ControllerConfig&, absl::string_view) {
        return absl::OkStatus();
      });
  if (!file.ok()) return file.status();
  return ResolveControllerConfig(*file, flags_.config_file(), Given());
}

}  // namespace arachne::controller
