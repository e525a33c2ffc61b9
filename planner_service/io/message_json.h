// Reading and writing arachne.v1 messages as JSON or YAML files: the
// protobuf JSON mapping, made strict and precise.
//
// Text is parsed by ParseJsonOrYaml into one tree, checked against the
// message's descriptor, then handed to protobuf's own JSON parser
// (JsonStringToMessage). The check is what gives file errors the shape of
// every other io error, "<source>: <field.path>: <what>, got <value>":
// protobuf's parser stops at the first problem with a message that names
// neither the path nor (for some errors) the field. The check also makes
// YAML fit the mapping: an unquoted `gpu: 3090` is an integer in YAML but a
// string field in the schema, and is read as "3090".
//
// What the check enforces, from the descriptor alone:
//   * unknown fields are errors listing the allowed names (a typo such as
//     `gpu_typ` must not fall back to a default);
//   * each value has its field's type: objects for messages, lists for
//     repeated fields, integers (numbers, or decimal strings as the mapping
//     allows) within the field's range, numbers, booleans, enum names;
//   * fields marked `[(arachne.v1.required) = true]` (options.proto) must
//     be present;
//   * null (a YAML `key:` with no value) means absent.
// Semantic checks (positive counts, known GPU types, ...) belong to the
// converters that turn a message into planner types.
#ifndef ARACHNE_PLANNER_SERVICE_IO_MESSAGE_JSON_H_
#define ARACHNE_PLANNER_SERVICE_IO_MESSAGE_JSON_H_

#include <cstdint>
#include <string>

#include "absl/status/status.h"
#include "absl/strings/string_view.h"
#include "google/protobuf/message.h"
#include "nlohmann/json.hpp"

namespace arachne {

// Parses YAML or JSON `text` into `message` (cleared first). Errors are
// InvalidArgument "<source>: <field.path>: <what>, got <value>", or
// "<source>:<line>:<column>: ..." for text that is neither JSON nor YAML.
absl::Status ParseMessageText(absl::string_view text, absl::string_view source,
                              google::protobuf::Message* message);

// The same for a tree already parsed; `path` prefixes the field paths of
// errors (e.g. "cluster" gives "cluster.nodes[2].gpus"). With an empty
// `source` errors read "<path>: ...".
absl::Status MessageFromJson(const nlohmann::json& json,
                             absl::string_view source, absl::string_view path,
                             google::protobuf::Message* message);

// The message as a tree, by the protobuf JSON mapping with the proto field
// names (snake_case) and every scalar field written, including zeros (an
// `optional` field only when set). 64-bit integers come out as strings, as
// the mapping prescribes; MessageFromJson reads them back either way.
nlohmann::json MessageToJson(const google::protobuf::Message& message);

// Errors of the converters from a message to planner types, for a message
// read from `source` at `path`: "<source>: <path>.<field>: <message>", or
// with an empty source (a request field of the service)
// "<path>.<field>: <message>". All InvalidArgument.
class MessageErrors {
 public:
  MessageErrors(absl::string_view source, absl::string_view path)
      : source_(source), path_(path) {}

  // The errors of a sub-message: "templates[0]" under "plan" is
  // "plan.templates[0]".
  MessageErrors Under(absl::string_view field) const;

  absl::Status At(absl::string_view field, absl::string_view message) const;

  // OkStatus when value >= min, else "must be an integer > 0, got -2"
  // (">= min" spelled as the usual bound).
  absl::Status IntAtLeast(absl::string_view field, int64_t value,
                          int64_t min) const;
  // As IntAtLeast, and "must be an integer <= 64, got 100" above `max`.
  absl::Status IntInRange(absl::string_view field, int64_t value, int64_t min,
                          int64_t max) const;

  const std::string& source() const { return source_; }
  const std::string& path() const { return path_; }

 private:
  std::string source_;
  std::string path_;
};

}  // namespace arachne

#endif  // ARACHNE_PLANNER_SERVICE_IO_MESSAGE_JSON_H_
