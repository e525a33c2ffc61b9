#include "planner_service/io/json_yaml.h"

#include <algorithm>
#include <cerrno>
#include <charconv>
#include <cmath>
#include <cstdlib>
#include <sstream>
#include <string>
#include <utility>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "absl/strings/ascii.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "yaml-cpp/eventhandler.h"
#include "yaml-cpp/yaml.h"

namespace arachne {
namespace {

using Json = nlohmann::json;

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

std::string SizeLimitMessage(absl::string_view what, int64_t size,
                             int64_t limit) {
  return absl::StrCat(what, " of ", size, " bytes is longer than the limit of ",
                      limit, " bytes");
}

// Counts what a tree holds while it is built, for the limits of json_yaml.h;
// shared by the JSON and the YAML builder.
class TreeBudget {
 public:
  // An error message when one more value at `depth` (1 for the root) breaks
  // a limit, else "".
  std::string AddValue(int depth) {
    if (depth > kMaxNestingDepth) {
      return absl::StrCat("nested deeper than the limit of ", kMaxNestingDepth,
                          " levels");
    }
    if (++values_ > kMaxInputValues) {
      return absl::StrCat("holds more than the limit of ", kMaxInputValues,
                          " values");
    }
    return "";
  }
  // The same for `count` values copied by an alias.
  std::string AddAliasValues(int64_t count) {
    alias_values_ += count;
    if (alias_values_ > kMaxAliasValues) {
      return absl::StrCat("YAML aliases expand to more than the limit of ",
                          kMaxAliasValues, " values");
    }
    values_ += count;
    if (values_ > kMaxInputValues) {
      return absl::StrCat("holds more than the limit of ", kMaxInputValues,
                          " values (aliases expanded)");
    }
    return "";
  }
  int64_t values() const { return values_; }

 private:
  int64_t values_ = 0;
  int64_t alias_values_ = 0;
};

// Checks a string or key: length and UTF-8. "" when fine.
std::string CheckText(absl::string_view s, absl::string_view what) {
  if (static_cast<int64_t>(s.size()) > kMaxStringBytes) {
    return SizeLimitMessage(what, s.size(), kMaxStringBytes);
  }
  if (size_t bad = FirstInvalidUtf8(s); bad != absl::string_view::npos) {
    return absl::StrFormat("%s is not valid UTF-8 (byte 0x%02X at offset %d)",
                           what, static_cast<unsigned char>(s[bad]), bad);
  }
  return "";
}

// The path of the value being built, "nodes[2].gpu", for limit errors.
std::string PathOfStack(const std::vector<std::string>& parts) {
  std::string path;
  for (const std::string& p : parts) {
    if (!p.empty() && p[0] == '[') {
      path += p;
    } else {
      path = JoinFieldPath(path, p);
    }
    // A path as deep as the limit is long; its start says where.
    if (path.size() > 2 * kMaxQuotedBytes) return absl::StrCat(path, "...");
  }
  return path;
}

// nlohmann's SAX interface, building the tree under the limits; stops at the
// first problem, which `error()` then describes. Parsing is iterative in
// nlohmann, so only this builder needs to bound depth.
class JsonTreeBuilder {
 public:
  explicit JsonTreeBuilder(absl::string_view text) : text_(text) {}

  bool null() { return Value(nullptr); }
  bool boolean(bool v) { return Value(v); }
  bool number_integer(Json::number_integer_t v) { return Value(v); }
  bool number_unsigned(Json::number_unsigned_t v) { return Value(v); }
  bool number_float(Json::number_float_t v, const std::string&) {
    return Value(v);
  }
  bool string(std::string& v) {
    if (std::string e = CheckText(v, "a string"); !e.empty()) return Fail(e);
    return Value(std::move(v));
  }
  bool binary(Json::binary_t&) { return Fail("binary values are not JSON"); }
  bool start_object(std::size_t) { return Open(Json::object()); }
  bool end_object() { return Close(); }
  bool start_array(std::size_t) { return Open(Json::array()); }
  bool end_array() { return Close(); }
  bool key(std::string& k) {
    if (std::string e = CheckText(k, "a key"); !e.empty()) return Fail(e);
    Json& object = *stack_.back();
    if (object.contains(k)) {
      return Fail(absl::StrCat("duplicate key ", QuoteForMessage(k)));
    }
    key_ = std::move(k);
    path_.push_back(key_);
    return true;
  }
  bool parse_error(std::size_t position, const std::string& token,
                   const nlohmann::detail::exception& e) {
    auto [line, column] = LineColumnOfByte(text_, position);
    std::string what;
    if (e.id == 406) {
      // nlohmann's "number overflow parsing '1e999'".
      what = absl::StrCat("number ", QuoteForMessage(token),
                          " is out of the range of a double");
    } else {
      // Drop "[json.exception.parse_error.101] parse error at line 1,
      // column 2: "; the position is printed in our own form.
      absl::string_view w = e.what();
      if (size_t col = w.find("column "); col != absl::string_view::npos) {
        if (size_t colon = w.find(": ", col);
            colon != absl::string_view::npos) {
          w.remove_prefix(colon + 2);
        }
      }
      // The lexer quotes the text of a bad token, which may be huge.
      what = std::string(w.substr(0, 4 * kMaxQuotedBytes));
      if (w.size() > what.size()) absl::StrAppend(&what, "...");
    }
    error_ = absl::StrCat(line, ":", column, ": invalid JSON: ", what);
    positioned_ = true;
    return false;
  }

  bool positioned() const { return positioned_; }
  const std::string& error() const { return error_; }
  Json TakeRoot() { return std::move(root_); }

 private:
  bool Fail(std::string message) {
    const std::string path = PathOfStack(path_);
    error_ =
        path.empty() ? std::move(message) : absl::StrCat(path, ": ", message);
    return false;
  }

  // Places `v` as the root, the next array element or the value of the
  // last key; returns where it went.
  Json* Place(Json v) {
    if (stack_.empty()) {
      root_ = std::move(v);
      return &root_;
    }
    Json& parent = *stack_.back();
    if (parent.is_array()) {
      parent.push_back(std::move(v));
      return &parent.back();
    }
    Json& slot = parent[key_];
    slot = std::move(v);
    return &slot;
  }

  void PushIndexPath() {
    if (!stack_.empty() && stack_.back()->is_array()) {
      path_.push_back(absl::StrCat("[", stack_.back()->size(), "]"));
    }
  }
  void PopValuePath() {
    if (!path_.empty()) path_.pop_back();
  }

  bool Value(Json v) {
    PushIndexPath();
    if (std::string e = budget_.AddValue(stack_.size() + 1); !e.empty()) {
      return Fail(e);
    }
    Place(std::move(v));
    if (!stack_.empty()) PopValuePath();
    return true;
  }

  bool Open(Json container) {
    PushIndexPath();
    if (std::string e = budget_.AddValue(stack_.size() + 1); !e.empty()) {
      return Fail(e);
    }
    stack_.push_back(Place(std::move(container)));
    return true;
  }

  bool Close() {
    stack_.pop_back();
    if (!stack_.empty()) PopValuePath();
    return true;
  }

  absl::string_view text_;
  Json root_;
  std::vector<Json*> stack_;  // open containers, innermost last
  std::vector<std::string> path_;
  std::string key_;
  TreeBudget budget_;
  std::string error_;
  bool positioned_ = false;
};

absl::StatusOr<Json> ParseJson(absl::string_view text,
                               absl::string_view source) {
  JsonTreeBuilder builder(text);
  bool ok = false;
  try {
    ok = Json::sax_parse(text.begin(), text.end(), &builder,
                         Json::input_format_t::json, /*strict=*/true);
  } catch (const Json::exception& e) {
    // The SAX parser reports its errors through parse_error; this is a
    // safety net, never a crash.
    return absl::InvalidArgumentError(
        absl::StrCat(source, ": invalid JSON: ", e.what()));
  }
  if (!ok) {
    return absl::InvalidArgumentError(absl::StrCat(
        source, builder.positioned() ? ":" : ": ", builder.error()));
  }
  return builder.TakeRoot();
}

// Bounded by the limits, so a text of any shape costs at most a few
// hundred MB and never the stack.
bool IsYamlNull(absl::string_view s) {
  return s.empty() || s == "~" || s == "null" || s == "Null" || s == "NULL";
}

bool AllDigits(absl::string_view s, int base) {
  if (s.empty()) return false;
  for (char c : s) {
    const bool ok = base == 16 ? absl::ascii_isxdigit(c)
                               : (c >= '0' && c <= (base == 8 ? '7' : '9'));
    if (!ok) return false;
  }
  return true;
}

// [-+]?(\.[0-9]+|[0-9]+(\.[0-9]*)?)([eE][-+]?[0-9]+)?, the core schema's
// float, written out: std::regex recurses per character and overflows the
// stack on a long scalar.
bool IsYamlFloat(absl::string_view s) {
  size_t i = 0;
  auto digits = [&]() {
    const size_t start = i;
    while (i < s.size() && absl::ascii_isdigit(s[i])) ++i;
    return i - start;
  };
  if (i < s.size() && (s[i] == '-' || s[i] == '+')) ++i;
  if (i < s.size() && s[i] == '.') {
    ++i;
    if (digits() == 0) return false;
  } else {
    if (digits() == 0) return false;
    if (i < s.size() && s[i] == '.') {
      ++i;
      digits();
    }
  }
  if (i < s.size() && (s[i] == 'e' || s[i] == 'E')) {
    ++i;
    if (i < s.size() && (s[i] == '-' || s[i] == '+')) ++i;
    if (digits() == 0) return false;
  }
  return i == s.size();
}

// A decimal number as a double: its value, the nearest subnormal or zero
// for tiny magnitudes (as a JSON reader gives them), or an error beyond a
// double's range.
absl::StatusOr<double> ParseYamlDouble(const std::string& s) {
  errno = 0;
  char* end = nullptr;
  const double v = std::strtod(s.c_str(), &end);
  if (end != s.c_str() + s.size()) {
    return absl::InvalidArgumentError(
        absl::StrCat("number ", QuoteForMessage(s), " cannot be read"));
  }
  if (std::isinf(v)) {
    return absl::InvalidArgumentError(absl::StrCat(
        "number ", QuoteForMessage(s), " is out of the range of a double"));
  }
  return v;
}

// YAML 1.2 core schema resolution of a plain (unquoted) scalar; an error
// message (without position) for numbers no double or int64 holds.
absl::StatusOr<Json> ResolvePlainScalar(const std::string& s) {
  if (IsYamlNull(s)) return Json(nullptr);
  if (s == "true" || s == "True" || s == "TRUE") return Json(true);
  if (s == "false" || s == "False" || s == "FALSE") return Json(false);
  absl::string_view unsigned_part = s;
  if (!unsigned_part.empty() &&
      (unsigned_part[0] == '-' || unsigned_part[0] == '+')) {
    unsigned_part.remove_prefix(1);
  }
  if (AllDigits(unsigned_part, 10)) {
    const char* begin = s.data() + (s[0] == '+' ? 1 : 0);
    int64_t v = 0;
    auto [ptr, ec] = std::from_chars(begin, s.data() + s.size(), v);
    if (ec == std::errc() && ptr == s.data() + s.size()) return Json(v);
    // Out of int64 range: keep the magnitude, as JSON readers do.
    ARACHNE_IO_ASSIGN_OR_RETURN(double d, ParseYamlDouble(s));
    return Json(d);
  }
  if (s.size() > 2 && s[0] == '0' && (s[1] == 'x' || s[1] == 'o') &&
      AllDigits(absl::string_view(s).substr(2), s[1] == 'x' ? 16 : 8)) {
    int64_t v = 0;
    const int base = s[1] == 'x' ? 16 : 8;
    auto [ptr, ec] =
        std::from_chars(s.data() + 2, s.data() + s.size(), v, base);
    if (ec == std::errc() && ptr == s.data() + s.size()) return Json(v);
    return absl::InvalidArgumentError(absl::StrCat(
        "integer ", QuoteForMessage(s), " is out of the range of int64"));
  }
  if (IsYamlFloat(s)) {
    ARACHNE_IO_ASSIGN_OR_RETURN(double d, ParseYamlDouble(s));
    return Json(d);
  }
  if (s == ".inf" || s == ".Inf" || s == ".INF" || s == "+.inf" ||
      s == "+.Inf" || s == "+.INF") {
    return Json(HUGE_VAL);
  }
  if (s == "-.inf" || s == "-.Inf" || s == "-.INF") return Json(-HUGE_VAL);
  if (s == ".nan" || s == ".NaN" || s == ".NAN") return Json(std::nan(""));
  return Json(s);
}

// Thrown by YamlTreeBuilder to stop yaml-cpp's parser at the first problem
// (its event interface cannot return one); caught in ParseYaml.
struct StopYaml {};

// yaml-cpp's event interface, building the tree directly under the limits
// of json_yaml.h. Going through events rather than YAML::Load lets aliases
// be counted as they expand and nesting be bounded before a node exists.
class YamlTreeBuilder : public YAML::EventHandler {
 public:
  void OnDocumentStart(const YAML::Mark& mark) override {
    if (++documents_ > 1) {
      Fail(mark, "holds more than one YAML document (one is expected)");
    }
  }
  void OnDocumentEnd() override {}

  void OnNull(const YAML::Mark& mark, YAML::anchor_t anchor) override {
    Add(mark, Json(nullptr), anchor);
  }

  void OnAlias(const YAML::Mark& mark, YAML::anchor_t anchor) override {
    auto it = anchors_.find(anchor);
    if (it == anchors_.end()) {
      Fail(mark, "alias refers to a node that contains it");
    }
    const Anchored& a = it->second;
    if (Depth() + a.depth > kMaxNestingDepth) {
      Fail(mark, absl::StrCat("alias nests deeper than the limit of ",
                              kMaxNestingDepth, " levels"));
    }
    if (std::string e = budget_.AddAliasValues(a.values); !e.empty()) {
      Fail(mark, e);
    }
    if (ExpectingKey()) {
      if (!a.value.is_string())
        Fail(mark, "mapping keys must be plain strings");
      SetKey(mark, a.value.get<std::string>());
      return;
    }
    Place(a.value);
  }

  void OnScalar(const YAML::Mark& mark, const std::string& tag,
                YAML::anchor_t anchor, const std::string& value) override {
    if (std::string e = CheckText(value, ExpectingKey() ? "a key" : "a string");
        !e.empty()) {
      Fail(mark, e);
    }
    if (ExpectingKey()) {
      CountValue(mark);
      if (anchor != YAML::NullAnchor) {
        anchors_[anchor] = Anchored{Json(value), 1, 0};
      }
      SetKey(mark, value);
      return;
    }
    absl::StatusOr<Json> v = ScalarValue(tag, value);
    if (!v.ok()) Fail(mark, v.status().message());
    Add(mark, *std::move(v), anchor);
  }

  void OnSequenceStart(const YAML::Mark& mark, const std::string&,
                       YAML::anchor_t anchor,
                       YAML::EmitterStyle::value) override {
    Open(mark, Json::array(), anchor);
  }
  void OnSequenceEnd() override { Close(); }
  void OnMapStart(const YAML::Mark& mark, const std::string&,
                  YAML::anchor_t anchor, YAML::EmitterStyle::value) override {
    Open(mark, Json::object(), anchor);
  }
  void OnMapEnd() override { Close(); }

  Json TakeRoot() { return std::move(root_); }
  const absl::Status& error() const { return error_; }
  void SetSource(absl::string_view source) { source_ = std::string(source); }

 private:
  struct Anchored {
    Json value;
    int64_t values = 0;  // values in `value`
    int depth = 0;       // levels of `value` (1 for a scalar)
  };
  struct OpenNode {
    Json* container;
    YAML::anchor_t anchor;
    int64_t values_before;  // budget count when it opened
    int depth;              // levels below it so far
    bool has_key = false;   // a mapping's key read, value pending
    std::string key;
  };

  [[noreturn]] void Fail(const YAML::Mark& mark, absl::string_view message) {
    error_ = absl::InvalidArgumentError(
        mark.is_null() ? absl::StrCat(source_, ": ", message)
                       : absl::StrCat(source_, ":", mark.line + 1, ":",
                                      mark.column + 1, ": ", message));
    throw StopYaml{};
  }

  int Depth() const { return static_cast<int>(open_.size()); }
  bool ExpectingKey() const {
    return !open_.empty() && open_.back().container->is_object() &&
           !open_.back().has_key;
  }

  void CountValue(const YAML::Mark& mark) {
    if (std::string e = budget_.AddValue(Depth() + 1); !e.empty()) {
      Fail(mark, e);
    }
  }

  void SetKey(const YAML::Mark& mark, std::string key) {
    OpenNode& top = open_.back();
    if (top.container->contains(key)) {
      Fail(mark, absl::StrCat("duplicate key ", QuoteForMessage(key)));
    }
    top.has_key = true;
    top.key = std::move(key);
  }

  absl::StatusOr<Json> ScalarValue(const std::string& tag,
                                   const std::string& s) {
    if (tag == "?") return ResolvePlainScalar(s);
    // "!" is yaml-cpp's tag for quoted scalars: always strings, so "1.0"
    // stays a version string and "no" a word.
    if (tag == "!" || tag == "tag:yaml.org,2002:str") return Json(s);
    absl::StatusOr<Json> v = ResolvePlainScalar(s);
    if (!v.ok()) return v;
    if ((tag == "tag:yaml.org,2002:int" && v->is_number_integer()) ||
        (tag == "tag:yaml.org,2002:float" && v->is_number()) ||
        (tag == "tag:yaml.org,2002:bool" && v->is_boolean()) ||
        (tag == "tag:yaml.org,2002:null" && v->is_null())) {
      if (tag == "tag:yaml.org,2002:float") return Json(v->get<double>());
      return v;
    }
    return absl::InvalidArgumentError(
        absl::StrCat("unsupported tag or value ",
                     QuoteForMessage(absl::StrCat(tag, " ", s))));
  }

  // Puts a finished value where it belongs; returns its address.
  Json* Place(Json v) {
    if (open_.empty()) {
      root_ = std::move(v);
      return &root_;
    }
    OpenNode& top = open_.back();
    if (top.container->is_array()) {
      top.container->push_back(std::move(v));
      return &top.container->back();
    }
    Json& slot = (*top.container)[top.key];
    slot = std::move(v);
    top.has_key = false;
    return &slot;
  }

  void Add(const YAML::Mark& mark, Json v, YAML::anchor_t anchor) {
    if (ExpectingKey()) Fail(mark, "mapping keys must be plain strings");
    CountValue(mark);
    if (anchor != YAML::NullAnchor) anchors_[anchor] = Anchored{v, 1, 1};
    Place(std::move(v));
    NoteDepth(1);
  }

  void Open(const YAML::Mark& mark, Json container, YAML::anchor_t anchor) {
    if (ExpectingKey()) Fail(mark, "mapping keys must be plain strings");
    CountValue(mark);
    // An alias inside this node to this node's own anchor finds it absent.
    anchors_.erase(anchor);
    Json* placed = Place(std::move(container));
    // Place() consumed the parent's key; the container keeps its slot.
    open_.push_back(
        OpenNode{placed, anchor, budget_.values() - 1, 0, false, ""});
  }

  void Close() {
    OpenNode done = std::move(open_.back());
    open_.pop_back();
    if (done.anchor != YAML::NullAnchor) {
      anchors_[done.anchor] =
          Anchored{*done.container, budget_.values() - done.values_before,
                   done.depth + 1};
    }
    NoteDepth(done.depth + 1);
  }

  // A finished value `levels` deep sits under the innermost open node.
  void NoteDepth(int levels) {
    if (!open_.empty()) {
      open_.back().depth = std::max(open_.back().depth, levels);
    }
  }

  std::string source_;
  Json root_;
  std::vector<OpenNode> open_;
  absl::flat_hash_map<YAML::anchor_t, Anchored> anchors_;
  TreeBudget budget_;
  absl::Status error_;
  int documents_ = 0;
};

absl::Status YamlError(absl::string_view source, const YAML::Mark& mark,
                       absl::string_view message) {
  if (mark.is_null()) {
    return absl::InvalidArgumentError(
        absl::StrCat(source, ": invalid YAML: ", message));
  }
  return absl::InvalidArgumentError(absl::StrCat(
      source, ":", mark.line + 1, ":", mark.column + 1, ": ", message));
}

absl::StatusOr<Json> ParseYaml(absl::string_view text,
                               absl::string_view source) {
  YamlTreeBuilder builder;
  builder.SetSource(source);
  try {
    std::istringstream in{std::string(text)};
    YAML::Parser parser(in);
    // The first document, then whether another follows (an error).
    if (parser.HandleNextDocument(builder)) parser.HandleNextDocument(builder);
  } catch (const StopYaml&) {
    return builder.error();
  } catch (const YAML::Exception& e) {
    return YamlError(source, e.mark, absl::StrCat("invalid YAML: ", e.msg));
  } catch (const std::exception& e) {
    // yaml-cpp may throw the standard library's errors on odd input; they
    // are bad input, never a crash.
    return absl::InvalidArgumentError(
        absl::StrCat(source, ": invalid YAML: ", e.what()));
  }
  return builder.TakeRoot();
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

absl::Status CheckInputSize(absl::string_view text, absl::string_view source) {
  if (static_cast<int64_t>(text.size()) > kMaxInputBytes) {
    return absl::InvalidArgumentError(absl::StrCat(
        source, ": ", SizeLimitMessage("input", text.size(), kMaxInputBytes)));
  }
  return absl::OkStatus();
}

}  // namespace

absl::StatusOr<nlohmann::json> ParseJsonOrYaml(absl::string_view text,
                                               absl::string_view source_name) {
  ARACHNE_IO_RETURN_IF_ERROR(CheckInputSize(text, source_name));
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

absl::StatusOr<nlohmann::json> ParseJsonText(absl::string_view text,
                                             absl::string_view source_name) {
  ARACHNE_IO_RETURN_IF_ERROR(CheckInputSize(text, source_name));
  return ParseJson(text, source_name);
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

std::string AbbreviateQuoted(absl::string_view message,
                             absl::string_view value) {
  if (value.size() <= static_cast<size_t>(kMaxQuotedBytes)) {
    return std::string(message);
  }
  const std::string quoted = absl::StrCat("\"", value, "\"");
  const size_t at = message.find(quoted);
  if (at == absl::string_view::npos) return std::string(message);
  return absl::StrCat(message.substr(0, at), QuoteForMessage(value),
                      message.substr(at + quoted.size()));
}

namespace {

// Appends a rendering of `value` to `out`, giving up ("...") once `out`
// passes `budget` characters or `depth` levels: messages stay one line and
// the recursion stays shallow whatever the tree.
void AppendValue(const Json& value, int depth, size_t budget,
                 std::string* out) {
  if (out->size() > budget) return;
  switch (value.type()) {
    case Json::value_t::string:
      out->append(QuoteForMessage(value.get_ref<const std::string&>()));
      return;
    case Json::value_t::number_float: {
      const double d = value.get<double>();
      // Only YAML can spell these; JSON's dump would say null.
      if (std::isnan(d)) {
        out->append(".nan");
      } else if (std::isinf(d)) {
        out->append(d > 0 ? ".inf" : "-.inf");
      } else {
        out->append(value.dump());
      }
      return;
    }
    case Json::value_t::array:
    case Json::value_t::object: {
      const bool array = value.is_array();
      out->push_back(array ? '[' : '{');
      if (depth >= 4 && !value.empty()) {
        out->append("...");
      } else {
        bool first = true;
        for (auto it = value.begin(); it != value.end(); ++it) {
          if (out->size() > budget) {
            out->append("...");
            break;
          }
          if (!first) out->push_back(',');
          first = false;
          if (!array) {
            out->append(QuoteForMessage(it.key()));
            out->push_back(':');
          }
          AppendValue(*it, depth + 1, budget, out);
        }
      }
      out->push_back(array ? ']' : '}');
      return;
    }
    default:
      // null, booleans and integers: short by nature.
      out->append(value.dump());
      return;
  }
}

}  // namespace

std::string DescribeJsonValue(const nlohmann::json& value) {
  if (value.is_string()) {
    return QuoteForMessage(value.get_ref<const std::string&>());
  }
  std::string s;
  AppendValue(value, 0, 60, &s);
  if (s.size() > 60) {
    // Cut on a character boundary, so the message stays UTF-8.
    size_t cut = 57;
    while (cut > 0 && (static_cast<unsigned char>(s[cut]) & 0xC0) == 0x80) {
      --cut;
    }
    s = absl::StrCat(s.substr(0, cut), "...");
  }
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
      return FieldError(
          source_, path_,
          absl::StrCat("unknown field ", QuoteForMessage(key),
                       " (allowed: ", absl::StrJoin(allowed, ", "), ")"));
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
