"""Checkpoints in the canonical layout, the agent's format
(worker_agent/checkpoint.h), so either engine reads what the other wrote
and any plan reads any plan's: a directory with one file per GPU,
`shard-<node>-<index>.bin`, each the magic "ARCKPT1\\n", a uint32 count,
then per piece: uint32 name length, the tensor's name, int64 begin and end
(canonical bytes), uint64 checksum (migration::Checksum) and the bytes;
little-endian throughout.
"""

from __future__ import annotations

import os
import re
import struct
from typing import Dict, List, Tuple

import numpy as np

from arachne_torch.state import StateTensor

MAGIC = b"ARCKPT1\n"
_MASK = (1 << 64) - 1
_PRIME = 0x100000001B3


class CheckpointError(Exception):
    """A checkpoint that cannot be read (what and where in the message);
    `code` is the gRPC status it answers with."""

    def __init__(self, code: str, message: str):
        super().__init__(message)
        self.code = code  # "NOT_FOUND", "DATA_LOSS", "FAILED_PRECONDITION"


def checksum(data: bytes) -> int:
    """migration::Checksum: FNV-1a over 8-byte words in four lanes, folded,
    then the tail words and bytes, then an avalanche."""
    n = len(data)
    lanes = [((0xCBF29CE484222325 ^ n) + 0x9E3779B97F4A7C15 * l) & _MASK
             for l in range(4)]
    full = n // 32 * 32
    words = np.frombuffer(data, dtype="<u8", count=full // 8).tolist() \
        if full else []
    for i in range(0, len(words), 4):
        for l in range(4):
            x = ((lanes[l] ^ words[i + l]) * _PRIME) & _MASK
            lanes[l] = x ^ (x >> 29)
    h = lanes[0]
    for l in range(1, 4):
        h = ((h ^ lanes[l]) * _PRIME) & _MASK
        h ^= h >> 29
    i = full
    while i + 8 <= n:
        (w,) = struct.unpack_from("<Q", data, i)
        h = ((h ^ w) * _PRIME) & _MASK
        h ^= h >> 29
        i += 8
    while i < n:
        h = ((h ^ data[i]) * _PRIME) & _MASK
        i += 1
    h ^= h >> 33
    h = (h * 0xFF51AFD7ED558CCD) & _MASK
    h ^= h >> 33
    return h


def shard_file_name(node: str, index: int) -> str:
    safe = re.sub(r"[^A-Za-z0-9_-]", ".", node)
    return f"shard-{safe}-{index}.bin"


def write_shard(directory: str, tensors: List[StateTensor], node: str,
                index: int, pieces: Dict[Tuple[int, int, int], bytes]) -> None:
    """Writes one GPU's pieces atomically (a temporary file, then rename),
    in tensor order as the agent's writer does."""
    os.makedirs(directory, exist_ok=True)
    out = [MAGIC, struct.pack("<I", len(pieces))]
    for (tid, begin, end), data in sorted(pieces.items()):
        name = tensors[tid].name.encode()
        out += [struct.pack("<I", len(name)), name,
                struct.pack("<qqQ", begin, end, checksum(data)), data]
    path = os.path.join(directory, shard_file_name(node, index))
    tmp = path + ".tmp"
    with open(tmp, "wb") as f:
        for part in out:
            f.write(part)
    os.replace(tmp, path)


def read_checkpoint(directory: str, tensors: List[StateTensor],
                    model_name: str) -> List[bytearray]:
    """Every tensor whole, in canonical bytes, from every shard of
    `directory`; CheckpointError as the agent's reader words it."""
    try:
        files = sorted(f for f in os.listdir(directory)
                       if f.startswith("shard-") and f.endswith(".bin"))
    except OSError:
        files = []
    if not files:
        raise CheckpointError("NOT_FOUND",
                              f"checkpoint_dir {directory}: no shard files")
    id_of = {t.name: i for i, t in enumerate(tensors)}
    full = [bytearray(t.bytes) for t in tensors]
    have = [np.zeros(t.bytes, dtype=bool) for t in tensors]
    for fname in files:
        path = os.path.join(directory, fname)
        with open(path, "rb") as f:
            c = f.read()
        if c[:8] != MAGIC:
            raise CheckpointError("DATA_LOSS",
                                  f"{path}: not an Arachne checkpoint shard")
        at = 8

        def get(fmt):
            nonlocal at
            size = struct.calcsize(fmt)
            if at + size > len(c):
                raise CheckpointError("DATA_LOSS",
                                      f"{path}: truncated at byte {at}")
            v = struct.unpack_from(fmt, c, at)
            at += size
            return v

        (count,) = get("<I")
        for _ in range(count):
            (length,) = get("<I")
            if at + length > len(c):
                raise CheckpointError("DATA_LOSS",
                                      f"{path}: truncated at byte {at}")
            name = c[at:at + length].decode(errors="replace")
            at += length
            begin, end, summed = get("<qqQ")
            tid = id_of.get(name)
            if tid is None:
                raise CheckpointError(
                    "FAILED_PRECONDITION",
                    f"{path}: tensor '{name}' is not part of model "
                    f"{model_name}")
            if begin < 0 or end < begin or end > tensors[tid].bytes or \
                    at + (end - begin) > len(c):
                raise CheckpointError(
                    "DATA_LOSS", f"{path}: tensor '{name}' range [{begin}, "
                    f"{end}) is out of bounds or truncated")
            data = c[at:at + end - begin]
            if checksum(data) != summed:
                raise CheckpointError(
                    "DATA_LOSS", f"{path}: tensor '{name}' bytes [{begin}, "
                    f"{end}): checksum mismatch")
            at += end - begin
            held = have[tid][begin:end]
            old = np.frombuffer(full[tid], dtype=np.uint8)[begin:end]
            new = np.frombuffer(data, dtype=np.uint8)
            clash = np.nonzero(held & (old != new))[0]
            if clash.size:
                o = int(clash[0])
                raise CheckpointError(
                    "DATA_LOSS", f"tensor '{name}' byte {begin + o}: two "
                    f"holders disagree ({old[o]} vs {new[o]})")
            full[tid][begin:end] = data
            have[tid][begin:end] = True
    for tid, h in enumerate(have):
        missing = np.nonzero(~h)[0]
        if missing.size:
            raise CheckpointError(
                "FAILED_PRECONDITION",
                f"no shard holds byte {int(missing[0])} of tensor "
                f"'{tensors[tid].name}'")
    return full
