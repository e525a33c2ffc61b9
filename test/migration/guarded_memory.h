// Device memory stood in for on a CPU: a StateMemory whose bytes the
// executor may only reach through its operations, as it can only reach a
// GPU's through CUDA. The bytes live in an mmap arena that is PROT_NONE
// except while one of this memory's operations or a transport's round runs,
// so an executor that read or wrote a state byte itself would fault (and
// the forked rank die with SIGSEGV) instead of passing by luck.
#ifndef ARACHNE_TEST_MIGRATION_GUARDED_MEMORY_H_
#define ARACHNE_TEST_MIGRATION_GUARDED_MEMORY_H_

#include <sys/mman.h>

#include <cstdint>
#include <cstring>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "glog/logging.h"
#include "migration/core/checksum.h"
#include "migration/core/executor.h"
#include "migration/core/state_memory.h"
#include "migration/core/transport.h"

namespace arachne::migration::testing {

class GuardedMemory : public StateMemory {
 public:
  explicit GuardedMemory(size_t capacity) : capacity_(capacity) {
    void* p = mmap(nullptr, capacity_, PROT_NONE,
                   MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
    CHECK(p != MAP_FAILED) << "mmap of " << capacity_ << " bytes";
    arena_ = static_cast<uint8_t*>(p);
  }
  ~GuardedMemory() override { munmap(arena_, capacity_); }
  GuardedMemory(const GuardedMemory&) = delete;
  GuardedMemory& operator=(const GuardedMemory&) = delete;

  // Opens the arena to this process (for the test's own checks and for a
  // transport's round) and closes it again.
  void Open() { CHECK_EQ(mprotect(arena_, capacity_, PROT_READ | PROT_WRITE), 0); }
  void Close() { CHECK_EQ(mprotect(arena_, capacity_, PROT_NONE), 0); }

  MemoryKind kind() const override { return MemoryKind::kDevice; }
  absl::Status Copy(void* to, const void* from, size_t bytes) override {
    CheckInArena(to, bytes);
    CheckInArena(from, bytes);
    Open();
    std::memcpy(to, from, bytes);
    Close();
    copied_bytes += bytes;
    return absl::OkStatus();
  }
  absl::StatusOr<uint64_t> Checksum(const void* data, size_t bytes) override {
    CheckInArena(data, bytes);
    Open();
    const uint64_t sum = migration::Checksum(data, bytes);
    Close();
    checksummed_bytes += bytes;
    return sum;
  }
  absl::Status ToHost(void* host, const void* from, size_t bytes) override {
    CheckInArena(from, bytes);
    Open();
    std::memcpy(host, from, bytes);
    Close();
    return absl::OkStatus();
  }
  absl::Status FromHost(void* to, const void* host, size_t bytes) override {
    CheckInArena(to, bytes);
    Open();
    std::memcpy(to, host, bytes);
    Close();
    return absl::OkStatus();
  }
  absl::StatusOr<std::shared_ptr<uint8_t>> Allocate(size_t bytes) override {
    ++allocations;
    uint8_t* p = Take(bytes);
    if (p == nullptr) {
      return absl::ResourceExhaustedError(
          absl::StrCat("guarded memory: ", bytes, " bytes more than its ",
                       capacity_));
    }
    return std::shared_ptr<uint8_t>(p, [](uint8_t*) {});  // the arena's
  }

  // A state in this memory: one buffer per holding (the arena must be open
  // to fill it).
  ShardSet State(const std::vector<Holding>& holdings) {
    std::vector<uint8_t*> data;
    for (const Holding& h : holdings) {
      data.push_back(Take(static_cast<size_t>(h.range.size())));
      CHECK(data.back() != nullptr) << "arena too small";
    }
    return ShardSet::View(holdings, std::move(data));
  }

  int64_t copied_bytes = 0;
  int64_t checksummed_bytes = 0;
  int allocations = 0;

 private:
  uint8_t* Take(size_t bytes) {
    const size_t at = (used_ + 63) / 64 * 64;
    if (at + bytes > capacity_) return nullptr;
    used_ = at + bytes;
    return arena_ + at;
  }
  void CheckInArena(const void* p, size_t bytes) const {
    const auto* b = static_cast<const uint8_t*>(p);
    CHECK(bytes == 0 || (b >= arena_ && b + bytes <= arena_ + capacity_))
        << "a buffer outside the guarded memory";
  }

  uint8_t* arena_ = nullptr;
  size_t capacity_;
  size_t used_ = 0;
};

// A host transport that takes GuardedMemory buffers, as a device transport
// takes device pointers: the arena is open only while a round runs.
class GuardedTransport : public Transport {
 public:
  GuardedTransport(std::unique_ptr<Transport> inner, GuardedMemory* memory)
      : inner_(std::move(inner)), memory_(memory) {}
  std::string name() const override { return "guarded-" + inner_->name(); }
  int rank() const override { return inner_->rank(); }
  int world_size() const override { return inner_->world_size(); }
  MemoryKind memory() const override { return MemoryKind::kDevice; }
  absl::Status RunRound(uint64_t tag, absl::Span<const SendOp> sends,
                        absl::Span<const RecvOp> recvs,
                        absl::Duration timeout) override {
    memory_->Open();
    absl::Status s = inner_->RunRound(tag, sends, recvs, timeout);
    memory_->Close();
    return s;
  }

 private:
  std::unique_ptr<Transport> inner_;
  GuardedMemory* memory_;
};

}  // namespace arachne::migration::testing

#endif  // ARACHNE_TEST_MIGRATION_GUARDED_MEMORY_H_
