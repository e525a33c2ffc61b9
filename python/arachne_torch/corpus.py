"""The synthetic corpus of the reference engine, sample for sample
(worker_agent/engine/synthetic_corpus.h): a counter-based generator, so a
sample depends on (seed, index) only and every plan reads the same global
batch whatever rank reads which sample.
"""

from __future__ import annotations

import numpy as np

_MASK = (1 << 64) - 1


def splitmix64(x):
    """SplitMix64 of x (a Python int or a numpy uint64 array)."""
    if isinstance(x, np.ndarray):
        with np.errstate(over="ignore"):
            x = x + np.uint64(0x9E3779B97F4A7C15)
            x = (x ^ (x >> np.uint64(30))) * np.uint64(0xBF58476D1CE4E5B9)
            x = (x ^ (x >> np.uint64(27))) * np.uint64(0x94D049BB133111EB)
            return x ^ (x >> np.uint64(31))
    x = (x + 0x9E3779B97F4A7C15) & _MASK
    x = ((x ^ (x >> 30)) * 0xBF58476D1CE4E5B9) & _MASK
    x = ((x ^ (x >> 27)) * 0x94D049BB133111EB) & _MASK
    return x ^ (x >> 31)


class SyntheticCorpus:
    """Sequences over `vocab` tokens: mostly a fixed successor of the
    previous token (a learnable structure), one in eight a fresh draw."""

    def __init__(self, seed: int, vocab: int, seq_len: int):
        if vocab < 2 or seq_len < 1:
            raise ValueError(f"corpus: vocab {vocab} and seq_len {seq_len}")
        self.seed = seed & _MASK
        self.vocab = vocab
        self.seq_len = seq_len
        nxt = np.arange(vocab, dtype=np.int64)
        i = np.arange(vocab - 1, 0, -1, dtype=np.uint64)
        keys = self.seed ^ (0x5151 << 40)
        j = (splitmix64(np.uint64(keys) ^ i) % (i + np.uint64(1))).astype(
            np.int64)
        # Fisher-Yates, in the reference's order (i from vocab-1 down to 1).
        for a, b in zip(i.astype(np.int64).tolist(), j.tolist()):
            nxt[a], nxt[b] = nxt[b], nxt[a]
        self.next = nxt

    def samples(self, first: int, count: int) -> np.ndarray:
        """Samples first..first+count-1, each seq_len + 1 tokens: [count,
        seq_len + 1] int64 (inputs are [:, :-1], targets [:, 1:])."""
        idx = np.arange(first, first + count, dtype=np.uint64)
        with np.errstate(over="ignore"):
            base = splitmix64(np.uint64(self.seed) * np.uint64(0x100000001B3)
                              + idx)
            pos = np.arange(1, self.seq_len + 1, dtype=np.uint64)
            r = splitmix64(base[:, None] + pos[None, :])
        v = np.uint64(self.vocab)
        out = np.empty((count, self.seq_len + 1), dtype=np.int64)
        out[:, 0] = (splitmix64(base) % v).astype(np.int64)
        fresh = ((r >> np.uint64(3)) % v).astype(np.int64)
        follow = (r & np.uint64(7)) != 0
        for t in range(1, self.seq_len + 1):
            out[:, t] = np.where(follow[:, t - 1], self.next[out[:, t - 1]],
                                 fresh[:, t - 1])
        return out
