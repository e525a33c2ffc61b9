#include "config/config_reader.h"

#include <cmath>
#include <type_traits>
#include <utility>

#include "CLI/CLI.hpp"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_replace.h"
#include "glog/logging.h"

namespace arachne {

std::string ConfigFlagName(absl::string_view field) {
  return absl::StrCat("--", absl::StrReplaceAll(field, {{"_", "-"}}));
}

bool HasConfigField(const google::protobuf::Message& config,
                    absl::string_view field) {
  const google::protobuf::FieldDescriptor* fd =
      config.GetDescriptor()->FindFieldByName(std::string(field));
  CHECK(fd != nullptr) << config.GetDescriptor()->full_name()
                       << " has no field " << field;
  return config.GetReflection()->HasField(config, fd);
}

absl::Status SettingError(absl::string_view name, absl::string_view message) {
  return absl::InvalidArgumentError(absl::StrCat(name, ": ", message));
}

absl::Status RequiredSettingError(absl::string_view field) {
  return absl::InvalidArgumentError(
      absl::StrCat(ConfigFlagName(field), ": required (or ", field,
                   " in the config file), got none"));
}

std::string SettingNames::operator()(absl::string_view field) const {
  if (flags_ != nullptr && HasConfigField(*flags_, field)) {
    return ConfigFlagName(field);
  }
  if (file_ != nullptr && HasConfigField(*file_, field)) {
    return file_source_.empty() ? std::string(field)
                                : absl::StrCat(file_source_, ": ", field);
  }
  return ConfigFlagName(field);
}

absl::Status SettingNames::Error(absl::string_view field,
                                 absl::string_view message) const {
  return SettingError((*this)(field), message);
}

absl::Status CheckSecondsSetting(absl::string_view name, double value,
                                 bool zero_ok) {
  if (std::isfinite(value) && (zero_ok ? value >= 0 : value > 0)) {
    return absl::OkStatus();
  }
  return SettingError(
      name,
      absl::StrCat(zero_ok ? "must be >= 0" : "must be > 0", ", got ", value));
}

absl::Status CheckIntegerSetting(absl::string_view name, int64_t value,
                                 int64_t min, std::optional<int64_t> max) {
  if (value >= min && (!max.has_value() || value <= *max)) {
    return absl::OkStatus();
  }
  return SettingError(
      name, max.has_value()
                ? absl::StrCat("must be an integer in ", min, "..", *max,
                               ", got ", value)
                : absl::StrCat("must be an integer >= ", min, ", got ", value));
}

absl::Status CheckServerTlsSettings(absl::string_view cert,
                                    absl::string_view key,
                                    absl::string_view client_ca,
                                    SettingNamer name) {
  if (cert.empty() && (!key.empty() || !client_ca.empty())) {
    return SettingError(
        name("tls_cert"),
        absl::StrCat("required with ",
                     name(key.empty() ? "tls_client_ca" : "tls_key"),
                     ", got none"));
  }
  if (!cert.empty() && key.empty()) {
    return SettingError(
        name("tls_key"),
        absl::StrCat("required with ", name("tls_cert"), ", got none"));
  }
  return absl::OkStatus();
}

ConfigFlags::ConfigFlags(CLI::App& app,
                         const google::protobuf::Descriptor& schema)
    : app_(app), schema_(schema) {
  app.add_option(
      "--config", config_file_,
      absl::StrCat("settings file (YAML or JSON, ", schema.full_name(),
                   ": the flags below with '-' written '_'); flags "
                   "given here override it"));
}

void ConfigFlags::Add(absl::string_view field, std::string help,
                      std::optional<Value> shown) {
  const google::protobuf::FieldDescriptor* fd =
      schema_.FindFieldByName(std::string(field));
  CHECK(fd != nullptr) << schema_.full_name() << " has no field " << field;
  // Given() and the merge tell a flag not given from one given as 0 or ""
  // by the field's presence.
  CHECK(fd->has_presence())
      << schema_.full_name() << "." << field << " must be `optional`";
  Value value;
  switch (fd->cpp_type()) {
    case google::protobuf::FieldDescriptor::CPPTYPE_STRING:
      value = std::string();
      break;
    case google::protobuf::FieldDescriptor::CPPTYPE_INT32:
      value = int32_t{0};
      break;
    case google::protobuf::FieldDescriptor::CPPTYPE_DOUBLE:
      value = 0.0;
      break;
    case google::protobuf::FieldDescriptor::CPPTYPE_BOOL:
      value = false;
      break;
    default:
      LOG(FATAL) << schema_.full_name() << "." << field << " is a "
                 << fd->cpp_type_name() << ", which no flag reads";
  }
  if (shown.has_value()) {
    CHECK_EQ(shown->index(), value.index())
        << "the default shown for " << field << " is not of its type";
    value = *std::move(shown);
  }
  Flag& flag = flags_.emplace_back(Flag{fd, nullptr, std::move(value)});
  const std::string name = ConfigFlagName(field);
  flag.option = std::visit(
      [&](auto& target) -> CLI::Option* {
        if constexpr (std::is_same_v<std::decay_t<decltype(target)>, bool>) {
          return app_.add_flag(name, target, std::move(help));
        } else {
          return app_.add_option(name, target, std::move(help));
        }
      },
      flag.value);
  if (shown.has_value()) flag.option->capture_default_str();
}

void ConfigFlags::SetGiven(google::protobuf::Message* given) const {
  CHECK_EQ(given->GetDescriptor(), &schema_);
  const google::protobuf::Reflection* r = given->GetReflection();
  for (const Flag& flag : flags_) {
    if (flag.option->count() == 0) continue;
    std::visit(
        [&](const auto& value) {
          using T = std::decay_t<decltype(value)>;
          if constexpr (std::is_same_v<T, std::string>) {
            r->SetString(given, flag.field, value);
          } else if constexpr (std::is_same_v<T, int32_t>) {
            r->SetInt32(given, flag.field, value);
          } else if constexpr (std::is_same_v<T, double>) {
            r->SetDouble(given, flag.field, value);
          } else {
            r->SetBool(given, flag.field, value);
          }
        },
        flag.value);
  }
}

void AddServerSecurityFlags(ConfigFlags& flags) {
  flags.Add("tls_cert", "server certificate chain (PEM); enables TLS");
  flags.Add("tls_key", "private key of --tls-cert (PEM)");
  flags.Add("tls_client_ca",
            "CA certificates (PEM) that client certificates must chain to; "
            "enables mutual TLS");
  flags.Add("token_file",
            "file holding the bearer token clients must send as "
            "'authorization: Bearer <token>' (a file, not a flag value, so it "
            "stays out of the process list)");
}

}  // namespace arachne
