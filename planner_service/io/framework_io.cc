#include "planner_service/io/framework_io.h"

#include <string>
#include <utility>

#include "absl/status/status.h"
#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "glog/logging.h"
#include "google/protobuf/descriptor.h"
#include "google/protobuf/message.h"
#include "planner_service/io/message_json.h"

namespace arachne {
namespace {

using Json = nlohmann::json;
using google::protobuf::FieldDescriptor;

// framework.h's messages start with the field they are about ("framework"
// or "framework.attention"); placed under `path` (the field holding the
// framework, e.g. "training.framework") of `source`. `value`, the user's
// text, is abbreviated when long.
absl::Status Located(const absl::Status& s, absl::string_view source,
                     absl::string_view path, absl::string_view value) {
  std::string message = AbbreviateQuoted(s.message(), value);
  std::string field;
  const size_t colon = message.find(": ");
  if (absl::StartsWith(message, "framework") && colon != std::string::npos) {
    // "framework.attention" -> "<path>.attention".
    field = path.empty() ? message.substr(0, colon)
                         : absl::StrCat(path, message.substr(9, colon - 9));
    message = message.substr(colon + 2);
  } else {
    field = std::string(path);
  }
  return MessageErrors(source, field).At("", message);
}

absl::StatusOr<FrameworkConfig> FromPreset(absl::string_view name,
                                           absl::string_view source,
                                           absl::string_view path) {
  if (name.empty()) return FrameworkConfig{};
  absl::StatusOr<FrameworkPreset> preset = ParseFrameworkPreset(name);
  if (!preset.ok()) return Located(preset.status(), source, path, name);
  return FrameworkPresetConfig(*preset);
}

// A YAML / JSON scalar as SetFrameworkField's text form.
absl::StatusOr<std::string> ScalarText(const ObjectReader& r,
                                       const std::string& key,
                                       const Json& value) {
  if (value.is_string()) return value.get<std::string>();
  if (value.is_boolean()) return std::string(value.get<bool>() ? "true" : "false");
  if (value.is_number()) return value.dump();
  return r.Error(key, absl::StrCat("must be a string, number or boolean, got ",
                                   DescribeJsonValue(value)));
}

// The message's field `name` (framework.h's names are the proto's): the
// schema and FrameworkFieldNames() must list the same fields.
const FieldDescriptor* MessageField(absl::string_view name) {
  const FieldDescriptor* field =
      v1::Framework::descriptor()->FindFieldByName(std::string(name));
  CHECK(field != nullptr && field->has_presence())
      << "arachne.v1.Framework has no optional field " << name;
  return field;
}

}  // namespace

absl::StatusOr<FrameworkConfig> ReadFramework(const ObjectReader& training) {
  const Json* value = training.Find("framework");
  if (value == nullptr) return FrameworkConfig{};
  const std::string path = training.PathOf("framework");
  if (value->is_string()) {
    return FromPreset(value->get<std::string>(), training.source(), path);
  }
  if (!value->is_object()) {
    return training.Error(
        "framework",
        absl::StrCat("must be a preset name or a mapping {preset: ..., "
                     "<field>: <value>, ...}, got ",
                     DescribeJsonValue(*value)));
  }
  ARACHNE_IO_ASSIGN_OR_RETURN(ObjectReader r, training.Object("framework"));
  ARACHNE_IO_ASSIGN_OR_RETURN(const std::string preset,
                              r.StringOr("preset", ""));
  ARACHNE_IO_ASSIGN_OR_RETURN(
      FrameworkConfig framework,
      FromPreset(preset, r.source(), r.PathOf("preset")));
  // Overrides in key order (the tree keeps no other); each is checked as it
  // is set, so the first bad one is reported.
  for (const auto& [key, field_value] : r.value().items()) {
    if (key == "preset" || field_value.is_null()) continue;
    ARACHNE_IO_ASSIGN_OR_RETURN(const std::string text,
                                ScalarText(r, key, field_value));
    if (absl::Status s = SetFrameworkField(framework, key, text); !s.ok()) {
      return Located(s, r.source(), path, text);
    }
  }
  return framework;
}

absl::StatusOr<FrameworkConfig> FrameworkFromMessage(
    const v1::Framework& message, absl::string_view source,
    absl::string_view path) {
  ARACHNE_IO_ASSIGN_OR_RETURN(
      FrameworkConfig framework,
      FromPreset(message.preset(), source, JoinFieldPath(path, "preset")));
  const google::protobuf::Reflection* reflection = message.GetReflection();
  for (const std::string& name : FrameworkFieldNames()) {
    const FieldDescriptor* field = MessageField(name);
    if (!reflection->HasField(message, field)) continue;
    std::string text;
    switch (field->cpp_type()) {
      case FieldDescriptor::CPPTYPE_STRING:
        text = reflection->GetString(message, field);
        break;
      case FieldDescriptor::CPPTYPE_BOOL:
        text = reflection->GetBool(message, field) ? "true" : "false";
        break;
      case FieldDescriptor::CPPTYPE_DOUBLE:
        // Exact: the value read back is the double sent.
        text = absl::StrFormat("%.17g", reflection->GetDouble(message, field));
        break;
      default:
        LOG(FATAL) << "arachne.v1.Framework." << name
                   << ": no conversion for its type";
    }
    if (absl::Status s = SetFrameworkField(framework, name, text); !s.ok()) {
      return Located(s, source, path, text);
    }
  }
  return framework;
}

v1::Framework FrameworkToMessage(const FrameworkConfig& framework) {
  v1::Framework message;
  message.set_preset(std::string(FrameworkPresetName(framework.preset)));
  const google::protobuf::Reflection* reflection = message.GetReflection();
  for (const auto& [name, text] : FrameworkOverrides(framework)) {
    const FieldDescriptor* field = MessageField(name);
    switch (field->cpp_type()) {
      case FieldDescriptor::CPPTYPE_STRING:
        reflection->SetString(&message, field, text);
        break;
      case FieldDescriptor::CPPTYPE_BOOL:
        reflection->SetBool(&message, field, text == "true");
        break;
      case FieldDescriptor::CPPTYPE_DOUBLE: {
        double v = 0;
        CHECK(absl::SimpleAtod(text, &v))
            << "framework." << name << ": its own text form " << text
            << " does not parse";
        reflection->SetDouble(&message, field, v);
        break;
      }
      default:
        LOG(FATAL) << "arachne.v1.Framework." << name
                   << ": no conversion for its type";
    }
  }
  return message;
}

std::string FrameworkSummary(const FrameworkConfig& framework) {
  std::string out(FrameworkPresetName(framework.preset));
  const auto overrides = FrameworkOverrides(framework);
  if (overrides.empty()) return out;
  absl::StrAppend(&out, " (",
                  absl::StrJoin(overrides, ", ", absl::PairFormatter("=")),
                  ")");
  return out;
}

absl::StatusOr<TrainingConfig> TrainingFromMessage(
    const v1::TrainingConfig& message, absl::string_view source,
    absl::string_view path) {
  // "<source>: <path>.<field>: ..." ("<path>.<field>: ..." without a source).
  auto error = [&](absl::string_view field, absl::string_view what) {
    return absl::InvalidArgumentError(
        absl::StrCat(source, source.empty() ? "" : ": ",
                     field.empty() ? std::string(path)
                                   : JoinFieldPath(path, field),
                     ": ", what));
  };
  TrainingConfig training;
  for (const auto& [field, value] :
       {std::pair<const char*, int>{"seq_len", message.seq_len()},
        {"global_batch", message.global_batch()}}) {
    if (value < 0) {
      return error(field, absl::StrCat("must be > 0 (or 0 for the default), "
                                       "got ",
                                       value));
    }
  }
  if (message.seq_len() > 0) training.seq_len = message.seq_len();
  if (message.global_batch() > 0) training.global_batch = message.global_batch();
  if (!message.precision().empty()) {
    absl::StatusOr<Precision> p = ParsePrecision(message.precision());
    if (!p.ok()) return error("precision", p.status().message());
    training.precision = *p;
  }
  if (!message.recompute().empty()) {
    absl::StatusOr<Recompute> r = ParseRecompute(message.recompute());
    if (!r.ok()) return error("recompute", r.status().message());
    training.recompute = *r;
  }
  training.distributed_optimizer = message.distributed_optimizer();
  ARACHNE_IO_ASSIGN_OR_RETURN(
      training.framework,
      FrameworkFromMessage(message.framework(), source,
                           JoinFieldPath(path, "framework")));
  if (absl::Status s = training.Validate(); !s.ok()) {
    return error("", s.message());
  }
  return training;
}

v1::TrainingConfig TrainingToMessage(const TrainingConfig& training) {
  v1::TrainingConfig message;
  message.set_seq_len(training.seq_len);
  message.set_global_batch(training.global_batch);
  message.set_precision(std::string(PrecisionName(training.precision)));
  message.set_recompute(std::string(RecomputeName(training.recompute)));
  message.set_distributed_optimizer(training.distributed_optimizer);
  *message.mutable_framework() = FrameworkToMessage(training.framework);
  return message;
}

}  // namespace arachne
