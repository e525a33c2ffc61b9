// Where a rank's state lives, and the few things the executor does to bytes
// there: copy them, checksum them, move them to and from the host, and
// allocate the staging buffers of packed segments and checksums. The
// executor never reads or writes a state byte itself, so one executor runs
// on host memory (HostMemory) and on a GPU's (the CUDA implementation in
// migration/nccl, where a device segment's checksum is taken over a copy
// back to pinned host memory, chunk by chunk).
#ifndef ARACHNE_MIGRATION_CORE_STATE_MEMORY_H_
#define ARACHNE_MIGRATION_CORE_STATE_MEMORY_H_

#include <cstddef>
#include <cstdint>
#include <memory>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "migration/core/transport.h"

namespace arachne::migration {

class StateMemory {
 public:
  virtual ~StateMemory() = default;
  virtual MemoryKind kind() const = 0;
  // Copies `bytes` from `from` to `to`, both in this memory (they do not
  // overlap).
  virtual absl::Status Copy(void* to, const void* from, size_t bytes) = 0;
  // Checksum() (migration/core/checksum.h) of `bytes` at `data` in this
  // memory: the same value a host computes over the same bytes.
  virtual absl::StatusOr<uint64_t> Checksum(const void* data,
                                            size_t bytes) = 0;
  // Between this memory and host memory.
  virtual absl::Status ToHost(void* host, const void* from, size_t bytes) = 0;
  virtual absl::Status FromHost(void* to, const void* host, size_t bytes) = 0;
  // A buffer of `bytes` in this memory (contents undefined), freed when
  // the last shared_ptr goes.
  virtual absl::StatusOr<std::shared_ptr<uint8_t>> Allocate(size_t bytes) = 0;
};

// Host memory: memcpy and Checksum(), buffers from the heap.
StateMemory& HostMemory();

// One staging buffer in a StateMemory, grown when a round needs more and
// kept between rounds and switches, so it is allocated once, not per
// transfer.
class StagingBuffer {
 public:
  uint8_t* data() const { return data_.get(); }
  size_t size() const { return size_; }
  // At least `bytes` in `memory` (the contents are not kept when it grows;
  // a buffer of another memory is replaced).
  absl::Status Reserve(StateMemory& memory, size_t bytes);

 private:
  std::shared_ptr<uint8_t> data_;
  size_t size_ = 0;
  const StateMemory* memory_ = nullptr;
};

}  // namespace arachne::migration

#endif  // ARACHNE_MIGRATION_CORE_STATE_MEMORY_H_
