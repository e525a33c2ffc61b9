// Every CUDA and NCCL call of the NCCL transport goes through these macros:
// a failure returns a Status naming the file, line, call and the library's
// own message (for NCCL also ncclGetLastError), instead of aborting.
#ifndef ARACHNE_MIGRATION_NCCL_NCCL_CHECKS_H_
#define ARACHNE_MIGRATION_NCCL_NCCL_CHECKS_H_

#include <cuda_runtime.h>
#include <nccl.h>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"

namespace arachne::migration::internal {

inline absl::Status CudaStatus(cudaError_t e, const char* call,
                               const char* file, int line) {
  return absl::InternalError(absl::StrCat(file, ":", line, ": ", call,
                                          " failed: ", cudaGetErrorName(e),
                                          ": ", cudaGetErrorString(e)));
}

inline absl::Status NcclStatus(ncclResult_t r, ncclComm_t comm,
                               const char* call, const char* file, int line) {
  const std::string msg =
      absl::StrCat(file, ":", line, ": ", call, " failed: ",
                   ncclGetErrorString(r), " (", ncclGetLastError(comm), ")");
  // A remote or system failure is the peer's or the network's, not ours.
  if (r == ncclRemoteError || r == ncclSystemError) {
    return absl::UnavailableError(msg);
  }
  if (r == ncclInvalidArgument || r == ncclInvalidUsage) {
    return absl::InvalidArgumentError(msg);
  }
  return absl::InternalError(msg);
}

}  // namespace arachne::migration::internal

#define ARACHNE_CUDA_RETURN_IF_ERROR(call)                                 \
  do {                                                                     \
    const cudaError_t arachne_cuda_e = (call);                             \
    if (arachne_cuda_e != cudaSuccess) {                                   \
      return ::arachne::migration::internal::CudaStatus(                   \
          arachne_cuda_e, #call, __FILE__, __LINE__);                      \
    }                                                                      \
  } while (0)

#define ARACHNE_NCCL_RETURN_IF_ERROR(comm, call)                           \
  do {                                                                     \
    const ncclResult_t arachne_nccl_r = (call);                            \
    if (arachne_nccl_r != ncclSuccess && arachne_nccl_r != ncclInProgress) { \
      return ::arachne::migration::internal::NcclStatus(                   \
          arachne_nccl_r, (comm), #call, __FILE__, __LINE__);              \
    }                                                                      \
  } while (0)

#endif  // ARACHNE_MIGRATION_NCCL_NCCL_CHECKS_H_
