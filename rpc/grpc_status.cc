#include "rpc/grpc_status.h"

#include <string>

#include "absl/strings/str_cat.h"

namespace arachne {

grpc::Status ToGrpcStatus(const absl::Status& status) {
  if (status.ok()) return grpc::Status::OK;
  // absl::StatusCode and grpc::StatusCode share the canonical numbering.
  return grpc::Status(static_cast<grpc::StatusCode>(status.code()),
                      std::string(status.message()));
}

absl::Status FromGrpcStatus(const grpc::Status& status,
                            absl::string_view prefix) {
  if (status.ok()) return absl::OkStatus();
  return absl::Status(static_cast<absl::StatusCode>(status.error_code()),
                      prefix.empty()
                          ? status.error_message()
                          : absl::StrCat(prefix, ": ", status.error_message()));
}

}  // namespace arachne
