#include "migration/core/state_memory.h"

#include <cstring>
#include <new>

#include "absl/strings/str_cat.h"
#include "migration/core/checksum.h"

namespace arachne::migration {
namespace {

class Host : public StateMemory {
 public:
  MemoryKind kind() const override { return MemoryKind::kHost; }
  absl::Status Copy(void* to, const void* from, size_t bytes) override {
    std::memcpy(to, from, bytes);
    return absl::OkStatus();
  }
  absl::StatusOr<uint64_t> Checksum(const void* data, size_t bytes) override {
    return migration::Checksum(data, bytes);
  }
  absl::Status ToHost(void* host, const void* from, size_t bytes) override {
    std::memcpy(host, from, bytes);
    return absl::OkStatus();
  }
  absl::Status FromHost(void* to, const void* host, size_t bytes) override {
    std::memcpy(to, host, bytes);
    return absl::OkStatus();
  }
  absl::StatusOr<std::shared_ptr<uint8_t>> Allocate(size_t bytes) override {
    uint8_t* p = new (std::nothrow) uint8_t[bytes == 0 ? 1 : bytes];
    if (p == nullptr) {
      return absl::ResourceExhaustedError(
          absl::StrCat("host memory: cannot allocate ", bytes, " bytes"));
    }
    return std::shared_ptr<uint8_t>(p, std::default_delete<uint8_t[]>());
  }
};

}  // namespace

StateMemory& HostMemory() {
  static Host* host = new Host;
  return *host;
}

absl::Status StagingBuffer::Reserve(StateMemory& memory, size_t bytes) {
  if (memory_ == &memory && size_ >= bytes) return absl::OkStatus();
  data_.reset();  // free first: the old buffer is not needed
  size_ = 0;
  absl::StatusOr<std::shared_ptr<uint8_t>> p = memory.Allocate(bytes);
  if (!p.ok()) return p.status();
  data_ = *std::move(p);
  size_ = bytes;
  memory_ = &memory;
  return absl::OkStatus();
}

}  // namespace arachne::migration
