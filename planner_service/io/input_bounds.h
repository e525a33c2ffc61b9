// Bounds on what callers send to Arachne's live services (the controller's
// RPCs, the agent's --node), in one place so that every entry point applies
// the same rule: the node-name rule, UTF-8 text that names its field when it
// is not, free text cut to a stated length with a marker, seconds with a
// maximum, and a request's bytes parsed with the field that is not UTF-8
// named. docs/errors.md, "Input bounds", states each bound.
//
// Every error is InvalidArgument "<field>: <what is wrong>, got <value>",
// the value quoted by QuoteForMessage (json_yaml.h): at most its first
// kMaxQuotedBytes bytes and its size, so a 10 KB value never comes back
// whole (gRPC carries the message in a header of limited size).
#ifndef ARACHNE_PLANNER_SERVICE_IO_INPUT_BOUNDS_H_
#define ARACHNE_PLANNER_SERVICE_IO_INPUT_BOUNDS_H_

#include <cstddef>
#include <string>

#include "absl/status/status.h"
#include "absl/strings/string_view.h"

namespace google::protobuf {
class Message;
}  // namespace google::protobuf

namespace arachne {

// The node-name rule (a DNS name as RFC 1123 and Kubernetes node names have
// it, with upper case and '_' allowed too): 1 to kMaxNodeNameBytes bytes,
// '.'-separated labels of 1 to kMaxNodeLabelBytes characters each, a label
// made of ASCII letters, digits, '-' and '_' and starting and ending with a
// letter or digit. So no '/', no "..", no NUL, no space, nothing but ASCII.
// Cluster files (cluster_io.h) hold names of at most kMaxNodeNameBytes too.
inline constexpr int kMaxNodeNameBytes = 253;
inline constexpr int kMaxNodeLabelBytes = 63;

// OK when `name` follows the node-name rule, else InvalidArgument naming
// `field` and what is wrong:
//   "<field>: must be a node name, got \"\""
//   "<field>: must be a node name of at most 253 bytes, got \"nnn...\" (10240 bytes)"
//   "<field>: must be a node name of ASCII letters, digits, '-', '_' and '.',
//    got \"a/b\" (byte 0x2F at offset 1)"
//   "<field>: must be a node name of '.'-separated labels of 1 to 63
//    characters, each starting and ending with a letter or digit, got \"..\""
absl::Status CheckNodeName(absl::string_view field, absl::string_view name);

// An agent process's incarnation (controller.proto RegisterRequest): 1 to
// kMaxIncarnationBytes bytes of ASCII letters, digits, '-' and '_'.
inline constexpr size_t kMaxIncarnationBytes = 64;
// OK when `incarnation` follows that rule, else InvalidArgument
//   "incarnation: must be 1 to 64 bytes of ASCII letters, digits, '-' and
//    '_', got \"a b\" (byte 0x20 at offset 1)"
absl::Status CheckIncarnation(absl::string_view incarnation);

// OK when `text` is well-formed UTF-8, else InvalidArgument
// "<field>: must be UTF-8 text, got byte 0xFF at offset 3 of 5 bytes".
absl::Status CheckUtf8(absl::string_view field, absl::string_view text);

// Free text a caller sends (RequestReplan's reason): longer is cut.
inline constexpr size_t kMaxReasonBytes = 1024;
// Text the controller records and reports (a decision's trigger and reason,
// an event's message, the status error): longer is cut.
inline constexpr size_t kMaxRecordTextBytes = 16384;

// `text` when it has at most `max_bytes` bytes; else its longest prefix
// that ends on a UTF-8 character boundary followed by the marker
// " [truncated: <N> bytes in all]", the whole at most `max_bytes` bytes.
// `max_bytes` must leave room for the marker (>= 64).
std::string TruncateText(absl::string_view text, size_t max_bytes);

// OK when `seconds` is in (0, max_seconds], else InvalidArgument
// "<field>: must be seconds in (0, <max_seconds>], got <seconds>" (NaN and
// infinities included).
absl::Status CheckSeconds(absl::string_view field, double seconds,
                          double max_seconds);

// Parses `bytes` (a request off the wire) into `message`. A string field
// (at any depth) that is not UTF-8 is InvalidArgument naming it, e.g.
// "nodes[1]: must be UTF-8 text, got byte 0xFF at offset 0 of 1 bytes";
// other bytes that do not parse are InvalidArgument "request: not a valid
// <type> (truncated or garbled bytes)". Proto3 strings must be UTF-8, so
// protobuf's own parser refuses such a request without saying where (gRPC
// answers that INTERNAL with an empty message); this names the field.
absl::Status ParseMessageBytes(absl::string_view bytes,
                               google::protobuf::Message* message);

}  // namespace arachne

#endif  // ARACHNE_PLANNER_SERVICE_IO_INPUT_BOUNDS_H_
