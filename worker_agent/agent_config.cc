#include "worker_agent/agent_config.h"

#include <cstdio>
#include <cstring>
#include <cmath>
#include <deque>
#include <filesystem>
#include <fstream>
#include <system_error>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "planner_service/core/model/node_pool.h"
#include "planner_service/io/gpu_catalog_io.h"
#include "planner_service/io/input_bounds.h"
#include "planner_service/io/json_yaml.h"
#include "planner_service/io/model_io.h"
#include "worker_agent/checkpoint_io.h"

namespace arachne::agent {
namespace {

// The checks of one value each, on the fields set in `config`.
absl::Status CheckValues(const v1::AgentConfig& config,
                         const SettingNames& names) {
  if (config.has_listen() && config.listen().find(':') == std::string::npos) {
    return names.Error("listen", absl::StrCat("must be host:port, got \"",
                                              config.listen(), "\""));
  }
  // The controller's node-name rule (docs/errors.md, "Input bounds"): the
  // agent registers under this name, so it must pass there too.
  if (config.has_node()) {
    if (absl::Status s = CheckNodeName(names("node"), config.node()); !s.ok()) {
      return s;
    }
  }
  if (config.has_failpoint() && !config.failpoint().empty() &&
      config.failpoint() != "corrupt-migration-stage-1" &&
      config.failpoint() != "corrupt-migration-stage-2" &&
      !(absl::StartsWith(config.failpoint(), kHangStatusWhile) &&
        config.failpoint().size() > strlen(kHangStatusWhile) &&
        config.failpoint()[strlen(kHangStatusWhile)] == '/')) {
    return names.Error("failpoint",
                       absl::StrCat("must be corrupt-migration-stage-1, "
                                    "corrupt-migration-stage-2 or ",
                                    kHangStatusWhile, "<absolute path>, got \"",
                                    config.failpoint(), "\""));
  }
  if (config.has_engine_command() &&
      (config.engine_command().find_first_not_of(" \t") == std::string::npos ||
       config.engine_command().size() > 4096)) {
    return names.Error("engine_command",
                       config.engine_command().size() > 4096
                           ? absl::StrCat("at most 4096 characters, got ",
                                          config.engine_command().size())
                           : absl::StrCat("must name a program, got \"",
                                          config.engine_command(), "\""));
  }
  if (config.has_log_dir() && config.log_dir().empty()) {
    return names.Error("log_dir", "must be a directory, got \"\"");
  }
  if (config.has_checkpoint_root() &&
      (config.checkpoint_root().empty() ||
       config.checkpoint_root().find('\0') != std::string::npos ||
       !std::filesystem::path(config.checkpoint_root()).is_absolute())) {
    return names.Error("checkpoint_root",
                       absl::StrCat("must be an absolute directory path, got ",
                                    QuoteForMessage(config.checkpoint_root())));
  }
  if (config.has_host() && config.host().empty()) {
    return names.Error("host", "must be a host name or address, got \"\"");
  }
  if (config.has_gpu_type() && config.gpu_type().empty()) {
    return names.Error("gpu_type", "must be a GPU type id or alias, got \"\"");
  }
  if (config.has_virtual_gpus()) {
    if (absl::Status s = CheckIntegerSetting(
            names("virtual_gpus"), config.virtual_gpus(), 1, kMaxGpusPerNode);
        !s.ok()) {
      return s;
    }
  }
  if (config.has_virtual_gpu_speed() &&
      !(std::isfinite(config.virtual_gpu_speed()) &&
        config.virtual_gpu_speed() > 0 && config.virtual_gpu_speed() <= 1)) {
    return names.Error(
        "virtual_gpu_speed",
        absl::StrCat("must be a fraction of a CPU rank's speed in (0, 1], "
                     "got ",
                     config.virtual_gpu_speed()));
  }
  if (config.has_migration_staging_mib()) {
    if (absl::Status s = CheckIntegerSetting(
            names("migration_staging_mib"), config.migration_staging_mib(),
            kMinMigrationStagingMib, kMaxMigrationStagingMib);
        !s.ok()) {
      return s;
    }
  }
  if (config.has_controller() &&
      config.controller().find(':') == std::string::npos) {
    return names.Error("controller", absl::StrCat("must be host:port, got \"",
                                                  config.controller(), "\""));
  }
  if (config.has_grace_s()) {
    return CheckSecondsSetting(names("grace_s"), config.grace_s(), true);
  }
  return absl::OkStatus();
}

// CheckValues of a file's fields alone, named "<source>: <field>".
absl::Status CheckFileValues(const v1::AgentConfig& config,
                             absl::string_view source) {
  return CheckValues(config, SettingNames(source, &config, nullptr));
}

// Keeps the code, puts `prefix` (a setting's name) before the message.
absl::Status Prefixed(const absl::Status& s, absl::string_view prefix) {
  return absl::Status(s.code(), absl::StrCat(prefix, ": ", s.message()));
}

}  // namespace

absl::StatusOr<v1::AgentConfig> ParseAgentConfig(absl::string_view text,
                                                 absl::string_view source) {
  return ReadConfigText<v1::AgentConfig>(text, source, CheckFileValues);
}

absl::StatusOr<v1::AgentConfig> LoadAgentConfigFile(const std::string& path) {
  return ReadConfigFile<v1::AgentConfig>(path, CheckFileValues);
}

absl::StatusOr<AgentSettings> ResolveAgentConfig(const v1::AgentConfig& file,
                                                 absl::string_view file_source,
                                                 const v1::AgentConfig& flags,
                                                 int cuda_devices) {
  const v1::AgentConfig config = MergeFlagsOverFile(file, flags);
  const SettingNames names(file_source, &file, &flags);
  if (absl::Status s = CheckValues(config, names); !s.ok()) return s;

  AgentSettings settings;
  if (config.has_listen()) settings.listen = config.listen();
  if (!config.has_node()) return RequiredSettingError("node");
  settings.node = config.node();
  if (config.has_host()) settings.host = config.host();
  settings.failpoint = config.failpoint();
  if (!config.has_gpu_type()) return RequiredSettingError("gpu_type");

  settings.profiles_dir = config.profiles_dir();
  absl::StatusOr<GpuCatalog> catalog = LoadGpuCatalog(settings.profiles_dir);
  if (!catalog.ok()) return Prefixed(catalog.status(), names("profiles_dir"));
  settings.catalog = *std::move(catalog);
  absl::StatusOr<std::vector<ModelSpec>> models =
      LoadModelCatalog(settings.profiles_dir);
  if (!models.ok()) return Prefixed(models.status(), names("profiles_dir"));
  settings.models = *std::move(models);

  absl::StatusOr<int> type = settings.catalog.IndexOf(config.gpu_type());
  if (!type.ok()) {
    // A value the user wrote, not a missing resource: InvalidArgument.
    return names.Error("gpu_type", type.status().message());
  }
  settings.gpu_type = *type;

  if (config.has_virtual_gpus()) {
    settings.gpu_count = config.virtual_gpus();
    settings.virtual_gpus = true;
  } else if (cuda_devices > 0) {
    settings.gpu_count = cuda_devices;
    settings.virtual_gpus = false;
  } else {
    return absl::InvalidArgumentError(
        "--virtual-gpus: required on a machine without CUDA GPUs (none "
        "visible), got none");
  }
  if (config.has_virtual_gpu_speed()) {
    if (!settings.virtual_gpus) {
      return names.Error(
          "virtual_gpu_speed",
          absl::StrCat("only with virtual_gpus (CPU ranks); this agent "
                       "runs on ",
                       settings.gpu_count, " CUDA GPUs, got ",
                       config.virtual_gpu_speed()));
    }
    settings.virtual_gpu_speed = config.virtual_gpu_speed();
  }
  if (config.has_migration_staging_mib()) {
    settings.migration_staging_mib = config.migration_staging_mib();
  }

  settings.tls.cert_file = config.tls_cert();
  settings.tls.key_file = config.tls_key();
  settings.tls.client_ca_file = config.tls_client_ca();
  if (absl::Status s =
          CheckServerTlsSettings(settings.tls.cert_file, settings.tls.key_file,
                                 settings.tls.client_ca_file, names);
      !s.ok()) {
    return s;
  }
  if (!config.token_file().empty()) {
    absl::StatusOr<std::string> token =
        ReadBearerTokenFile(config.token_file(), names("token_file"));
    if (!token.ok()) return token.status();
    settings.bearer_token = *std::move(token);
  }
  settings.controller = config.controller();
  settings.controller_tls.ca_file = config.controller_tls_ca();
  settings.controller_tls.cert_file = config.controller_tls_cert();
  settings.controller_tls.key_file = config.controller_tls_key();
  // Settings of the controller channel without a controller are a mistake
  // (a forgotten --controller), not something to ignore.
  for (const char* field : {"controller_token_file", "controller_tls_ca",
                            "controller_tls_cert", "controller_tls_key"}) {
    if (settings.controller.empty() &&
        (HasConfigField(file, field) || HasConfigField(flags, field))) {
      return names.Error(field,
                         absl::StrCat("given without ", names("controller"),
                                      "; nothing would use it"));
    }
  }
  if (settings.controller_tls.cert_file.empty() !=
      settings.controller_tls.key_file.empty()) {
    const char* missing = settings.controller_tls.cert_file.empty()
                              ? "controller_tls_cert"
                              : "controller_tls_key";
    const char* given = settings.controller_tls.cert_file.empty()
                            ? "controller_tls_key"
                            : "controller_tls_cert";
    return names.Error(
        missing, absl::StrCat("required with ", names(given), ", got none"));
  }
  if (!settings.controller_tls.cert_file.empty() &&
      settings.controller_tls.ca_file.empty()) {
    return names.Error(
        "controller_tls_ca",
        absl::StrCat("required with ", names("controller_tls_cert"),
                     " (mutual TLS needs TLS), got none"));
  }
  if (!config.controller_token_file().empty()) {
    absl::StatusOr<std::string> token = ReadBearerTokenFile(
        config.controller_token_file(), names("controller_token_file"));
    if (!token.ok()) return token.status();
    settings.controller_token = *std::move(token);
  }
  settings.port_file = config.port_file();
  settings.engine_command = absl::StrSplit(
      config.engine_command(), absl::ByAnyChar(" \t"), absl::SkipEmpty());
  settings.log_dir = config.log_dir();
  settings.in_process_ranks = config.in_process_ranks();
  if (settings.in_process_ranks && config.has_engine_command()) {
    return names.Error("engine_command",
                       absl::StrCat("given with ", names("in_process_ranks"),
                                    ", which runs no engine command"));
  }
  if (config.has_grace_s()) settings.grace = absl::Seconds(config.grace_s());
  if (config.has_checkpoint_root()) {
    // Created now, so that a root the agent cannot make fails at start and
    // not at the first checkpoint; resolved now, so that requests are
    // compared with the real directory (a root under a symlinked /tmp too).
    namespace fs = std::filesystem;
    std::error_code ec;
    fs::create_directories(config.checkpoint_root(), ec);
    fs::path root;
    if (!ec) root = fs::canonical(config.checkpoint_root(), ec);
    if (!ec && !fs::is_directory(root, ec) && !ec) {
      ec = std::make_error_code(std::errc::not_a_directory);
    }
    if (ec) {
      return absl::Status(
          CheckpointIoCode(ec),
          absl::StrCat(names("checkpoint_root"), ": cannot create or resolve ",
                       QuoteForMessage(config.checkpoint_root()), ": ",
                       ec.message()));
    }
    settings.checkpoint_root = root.string();
  }
  return settings;
}

absl::StatusOr<std::string> CheckCheckpointDir(absl::string_view root,
                                               absl::string_view field,
                                               absl::string_view dir) {
  namespace fs = std::filesystem;
  if (root.empty()) {
    return absl::FailedPreconditionError(absl::StrCat(
        field, ": this agent was started without --checkpoint-root "
        "(checkpoint_root in its config file), so it writes and reads no "
        "checkpoints; got ", QuoteForMessage(dir)));
  }
  const std::string quoted_root = QuoteForMessage(root);
  if (dir.empty() || dir.find('\0') != absl::string_view::npos ||
      !fs::path(std::string(dir)).is_absolute()) {
    return absl::InvalidArgumentError(absl::StrCat(
        field, ": must be an absolute path inside the checkpoint root ",
        quoted_root, ", got ", QuoteForMessage(dir)));
  }
  // "." and ".." folded first, as the words of the path say; then each
  // existing component resolved as the kernel would (a symlink's target
  // replaces it, ".." in a target goes up from the resolved directory),
  // until the first component that does not exist: the rest is created
  // below it as written.
  const fs::path normal = fs::path(std::string(dir)).lexically_normal();
  std::deque<fs::path> todo;
  for (const fs::path& c : normal.relative_path()) todo.push_back(c);
  fs::path done = "/";
  bool exists = true;
  int links = 0;
  auto io_error = [&](const std::error_code& ec, const fs::path& at) {
    // A name too long is the value's fault, not the machine's.
    return absl::Status(
        ec == std::errc::filename_too_long
            ? absl::StatusCode::kInvalidArgument
            : CheckpointIoCode(ec),
        absl::StrCat(field, ": cannot resolve ", QuoteForMessage(dir), " at ",
                     QuoteForMessage(at.string()), ": ", ec.message()));
  };
  while (!todo.empty()) {
    const fs::path c = todo.front();
    todo.pop_front();
    if (c.empty() || c == ".") continue;
    if (c == "..") {
      done = done.parent_path();
      continue;
    }
    const fs::path next = done / c;
    if (!exists) {
      done = next;
      continue;
    }
    std::error_code ec;
    const fs::file_status st = fs::symlink_status(next, ec);
    if (ec && st.type() != fs::file_type::not_found) return io_error(ec, next);
    if (st.type() == fs::file_type::not_found) {
      exists = false;
      done = next;
      continue;
    }
    if (fs::is_symlink(st)) {
      if (++links > 40) {
        return io_error(std::make_error_code(std::errc::too_many_symbolic_link_levels), next);
      }
      const fs::path target = fs::read_symlink(next, ec);
      if (ec) return io_error(ec, next);
      if (target.is_absolute()) done = "/";
      const fs::path relative = target.relative_path();
      std::vector<fs::path> parts(relative.begin(), relative.end());
      todo.insert(todo.begin(), parts.begin(), parts.end());
      continue;
    }
    if (!todo.empty() && !fs::is_directory(st)) {
      return io_error(std::make_error_code(std::errc::not_a_directory), next);
    }
    done = next;
  }
  // Inside: the root's components are a prefix of the resolved path's.
  const fs::path root_path{std::string(root)};
  auto r = root_path.begin();
  auto d = done.begin();
  for (; r != root_path.end() && d != done.end(); ++r, ++d) {
    if (*r != *d) break;
  }
  while (r != root_path.end() && r->empty()) ++r;
  if (r != root_path.end()) {
    const std::string resolved = done.string();
    return absl::InvalidArgumentError(absl::StrCat(
        field, ": must be inside the checkpoint root ", quoted_root, ", got ",
        QuoteForMessage(dir),
        resolved == dir ? std::string()
                        : absl::StrCat(" (resolved to ",
                                       QuoteForMessage(resolved), ")")));
  }
  return done.string();
}

absl::Status WritePortFile(const std::string& path, int port) {
  const std::string temporary = absl::StrCat(path, ".tmp");
  {
    std::ofstream out(temporary, std::ios::trunc);
    out << port << "\n";
    out.close();
    if (!out) {
      return absl::UnavailableError(
          absl::StrCat("port_file: cannot write \"", temporary, "\""));
    }
  }
  if (std::rename(temporary.c_str(), path.c_str()) != 0) {
    std::remove(temporary.c_str());
    return absl::UnavailableError(absl::StrCat(
        "port_file: cannot rename \"", temporary, "\" to \"", path, "\""));
  }
  return absl::OkStatus();
}

AgentFlags::AgentFlags(CLI::App& app)
    : flags_(app, *v1::AgentConfig::descriptor()) {
  const AgentSettings defaults;
  flags_.Add("listen",
             "host:port to serve arachne.v1.Agent on (port 0 picks one; see "
             "--port-file)",
             defaults.listen);
  flags_.Add("node",
             "this node's name, as clusters and plans name it (required)");
  flags_.Add("host",
             "address other nodes reach this node's ranks at (process groups "
             "and the migration transport listen there)",
             defaults.host);
  flags_.Add("migration_staging_mib",
             absl::StrCat("the staging memory each GPU's migration uses for "
                          "packed small segments, in MiB, ",
                          kMinMigrationStagingMib, "..",
                          kMaxMigrationStagingMib,
                          " (allocated once, kept between switches; "
                          "admission by memory counts it)"),
             defaults.migration_staging_mib);
  flags_.Add("failpoint",
             "fault injection for testing: corrupt-migration-stage-1 or "
             "corrupt-migration-stage-2 flips a byte this node receives; "
             "hang-status-while:PATH: Status answers nothing while PATH "
             "exists");
  flags_.Add("gpu_type",
             "GPU type of this node: a catalog id or alias, e.g. A6000 "
             "(required)");
  flags_.Add("virtual_gpus",
             "CPU ranks standing in for N GPUs (required without CUDA GPUs; "
             "default: every visible CUDA GPU)");
  flags_.Add("virtual_gpu_speed",
             "with --virtual-gpus: each virtual GPU computes at this "
             "fraction of a CPU rank's speed, in (0, 1] (each compute step "
             "is held to 1/speed times its CPU time)",
             defaults.virtual_gpu_speed);
  flags_.Add("profiles_dir",
             "directory of gpus.yaml and models.yaml (default: built-in "
             "data)");
  AddServerSecurityFlags(flags_);
  flags_.Add("port_file", "after listening, write the bound port to this file");
  flags_.Add("grace_s",
             "on SIGTERM/SIGINT, seconds calls in flight get to finish",
             absl::ToDoubleSeconds(defaults.grace));
  flags_.Add("engine_command",
             "the engine each GPU's rank runs as: program and arguments, "
             "space-separated (default: arachne-engine beside arachne-agent)");
  flags_.Add("log_dir",
             "directory of the engines' logs, engine-<i>.log (default: the "
             "engines' socket directory under $TMPDIR)");
  flags_.Add("checkpoint_root",
             "absolute directory every checkpoint path (SaveCheckpoint's dir, "
             "Prepare's checkpoint_dir) must lie in; created at start "
             "(default: none, and no checkpoints are written or read)");
  flags_.Add("in_process_ranks",
             "run the ranks as threads of the agent (built-in reference "
             "engine), not as engine processes");
  flags_.Add("controller",
             "host:port of the job's arachne-controller: register there and "
             "renew the lease by Heartbeat (training goes on while it is "
             "unreachable)");
  flags_.Add("controller_token_file",
             "file holding the bearer token the controller requires");
  flags_.Add("controller_tls_ca",
             "CA certificates (PEM) of the controller's certificate; enables "
             "TLS to the controller");
  flags_.Add("controller_tls_cert",
             "client certificate chain (PEM) for mutual TLS with the "
             "controller");
  flags_.Add("controller_tls_key",
             "private key of --controller-tls-cert (PEM)");
}

v1::AgentConfig AgentFlags::Given() const {
  return flags_.Given<v1::AgentConfig>();
}

absl::StatusOr<AgentSettings> AgentFlags::Settings(int cuda_devices) const {
  absl::StatusOr<v1::AgentConfig> file =
      flags_.File<v1::AgentConfig>(CheckFileValues);
  if (!file.ok()) return file.status();
  return ResolveAgentConfig(*file, flags_.config_file(), Given(), cuda_devices);
}

}  // namespace arachne::agent
