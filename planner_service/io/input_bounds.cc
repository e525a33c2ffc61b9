#include "planner_service/io/input_bounds.h"

#include <cmath>
#include <map>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "google/protobuf/descriptor.h"
#include "google/protobuf/message.h"
#include "google/protobuf/unknown_field_set.h"
#include "planner_service/io/json_yaml.h"

namespace arachne {
namespace {

bool IsAsciiAlnum(unsigned char c) {
  return (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') ||
         (c >= '0' && c <= '9');
}

// Nested messages a request may have before the walk below stops looking
// (protobuf's own parser stops at 100).
constexpr int kMaxWalkDepth = 64;

// The first string field in `bytes` (the wire form of a `type` message)
// that is not UTF-8, as CheckUtf8's error naming it by its path; OK when
// there is none or the bytes are not even wire format (the parser says so).
absl::Status FirstNonUtf8Field(absl::string_view bytes,
                               const google::protobuf::Descriptor& type,
                               const std::string& path, int depth) {
  google::protobuf::UnknownFieldSet fields;
  if (depth > kMaxWalkDepth ||
      !fields.ParseFromArray(bytes.data(), static_cast<int>(bytes.size()))) {
    return absl::OkStatus();
  }
  std::map<int, int> seen;  // field number -> elements of it so far
  for (int i = 0; i < fields.field_count(); ++i) {
    const google::protobuf::UnknownField& f = fields.field(i);
    const google::protobuf::FieldDescriptor* fd =
        type.FindFieldByNumber(f.number());
    if (fd == nullptr ||
        f.type() != google::protobuf::UnknownField::TYPE_LENGTH_DELIMITED) {
      continue;
    }
    std::string name = fd->name();
    if (fd->is_repeated()) {
      name = absl::StrCat(name, "[", seen[f.number()]++, "]");
    }
    if (!path.empty()) name = absl::StrCat(path, ".", name);
    if (fd->type() == google::protobuf::FieldDescriptor::TYPE_STRING) {
      if (absl::Status s = CheckUtf8(name, f.length_delimited()); !s.ok()) {
        return s;
      }
    } else if (fd->type() == google::protobuf::FieldDescriptor::TYPE_MESSAGE) {
      if (absl::Status s = FirstNonUtf8Field(
              f.length_delimited(), *fd->message_type(), name, depth + 1);
          !s.ok()) {
        return s;
      }
    }
  }
  return absl::OkStatus();
}

}  // namespace

absl::Status CheckIncarnation(absl::string_view incarnation) {
  const std::string rule = absl::StrCat(
      "incarnation: must be 1 to ", kMaxIncarnationBytes,
      " bytes of ASCII letters, digits, '-' and '_', got ",
      QuoteForMessage(incarnation));
  if (incarnation.empty() || incarnation.size() > kMaxIncarnationBytes) {
    return absl::InvalidArgumentError(rule);
  }
  for (size_t i = 0; i < incarnation.size(); ++i) {
    const unsigned char c = incarnation[i];
    if (!IsAsciiAlnum(c) && c != '-' && c != '_') {
      return absl::InvalidArgumentError(absl::StrCat(
          rule, absl::StrFormat(" (byte 0x%02X", c), " at offset ", i, ")"));
    }
  }
  return absl::OkStatus();
}

absl::Status CheckNodeName(absl::string_view field, absl::string_view name) {
  if (name.empty()) {
    return absl::InvalidArgumentError(
        absl::StrCat(field, ": must be a node name, got \"\""));
  }
  if (name.size() > static_cast<size_t>(kMaxNodeNameBytes)) {
    return absl::InvalidArgumentError(
        absl::StrCat(field, ": must be a node name of at most ",
                     kMaxNodeNameBytes, " bytes, got ", QuoteForMessage(name)));
  }
  for (size_t i = 0; i < name.size(); ++i) {
    const unsigned char c = name[i];
    if (!IsAsciiAlnum(c) && c != '-' && c != '_' && c != '.') {
      return absl::InvalidArgumentError(absl::StrCat(
          field,
          ": must be a node name of ASCII letters, digits, '-', '_' and '.', "
          "got ",
          QuoteForMessage(name), absl::StrFormat(" (byte 0x%02X", c),
          " at offset ", i, ")"));
    }
  }
  size_t start = 0;
  while (start <= name.size()) {
    size_t end = name.find('.', start);
    if (end == absl::string_view::npos) end = name.size();
    const absl::string_view label = name.substr(start, end - start);
    if (label.empty() ||
        label.size() > static_cast<size_t>(kMaxNodeLabelBytes) ||
        !IsAsciiAlnum(label.front()) || !IsAsciiAlnum(label.back())) {
      return absl::InvalidArgumentError(absl::StrCat(
          field, ": must be a node name of '.'-separated labels of 1 to ",
          kMaxNodeLabelBytes,
          " characters, each starting and ending with a letter or digit, "
          "got ",
          QuoteForMessage(name)));
    }
    start = end + 1;
  }
  return absl::OkStatus();
}

absl::Status CheckUtf8(absl::string_view field, absl::string_view text) {
  const size_t bad = FirstInvalidUtf8(text);
  if (bad == absl::string_view::npos) return absl::OkStatus();
  return absl::InvalidArgumentError(absl::StrCat(
      field, ": must be UTF-8 text, got ",
      absl::StrFormat("byte 0x%02X", static_cast<unsigned char>(text[bad])),
      " at offset ", bad, " of ", text.size(), " bytes"));
}

std::string TruncateText(absl::string_view text, size_t max_bytes) {
  if (text.size() <= max_bytes) return std::string(text);
  const std::string marker =
      absl::StrCat(" [truncated: ", text.size(), " bytes in all]");
  size_t keep = max_bytes > marker.size() ? max_bytes - marker.size() : 0;
  // Back to the start of a character, so the cut leaves UTF-8 intact.
  while (keep > 0 && (static_cast<unsigned char>(text[keep]) & 0xC0) == 0x80) {
    --keep;
  }
  return absl::StrCat(text.substr(0, keep), marker);
}

absl::Status CheckSeconds(absl::string_view field, double seconds,
                          double max_seconds) {
  if (std::isfinite(seconds) && seconds > 0 && seconds <= max_seconds) {
    return absl::OkStatus();
  }
  return absl::InvalidArgumentError(absl::StrCat(
      field, ": must be seconds in (0, ", max_seconds, "], got ", seconds));
}

absl::Status ParseMessageBytes(absl::string_view bytes,
                               google::protobuf::Message* message) {
  // Before protobuf's parser, which logs an error for every such field.
  if (absl::Status s =
          FirstNonUtf8Field(bytes, *message->GetDescriptor(), "", 0);
      !s.ok()) {
    return s;
  }
  if (!message->ParseFromArray(bytes.data(), static_cast<int>(bytes.size()))) {
    return absl::InvalidArgumentError(
        absl::StrCat("request: not a valid ", message->GetTypeName(),
                     " (truncated or garbled bytes)"));
  }
  return absl::OkStatus();
}

}  // namespace arachne
