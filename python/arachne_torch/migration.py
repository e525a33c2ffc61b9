"""Live migration inside the engine: this rank's share of the switch's one
deterministic schedule (PrepareRequest.migration, computed by the agent with
the C++ migration library), executed over a Gloo group of every GPU of the
new cluster (its migration world, cluster order) that the ranks build at
Prepare under "arachne/g<N>/migration".

As the C++ executor (migration/core/executor.h): the bytes a rank keeps are
copied locally from its old state into its new; then stage by stage, round by
round, every rank sends the transfers whose sender it is and receives those
whose receiver it is (at most one of each per round, so both ends know their
peer and size in advance and nothing can deadlock). Both ends cut a transfer
into the same messages (`plan_wire`, a function of the transfer and the
staging size only) and run them in the same sub-rounds: each segment of
256 KiB or more travels as its own messages (chunks of it), read from and
received into the engine's tensors directly where its bytes are contiguous
in host memory; the smaller ones are packed. A sub-round carries at most
half the staging size (`staging_bytes_option`, default 256 MiB as the C++
executor's) of a transfer's bytes, so whatever must be copied on the way
(packs, strided row-parallel weights, a CUDA device's tensors) goes through
one staging buffer each way, never a copy of the whole transfer. The last
sub-round carries one checksum per segment, computed by the sender over its
own bytes; the receiver verifies each segment where it landed. Reads come
from the old trainer's tensors and writes go into the new trainer's tensors
in place, in the canonical layout (migration/core/state_layout.h): only the
new state is ever written, so a failed round leaves the old state whole and
the switch can abort back to it.
"""

from __future__ import annotations

import dataclasses
import datetime
import hashlib
import os
import time
from typing import Dict, List, Mapping, Optional, Tuple

import numpy as np
import torch

from arachne_torch import state as st
from arachne_torch.job import BadRequest

# Staging: the memory a rank's migration copies bytes through, both
# directions together (each sub-round carries at most half of it each way).
STAGING_ENV = "ARACHNE_TORCH_STAGING_BYTES"  # bytes; overrides the next
AGENT_STAGING_ENV = "ARACHNE_MIGRATION_STAGING_MIB"  # the agent's, in MiB
DEFAULT_STAGING_BYTES = 256 << 20  # ExecutorOptions::kDefaultStagingBytes
MIN_STAGING_BYTES = 1 << 20        # ExecutorOptions::kMinStagingBytes
MAX_STAGING_BYTES = 64 << 30       # the agent's --migration-staging-mib
# Segments this large travel as their own messages (the C++ executor's
# kDirectSegmentBytes); the smaller ones are packed.
DIRECT_SEGMENT_BYTES = 256 << 10
# A segment cut across sub-rounds is cut at bytes aligned to this (every
# element size divides it), into chunks of at least _MIN_CHUNK_BYTES.
_ALIGN = 8
_MIN_CHUNK_BYTES = 64 << 10
# Gloo tags: every message between two ranks has its own, numbered in wire
# order per sender-receiver pair and stage; stage 2 starts at 1 << 30, so no
# two messages of a generation's group share one.
_STAGE_TAG_BASE = {1: 0, 2: 1 << 30}
_TAGS_PER_STAGE = 1 << 30
# Where the bytes of a segment cut in the canonical order are copied element
# by element through a bounded temporary (an unaligned buffer), at most this
# many bytes at a time.
_COPY_CHUNK_BYTES = 4 << 20


class MigrationError(RuntimeError):
    """A transfer that failed: `code` is the gRPC status name it answers
    with ("DATA_LOSS" for a checksum mismatch, "DEADLINE_EXCEEDED" for a
    round past its timeout, "UNAVAILABLE" for a peer that failed,
    "FAILED_PRECONDITION" when this rank lacks bytes it must send)."""

    def __init__(self, code: str, message: str):
        super().__init__(message)
        self.code = code


@dataclasses.dataclass(frozen=True)
class Segment:
    tensor: int
    begin: int
    end: int

    @property
    def bytes(self) -> int:
        return self.end - self.begin


@dataclasses.dataclass(frozen=True)
class Transfer:
    round: int
    peer: int
    send: bool
    segments: Tuple[Segment, ...]

    @property
    def bytes(self) -> int:
        return sum(s.bytes for s in self.segments)


@dataclasses.dataclass(frozen=True)
class RankMigration:
    rank: int
    world_size: int
    kept: Tuple[Segment, ...]
    stages: Dict[int, Tuple[Transfer, ...]]
    # The staging size its executor uses (0: staging_bytes_option() then),
    # read at Prepare so that a bad setting is refused before the pause.
    staging_bytes: int = 0

    @property
    def bytes_kept(self) -> int:
        return sum(s.bytes for s in self.kept)

    def bytes_moved(self, send: bool) -> int:
        return sum(t.bytes for s in (1, 2) for t in self.stages[s]
                   if t.send == send)

    @staticmethod
    def from_proto(msg, tensors: List[st.StateTensor], cluster_rank: int,
                   world_size: int,
                   field: str = "migration",
                   staging_bytes: Optional[int] = None) -> "RankMigration":
        """Reads and checks it: this GPU's rank and the world's size as the
        cluster gives them, every segment a byte range of a tensor, rounds in
        order with at most one send and one receive each; and the staging
        size (`staging_bytes`, else staging_bytes_option())."""
        staging = staging_bytes_option() if staging_bytes is None \
            else check_staging_bytes(staging_bytes)
        if msg.world_size != world_size:
            raise BadRequest(f"{field}.world_size: the cluster has "
                             f"{world_size} GPUs, got {msg.world_size}")
        if msg.rank != cluster_rank:
            raise BadRequest(f"{field}.rank: this GPU is rank {cluster_rank} "
                             f"of the cluster, got {msg.rank}")

        def segment(s, where) -> Segment:
            if not 0 <= s.tensor < len(tensors):
                raise BadRequest(f"{where}.tensor: must be in 0.."
                                 f"{len(tensors) - 1}, got {s.tensor}")
            size = tensors[s.tensor].bytes
            if not 0 <= s.begin < s.end <= size:
                raise BadRequest(f"{where}: [{s.begin}, {s.end}) is not a "
                                 f"byte range of {tensors[s.tensor].name} "
                                 f"({size} bytes)")
            return Segment(s.tensor, s.begin, s.end)

        kept = tuple(segment(s, f"{field}.kept[{i}]")
                     for i, s in enumerate(msg.kept))
        stages = {}
        for stage, items, count in ((1, msg.stage1, msg.stage1_rounds),
                                    (2, msg.stage2, msg.stage2_rounds)):
            if not 0 <= count <= 1 << 20:
                raise BadRequest(f"{field}.stage{stage}_rounds: must be in "
                                 f"0..{1 << 20}, got {count}")
            out, seen = [], set()
            for i, t in enumerate(items):
                w = f"{field}.stage{stage}[{i}]"
                if not 0 <= t.round < count:
                    raise BadRequest(f"{w}.round: must be in 0..{count - 1}, "
                                     f"got {t.round}")
                if out and t.round < out[-1].round:
                    raise BadRequest(f"{w}.round: {t.round} comes after round "
                                     f"{out[-1].round} (rounds in order)")
                if (t.round, t.send) in seen:
                    raise BadRequest(f"{w}: a second {'send' if t.send else 'receive'} "
                                     f"in round {t.round}")
                seen.add((t.round, t.send))
                if not 0 <= t.peer < world_size or t.peer == cluster_rank:
                    raise BadRequest(f"{w}.peer: must be another rank in 0.."
                                     f"{world_size - 1}, got {t.peer}")
                if not t.segments:
                    raise BadRequest(f"{w}.segments: none")
                out.append(Transfer(t.round, t.peer, t.send, tuple(
                    segment(s, f"{w}.segments[{j}]")
                    for j, s in enumerate(t.segments))))
            stages[stage] = tuple(out)
        return RankMigration(msg.rank, msg.world_size, kept, stages,
                             staging)


def cluster_rank(cluster, node: str, local_rank: int) -> int:
    """This GPU's migration rank: its place in the cluster (nodes in order,
    local index inside), -1 when the cluster lacks it."""
    first = 0
    for n in cluster.nodes:
        if n.name == node:
            return first + local_rank if local_rank < n.gpus else -1
        first += n.gpus
    return -1


def cluster_size(cluster) -> int:
    return sum(n.gpus for n in cluster.nodes)


def staging_bytes_option(environ: Mapping[str, str] = os.environ) -> int:
    """The staging size of this engine's migration, in bytes:
    ARACHNE_TORCH_STAGING_BYTES, else the agent's
    ARACHNE_MIGRATION_STAGING_MIB (set when it runs with
    --migration-staging-mib), else 256 MiB. BadRequest naming the variable
    when it is not a whole number in range. Every engine of a switch must
    use the same size (both ends of a transfer cut it alike)."""
    v = environ.get(STAGING_ENV)
    if v is not None and v != "":
        return _integer_option(STAGING_ENV, v, MIN_STAGING_BYTES,
                               MAX_STAGING_BYTES, 1)
    v = environ.get(AGENT_STAGING_ENV)
    if v is not None and v != "":
        return _integer_option(AGENT_STAGING_ENV, v, MIN_STAGING_BYTES >> 20,
                               MAX_STAGING_BYTES >> 20, 1 << 20)
    return DEFAULT_STAGING_BYTES


def _integer_option(name: str, v: str, lo: int, hi: int, unit: int) -> int:
    try:
        n = int(v.strip(), 10)
    except ValueError:
        n = None
    if n is None or not lo <= n <= hi:
        what = "bytes" if unit == 1 else "MiB"
        raise BadRequest(f"{name}: must be an integer in {lo}..{hi} "
                         f"({what}), got \"{v[:64]}\"")
    return n * unit


def check_staging_bytes(n: int) -> int:
    if not isinstance(n, int) or not MIN_STAGING_BYTES <= n <= \
            MAX_STAGING_BYTES:
        raise BadRequest(f"staging_bytes: must be an integer in "
                         f"{MIN_STAGING_BYTES}..{MAX_STAGING_BYTES}, got "
                         f"{n!r}")
    return n


class Checksum:
    """64-bit checksum of a segment's bytes (BLAKE2b), fed in order, in any
    number of pieces: catches corruption and misrouted bytes between two
    ranks of this engine."""

    def __init__(self):
        self._h = hashlib.blake2b(digest_size=8)

    def update(self, data: torch.Tensor) -> "Checksum":
        """`data`: a contiguous uint8 tensor in host memory."""
        self._h.update(memoryview(data.numpy()))
        return self

    def value(self) -> int:
        return int.from_bytes(self._h.digest(), "little")


def segment_checksum(data: torch.Tensor) -> int:
    """The checksum of a contiguous uint8 tensor's bytes."""
    return Checksum().update(data).value()


def _ceil8(n: int) -> int:
    return -(-n // _ALIGN) * _ALIGN


def _split(seg: "Segment", most: int) -> List["Segment"]:
    """`seg` cut into segments of at most `most` bytes (a multiple of 8),
    at canonical byte offsets aligned to 8."""
    out, at = [], seg.begin
    while at < seg.end:
        end = min(seg.end, (at + most) // _ALIGN * _ALIGN)
        if end <= at:
            end = min(seg.end, at + most)
        out.append(Segment(seg.tensor, at, end))
        at = end
    return out


class CanonicalState:
    """A trainer's tensors seen as canonical bytes (the layout's byte
    ranges), read and written in place. Row-parallel weights are kept
    transposed by the trainer; their canonical rows are its columns, so a
    range of them is read and written through strided views. Tensors on a
    CUDA device are read and written through host memory (`staged`: the
    transfers go over Gloo and are checksummed on the host), through the
    caller's buffer."""

    def __init__(self, trainer, staged: Optional[bool] = None):
        self.trainer = trainer
        # tensor id -> (part, split, first canonical byte held, bytes per
        # element)
        self.parts: Dict[int, Tuple[torch.Tensor, str, int, int]] = {}
        for p in trainer.params:
            for k, part in enumerate(p.parts()):
                ts = trainer.tensors[p.ids[k]]
                begin, _ = p.kind_range(ts)
                self.parts[p.ids[k]] = (part, p.split, begin,
                                        st.BYTES_PER_ELEMENT[ts.kind])
        self.scalars_id = trainer.scalars_id
        self.scalars = torch.from_numpy(
            np.asarray(trainer.scalars, dtype="<i8").copy())
        if staged is None:
            staged = any(e[0].device.type != "cpu"
                         for e in self.parts.values())
        self.staged = staged

    def holds(self, seg: Segment) -> bool:
        if seg.tensor == self.scalars_id:
            return seg.end <= 8 * st.NUM_SCALARS
        entry = self.parts.get(seg.tensor)
        if entry is None:
            return False
        part, _, begin, bpe = entry
        return begin <= seg.begin and seg.end <= begin + part.numel() * bpe

    def _elements(self, seg: Segment):
        """The part, its canonical 2-D view (rows of the canonical order)
        and the element range [a, b) covering the segment's bytes, with the
        segment's byte offset inside that range."""
        part, split, begin, bpe = self.parts[seg.tensor]
        lo, hi = seg.begin - begin, seg.end - begin
        a, b = lo // bpe, -(-hi // bpe)
        # Every other part is stored in canonical order: one row.
        view = part.t() if split == "row" else part.view(1, -1)
        return view, a, b, lo - a * bpe

    @staticmethod
    def _pieces(view: torch.Tensor, a: int, b: int):
        """The strided pieces of `view` (2-D, canonical row order) holding
        flat elements [a, b): a partial first row, whole rows, a partial
        last row."""
        cols = view.shape[1]
        r0, c0 = divmod(a, cols)
        r1, c1 = divmod(b, cols)
        if r0 == r1:
            return [view[r0, c0:c1]]
        out = [view[r0, c0:]] if c0 else []
        first_full = r0 + 1 if c0 else r0
        if r1 > first_full:
            out.append(view[first_full:r1])
        if c1:
            out.append(view[r1, :c1])
        return out

    def byte_view(self, seg: Segment) -> Optional[torch.Tensor]:
        """The segment's bytes as a flat uint8 tensor sharing the state's
        memory (read from and written to in place, no copy), or None where
        they are not contiguous in host memory: strided (a row-parallel
        weight's canonical rows) or on a CUDA device."""
        if seg.tensor == self.scalars_id:
            return self.scalars.view(torch.uint8)[seg.begin:seg.end]
        if self.staged:
            return None
        view, a, b, off = self._elements(seg)
        pieces = self._pieces(view, a, b)
        if len(pieces) == 1 and pieces[0].is_contiguous() and \
                pieces[0].device.type == "cpu":
            # Stored in canonical order: a view of the tensor's own bytes.
            return _bytes_of(pieces[0])[off:off + seg.bytes]
        return None

    def read_into(self, seg: Segment, out: torch.Tensor) -> None:
        """Copies the segment's bytes into `out` (uint8, host, seg.bytes
        long). With `out` placed at a byte address congruent to seg.begin
        modulo 8 (as the executor's staging places it), whole elements are
        copied straight from the tensor, strided or on a device; otherwise
        through a temporary of at most a few MiB at a time."""
        v = self.byte_view(seg)
        if v is not None:
            out.copy_(v)
        else:
            self._move(seg, out, to_state=False)

    @torch.no_grad()
    def write_from(self, seg: Segment, data: torch.Tensor) -> None:
        """Writes `data` (uint8, host, seg.bytes long) into the segment in
        place; bytes of a partly covered element keep their other bytes."""
        v = self.byte_view(seg)
        if v is not None:
            v.copy_(data)
        else:
            self._move(seg, data, to_state=True)

    def read(self, seg: Segment) -> torch.Tensor:
        """The segment's bytes, a contiguous uint8 tensor (a view of the
        tensor where it can be, else a copy of the segment)."""
        v = self.byte_view(seg)
        if v is not None:
            return v
        buf = torch.empty(seg.bytes + _ALIGN, dtype=torch.uint8)
        lead = seg.begin % _ALIGN
        out = buf[lead:lead + seg.bytes]
        self._move(seg, out, to_state=False)
        return out

    def write(self, seg: Segment, data: torch.Tensor) -> None:
        self.write_from(seg, data)

    @torch.no_grad()
    def _move(self, seg: Segment, buf: torch.Tensor, to_state: bool) -> None:
        """Copies between the segment and `buf` (its bytes, host uint8):
        a partly covered first and last element through a one-element
        temporary, the whole elements between piece by piece."""
        part, split, begin, bpe = self.parts[seg.tensor]
        view = part.t() if split == "row" else part.view(1, -1)
        cols = view.shape[1]
        lo, hi = seg.begin - begin, seg.end - begin
        a, b = -(-lo // bpe), hi // bpe  # the whole elements

        def element(e):
            r, c = divmod(e, cols)
            return view[r, c:c + 1]
        if lo % bpe:
            e, s = lo // bpe, lo % bpe
            n = min(bpe, hi - e * bpe) - s
            _partial_element(element(e), s, buf[:n], to_state)
        if a < b:
            at = a * bpe - lo
            self._whole(view, a, b, buf[at:at + (b - a) * bpe], to_state)
        if hi % bpe and hi // bpe >= a:
            e = hi // bpe
            at = e * bpe - lo
            _partial_element(element(e), 0, buf[at:at + hi % bpe], to_state)

    def _whole(self, view, a: int, b: int, buf: torch.Tensor,
               to_state: bool) -> None:
        """Whole elements [a, b) of `view` <-> `buf`, their bytes."""
        bpe = view.element_size()
        pieces = self._pieces(view, a, b)
        at = 0
        if buf.storage_offset() % bpe == 0 and buf.data_ptr() % bpe == 0:
            # Aligned: `buf` seen as elements, each piece copied straight
            # (strided, or device to host and back).
            typed = buf.view(view.dtype)
            for p in pieces:
                n = p.numel()
                dst = typed[at:at + n].view(p.shape)
                if to_state:
                    p.copy_(dst)
                else:
                    dst.copy_(p)
                at += n
            return
        most = max(1, _COPY_CHUNK_BYTES // bpe)
        for p in pieces:
            for c in _chunks(p, most):
                n = c.numel() * bpe
                tmp = torch.empty(c.shape, dtype=view.dtype)
                raw = _bytes_of(tmp)
                if to_state:
                    raw.copy_(buf[at:at + n])
                    c.copy_(tmp)
                else:
                    tmp.copy_(c)
                    buf[at:at + n].copy_(raw)
                at += n

    def commit_scalars(self) -> None:
        self.trainer.scalars = self.scalars.tolist()


def _chunks(p: torch.Tensor, most: int):
    """`p` (a 1-D or 2-D view) in canonical order, as views of at most
    `most` elements (a row at least, or part of one)."""
    if p.dim() == 1:
        for i in range(0, p.shape[0], most):
            yield p[i:i + most]
        return
    rows, cols = p.shape
    if cols > most:
        for r in range(rows):
            for i in range(0, cols, most):
                yield p[r, i:i + most]
        return
    step = most // cols
    for r in range(0, rows, step):
        yield p[r:r + step]


@torch.no_grad()
def _partial_element(el: torch.Tensor, s: int, buf: torch.Tensor,
                     to_state: bool) -> None:
    """Bytes [s, s + len(buf)) of one element (`el`, a 1-element view)
    <-> `buf`; the element's other bytes are kept."""
    tmp = el.cpu().clone()
    raw = _bytes_of(tmp)
    if to_state:
        raw[s:s + buf.numel()].copy_(buf)
        el.copy_(tmp)
    else:
        buf.copy_(raw[s:s + buf.numel()])


def _bytes_of(t: torch.Tensor) -> torch.Tensor:
    """A contiguous tensor's bytes, flat, without a copy."""
    t = t.view(-1)
    if t.dtype == torch.bfloat16:
        t = t.view(torch.int16)
    return torch.from_numpy(t.numpy().view(np.uint8))


# -- the wire: how a transfer travels -----------------------------------------

@dataclasses.dataclass(frozen=True)
class Piece:
    """Bytes [begin, end) of a transfer's segment `segment` (its index),
    at byte `at` of their message."""
    segment: int
    begin: int
    end: int
    at: int

    @property
    def bytes(self) -> int:
        return self.end - self.begin


@dataclasses.dataclass(frozen=True)
class Message:
    """One Gloo message of a transfer. kind "header": the sender's staging
    size (int64), which the receiver checks against its own; "direct": one
    chunk of a large segment, alone; "pack": small segments back to back,
    each at a byte congruent to its canonical offset modulo 8 (the padding
    is zeros); "sums": one int64 checksum per segment."""
    kind: str
    size: int
    pieces: Tuple[Piece, ...] = ()
    # Where a copy of a direct chunk starts past an 8-byte boundary in a
    # staging buffer (its canonical offset modulo 8), so that its whole
    # elements are aligned there.
    lead: int = 0

    @property
    def staging_bytes(self) -> int:
        """The most staging buffer it takes where it must be copied."""
        return _ceil8(self.lead + self.size) \
            if self.kind in ("direct", "pack") else 0


@dataclasses.dataclass(frozen=True)
class WirePlan:
    """A transfer's messages, sub-round by sub-round, in wire order (tag
    order). Each sub-round's direct and packed bytes take at most half the
    staging size together."""
    subrounds: Tuple[Tuple[Message, ...], ...]

    @property
    def messages(self) -> Tuple[Message, ...]:
        return tuple(m for sub in self.subrounds for m in sub)

    def staging_bytes(self, sub: int) -> int:
        return sum(m.staging_bytes for m in self.subrounds[sub])


def plan_wire(t: Transfer, staging_bytes: int) -> WirePlan:
    """How transfer `t` travels with `staging_bytes` of staging: a function
    of its segments and the staging size alone, so both ends (the sender's
    send and the receiver's receive of the same transfer) derive the same
    messages, sizes, order and sub-rounds. Sub-round 0 starts with the
    header, the last ends with the checksums; a segment of at least
    DIRECT_SEGMENT_BYTES goes as direct chunks (one chunk where it fits),
    the smaller ones into the sub-round's pack, which comes after its
    direct chunks. A sub-round's data messages take at most
    staging_bytes // 2 of staging (`Message.staging_bytes`)."""
    half = staging_bytes // 2 // _ALIGN * _ALIGN
    assert half >= 2 * DIRECT_SEGMENT_BYTES, staging_bytes
    subs: List[List[Message]] = [[Message("header", 8)]]
    state = {"used": 0, "pack": [], "pack_size": 0}

    def close_pack():
        if state["pack"]:
            subs[-1].append(Message("pack", state["pack_size"],
                                    tuple(state["pack"])))
        state["pack"], state["pack_size"] = [], 0

    def next_sub():
        close_pack()
        subs.append([])
        state["used"] = 0

    def room() -> int:
        return half - state["used"] - _ceil8(state["pack_size"])

    for k, s in enumerate(t.segments):
        n = s.bytes
        if n < DIRECT_SEGMENT_BYTES:
            size = state["pack_size"]
            at = size + (s.begin - size) % _ALIGN
            if _ceil8(at + n) - _ceil8(size) > room():
                next_sub()
                at = s.begin % _ALIGN
            state["pack"].append(Piece(k, 0, n, at))
            state["pack_size"] = at + n
            continue
        off = 0
        while off < n:
            lead = (s.begin + off) % _ALIGN
            rest = n - off
            if _ceil8(lead + rest) <= room():
                take = rest
            else:
                # Up to the sub-round's room, ending on an aligned byte.
                take = (s.begin + off + room() - lead) // _ALIGN * _ALIGN \
                    - (s.begin + off)
                if take < _MIN_CHUNK_BYTES:
                    next_sub()
                    continue
            subs[-1].append(Message("direct", take,
                                     (Piece(k, off, off + take, 0),), lead))
            state["used"] += _ceil8(lead + take)
            off += take
    close_pack()
    subs[-1].append(Message("sums", 8 * len(t.segments)))
    return WirePlan(tuple(tuple(s) for s in subs))


@dataclasses.dataclass
class StageReport:
    rounds: int = 0
    subrounds: int = 0
    bytes_sent: int = 0
    bytes_received: int = 0
    seconds: float = 0.0
    # The most staging memory allocated at once (both directions), bytes:
    # at most the executor's staging_bytes.
    staging_peak: int = 0


class _Staging:
    """A stage's staging buffers, one each way, grown to what a sub-round
    needs (at most half the staging size each), kept from one sub-round to
    the next."""

    def __init__(self):
        self.bufs = {True: None, False: None}
        self.peak = 0

    def get(self, send: bool, n: int) -> torch.Tensor:
        if self.bufs[send] is None or self.bufs[send].numel() < n:
            self.bufs[send] = None  # the old one goes first
            self.bufs[send] = torch.empty(n, dtype=torch.uint8)
        self.peak = max(self.peak, sum(x.numel() for x in self.bufs.values()
                                       if x is not None))
        return self.bufs[send]


class _Slots:
    """Places a sub-round's copied messages in a staging buffer: each at an
    8-byte boundary plus its lead."""

    def __init__(self, buf: torch.Tensor):
        self.buf, self.pos = buf, 0

    def take(self, m: Message) -> torch.Tensor:
        at = _ceil8(self.pos) + m.lead
        self.pos = at + m.size
        return self.buf[at:at + m.size]


class Executor:
    """Runs one rank's RankMigration over `group` (the migration world's
    Gloo group): from `old` (None for a GPU that joins) into `new` (None
    for a GPU the new plan leaves idle), through at most `staging_bytes` of
    staging (None: the share's, read at Prepare, else
    `staging_bytes_option()`; every rank of the switch must use the
    same)."""

    def __init__(self, share: RankMigration, group,
                 old: Optional[CanonicalState],
                 new: Optional[CanonicalState], tensors, describe_rank,
                 staging_bytes: Optional[int] = None):
        self.share, self.group = share, group
        self.old, self.new, self.tensors = old, new, tensors
        self.describe_rank = describe_rank  # rank -> "node x GPU i"
        if staging_bytes is not None:
            self.staging_bytes = check_staging_bytes(staging_bytes)
        elif share.staging_bytes:
            self.staging_bytes = check_staging_bytes(share.staging_bytes)
        else:
            self.staging_bytes = staging_bytes_option()

    def _where(self, stage, t: Transfer) -> str:
        verb = "send to" if t.send else "receive from"
        return (f"migration stage {stage} round {t.round}: {verb} rank "
                f"{t.peer} ({self.describe_rank(t.peer)})")

    def _seg_name(self, s: Segment) -> str:
        return f"{self.tensors[s.tensor].name} [{s.begin}, {s.end})"

    def copy_kept(self) -> int:
        if not self.share.kept:
            return 0
        if self.old is None or self.new is None:
            raise MigrationError(
                "FAILED_PRECONDITION",
                f"migration: rank {self.share.rank} is told to keep "
                f"{self.share.bytes_kept} bytes but has no "
                f"{'old' if self.old is None else 'new'} state")
        for s in self.share.kept:
            if not self.old.holds(s) or not self.new.holds(s):
                raise MigrationError(
                    "FAILED_PRECONDITION",
                    f"migration: rank {self.share.rank} keeps "
                    f"{self._seg_name(s)}, which its "
                    f"{'old' if not self.old.holds(s) else 'new'} state "
                    "does not hold")
        half = self.staging_bytes // 2 // _ALIGN * _ALIGN
        staging = _Staging()
        with torch.no_grad():
            for s in self.share.kept:
                src, dst = self.old.byte_view(s), self.new.byte_view(s)
                if dst is not None and src is not None:
                    if dst.data_ptr() != src.data_ptr():
                        dst.copy_(src)
                elif src is not None:
                    # Straight from the old tensor's bytes (aligned as
                    # they are in the tensor) into the new, strided.
                    self.new.write_from(s, src)
                elif dst is not None:
                    self.old.read_into(s, dst)
                else:
                    # Both strided or on a device: through one buffer of at
                    # most half the staging size.
                    for c in _split(s, half - _ALIGN):
                        lead = c.begin % _ALIGN
                        slot = staging.get(True, lead + c.bytes)[
                            lead:lead + c.bytes]
                        self.old.read_into(c, slot)
                        self.new.write_from(c, slot)
                        del slot
        return self.share.bytes_kept

    def _check(self, stage, t: Transfer) -> None:
        if t.send:
            if self.old is None:
                raise MigrationError(
                    "FAILED_PRECONDITION",
                    f"{self._where(stage, t)}: this GPU held nothing under "
                    "the old plan")
            for s in t.segments:
                if not self.old.holds(s):
                    raise MigrationError(
                        "FAILED_PRECONDITION",
                        f"{self._where(stage, t)}: the old state does not "
                        f"hold {self._seg_name(s)}")
        else:
            if self.new is None:
                raise MigrationError(
                    "FAILED_PRECONDITION",
                    f"{self._where(stage, t)}: this GPU holds nothing under "
                    "the new plan")
            for s in t.segments:
                if not self.new.holds(s):
                    raise MigrationError(
                        "FAILED_PRECONDITION",
                        f"{self._where(stage, t)}: the new state does not "
                        f"hold {self._seg_name(s)}")

    def _first_tags(self, stage: int, transfers, plans) -> List[int]:
        """Each transfer's first tag: the stage's base plus the messages of
        the same direction with the same peer before it in the stage, which
        both ends count alike."""
        count: Dict[Tuple[bool, int], int] = {}
        out = []
        for t, p in zip(transfers, plans):
            key = (t.send, t.peer)
            first = count.get(key, 0)
            count[key] = first + len(p.messages)
            if count[key] > _TAGS_PER_STAGE:
                raise MigrationError(
                    "FAILED_PRECONDITION",
                    f"{self._where(stage, t)}: more than {_TAGS_PER_STAGE} "
                    "messages with one peer in a stage")
            out.append(_STAGE_TAG_BASE[stage] + first)
        return out

    def run_stage(self, stage: int, round_timeout_s: float) -> StageReport:
        report = StageReport()
        start = time.monotonic()
        transfers = self.share.stages[stage]
        plans = [plan_wire(t, self.staging_bytes) for t in transfers]
        tags = self._first_tags(stage, transfers, plans)
        staging = _Staging()
        i = 0
        while i < len(transfers):
            # One round: this rank's send and / or receive.
            rnd = transfers[i].round
            out = inn = None
            while i < len(transfers) and transfers[i].round == rnd:
                x = (transfers[i], plans[i], tags[i])
                if transfers[i].send:
                    out = x
                else:
                    inn = x
                i += 1
            for x in (out, inn):
                if x is not None:
                    self._check(stage, x[0])
            report.subrounds += self._round(stage, out, inn, staging,
                                            round_timeout_s)
            if out is not None:
                report.bytes_sent += out[0].bytes
            if inn is not None:
                report.bytes_received += inn[0].bytes
            report.rounds += 1
        report.staging_peak = staging.peak
        report.seconds = time.monotonic() - start
        return report

    def _round(self, stage, out, inn, staging: _Staging,
               round_timeout_s: float) -> int:
        """One round, sub-round by sub-round: sub-round k posts every
        message of sub-round k of the send and of the receive, then waits
        for all of them (each sub-round within the round timeout). Returns
        the sub-rounds."""
        sums_out = [Checksum() for _ in out[0].segments] if out else []
        sums_in = [Checksum() for _ in inn[0].segments] if inn else []
        subs = max(len(x[1].subrounds) for x in (out, inn) if x is not None)
        next_tag = {True: out[2] if out else 0, False: inn[2] if inn else 0}
        for k in range(subs):
            # A call of its own: nothing refers to a staging buffer between
            # sub-rounds, so a growing one is freed before the next.
            self._subround(stage, k, subs, out, inn, staging, sums_out,
                           sums_in, next_tag, round_timeout_s)
        return subs

    def _subround(self, stage, k, subs, out, inn, staging: _Staging,
                  sums_out, sums_in, next_tag, round_timeout_s) -> None:
        works, landed, expect = [], [], None
        if inn is not None and k < len(inn[1].subrounds):
            t, plan, _ = inn
            views = self._views(self.new, t, plan.subrounds[k])
            slots = self._slots(staging, False, plan.subrounds[k], views)
            for m, view in zip(plan.subrounds[k], views):
                tag = next_tag[False]
                next_tag[False] += 1
                then = None
                if m.kind == "header":
                    buf = torch.zeros(1, dtype=torch.int64)
                    then = self._header_check(stage, t, buf)
                elif m.kind == "sums":
                    expect = buf = torch.zeros(len(t.segments),
                                               dtype=torch.int64)
                elif view is not None:
                    buf = view  # received in place
                    landed.append((m, None))
                else:
                    buf = slots.take(m)
                    landed.append((m, buf))
                works.append((t, self.group.recv([buf], t.peer, tag), then))
        if out is not None and k < len(out[1].subrounds):
            t, plan, _ = out
            views = self._views(self.old, t, plan.subrounds[k])
            slots = self._slots(staging, True, plan.subrounds[k], views)
            sent = []
            for m, view in zip(plan.subrounds[k], views):
                tag = next_tag[True]
                next_tag[True] += 1
                if m.kind == "header":
                    buf = torch.tensor([self.staging_bytes],
                                       dtype=torch.int64)
                elif m.kind == "sums":
                    # The last message: every segment's bytes are
                    # checksummed once this sub-round's are.
                    self._checksum(sent, sums_out)
                    sent = []
                    buf = torch.tensor(np.asarray(
                        [c.value() for c in sums_out],
                        dtype=np.uint64).view(np.int64))
                else:
                    if view is not None:
                        buf = view  # sent from the tensor itself
                    else:
                        buf = slots.take(m)
                        self._fill(t, m, buf)
                    sent.append((m, buf))
                works.append((t, self.group.send([buf], t.peer, tag), None))
            # While the bytes travel: their checksums.
            self._checksum(sent, sums_out)
        self._wait(stage, works, round_timeout_s, k, subs)
        if inn is not None:
            self._land(inn[0], landed, sums_in)
        if expect is not None:
            self._verify(stage, inn[0], sums_in, expect)

    def _views(self, state: CanonicalState, t: Transfer, sub):
        """Per message of a sub-round: the state's own bytes for a direct
        chunk contiguous in host memory (sent or received in place), else
        None."""
        return [state.byte_view(self._sub(t, m.pieces[0]))
                if m.kind == "direct" else None for m in sub]

    @staticmethod
    def _slots(staging: _Staging, send: bool, sub, views) -> _Slots:
        """The staging for a sub-round's messages that are copied: packs
        and the direct chunks not in place."""
        need = sum(m.staging_bytes for m, v in zip(sub, views)
                   if v is None)
        return _Slots(staging.get(send, need) if need else None)

    def _header_check(self, stage, t: Transfer, header: torch.Tensor):
        """Run as soon as the header is in, before any message sized by a
        different staging could fail the round less clearly."""
        def check():
            if int(header[0]) != self.staging_bytes:
                raise MigrationError(
                    "FAILED_PRECONDITION",
                    f"{self._where(stage, t)}: rank {t.peer} stages "
                    f"{int(header[0])} bytes, this rank "
                    f"{self.staging_bytes}: every engine of a switch must "
                    f"use the same staging size ({STAGING_ENV} or "
                    f"{AGENT_STAGING_ENV})")
        return check

    @staticmethod
    def _sub(t: Transfer, p: Piece) -> Segment:
        s = t.segments[p.segment]
        return Segment(s.tensor, s.begin + p.begin, s.begin + p.end)

    def _fill(self, t: Transfer, m: Message, buf: torch.Tensor) -> None:
        """A copied message's bytes from the old state (a pack's padding
        zeroed)."""
        at = 0
        for p in m.pieces:
            if p.at > at:
                buf[at:p.at].zero_()
            self.old.read_into(self._sub(t, p), buf[p.at:p.at + p.bytes])
            at = p.at + p.bytes

    @staticmethod
    def _checksum(sent, sums: List[Checksum]) -> None:
        for m, buf in sent:
            for p in m.pieces:
                sums[p.segment].update(buf[p.at:p.at + p.bytes])

    def _land(self, t: Transfer, landed, sums: List[Checksum]) -> None:
        """Received messages into the new state; each piece checksummed
        where it landed: a direct chunk received in place as it is, a
        copied one read back from the new state after it is written."""
        for m, buf in landed:
            for p in m.pieces:
                seg = self._sub(t, p)
                if buf is None:
                    sums[p.segment].update(self.new.byte_view(seg))
                    continue
                data = buf[p.at:p.at + p.bytes]
                self.new.write_from(seg, data)
                v = self.new.byte_view(seg)
                if v is None:
                    self.new.read_into(seg, data)
                    v = data
                sums[p.segment].update(v)

    def _verify(self, stage, t: Transfer, sums: List[Checksum],
                expect: torch.Tensor) -> None:
        want = expect.numpy().view(np.uint64)
        for j, s in enumerate(t.segments):
            got = sums[j].value()
            if got != int(want[j]):
                raise MigrationError(
                    "DATA_LOSS",
                    f"{self._where(stage, t)}: {self._seg_name(s)} fails its "
                    f"checksum where it landed ({got:016x}, the sender's "
                    f"{int(want[j]):016x})")

    def _wait(self, stage, works, round_timeout_s: float, k: int,
              subs: int) -> None:
        deadline = time.monotonic() + round_timeout_s
        of = f", sub-round {k + 1} of {subs}" if subs > 1 else ""
        for t, w, then in works:
            left = deadline - time.monotonic()
            try:
                ok = w.wait(datetime.timedelta(seconds=max(left, 0.001)))
            except RuntimeError as e:
                text = str(e).split("\n", 1)[0]
                code = "DEADLINE_EXCEEDED" if "imeout" in text or \
                    "imed out" in text else "UNAVAILABLE"
                raise MigrationError(
                    code, f"{self._where(stage, t)}: {text} (round "
                    f"timeout {round_timeout_s:g}s{of})") from e
            if ok is False:
                raise MigrationError(
                    "DEADLINE_EXCEEDED",
                    f"{self._where(stage, t)}: not done within the round "
                    f"timeout ({round_timeout_s:g}s{of})")
            if then is not None:
                then()
