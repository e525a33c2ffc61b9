#include "planner_service/io/message_json.h"

#include <cmath>
#include <cstdint>
#include <limits>
#include <string>
#include <utility>
#include <vector>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "arachne/v1/options.pb.h"
#include "google/protobuf/descriptor.h"
#include "glog/logging.h"
#include "google/protobuf/util/json_util.h"
#include "planner_service/io/json_yaml.h"

namespace arachne {
namespace {

using Json = nlohmann::json;
using google::protobuf::Descriptor;
using google::protobuf::FieldDescriptor;

// Walks a tree against a message descriptor, producing the tree protobuf's
// parser gets: keys renamed to proto field names, nulls dropped, YAML
// integers in string fields turned into their text, integer strings into
// numbers.
class SchemaChecker {
 public:
  explicit SchemaChecker(absl::string_view source) : errors_(source, "") {}

  absl::StatusOr<Json> Message(const Json& value, const Descriptor& type,
                               const std::string& path) const {
    if (!value.is_object()) {
      return Error(path, absl::StrCat("must be a mapping (object), got ",
                                      DescribeJsonValue(value)));
    }
    Json out = Json::object();
    for (const auto& [key, v] : value.items()) {
      const FieldDescriptor* field = type.FindFieldByName(key);
      for (int i = 0; field == nullptr && i < type.field_count(); ++i) {
        if (type.field(i)->json_name() == key) field = type.field(i);
      }
      if (field == nullptr) {
        std::vector<std::string> allowed;
        for (int i = 0; i < type.field_count(); ++i) {
          allowed.push_back(type.field(i)->name());
        }
        return Error(path, absl::StrCat("unknown field ", QuoteForMessage(key),
                                        " (allowed: ",
                                        absl::StrJoin(allowed, ", "), ")"));
      }
      if (v.is_null()) continue;
      const std::string field_path = JoinFieldPath(path, field->name());
      if (out.contains(field->name())) {
        return Error(field_path,
                     absl::StrCat("given twice (as \"", field->name(),
                                  "\" and \"", field->json_name(), "\")"));
      }
      absl::StatusOr<Json> checked = Field(v, *field, field_path);
      if (!checked.ok()) return checked.status();
      out[field->name()] = *std::move(checked);
    }
    for (int i = 0; i < type.field_count(); ++i) {
      const FieldDescriptor* field = type.field(i);
      if (field->options().GetExtension(v1::required) &&
          !out.contains(field->name())) {
        return Error(path, absl::StrCat("missing required field \"",
                                        field->name(), "\""));
      }
    }
    return out;
  }

 private:
  absl::StatusOr<Json> Field(const Json& v, const FieldDescriptor& field,
                             const std::string& path) const {
    if (field.is_map()) {
      if (!v.is_object()) {
        return Error(path, absl::StrCat("must be a mapping (object), got ",
                                        DescribeJsonValue(v)));
      }
      const FieldDescriptor& value_field = *field.message_type()->map_value();
      Json out = Json::object();
      for (const auto& [key, item] : v.items()) {
        // A key becomes part of the path; a long one is abbreviated.
        absl::StatusOr<Json> checked =
            Single(item, value_field,
                   JoinFieldPath(path, key.size() > kMaxQuotedBytes
                                           ? QuoteForMessage(key)
                                           : key));
        if (!checked.ok()) return checked.status();
        out[key] = *std::move(checked);
      }
      return out;
    }
    if (field.is_repeated()) {
      if (!v.is_array()) {
        return Error(path,
                     absl::StrCat("must be a list, got ", DescribeJsonValue(v)));
      }
      Json out = Json::array();
      for (int i = 0; i < static_cast<int>(v.size()); ++i) {
        absl::StatusOr<Json> checked =
            Single(v[i], field, IndexFieldPath(path, i));
        if (!checked.ok()) return checked.status();
        out.push_back(*std::move(checked));
      }
      return out;
    }
    return Single(v, field, path);
  }

  // One value of `field`'s type (an element, for repeated fields).
  absl::StatusOr<Json> Single(const Json& v, const FieldDescriptor& field,
                              const std::string& path) const {
    switch (field.cpp_type()) {
      case FieldDescriptor::CPPTYPE_MESSAGE: {
        // Well-known types have their own JSON forms; protobuf checks them.
        if (absl::string_view(field.message_type()->file()->name())
                .substr(0, 16) == "google/protobuf/") {
          return v;
        }
        return Message(v, *field.message_type(), path);
      }
      case FieldDescriptor::CPPTYPE_STRING:
        if (v.is_string()) return v;
        // YAML reads `gpu: 3090` as a number; the schema says text.
        if (v.is_number_integer()) return Json(v.dump());
        return Error(path,
                     absl::StrCat("must be a string, got ", DescribeJsonValue(v)));
      case FieldDescriptor::CPPTYPE_BOOL:
        if (v.is_boolean()) return v;
        return Error(path, absl::StrCat("must be true or false, got ",
                                        DescribeJsonValue(v)));
      case FieldDescriptor::CPPTYPE_DOUBLE:
      case FieldDescriptor::CPPTYPE_FLOAT:
        if (v.is_number_integer()) return v;
        if (v.is_number_float() && std::isfinite(v.get<double>())) return v;
        return Error(path, absl::StrCat("must be a finite number, got ",
                                        DescribeJsonValue(v)));
      case FieldDescriptor::CPPTYPE_ENUM: {
        const auto* type = field.enum_type();
        if (v.is_string() &&
            type->FindValueByName(v.get<std::string>()) != nullptr) {
          return v;
        }
        if (v.is_number_integer() &&
            type->FindValueByNumber(v.get<int>()) != nullptr) {
          return v;
        }
        std::vector<std::string> names;
        for (int i = 0; i < type->value_count(); ++i) {
          names.push_back(type->value(i)->name());
        }
        return Error(path, absl::StrCat("must be one of ",
                                        absl::StrJoin(names, ", "), ", got ",
                                        DescribeJsonValue(v)));
      }
      // Only 64-bit integers may be strings: the mapping writes them so
      // (JSON numbers lose precision beyond 2^53). A 32-bit field written
      // "4" is a typed-in string, which the format calls an error.
      case FieldDescriptor::CPPTYPE_INT32:
        return Integer(v, path, std::numeric_limits<int32_t>::min(),
                       std::numeric_limits<int32_t>::max(),
                       /*string_ok=*/false);
      case FieldDescriptor::CPPTYPE_INT64:
        return Integer(v, path, std::numeric_limits<int64_t>::min(),
                       std::numeric_limits<int64_t>::max(),
                       /*string_ok=*/true);
      case FieldDescriptor::CPPTYPE_UINT32:
        return Integer(v, path, 0, std::numeric_limits<uint32_t>::max(),
                       /*string_ok=*/false);
      case FieldDescriptor::CPPTYPE_UINT64:
        // Beyond int64 is not a value any arachne field means.
        return Integer(v, path, 0, std::numeric_limits<int64_t>::max(),
                       /*string_ok=*/true);
    }
    return Error(path, "has a type this reader does not know");
  }

  // An integer in [min, max]: a JSON integer, or with `string_ok` a decimal
  // string (the mapping writes 64-bit integers as strings).
  absl::StatusOr<Json> Integer(const Json& v, const std::string& path,
                               int64_t min, int64_t max, bool string_ok) const {
    int64_t n = 0;
    bool ok = false;
    if (v.is_number_unsigned()) {
      ok = v.get<uint64_t>() <=
           static_cast<uint64_t>(std::numeric_limits<int64_t>::max());
      n = ok ? static_cast<int64_t>(v.get<uint64_t>()) : 0;
    } else if (v.is_number_integer()) {
      ok = true;
      n = v.get<int64_t>();
    } else if (v.is_string() && string_ok) {
      ok = absl::SimpleAtoi(v.get<std::string>(), &n);
    }
    if (!ok && !v.is_number_unsigned()) {
      int64_t unused = 0;
      const bool quoted_number =
          v.is_string() && absl::SimpleAtoi(v.get<std::string>(), &unused);
      return Error(path, absl::StrCat("must be an integer",
                                      quoted_number ? " (without quotes)" : "",
                                      ", got ", DescribeJsonValue(v)));
    }
    if (!ok || n < min || n > max) {
      return Error(path, absl::StrCat("must be an integer in [", min, ", ",
                                      max, "], got ", DescribeJsonValue(v)));
    }
    return Json(n);
  }

  absl::Status Error(absl::string_view path, absl::string_view message) const {
    return errors_.At(path, message);
  }

  MessageErrors errors_;  // at the root: `path` arguments are full paths
};

}  // namespace

absl::Status MessageFromJson(const nlohmann::json& json,
                             absl::string_view source, absl::string_view path,
                             google::protobuf::Message* message) {
  message->Clear();
  SchemaChecker checker(source);
  absl::StatusOr<Json> checked =
      checker.Message(json, *message->GetDescriptor(), std::string(path));
  if (!checked.ok()) return checked.status();
  google::protobuf::util::JsonParseOptions options;
  options.ignore_unknown_fields = false;
  const auto status = google::protobuf::util::JsonStringToMessage(
      checked->dump(), message, options);
  if (!status.ok()) {
    // The check above should leave protobuf nothing to reject; if it does,
    // its message is still better than none.
    return MessageErrors(source, path)
        .At("", absl::StrCat("does not fit the schema of ",
                             message->GetDescriptor()->full_name(), ": ",
                             status.ToString()));
  }
  return absl::OkStatus();
}

absl::Status ParseMessageText(absl::string_view text, absl::string_view source,
                              google::protobuf::Message* message) {
  absl::StatusOr<Json> tree = ParseJsonOrYaml(text, source);
  if (!tree.ok()) return tree.status();
  if (tree->is_null()) {
    return FieldError(source, "",
                      absl::StrCat("is empty; expected a mapping (",
                                   message->GetDescriptor()->name(), ")"));
  }
  return MessageFromJson(*tree, source, "", message);
}

MessageErrors MessageErrors::Under(absl::string_view field) const {
  return MessageErrors(source_, JoinFieldPath(path_, field));
}

absl::Status MessageErrors::At(absl::string_view field,
                               absl::string_view message) const {
  const std::string path =
      field.empty() ? path_ : JoinFieldPath(path_, field);
  if (!source_.empty()) return FieldError(source_, path, message);
  return absl::InvalidArgumentError(
      path.empty() ? std::string(message) : absl::StrCat(path, ": ", message));
}

absl::Status MessageErrors::IntAtLeast(absl::string_view field, int64_t value,
                                       int64_t min) const {
  return IntInRange(field, value, min, std::numeric_limits<int64_t>::max());
}

absl::Status MessageErrors::IntInRange(absl::string_view field, int64_t value,
                                       int64_t min, int64_t max) const {
  if (value < min) {
    const std::string bound = min == 1 ? "> 0" : absl::StrCat(">= ", min);
    return At(field,
              absl::StrCat("must be an integer ", bound, ", got ", value));
  }
  if (value > max) {
    return At(field,
              absl::StrCat("must be an integer <= ", max, ", got ", value));
  }
  return absl::OkStatus();
}

nlohmann::json MessageToJson(const google::protobuf::Message& message) {
  google::protobuf::util::JsonPrintOptions options;
  options.preserve_proto_field_names = true;
  options.always_print_primitive_fields = true;
  std::string text;
  const auto status =
      google::protobuf::util::MessageToJsonString(message, &text, options);
  // Printing a well-formed message cannot fail short of a protobuf bug.
  CHECK(status.ok()) << status.ToString();
  return Json::parse(text);
}

}  // namespace arachne
