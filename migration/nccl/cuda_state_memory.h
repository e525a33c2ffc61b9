// A GPU's memory as a StateMemory (migration/core/state_memory.h), so the
// executor migrates an engine's own device tensors in place over the NCCL
// transport (MemoryKind::kDevice). A device segment's checksum is taken over
// a copy back to pinned host memory, one chunk at a time (ChecksumStream):
// the same value the sender's host or device computed, so a corrupted
// segment on a GPU is DataLoss as on the host. Built only with CUDA.
#ifndef ARACHNE_MIGRATION_NCCL_CUDA_STATE_MEMORY_H_
#define ARACHNE_MIGRATION_NCCL_CUDA_STATE_MEMORY_H_

#include <cstddef>
#include <memory>

#include "absl/status/statusor.h"
#include "migration/core/state_memory.h"

namespace arachne::migration {

// The memory of CUDA device `device`; `checksum_chunk_bytes` of pinned host
// memory (a multiple of 32, at least 64 KiB, at most 1 GiB) are allocated
// once for the copies back. InvalidArgument names a bad device or chunk;
// the CUDA error when the device or the pinned buffer cannot be had.
absl::StatusOr<std::unique_ptr<StateMemory>> MakeCudaStateMemory(
    int device, size_t checksum_chunk_bytes = size_t{8} << 20);

}  // namespace arachne::migration

#endif  // ARACHNE_MIGRATION_NCCL_CUDA_STATE_MEMORY_H_
