// The checksum every migrated segment carries: computed by the sender over
// its own bytes, checked by the receiver where they landed.
#ifndef ARACHNE_MIGRATION_CORE_CHECKSUM_H_
#define ARACHNE_MIGRATION_CORE_CHECKSUM_H_

#include <cstddef>
#include <cstdint>

namespace arachne::migration {

// 64-bit checksum of a byte range (not cryptographic: it catches corruption
// and misrouted bytes).
uint64_t Checksum(const void* data, size_t bytes);

// Checksum() of `total` bytes fed in pieces, for bytes that cannot be read
// in one go (device memory copied back chunk by chunk): every piece but the
// last must be a multiple of kBlockBytes. Finish() gives what Checksum()
// gives for the concatenation.
class ChecksumStream {
 public:
  static constexpr size_t kBlockBytes = 32;
  explicit ChecksumStream(size_t total);
  void Update(const void* data, size_t bytes);
  uint64_t Finish();

 private:
  // Folds the lanes and hashes the bytes after the last whole block.
  void FinishWith(const uint8_t* tail, size_t bytes);

  size_t total_;
  size_t seen_ = 0;
  bool done_ = false;  // the last piece came: h_ holds the result
  uint64_t lane_[4];
  uint64_t h_ = 0;
};

}  // namespace arachne::migration

#endif  // ARACHNE_MIGRATION_CORE_CHECKSUM_H_
