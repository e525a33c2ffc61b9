// The one mapping between the project's absl::Status and gRPC's status, on
// the server (ToGrpcStatus) and on the client (FromGrpcStatus). The
// canonical codes are the same numbers on both sides (INVALID_ARGUMENT,
// FAILED_PRECONDITION, DEADLINE_EXCEEDED, DATA_LOSS, UNAVAILABLE, ...), so a
// code crosses the wire unchanged and messages pass through.
#ifndef ARACHNE_RPC_GRPC_STATUS_H_
#define ARACHNE_RPC_GRPC_STATUS_H_

#include "absl/status/status.h"
#include "absl/strings/string_view.h"
#include "grpcpp/support/status.h"

namespace arachne {

grpc::Status ToGrpcStatus(const absl::Status& status);

// The code of `status` with its message, prefixed "<prefix>: " when
// `prefix` is not empty (clients put the server address there).
absl::Status FromGrpcStatus(const grpc::Status& status,
                            absl::string_view prefix = "");

}  // namespace arachne

#endif  // ARACHNE_RPC_GRPC_STATUS_H_
