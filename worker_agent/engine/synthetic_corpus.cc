#include "worker_agent/engine/synthetic_corpus.h"

#include <numeric>
#include <utility>

#include "glog/logging.h"

namespace arachne::agent {

uint64_t SplitMix64(uint64_t x) {
  x += 0x9e3779b97f4a7c15ULL;
  x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ULL;
  x = (x ^ (x >> 27)) * 0x94d049bb133111ebULL;
  return x ^ (x >> 31);
}

SyntheticCorpus::SyntheticCorpus(uint64_t seed, int64_t vocab, int seq_len)
    : seed_(seed), vocab_(vocab), seq_len_(seq_len), next_(vocab) {
  CHECK_GT(vocab, 1);
  CHECK_GT(seq_len, 0);
  std::iota(next_.begin(), next_.end(), int64_t{0});
  // Fisher-Yates with the counter-based generator: the same permutation on
  // every machine and standard library.
  for (int64_t i = vocab - 1; i > 0; --i) {
    const int64_t j = static_cast<int64_t>(
        SplitMix64(seed ^ (0x5151ULL << 40) ^ static_cast<uint64_t>(i)) %
        static_cast<uint64_t>(i + 1));
    std::swap(next_[i], next_[j]);
  }
}

void SyntheticCorpus::Sample(int64_t index, int64_t* out) const {
  CHECK_GE(index, 0);
  const uint64_t base =
      SplitMix64(seed_ * 0x100000001b3ULL + static_cast<uint64_t>(index));
  const uint64_t v = static_cast<uint64_t>(vocab_);
  out[0] = static_cast<int64_t>(SplitMix64(base) % v);
  for (int i = 1; i <= seq_len_; ++i) {
    const uint64_t r = SplitMix64(base + static_cast<uint64_t>(i));
    out[i] = (r & 7) != 0 ? next_[out[i - 1]]
                          : static_cast<int64_t>((r >> 3) % v);
  }
}

}  // namespace arachne::agent
