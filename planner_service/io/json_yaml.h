// Reading JSON and YAML input files into one tree type (nlohmann::json), and
// strict, typed field readers that every file parser in planner_service/io
// uses, so that all formats report errors the same way:
//
//   "<source>: <field path>: <what is wrong>, got <value>"
//   e.g. "cluster.yaml: node_groups[1].count: must be an integer > 0, got -2"
//
// Unknown fields are errors, never silently ignored: a typo such as "gpu_typ"
// would otherwise fall back to a default and plan for the wrong cluster.
#ifndef ARACHNE_PLANNER_SERVICE_IO_JSON_YAML_H_
#define ARACHNE_PLANNER_SERVICE_IO_JSON_YAML_H_

#include <cstdint>
#include <initializer_list>
#include <limits>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "nlohmann/json.hpp"
#include "planner_service/core/text/quote.h"
#include "planner_service/core/text/utf8.h"

// Status plumbing for the io parsers (Abseil ships no such macros). Prefixed
// so they cannot clash with macros core may define.
#define ARACHNE_IO_CONCAT_INNER(a, b) a##b
#define ARACHNE_IO_CONCAT(a, b) ARACHNE_IO_CONCAT_INNER(a, b)
#define ARACHNE_IO_RETURN_IF_ERROR(expr)                  \
  do {                                                    \
    if (absl::Status _st = (expr); !_st.ok()) return _st; \
  } while (0)
#define ARACHNE_IO_ASSIGN_OR_RETURN_IMPL(tmp, lhs, expr) \
  auto tmp = (expr);                                     \
  if (!tmp.ok()) return tmp.status();                    \
  lhs = std::move(*tmp)
#define ARACHNE_IO_ASSIGN_OR_RETURN(lhs, expr) \
  ARACHNE_IO_ASSIGN_OR_RETURN_IMPL(            \
      ARACHNE_IO_CONCAT(_arachne_io_or_, __LINE__), lhs, expr)

namespace arachne {

// Input limits of every reader here (docs/formats.md, "Input limits"). They
// sit far above what any real cluster, plan, catalog, config.json or
// scenario holds, and far below what would exhaust memory or the stack:
// each breach is InvalidArgument naming the source and what went over.
//
// Bytes of one input text or file; a longer file (or an endless one such as
// /dev/zero) is refused after reading this much.
inline constexpr int64_t kMaxInputBytes = int64_t{16} << 20;  // 16 MiB
// Levels of nested lists and mappings; the deepest shipped file has 6.
// Trees deeper than this are where recursive code (dump, protobuf's parser,
// the schema check) would overflow the stack.
inline constexpr int kMaxNestingDepth = 64;
// Values (scalars, lists and mappings) in one tree, YAML aliases expanded.
inline constexpr int64_t kMaxInputValues = 1'000'000;
// Values that YAML aliases copy in one text: a 500-byte "billion laughs"
// file would otherwise expand to gigabytes.
inline constexpr int64_t kMaxAliasValues = 100'000;
// Bytes of one string or mapping key.
inline constexpr int64_t kMaxStringBytes = int64_t{1} << 20;  // 1 MiB

// `message` (from code that quotes `value` whole, such as core's "unknown
// GPU type \"<value>\"") with that quote abbreviated as QuoteForMessage
// does; unchanged when `value` is short or not quoted in it.
std::string AbbreviateQuoted(absl::string_view message,
                             absl::string_view value);

// QuoteForMessage and kMaxQuotedBytes, the length it abbreviates at, are in
// planner_service/core/text/quote.h: the core's messages quote alike.
// FirstInvalidUtf8 is in planner_service/core/text/utf8.h: nlohmann's dump
// throws on strings that are not UTF-8, so none may enter a tree.

// Parses `text` as JSON when it starts with '{' or '[' (after whitespace) and
// is valid JSON; otherwise as YAML (unless `source_name` ends in ".json",
// which must be valid JSON), converted to the same tree: plain scalars
// follow the YAML 1.2 core schema (ints stay integers, floats doubles,
// true/false bools, null/~/empty null), quoted scalars are always strings.
// Duplicate keys are rejected. Errors are InvalidArgument
// "<source_name>:<line>:<column>: <parser message>" (1-based).
// Within the limits above; a breach is InvalidArgument "<source_name>:
// ..." naming the limit (and the field path or line where it was crossed).
// Strings and keys must be valid UTF-8; a number beyond a double's range
// (1e999) is an error with its line and column, never infinity.
absl::StatusOr<nlohmann::json> ParseJsonOrYaml(absl::string_view text,
                                               absl::string_view source_name);

// JSON only (no YAML fallback), with the checks and limits above: for text
// that must be JSON whatever it is called, such as a request's
// `hf_config_json`. Errors "<source_name>:<line>:<column>: invalid JSON: ...".
absl::StatusOr<nlohmann::json> ParseJsonText(absl::string_view text,
                                             absl::string_view source_name);

// "a" + "b" -> "a.b"; "" + "b" -> "b".
std::string JoinFieldPath(absl::string_view path, absl::string_view key);
// "a" + 3 -> "a[3]".
std::string IndexFieldPath(absl::string_view path, int index);

// InvalidArgument "<source>: <path>: <message>" ("<source>: <message>" when
// `path` is empty).
absl::Status FieldError(absl::string_view source, absl::string_view path,
                        absl::string_view message);

// Compact rendering of a value for "got ..." parts of messages: strings in
// quotes (long ones abbreviated as QuoteForMessage does), containers
// abbreviated to keep messages one line, YAML's non-finite floats as .inf,
// -.inf and .nan. Never recursive beyond a few levels, so safe on a tree of
// any depth.
std::string DescribeJsonValue(const nlohmann::json& value);

// Reads the fields of one JSON object with precise errors. Cheap to copy: it
// points into the tree, which must outlive it.
class ObjectReader {
 public:
  // InvalidArgument "<source>: <path>: must be a mapping (object), got ..."
  // when `value` is not an object.
  static absl::StatusOr<ObjectReader> Create(const nlohmann::json& value,
                                             absl::string_view source,
                                             absl::string_view path);

  // InvalidArgument on the first field not in `allowed`:
  // "<source>: <path>: unknown field \"gpu_typ\" (allowed: a, b, c)".
  absl::Status AllowOnly(
      std::initializer_list<absl::string_view> allowed) const;

  // Present and not null (a YAML "key:" with no value counts as absent).
  bool Has(absl::string_view key) const;
  // The value, or nullptr when absent or null.
  const nlohmann::json* Find(absl::string_view key) const;

  // Full path of a field, e.g. "node_groups[1].count".
  std::string PathOf(absl::string_view key) const;
  // InvalidArgument "<source>: <path>.<key>: <message>".
  absl::Status Error(absl::string_view key, absl::string_view message) const;
  // InvalidArgument "<source>: <path>: missing required field \"<key>\"".
  absl::Status MissingError(absl::string_view key) const;

  // Required fields: MissingError when absent, a type/range error naming the
  // field and the value otherwise.
  // Non-empty string.
  absl::StatusOr<std::string> String(absl::string_view key) const;
  // Integer (not a float) in [min, max]; "must be an integer > 0, got -2".
  absl::StatusOr<int> Int(absl::string_view key,
                          int min = std::numeric_limits<int>::min(),
                          int max = std::numeric_limits<int>::max()) const;
  absl::StatusOr<int64_t> Int64(
      absl::string_view key,
      int64_t min = std::numeric_limits<int64_t>::min()) const;
  // Finite number (integer or float) > min (or >= min when !exclusive).
  absl::StatusOr<double> Number(absl::string_view key, double min,
                                bool exclusive) const;
  absl::StatusOr<bool> Bool(absl::string_view key) const;
  // The sub-object, as a reader with the extended path.
  absl::StatusOr<ObjectReader> Object(absl::string_view key) const;
  // The array (may be empty).
  absl::StatusOr<const nlohmann::json*> Array(absl::string_view key) const;

  // Optional fields: `fallback` when absent or null, else as above.
  absl::StatusOr<std::string> StringOr(absl::string_view key,
                                       std::string fallback) const;
  absl::StatusOr<int> IntOr(absl::string_view key, int fallback,
                            int min = std::numeric_limits<int>::min(),
                            int max = std::numeric_limits<int>::max()) const;
  absl::StatusOr<double> NumberOr(absl::string_view key, double fallback,
                                  double min, bool exclusive) const;
  absl::StatusOr<bool> BoolOr(absl::string_view key, bool fallback) const;
  // List of non-empty strings; empty when absent.
  absl::StatusOr<std::vector<std::string>> StringListOr(
      absl::string_view key) const;
  // Array, or an empty array when absent.
  absl::StatusOr<const nlohmann::json*> ArrayOr(absl::string_view key) const;

  const nlohmann::json& value() const { return *value_; }
  const std::string& source() const { return source_; }
  const std::string& path() const { return path_; }

 private:
  ObjectReader(const nlohmann::json* value, std::string source,
               std::string path)
      : value_(value), source_(std::move(source)), path_(std::move(path)) {}

  const nlohmann::json* value_;
  std::string source_;
  std::string path_;
};

}  // namespace arachne

#endif  // ARACHNE_PLANNER_SERVICE_IO_JSON_YAML_H_
