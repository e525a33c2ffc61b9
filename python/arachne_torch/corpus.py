"""A job's data: the synthetic corpus of the reference engine, sample for
sample (worker_agent/engine/synthetic_corpus.h), or a token file
(engine.token_file). Either way a sample depends on its index only, so every
plan reads the same global batch whatever rank reads which sample.
"""

from __future__ import annotations

import os
import stat
import threading
from typing import Dict, Tuple

import numpy as np

from arachne_torch.job import BadRequest, TokenFile

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


# Tokens per read of the vocabulary scan (16 MiB of uint32 at most).
SCAN_CHUNK_TOKENS = 1 << 22

# The largest token id of each file scanned by this process, keyed by what
# identifies its content ((dev, inode, size, mtime), token_bytes), so a
# later Prepare of the same file (a switch) does not read it again.
_max_token_ids: Dict[Tuple, int] = {}
_max_token_ids_mu = threading.Lock()


class TokenFileCorpus:
    """Samples read from a token file: a flat little-endian array of uint16
    (token_bytes 2) or uint32 (token_bytes 4) token ids, as Megatron- and
    nanoGPT-style `.bin` files are, memory-mapped.

    With N tokens in the file and S = (N - 1) // seq_len whole samples,
    sample i is the seq_len + 1 tokens starting at token (i % S) * seq_len:
    consecutive samples overlap by one token (the last target of one is the
    first input of the next), the last (N - 1) % seq_len tokens are never
    read, and sample S is sample 0 again.

    The constructor checks the file and raises BadRequest naming the field
    and the value: a path that is not an absolute path to a readable regular
    file, token_bytes not 2 or 4, a size that is not a whole number of
    tokens, fewer than seq_len + 1 tokens, a token id >= vocab (the whole
    file is scanned, once per process and file)."""

    def __init__(self, path: str, token_bytes: int, vocab: int,
                 seq_len: int):
        if vocab < 2 or seq_len < 1:
            raise ValueError(f"corpus: vocab {vocab} and seq_len {seq_len}")
        TokenFile(path, token_bytes).validate()
        f = "engine.token_file.path"
        try:
            info = os.stat(path)
        except (FileNotFoundError, NotADirectoryError):
            raise BadRequest(f"{f}: \"{path}\" does not exist") from None
        except OSError as e:
            raise BadRequest(f"{f}: \"{path}\" cannot be read: "
                             f"{e.strerror}") from None
        if not stat.S_ISREG(info.st_mode):
            m = info.st_mode
            what = ("a directory" if stat.S_ISDIR(m) else
                    "a FIFO" if stat.S_ISFIFO(m) else
                    "a socket" if stat.S_ISSOCK(m) else
                    "a device" if stat.S_ISCHR(m) or stat.S_ISBLK(m) else
                    "a special file")
            raise BadRequest(f"{f}: \"{path}\" is {what}, not a regular "
                             "file")
        try:
            with open(path, "rb") as fh:
                fh.read(1)
        except OSError as e:
            raise BadRequest(f"{f}: \"{path}\" cannot be read: "
                             f"{e.strerror}") from None
        size = info.st_size
        if size % token_bytes != 0:
            raise BadRequest(
                f"engine.token_file: \"{path}\" has {size} bytes, not a whole "
                f"number of tokens of token_bytes {token_bytes}")
        n = size // token_bytes
        if n < seq_len + 1:
            raise BadRequest(
                f"{f}: \"{path}\" holds {n} tokens, fewer than the "
                f"seq_len + 1 = {seq_len + 1} of one sample")
        self.path, self.token_bytes = path, token_bytes
        self.vocab, self.seq_len = vocab, seq_len
        self.num_tokens = n
        self.num_samples = (n - 1) // seq_len
        self.tokens = np.memmap(path, dtype="<u2" if token_bytes == 2
                                else "<u4", mode="r", shape=(n,))
        key = (info.st_dev, info.st_ino, size, info.st_mtime_ns, token_bytes)
        with _max_token_ids_mu:
            top = _max_token_ids.get(key)
        if top is None:
            top = 0
            for b in range(0, n, SCAN_CHUNK_TOKENS):
                top = max(top, int(self.tokens[b:b + SCAN_CHUNK_TOKENS].max()))
            with _max_token_ids_mu:
                _max_token_ids[key] = top
        if top >= vocab:
            for b in range(0, n, SCAN_CHUNK_TOKENS):
                bad = np.flatnonzero(self.tokens[b:b + SCAN_CHUNK_TOKENS] >=
                                     vocab)
                if bad.size:
                    j = b + int(bad[0])
                    raise BadRequest(
                        f"{f}: \"{path}\": token {j} is {int(self.tokens[j])}"
                        f", not below the model's vocab {vocab} "
                        f"(model_spec.vocab; token_bytes {token_bytes})")

    def samples(self, first: int, count: int) -> np.ndarray:
        """Samples first..first+count-1, each seq_len + 1 tokens: [count,
        seq_len + 1] int64 (inputs are [:, :-1], targets [:, 1:])."""
        i = np.arange(first, first + count, dtype=np.int64) % self.num_samples
        at = (i * self.seq_len)[:, None] + np.arange(self.seq_len + 1)
        return np.array(self.tokens[at], dtype=np.int64)


def make_corpus(job):
    """The corpus of `job` (a job.Job): its token file, or the synthetic
    corpus of engine.data_seed. BadRequest for a token file it cannot
    read."""
    tf = job.engine.token_file
    if tf is not None:
        return TokenFileCorpus(tf.path, tf.token_bytes, job.model.vocab,
                               job.training.seq_len)
    return SyntheticCorpus(job.engine.data_seed, job.model.vocab,
                           job.training.seq_len)
