"""Live migration inside the engine: this rank's share of the switch's one
deterministic schedule (PrepareRequest.migration, computed by the agent with
the C++ migration library), executed over a Gloo group of every GPU of the
new cluster (its migration world, cluster order) that the ranks build at
Prepare under "arachne/g<N>/migration".

As the C++ executor (migration/core/executor.h): the bytes a rank keeps are
copied locally from its old state into its new; then stage by stage, round by
round, every rank sends the transfers whose sender it is and receives those
whose receiver it is (at most one of each per round, so both ends know their
peer and size in advance and nothing can deadlock). A transfer is one message
of its segments packed back to back, then one message of per-segment
checksums computed by the sender over its own bytes; the receiver verifies
each segment where it landed. Reads come from the old trainer's tensors and
writes go into the new trainer's tensors in place, in the canonical layout
(migration/core/state_layout.h): only the new state is ever written, so a
failed round leaves the old state whole and the switch can abort back to it.
"""

from __future__ import annotations

import dataclasses
import datetime
import hashlib
import time
from typing import Dict, List, Optional, Tuple

import numpy as np
import torch

from arachne_torch import state as st
from arachne_torch.job import BadRequest

# Gloo tags: one pair per transfer, unique within a generation's group.
_TAGS_PER_ROUND = 2
_STAGE_TAG_BASE = {1: 0, 2: 1 << 24}


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

    @property
    def bytes_kept(self) -> int:
        return sum(s.bytes for s in self.kept)

    def bytes_moved(self, send: bool) -> int:
        return sum(t.bytes for s in (1, 2) for t in self.stages[s]
                   if t.send == send)

    @staticmethod
    def from_proto(msg, tensors: List[st.StateTensor], cluster_rank: int,
                   world_size: int,
                   field: str = "migration") -> "RankMigration":
        """Reads and checks it: this GPU's rank and the world's size as the
        cluster gives them, every segment a byte range of a tensor, rounds in
        order with at most one send and one receive each."""
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
        return RankMigration(msg.rank, msg.world_size, kept, stages)


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


def segment_checksum(data: torch.Tensor) -> int:
    """64-bit checksum of a byte tensor (BLAKE2b): catches corruption and
    misrouted bytes between two ranks of this engine."""
    return int.from_bytes(hashlib.blake2b(
        memoryview(data.numpy()), digest_size=8).digest(), "little")


class CanonicalState:
    """A trainer's tensors seen as canonical bytes (the layout's byte
    ranges), read and written in place. Row-parallel weights are kept
    transposed by the trainer; their canonical rows are its columns, so a
    range of them is read and written through strided views. Tensors on a
    CUDA device are read and written through host memory (`staged`: the
    transfers go over Gloo and are checksummed on the host), one segment at
    a time."""

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

    def read(self, seg: Segment) -> torch.Tensor:
        """The segment's bytes, a contiguous uint8 tensor."""
        if seg.tensor == self.scalars_id:
            return self.scalars.view(torch.uint8)[seg.begin:seg.end]
        view, a, b, off = self._elements(seg)
        pieces = self._pieces(view, a, b)
        if self.staged:
            flat = torch.cat([p.reshape(-1) for p in pieces]).cpu()
            return _bytes_of(flat)[off:off + seg.bytes]
        if len(pieces) == 1 and pieces[0].is_contiguous():
            # Stored in canonical order: a view of the tensor's own bytes.
            return _bytes_of(pieces[0])[off:off + seg.bytes]
        flat = torch.cat([p.reshape(-1) for p in pieces])
        return _bytes_of(flat)[off:off + seg.bytes]

    @torch.no_grad()
    def write(self, seg: Segment, data: torch.Tensor) -> None:
        """Writes `data` (uint8, seg.bytes long) into the segment in place;
        bytes of a partly covered element keep their other bytes."""
        if seg.tensor == self.scalars_id:
            self.scalars.view(torch.uint8)[seg.begin:seg.end].copy_(data)
            return
        view, a, b, off = self._elements(seg)
        pieces = self._pieces(view, a, b)
        if not self.staged and len(pieces) == 1 and \
                pieces[0].is_contiguous():
            # Stored in canonical order: the bytes go straight in.
            _bytes_of(pieces[0])[off:off + seg.bytes].copy_(data)
            return
        # The covered elements in host memory (read back first when the
        # segment covers an element partly), the bytes written there, then
        # copied into place.
        flat = torch.cat([p.reshape(-1) for p in pieces]).cpu() \
            if (off or seg.bytes % self.parts[seg.tensor][3]) else \
            torch.empty(b - a, dtype=view.dtype)
        raw = _bytes_of(flat)
        raw[off:off + seg.bytes].copy_(data)
        at = 0
        for p in pieces:
            n = p.numel()
            p.copy_(flat[at:at + n].view(p.shape))
            at += n

    def commit_scalars(self) -> None:
        self.trainer.scalars = self.scalars.tolist()


def _bytes_of(t: torch.Tensor) -> torch.Tensor:
    """A contiguous tensor's bytes, flat, without a copy."""
    t = t.view(-1)
    if t.dtype == torch.bfloat16:
        t = t.view(torch.int16)
    return torch.from_numpy(t.numpy().view(np.uint8))


@dataclasses.dataclass
class StageReport:
    rounds: int = 0
    bytes_sent: int = 0
    bytes_received: int = 0
    seconds: float = 0.0


class Executor:
    """Runs one rank's RankMigration over `group` (the migration world's
    Gloo group): from `old` (None for a GPU that joins) into `new` (None
    for a GPU the new plan leaves idle)."""

    def __init__(self, share: RankMigration, group,
                 old: Optional[CanonicalState],
                 new: Optional[CanonicalState], tensors, describe_rank):
        self.share, self.group = share, group
        self.old, self.new, self.tensors = old, new, tensors
        self.describe_rank = describe_rank  # rank -> "node x GPU i"

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
            self.new.write(s, self.old.read(s))
        return self.share.bytes_kept

    def run_stage(self, stage: int, round_timeout_s: float) -> StageReport:
        report = StageReport()
        start = time.monotonic()
        transfers = self.share.stages[stage]
        base = _STAGE_TAG_BASE[stage]
        i = 0
        while i < len(transfers):
            # One round: this rank's send and / or receive, posted together.
            rnd = transfers[i].round
            batch = []
            while i < len(transfers) and transfers[i].round == rnd:
                batch.append(transfers[i])
                i += 1
            tag = base + rnd * _TAGS_PER_ROUND
            works, recvs = [], []
            for t in sorted(batch, key=lambda t: not t.send):
                if t.send:
                    payload, sums = self._pack(stage, t)
                    works.append((t, self.group.send([payload], t.peer, tag)))
                    works.append((t, self.group.send([sums], t.peer, tag + 1)))
                    report.bytes_sent += t.bytes
                else:
                    if self.new is None:
                        raise MigrationError(
                            "FAILED_PRECONDITION",
                            f"{self._where(stage, t)}: this GPU holds nothing "
                            "under the new plan")
                    payload = torch.empty(t.bytes, dtype=torch.uint8)
                    sums = torch.empty(len(t.segments), dtype=torch.int64)
                    works.append((t, self.group.recv([payload], t.peer, tag)))
                    works.append((t, self.group.recv([sums], t.peer,
                                                     tag + 1)))
                    recvs.append((t, payload, sums))
            deadline = time.monotonic() + round_timeout_s
            for t, w in works:
                left = deadline - time.monotonic()
                try:
                    ok = w.wait(datetime.timedelta(seconds=max(left, 0.001)))
                except RuntimeError as e:
                    text = str(e).split("\n", 1)[0]
                    code = "DEADLINE_EXCEEDED" if "imeout" in text or \
                        "imed out" in text else "UNAVAILABLE"
                    raise MigrationError(
                        code, f"{self._where(stage, t)}: {text} (round "
                        f"timeout {round_timeout_s:g}s)") from e
                if ok is False:
                    raise MigrationError(
                        "DEADLINE_EXCEEDED",
                        f"{self._where(stage, t)}: not done within the round "
                        f"timeout ({round_timeout_s:g}s)")
            for t, payload, sums in recvs:
                self._unpack(stage, t, payload, sums)
                report.bytes_received += t.bytes
            report.rounds += 1
        report.seconds = time.monotonic() - start
        return report

    def _pack(self, stage, t: Transfer):
        if self.old is None:
            raise MigrationError(
                "FAILED_PRECONDITION",
                f"{self._where(stage, t)}: this GPU held nothing under the "
                "old plan")
        pieces, sums = [], []
        for s in t.segments:
            if not self.old.holds(s):
                raise MigrationError(
                    "FAILED_PRECONDITION",
                    f"{self._where(stage, t)}: the old state does not hold "
                    f"{self._seg_name(s)}")
            b = self.old.read(s)
            pieces.append(b)
            sums.append(segment_checksum(b))
        payload = pieces[0].clone() if len(pieces) == 1 else torch.cat(pieces)
        return payload, torch.tensor(np.asarray(sums, dtype=np.uint64).view(
            np.int64))

    def _unpack(self, stage, t: Transfer, payload, sums) -> None:
        at = 0
        expect = sums.numpy().view(np.uint64)
        for j, s in enumerate(t.segments):
            if not self.new.holds(s):
                raise MigrationError(
                    "FAILED_PRECONDITION",
                    f"{self._where(stage, t)}: the new state does not hold "
                    f"{self._seg_name(s)}")
            data = payload[at:at + s.bytes]
            self.new.write(s, data)
            landed = self.new.read(s)
            got = segment_checksum(landed)
            if got != int(expect[j]):
                raise MigrationError(
                    "DATA_LOSS",
                    f"{self._where(stage, t)}: {self._seg_name(s)} fails its "
                    f"checksum where it landed ({got:016x}, the sender's "
                    f"{int(expect[j]):016x})")
            at += s.bytes
