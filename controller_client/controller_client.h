// A client of a running `arachne-controller` (arachne.v1.Controller,
// proto/arachne/v1/controller.proto), for the users' tools: `arachne
// status`, `arachne watch`, `arachne drain`, `arachne replan`.
//
// Callers include no gRPC header: the gRPC implementation lives in
// controller_client.cc behind MakeGrpcControllerClient. Unlike the planner
// client, answers are the schema's own messages (GetStatusResponse, Event):
// they are plain data (libprotobuf only, the library the CLI already links
// to read files), the controller has no project-type equivalent of them, and
// a copy in structs would only have to be kept in step with the proto.
#ifndef ARACHNE_CONTROLLER_CLIENT_CONTROLLER_CLIENT_H_
#define ARACHNE_CONTROLLER_CLIENT_CONTROLLER_CLIENT_H_

#include <cstdint>
#include <functional>
#include <memory>
#include <string>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "arachne/v1/controller.pb.h"

namespace arachne {

struct ControllerClientConfig {
  std::string address;  // host:port of arachne-controller
  // Sent as `authorization: Bearer <token>` on every call when not empty.
  std::string token;
  // Or: the file holding that token (read once, by MakeGrpcControllerClient;
  // a path keeps the secret out of the process list). Not with `token`.
  std::string token_file;
  // TLS when not empty: trust these CA certificates (PEM file) for the
  // controller's certificate. Empty: plaintext.
  std::string tls_ca_file;
  // Mutual TLS: this client's certificate chain and key (PEM files).
  std::string tls_cert_file;
  std::string tls_key_file;
  // Deadline of each unary call. WatchEvents has none: it streams until the
  // caller stops it or the controller ends it.
  absl::Duration timeout = absl::Seconds(10);
};

// Thread-safe. Every error keeps the controller's canonical code and
// message, prefixed "controller <address>: " (InvalidArgument naming the
// request field, NotFound for an unknown node, Unauthenticated for a
// missing or wrong token, Unavailable when the controller cannot be
// reached, DeadlineExceeded past `timeout`).
class ControllerClient {
 public:
  virtual ~ControllerClient() = default;
  virtual absl::StatusOr<v1::GetStatusResponse> GetStatus() = 0;
  // A graceful leave of `node` within `deadline_s` seconds.
  virtual absl::Status DrainNode(const std::string& node,
                                 double deadline_s) = 0;
  virtual absl::Status RequestReplan(const std::string& reason) = 0;
  // Calls `on_event` with every event after sequence `after` (0: from the
  // oldest the controller kept), in order, until `on_event` returns false
  // (OK), the controller ends the stream (OK: it shut down) or the stream
  // fails (its error). Blocks; Cancel() from another thread ends it (OK).
  virtual absl::Status WatchEvents(
      int64_t after, const std::function<bool(const v1::Event&)>& on_event) = 0;
  // Ends a WatchEvents in progress (it returns OK); idempotent.
  virtual void Cancel() = 0;
};

// A client over one gRPC channel. InvalidArgument "address: ..." for an
// address that is not HOST:PORT (with a port in 1..65535) or for both
// token and token_file; the errors of rpc/credentials.h naming token_file
// (NotFound for a file that cannot be read, InvalidArgument for an empty
// one) and the TLS settings (tls_ca_file, tls_cert_file, tls_key_file). Connecting is lazy: an unreachable controller shows up as
// Unavailable on the first call.
absl::StatusOr<std::unique_ptr<ControllerClient>> MakeGrpcControllerClient(
    const ControllerClientConfig& config);

}  // namespace arachne

#endif  // ARACHNE_CONTROLLER_CLIENT_CONTROLLER_CLIENT_H_
