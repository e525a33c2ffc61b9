// A deterministic synthetic corpus for the reference engine: sample i is a
// function of (seed, i) only, so every plan reads the same tokens for the
// same sample index, and a data cursor (the next sample index) is all the
// state the data pipeline has.
//
// Structure a model can learn: a fixed random permutation `next` of the
// vocabulary (from the seed); each token follows its predecessor by `next`
// with probability 7/8 and is uniform otherwise. The loss falls from
// ln(vocab) towards the chain's entropy (about 1.3 nats for vocab 512).
#ifndef ARACHNE_WORKER_AGENT_ENGINE_SYNTHETIC_CORPUS_H_
#define ARACHNE_WORKER_AGENT_ENGINE_SYNTHETIC_CORPUS_H_

#include <cstdint>
#include <vector>

namespace arachne::agent {

class SyntheticCorpus {
 public:
  SyntheticCorpus(uint64_t seed, int64_t vocab, int seq_len);

  int seq_len() const { return seq_len_; }
  // seq_len + 1 tokens of sample `index` (inputs are [0, seq_len), targets
  // [1, seq_len]) written to `out`.
  void Sample(int64_t index, int64_t* out) const;

 private:
  uint64_t seed_;
  int64_t vocab_;
  int seq_len_;
  std::vector<int64_t> next_;
};

// SplitMix64 of x: the counter-based generator behind the corpus and the
// initial weights.
uint64_t SplitMix64(uint64_t x);

}  // namespace arachne::agent

#endif  // ARACHNE_WORKER_AGENT_ENGINE_SYNTHETIC_CORPUS_H_
