#include "migration/core/checksum.h"

#include <cstring>

#include "glog/logging.h"

namespace arachne::migration {
namespace {

// FNV-1a over 8-byte words in four independent lanes (32 bytes a step),
// folded together, then a final avalanche: sensitive to every byte and its
// position. One lane was a serial multiply chain at ~4 GB/s, which both ends
// of every transfer paid (bench/results/reconfig.md); four lanes keep the
// multiplier busy.
constexpr uint64_t kPrime = 0x100000001b3ull;

inline uint64_t Word(const uint8_t* p) {
  uint64_t w;
  std::memcpy(&w, p, 8);
  return w;
}

}  // namespace

ChecksumStream::ChecksumStream(size_t total) : total_(total) {
  for (int l = 0; l < 4; ++l) {
    lane_[l] = (0xcbf29ce484222325ull ^ total) + 0x9e3779b97f4a7c15ull * l;
  }
}

void ChecksumStream::Update(const void* data, size_t bytes) {
  CHECK(!done_) << "a piece after the last one";
  CHECK_LE(bytes, total_ - seen_) << "more bytes than the stream's total";
  const auto* p = static_cast<const uint8_t*>(data);
  const bool last = seen_ + bytes == total_;
  CHECK(last || bytes % kBlockBytes == 0)
      << "a piece of " << bytes << " bytes that is not the last must be a "
      << "multiple of " << kBlockBytes;
  size_t i = 0;
  for (; i + kBlockBytes <= bytes; i += kBlockBytes) {
    for (int l = 0; l < 4; ++l) {
      lane_[l] = (lane_[l] ^ Word(p + i + 8 * l)) * kPrime;
      lane_[l] ^= lane_[l] >> 29;
    }
  }
  seen_ += bytes;
  if (last) FinishWith(p + i, bytes - i);
}

void ChecksumStream::FinishWith(const uint8_t* p, size_t bytes) {
  uint64_t h = lane_[0];
  for (int l = 1; l < 4; ++l) {
    h = (h ^ lane_[l]) * kPrime;
    h ^= h >> 29;
  }
  size_t i = 0;
  for (; i + 8 <= bytes; i += 8) {
    h = (h ^ Word(p + i)) * kPrime;
    h ^= h >> 29;
  }
  for (; i < bytes; ++i) h = (h ^ p[i]) * kPrime;
  h ^= h >> 33;
  h *= 0xff51afd7ed558ccdull;
  h ^= h >> 33;
  h_ = h;
  done_ = true;
}

uint64_t ChecksumStream::Finish() {
  if (total_ == 0 && !done_) FinishWith(nullptr, 0);
  CHECK(done_) << "Finish after " << seen_ << " of " << total_ << " bytes";
  return h_;
}

uint64_t Checksum(const void* data, size_t bytes) {
  ChecksumStream s(bytes);
  if (bytes > 0) s.Update(data, bytes);
  return s.Finish();
}

}  // namespace arachne::migration
