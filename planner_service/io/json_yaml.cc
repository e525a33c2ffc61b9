#include "planner_service/io/json_yaml.h"

#include <charconv>
#include <cmath>
#include <regex>
#include <string>
#include <utility>
#include <vector>

#include "absl/container/flat_hash_set.h"
#include "absl/strings/ascii.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "yaml-cpp/yaml.h"

namespace arachne {
namespace {

using Json = nlohmann::json;

// Thrown from inside the JSON parser callback (which cannot return a
// status) when an object repeats a key; caught in ParseJson.
struct DuplicateJsonKey {
  std::string key;
};

std::pair<int, int> LineColumnOfByte(absl::string_view text, size_t byte) {
  int line = 1, column = 1;
  for (size_t i = 0; i < text.size() && i + 1 < byte; ++i) {
    if (text[i] == '\n') {
      ++line;
      column = 1;
    } else {
      ++column;
    }
  }
  return {line, column};
}

absl::StatusOr<Json> ParseJson(absl::string_view text,
                               absl::string_view source) {
  // One set of seen keys per open object, to reject duplicates: nlohmann
  // keeps the last one silently, which would hide a copy-paste mistake.
  std::vector<absl::flat_hash_set<std::string>> seen;
  auto callback = [&seen](int /*depth*/, Json::parse_event_t event,
                          Json& parsed) {
    switch (event) {
      case Json::parse_event_t::object_start:
        seen.emplace_back();
        break;
      case Json::parse_event_t::object_end:
        if (!seen.empty()) seen.pop_back();
        break;
      case Json::parse_event_t::key: {
        std::string key = parsed.get<std::string>();
        if (!seen.empty() && !seen.back().insert(key).second) {
          throw DuplicateJsonKey{std::move(key)};
        }
        break;
      }
      default:
        break;
    }
    return true;
  };
  try {
    return Json::parse(text.begin(), text.end(), callback);
  } catch (const DuplicateJsonKey& e) {
    return absl::InvalidArgumentError(
        absl::StrCat(source, ": duplicate key \"", e.key, "\""));
  } catch (const Json::parse_error& e) {
    auto [line, column] = LineColumnOfByte(text, e.byte);
    // Drop nlohmann's "[json.exception.parse_error.101] parse error at line
    // 1, column 2: " prefix; we print the position ourselves.
    absl::string_view what = e.what();
    if (size_t col = what.find("column "); col != absl::string_view::npos) {
      if (size_t colon = what.find(": ", col);
          colon != absl::string_view::npos) {
        what.remove_prefix(colon + 2);
      }
    }
    return absl::InvalidArgumentError(
        absl::StrCat(source, ":", line, ":", column, ": invalid JSON: ", what));
  }
}

bool IsYamlNull(const std::string& s) {
  return s.empty() || s == "~" || s == "null" || s == "Null" || s == "NULL";
}

// YAML 1.2 core schema resolution of a plain (unquoted) scalar.
Json ResolvePlainScalar(const std::string& s) {
  if (IsYamlNull(s)) return nullptr;
  if (s == "true" || s == "True" || s == "TRUE") return true;
  if (s == "false" || s == "False" || s == "FALSE") return false;
  static const std::regex kInt("[-+]?[0-9]+");
  static const std::regex kFloat(
      "[-+]?(\\.[0-9]+|[0-9]+(\\.[0-9]*)?)([eE][-+]?[0-9]+)?");
  if (std::regex_match(s, kInt)) {
    const char* begin = s.data() + (s[0] == '+' ? 1 : 0);
    int64_t v = 0;
    auto [ptr, ec] = std::from_chars(begin, s.data() + s.size(), v);
    if (ec == std::errc() && ptr == s.data() + s.size()) return v;
    return std::stod(s);  // out of int64 range: keep the magnitude
  }
  if (s.size() > 2 && s[0] == '0' && (s[1] == 'x' || s[1] == 'o')) {
    int64_t v = 0;
    const int base = s[1] == 'x' ? 16 : 8;
    auto [ptr, ec] =
        std::from_chars(s.data() + 2, s.data() + s.size(), v, base);
    if (ec == std::errc() && ptr == s.data() + s.size()) return v;
  }
  if (std::regex_match(s, kFloat)) return std::stod(s);
  static const std::regex kInf("[-+]?\\.(inf|Inf|INF)");
  if (std::regex_match(s, kInf)) {
    return s[0] == '-' ? -HUGE_VAL : HUGE_VAL;
  }
  if (s == ".nan" || s == ".NaN" || s == ".NAN") return std::nan("");
  return s;
}

absl::Status YamlError(absl::string_view source, const YAML::Mark& mark,
                       absl::string_view message) {
  if (mark.is_null()) {
    return absl::InvalidArgumentError(
        absl::StrCat(source, ": invalid YAML: ", message));
  }
  return absl::InvalidArgumentError(absl::StrCat(
      source, ":", mark.line + 1, ":", mark.column + 1, ": ", message));
}

absl::StatusOr<Json> YamlToJson(const YAML::Node& node,
                                absl::string_view source) {
  switch (node.Type()) {
    case YAML::NodeType::Undefined:
    case YAML::NodeType::Null:
      return Json(nullptr);
    case YAML::NodeType::Scalar: {
      const std::string& tag = node.Tag();
      const std::string& s = node.Scalar();
      if (tag == "?") return ResolvePlainScalar(s);
      // "!" is yaml-cpp's tag for quoted scalars: always strings, so "1.0"
      // stays a version string and "no" a word.
      if (tag == "!" || tag == "tag:yaml.org,2002:str") return Json(s);
      Json v = ResolvePlainScalar(s);
      if ((tag == "tag:yaml.org,2002:int" && v.is_number_integer()) ||
          (tag == "tag:yaml.org,2002:float" && v.is_number()) ||
          (tag == "tag:yaml.org,2002:bool" && v.is_boolean()) ||
          (tag == "tag:yaml.org,2002:null" && v.is_null())) {
        if (tag == "tag:yaml.org,2002:float") return Json(v.get<double>());
        return v;
      }
      return YamlError(
          source, node.Mark(),
          absl::StrCat("unsupported tag or value \"", tag, " ", s, "\""));
    }
    case YAML::NodeType::Sequence: {
      Json out = Json::array();
      for (const YAML::Node& item : node) {
        ARACHNE_IO_ASSIGN_OR_RETURN(Json v, YamlToJson(item, source));
        out.push_back(std::move(v));
      }
      return out;
    }
    case YAML::NodeType::Map: {
      Json out = Json::object();
      for (const auto& kv : node) {
        if (!kv.first.IsScalar()) {
          return YamlError(source, kv.first.Mark(),
                           "mapping keys must be plain strings");
        }
        const std::string& key = kv.first.Scalar();
        if (out.contains(key)) {
          return YamlError(source, kv.first.Mark(),
                           absl::StrCat("duplicate key \"", key, "\""));
        }
        ARACHNE_IO_ASSIGN_OR_RETURN(Json v, YamlToJson(kv.second, source));
        out[key] = std::move(v);
      }
      return out;
    }
  }
  return Json(nullptr);
}

absl::StatusOr<Json> ParseYaml(absl::string_view text,
                               absl::string_view source) {
  YAML::Node root;
  try {
    root = YAML::Load(std::string(text));
  } catch (const YAML::Exception& e) {
    return YamlError(source, e.mark, absl::StrCat("invalid YAML: ", e.msg));
  }
  return YamlToJson(root, source);
}

std::string DescribeIntRange(int64_t min, int64_t max, int64_t type_min,
                             int64_t type_max) {
  if (min == type_min && max == type_max) return "";
  if (max == type_max) {
    return min == 1 ? " > 0" : absl::StrCat(" >= ", min);
  }
  if (min == type_min) return absl::StrCat(" <= ", max);
  return absl::StrCat(" in [", min, ", ", max, "]");
}

}  // namespace

absl::StatusOr<nlohmann::json> ParseJsonOrYaml(absl::string_view text,
                                               absl::string_view source_name) {
  absl::string_view trimmed = absl::StripLeadingAsciiWhitespace(text);
  if (!trimmed.empty() && (trimmed[0] == '{' || trimmed[0] == '[')) {
    absl::StatusOr<Json> json = ParseJson(text, source_name);
    if (json.ok()) return json;
    // A .json file must be JSON: YAML would accept a trailing comma or a
    // missing quote and hide the mistake.
    if (absl::EndsWithIgnoreCase(source_name, ".json")) return json.status();
    // YAML flow style also starts with a brace ({gpu: A100, gpus: 4}); only
    // when that fails too is the JSON error the one to show.
    absl::StatusOr<Json> yaml = ParseYaml(text, source_name);
    if (yaml.ok()) return yaml;
    return json.status();
  }
  return ParseYaml(text, source_name);
}

std::string JoinFieldPath(absl::string_view path, absl::string_view key) {
  return path.empty() ? std::string(key) : absl::StrCat(path, ".", key);
}

std::string IndexFieldPath(absl::string_view path, int index) {
  return absl::StrCat(path, "[", index, "]");
}

absl::Status FieldError(absl::string_view source, absl::string_view path,
                        absl::string_view message) {
  if (path.empty()) {
    return absl::InvalidArgumentError(absl::StrCat(source, ": ", message));
  }
  return absl::InvalidArgumentError(
      absl::StrCat(source, ": ", path, ": ", message));
}

std::string DescribeJsonValue(const nlohmann::json& value) {
  std::string s = value.dump();
  if (s.size() > 60) s = absl::StrCat(s.substr(0, 57), "...");
  return s;
}

absl::StatusOr<ObjectReader> ObjectReader::Create(const nlohmann::json& value,
                                                  absl::string_view source,
                                                  absl::string_view path) {
  if (!value.is_object()) {
    return FieldError(source, path,
                      absl::StrCat("must be a mapping (object), got ",
                                   DescribeJsonValue(value)));
  }
  return ObjectReader(&value, std::string(source), std::string(path));
}

absl::Status ObjectReader::AllowOnly(
    std::initializer_list<absl::string_view> allowed) const {
  for (const auto& [key, unused] : value_->items()) {
    bool known = false;
    for (absl::string_view a : allowed) known = known || key == a;
    if (!known) {
      return FieldError(source_, path_,
                        absl::StrCat("unknown field \"", key, "\" (allowed: ",
                                     absl::StrJoin(allowed, ", "), ")"));
    }
  }
  return absl::OkStatus();
}

bool ObjectReader::Has(absl::string_view key) const {
  return Find(key) != nullptr;
}

const nlohmann::json* ObjectReader::Find(absl::string_view key) const {
  auto it = value_->find(std::string(key));
  if (it == value_->end() || it->is_null()) return nullptr;
  return &*it;
}

std::string ObjectReader::PathOf(absl::string_view key) const {
  return JoinFieldPath(path_, key);
}

absl::Status ObjectReader::Error(absl::string_view key,
                                 absl::string_view message) const {
  return FieldError(source_, PathOf(key), message);
}

absl::Status ObjectReader::MissingError(absl::string_view key) const {
  return FieldError(source_, path_,
                    absl::StrCat("missing required field \"", key, "\""));
}

absl::StatusOr<std::string> ObjectReader::String(absl::string_view key) const {
  const Json* v = Find(key);
  if (v == nullptr) return MissingError(key);
  if (!v->is_string() || v->get_ref<const std::string&>().empty()) {
    return Error(key, absl::StrCat("must be a non-empty string, got ",
                                   DescribeJsonValue(*v)));
  }
  return v->get<std::string>();
}

absl::StatusOr<int> ObjectReader::Int(absl::string_view key, int min,
                                      int max) const {
  const Json* v = Find(key);
  if (v == nullptr) return MissingError(key);
  // Name the bound that was broken: "> 0" for -2, "<= 1024" for 5000. A
  // value of the wrong type gets the lower bound, the usual constraint.
  auto bad = [&](bool too_large) {
    const std::string bound =
        too_large ? absl::StrCat(" <= ", max)
                  : DescribeIntRange(min, std::numeric_limits<int>::max(),
                                     std::numeric_limits<int>::min(),
                                     std::numeric_limits<int>::max());
    return Error(key, absl::StrCat("must be an integer", bound, ", got ",
                                   DescribeJsonValue(*v)));
  };
  if (!v->is_number_integer()) return bad(false);
  if (v->is_number_unsigned()) {
    if (v->get<uint64_t>() > static_cast<uint64_t>(max)) return bad(true);
    if (static_cast<int64_t>(v->get<uint64_t>()) < min) return bad(false);
    return static_cast<int>(v->get<uint64_t>());
  }
  const int64_t i = v->get<int64_t>();
  if (i < min) return bad(false);
  if (i > max) return bad(true);
  return static_cast<int>(i);
}

absl::StatusOr<int64_t> ObjectReader::Int64(absl::string_view key,
                                            int64_t min) const {
  const Json* v = Find(key);
  if (v == nullptr) return MissingError(key);
  const bool in_range =
      v->is_number_integer() &&
      (v->is_number_unsigned()
           ? v->get<uint64_t>() <=
                 static_cast<uint64_t>(std::numeric_limits<int64_t>::max())
           : v->get<int64_t>() >= min);
  if (!in_range) {
    return Error(key, absl::StrCat("must be an integer",
                                   DescribeIntRange(
                                       min, std::numeric_limits<int64_t>::max(),
                                       std::numeric_limits<int64_t>::min(),
                                       std::numeric_limits<int64_t>::max()),
                                   ", got ", DescribeJsonValue(*v)));
  }
  return v->get<int64_t>();
}

absl::StatusOr<double> ObjectReader::Number(absl::string_view key, double min,
                                            bool exclusive) const {
  const Json* v = Find(key);
  if (v == nullptr) return MissingError(key);
  const bool ok =
      v->is_number() && std::isfinite(v->get<double>()) &&
      (exclusive ? v->get<double>() > min : v->get<double>() >= min);
  if (!ok) {
    return Error(key, absl::StrCat("must be a number ", exclusive ? ">" : ">=",
                                   " ", min, ", got ", DescribeJsonValue(*v)));
  }
  return v->get<double>();
}

absl::StatusOr<bool> ObjectReader::Bool(absl::string_view key) const {
  const Json* v = Find(key);
  if (v == nullptr) return MissingError(key);
  if (!v->is_boolean()) {
    return Error(key, absl::StrCat("must be true or false, got ",
                                   DescribeJsonValue(*v)));
  }
  return v->get<bool>();
}

absl::StatusOr<ObjectReader> ObjectReader::Object(absl::string_view key) const {
  const Json* v = Find(key);
  if (v == nullptr) return MissingError(key);
  return Create(*v, source_, PathOf(key));
}

absl::StatusOr<const nlohmann::json*> ObjectReader::Array(
    absl::string_view key) const {
  const Json* v = Find(key);
  if (v == nullptr) return MissingError(key);
  if (!v->is_array()) {
    return Error(key,
                 absl::StrCat("must be a list, got ", DescribeJsonValue(*v)));
  }
  return v;
}

absl::StatusOr<std::string> ObjectReader::StringOr(absl::string_view key,
                                                   std::string fallback) const {
  if (!Has(key)) return fallback;
  return String(key);
}

absl::StatusOr<int> ObjectReader::IntOr(absl::string_view key, int fallback,
                                        int min, int max) const {
  if (!Has(key)) return fallback;
  return Int(key, min, max);
}

absl::StatusOr<double> ObjectReader::NumberOr(absl::string_view key,
                                              double fallback, double min,
                                              bool exclusive) const {
  if (!Has(key)) return fallback;
  return Number(key, min, exclusive);
}

absl::StatusOr<bool> ObjectReader::BoolOr(absl::string_view key,
                                          bool fallback) const {
  if (!Has(key)) return fallback;
  return Bool(key);
}

absl::StatusOr<std::vector<std::string>> ObjectReader::StringListOr(
    absl::string_view key) const {
  std::vector<std::string> out;
  if (!Has(key)) return out;
  ARACHNE_IO_ASSIGN_OR_RETURN(const Json* list, Array(key));
  for (int i = 0; i < static_cast<int>(list->size()); ++i) {
    const Json& item = (*list)[i];
    if (!item.is_string() || item.get_ref<const std::string&>().empty()) {
      return FieldError(source_, IndexFieldPath(PathOf(key), i),
                        absl::StrCat("must be a non-empty string, got ",
                                     DescribeJsonValue(item)));
    }
    out.push_back(item.get<std::string>());
  }
  return out;
}

absl::StatusOr<const nlohmann::json*> ObjectReader::ArrayOr(
    absl::string_view key) const {
  static const Json* const kEmpty = new Json(Json::array());
  if (!Has(key)) return kEmpty;
  return Array(key);
}

}  // namespace arachne
