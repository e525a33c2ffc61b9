"""One rank's training: a LLaMA-shaped decoder (RMSNorm, rotary attention
with grouped KV heads, SwiGLU MLP or MoE block, untied head) under any plan
the planner returns, with the mathematics of the reference engine
(worker_agent/engine/reference_engine.h), so both engines give the same
losses from the same state:

- pipeline stages on the 1F1B schedule, activations and their gradients
  sent point to point between stages of any TP degrees;
- Megatron tensor parallelism: column-parallel q/k/v/gate/up and LM head,
  row-parallel o/down, a vocabulary-parallel embedding;
- gradients summed over every rank (of any template) that holds a
  parameter, in the canonical layout, so replicas of different TP degrees
  and layer splits reduce together;
- MoE blocks under any expert tiling EP x ETP x EDP: each replica routes
  its tokens, the stage's expert group computes every (token, expert, ETP
  slice) exactly once and sums the outputs back;
- the global batch cut into the plan's micro-batches by sample index, and
  the loss scaled by the global token count.

The optimizer keeps fp32 master weights; the bf16 weight of the layout is
their rounding after each step. A rank computes on its device in its
precision (arachne_torch.device): fp32 on the master weights (the CPU's
default, the reference engine's mathematics), or mixed precision, every
matrix multiply in bf16 (on the layout's bf16 weight itself) or fp16 (with
dynamic loss scaling) and norms, softmax, the loss and the residual stream
in fp32, the gradients reaching the fp32 masters. Collectives are c10d
groups made through the job's TCPStore under "arachne/g<N>/<group>", as the
reference engine names them: Gloo on the CPU; on a CUDA device NCCL for the
tensor-, expert- and data-parallel groups, while the pipeline's
point-to-point messages and the iteration's last scalar reduction go over
the Gloo "world" group through host memory (Gloo's tags keep the 1F1B
order's sends and receives apart; NCCL's unbatched point-to-point would
match them by issue order and can deadlock).
"""

from __future__ import annotations

import dataclasses
import datetime
import math
import time
from typing import Dict, List, Optional, Tuple

import numpy as np
import torch
import torch.distributed as dist
import torch.nn.functional as F

from arachne_torch import state as st
from arachne_torch.corpus import make_corpus, splitmix64
from arachne_torch.device import COMPUTE_DTYPES, LossScale
from arachne_torch.job import Job, Plan
from arachne_torch.layout import Layout

INIT_STD = 0.02
NORM_EPS = 1e-5
ROPE_THETA = 10000.0

_KIND_INDEX = {"weight": 0, "master": 1, "adam_m": 2, "adam_v": 3}


class TrainingError(RuntimeError):
    """An iteration or a build failed (a peer went away, a timeout):
    UNAVAILABLE on the wire; the state is that of the last completed
    iteration (the optimizer step comes after the last collective)."""


# Every collective and point-to-point wait of an iteration gives up after
# this, as the reference engine's (NodeGpus::collective_timeout): when a peer
# dies or stops mid-iteration, this rank's iteration fails within it, well
# inside a Pause's phase timeout, and the rank holds the state of its last
# completed iteration (the optimizer step comes after the last collective).
# Building the groups keeps its own, longer timeout (Prepare's rendezvous).
COLLECTIVE_TIMEOUT = datetime.timedelta(seconds=10)


# ---------------------------------------------------------------------------
# Collectives with autograd (Megatron's f and g, the vocabulary gather, the
# expert dispatch and combine).

def _gloo_16bit(t: torch.Tensor) -> bool:
    # Gloo has no bf16 / fp16 reductions: such tensors on the CPU go through
    # fp32 (exact for the gathers, summed in fp32 for the reductions).
    return t.device.type == "cpu" and t.dtype in (torch.bfloat16,
                                                  torch.float16)


def _all_reduce(group, t: torch.Tensor) -> None:
    if _gloo_16bit(t):
        w = t.float()
        group.allreduce([w]).wait(COLLECTIVE_TIMEOUT)
        t.copy_(w)
        return
    group.allreduce([t]).wait(COLLECTIVE_TIMEOUT)


def _all_gather(group, x: torch.Tensor, size: int) -> List[torch.Tensor]:
    x = x.contiguous()
    w = x.float() if _gloo_16bit(x) else x
    out = [torch.empty_like(w) for _ in range(size)]
    group.allgather([out], [w]).wait(COLLECTIVE_TIMEOUT)
    return [o.to(x.dtype) for o in out] if w is not x else out


class _CopyToTp(torch.autograd.Function):
    """Identity forward, all-reduce of the gradient backward."""

    @staticmethod
    def forward(ctx, x, group):
        ctx.group = group
        return x.clone()

    @staticmethod
    def backward(ctx, g):
        g = g.contiguous().clone()
        _all_reduce(ctx.group, g)
        return g, None


class _ReduceFromTp(torch.autograd.Function):
    """All-reduce forward, identity backward."""

    @staticmethod
    def forward(ctx, x, group):
        y = x.contiguous().clone()
        _all_reduce(group, y)
        return y

    @staticmethod
    def backward(ctx, g):
        return g, None


class _GatherFromTp(torch.autograd.Function):
    """All-gather along the last dimension forward, this rank's slice of
    the gradient backward."""

    @staticmethod
    def forward(ctx, x, group, rank, size):
        ctx.rank, ctx.local = rank, x.size(-1)
        return torch.cat(_all_gather(group, x, size), -1)

    @staticmethod
    def backward(ctx, g):
        return (g.narrow(-1, ctx.rank * ctx.local, ctx.local).contiguous(),
                None, None, None)


@dataclasses.dataclass
class _ExpertGroup:
    group: object
    tp: int
    replicas: int
    replica: int

    def gather_replicas(self, x: torch.Tensor) -> List[torch.Tensor]:
        out = _all_gather(self.group, x, self.tp * self.replicas)
        return [out[r * self.tp] for r in range(self.replicas)]


class _GatherTokens(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x, info: _ExpertGroup):
        ctx.info = info
        return torch.cat(info.gather_replicas(x), 0)

    @staticmethod
    def backward(ctx, g):
        info = ctx.info
        g = g.contiguous().clone()
        _all_reduce(info.group, g)
        n = g.size(0) // info.replicas
        return g.narrow(0, info.replica * n, n).contiguous(), None


class _CombineTokens(torch.autograd.Function):
    @staticmethod
    def forward(ctx, y, info: _ExpertGroup):
        ctx.info = info
        s = y.contiguous().clone()
        _all_reduce(info.group, s)
        n = s.size(0) // info.replicas
        return s.narrow(0, info.replica * n, n).contiguous()

    @staticmethod
    def backward(ctx, g):
        return torch.cat(ctx.info.gather_replicas(g), 0), None


class _LowPrecisionWeight(torch.autograd.Function):
    """The 16-bit copy `low` of fp32 master `master` forward (the values
    are master's rounding), its gradient into the master backward, in fp32:
    the mixed-precision matrix multiplies read the low copy, the optimizer
    steps the master."""

    @staticmethod
    def forward(ctx, master, low):
        return low.view_as(low)

    @staticmethod
    def backward(ctx, g):
        return g.to(torch.float32), None


# ---------------------------------------------------------------------------
# Parameters.

def _name_hash(s: str) -> int:
    h = 1469598103934665603
    for c in s.encode():
        h = ((h ^ c) * 1099511628211) & ((1 << 64) - 1)
    return h


def initial_values(seed: int, name: str, first: int, count: int,
                   std: float) -> np.ndarray:
    """Elements first..first+count-1 (canonical order) of parameter `name`'s
    initial value: a normal draw from (seed, name, j), so every plan starts
    from the same weights whatever shard a rank holds."""
    j = np.arange(first, first + count, dtype=np.uint64)
    with np.errstate(over="ignore"):
        a = splitmix64(np.uint64(seed ^ _name_hash(name)) ^ (j * np.uint64(2)))
        b = splitmix64(a + np.uint64(0x632BE59BD9B4E019))
    u1 = ((a >> np.uint64(11)).astype(np.float64) + 1.0) * \
        (1.0 / 9007199254740993.0)
    u2 = (b >> np.uint64(11)).astype(np.float64) * (1.0 / 9007199254740992.0)
    return (std * np.sqrt(-2.0 * np.log(u1)) *
            np.cos(2.0 * np.pi * u2)).astype(np.float32)


@dataclasses.dataclass
class _Param:
    name: str
    split: str
    ids: List[int]                 # tensor ids: weight, master, adam_m, adam_v
    begin: int                     # canonical bytes of the master shard
    end: int
    canonical_shape: Tuple[int, ...]
    master: torch.Tensor           # engine layout, requires_grad
    weight: torch.Tensor           # bf16 rounding of master
    adam_m: torch.Tensor
    adam_v: torch.Tensor
    # The elements of the shard (canonical order, from its first) this rank
    # counts in the gradient's global norm (_owned_elements).
    owned: List[Tuple[int, int]] = dataclasses.field(default_factory=list)
    # fp16 compute: the iteration's fp16 rounding of master (the canonical
    # weight stays bf16).
    half: Optional[torch.Tensor] = None

    def swap(self, t: torch.Tensor) -> torch.Tensor:
        """Engine layout <-> canonical: row-parallel weights are kept
        transposed, so the conversion is its own inverse."""
        return t.t() if self.split == "row" else t

    def kind_range(self, tensor: st.StateTensor) -> Tuple[int, int]:
        if self.split == "replicated":
            return 0, tensor.bytes
        bpe = st.BYTES_PER_ELEMENT[tensor.kind]
        return self.begin // 4 * bpe, self.end // 4 * bpe

    def parts(self) -> List[torch.Tensor]:
        return [self.weight, self.master.detach(), self.adam_m, self.adam_v]


def _owned_elements(layout: Layout, me: int, tensor: int, begin: int,
                    end: int) -> List[Tuple[int, int]]:
    """The elements of canonical bytes [begin, end) of fp32 tensor `tensor`
    (plan rank `me`'s holding) that no lower plan rank holds, as [b, e)
    element offsets from `begin`: every canonical element of the model
    belongs to exactly one rank, so the ranks' sums of squared gradients over
    what they own add up to the whole model's, counted once, under every
    plan. The reference engine owns by the same rule (OwnedElements)."""
    lower = []
    for g in range(me):
        for h in layout.ranks[g].holdings:
            if h.tensor == tensor:
                b, e = max(h.begin, begin), min(h.end, end)
                if b < e:
                    lower.append((b, e))
    lower.sort()
    out, at = [], begin
    for b, e in lower:
        if b > at:
            out.append((at, b))
        at = max(at, e)
    if at < end:
        out.append((at, end))
    return [((b - begin) // 4, (e - begin) // 4) for b, e in out]


@dataclasses.dataclass
class _GradGroup:
    members: Tuple[int, ...]
    params: List[int]
    offsets: List[int]
    elements: int
    group: object = None


@dataclasses.dataclass
class IterationResult:
    iteration: int
    loss: float
    stop_agreed: bool
    seconds: float
    tokens: int
    skipped: bool = False  # fp16: the step overflowed and was skipped


def parse_store_address(address: str) -> Tuple[str, int]:
    host, _, port = address.rpartition(":")
    if not host or not port.isdigit() or not 1 <= int(port) <= 65535:
        from arachne_torch.job import BadRequest
        raise BadRequest("store_address: must be host:port with a port in "
                         f"[1, 65535], got \"{address[:128]}\"")
    return host, int(port)


def generation_prefix(generation: int) -> str:
    return f"arachne/g{generation}"


def open_job_store(store_address: str, prefix: str,
                   timeout_s: float) -> "dist.Store":
    """A client of the job's TCPStore, under `prefix`."""
    host, port = parse_store_address(store_address)
    tcp = dist.TCPStore(host, port, None, False,
                        datetime.timedelta(seconds=max(timeout_s, 60)), False)
    return dist.PrefixStore(prefix, tcp)


def gloo_group(store, name: str, rank: int, size: int, device,
               timeout_s: float) -> "dist.ProcessGroupGloo":
    """A Gloo group of `size` ranks meeting under `name` in `store`; blocks
    until all have joined (RuntimeError after timeout_s)."""
    opts = dist.ProcessGroupGloo._Options()
    opts._timeout = datetime.timedelta(seconds=timeout_s)
    opts._devices = [device]
    opts._threads = 1
    return dist.ProcessGroupGloo(dist.PrefixStore(name, store), rank, size,
                                 opts)


def nccl_group(store, name: str, rank: int, size: int,
               timeout_s: float):
    """An NCCL group of `size` ranks under `name` in `store`, for tensors
    on the current CUDA device. NCCL builds its communicator at the group's
    first collective, where the ranks meet."""
    opts = dist.ProcessGroupNCCL.Options()
    opts._timeout = datetime.timedelta(seconds=timeout_s)
    return dist.ProcessGroupNCCL(dist.PrefixStore(name, store), rank, size,
                                 opts)


def collective_backend(device: torch.device) -> str:
    """The backend of a plan's tensor-, expert- and data-parallel groups:
    NCCL for a CUDA device, Gloo for the CPU."""
    return "nccl" if device.type == "cuda" else "gloo"


class ComputePacer:
    """A virtual GPU slower than the CPU rank that stands in for it: each
    compute step (a micro-batch's forward or backward, the optimizer step)
    is held to 1 / speed times the CPU time the thread spent in it, the rest
    slept out. The CPU time, not the wall time, is scaled, so a step
    stretched by other processes on the same cores is not stretched again
    (the C++ engine's compute_pacer.h). Communication is not slowed."""

    def __init__(self, speed: float = 1.0, clock=time.monotonic,
                 cpu_clock=time.thread_time, sleep=time.sleep):
        if not 0 < speed <= 1:
            raise ValueError(f"virtual GPU speed must be in (0, 1], got "
                             f"{speed}")
        self.speed, self.clock, self.cpu_clock = speed, clock, cpu_clock
        self.sleep = sleep

    def wait_after(self, cpu_s: float, elapsed_s: float) -> float:
        """What is left of cpu_s / speed after elapsed_s, or 0."""
        if self.speed == 1:
            return 0.0
        return max(0.0, cpu_s / self.speed - elapsed_s)

    def start(self):
        return (self.clock(), self.cpu_clock()) if self.speed != 1 else None

    def pace(self, start) -> float:
        """Sleeps wait_after(the step since `start`); returns the sleep."""
        if self.speed == 1:
            return 0.0
        wait = self.wait_after(self.cpu_clock() - start[1],
                               self.clock() - start[0])
        if wait > 0:
            self.sleep(wait)
        return wait


class Trainer:
    """The training state and iterations of one rank of a plan."""

    def __init__(self, job: Job, plan: Plan, tensors: List[st.StateTensor],
                 layout: Layout, plan_rank: int, generation: int,
                 store_address: str, listen_host: str = "127.0.0.1",
                 timeout_s: float = 60.0, initialize: bool = True,
                 virtual_gpu_speed: float = 1.0, device: str = "cpu",
                 precision: str = "fp32"):
        self.job, self.plan, self.tensors = job, plan, tensors
        if precision not in COMPUTE_DTYPES:
            raise ValueError(f"precision: must be one of "
                             f"{', '.join(COMPUTE_DTYPES)}, got {precision!r}")
        self.device = torch.device(device)
        self.precision = precision
        self.dtype = COMPUTE_DTYPES[precision]
        self.low = precision != "fp32"
        if self.device.type == "cuda":
            torch.cuda.set_device(self.device)
        self.pacer = ComputePacer(virtual_gpu_speed)
        self.layout, self.me = layout, plan_rank
        self.role = layout.ranks[plan_rank]
        self.tmpl = plan.templates[self.role.template]
        self.stage = self.tmpl.stages[self.role.stage]
        self.corpus = make_corpus(job)  # BadRequest: a bad token file
        self.params: List[_Param] = []
        self.param_index: Dict[str, int] = {}
        self.scalars = [0] * st.NUM_SCALARS
        self.scalars_id = -1
        self.world = self.tp_group = self.experts = None
        self.grad_groups: List[_GradGroup] = []
        t0 = time.monotonic()
        self._create_params(initialize)
        hd = job.model.head_dim
        inv = torch.pow(ROPE_THETA,
                        -torch.arange(0, hd, 2, dtype=torch.float64) / hd)
        ang = torch.outer(torch.arange(job.training.seq_len,
                                       dtype=torch.float64), inv)
        ang = torch.cat([ang, ang], -1).to(torch.float32)
        self.rope_cos = ang.cos().to(self.device)
        self.rope_sin = ang.sin().to(self.device)
        self.causal = torch.ones(job.training.seq_len, job.training.seq_len,
                                 dtype=torch.bool,
                                 device=self.device).triu(1)
        self.heads_local = job.model.num_heads // self.stage.tp
        self.kv_heads_local = job.model.num_kv_heads // self.stage.tp
        t1 = time.monotonic()
        self._create_groups(generation, store_address, listen_host, timeout_s)
        self.build_seconds = t1 - t0
        self.groups_seconds = time.monotonic() - t1

    # -- building ----------------------------------------------------------

    def _create_params(self, initialize: bool) -> None:
        id_of = {t.name: i for i, t in enumerate(self.tensors)}
        depth_layers = self.job.model.num_layers
        for h in self.role.holdings:
            ts = self.tensors[h.tensor]
            if ts.kind == "scalars":
                self.scalars_id = h.tensor
                continue
            if ts.kind != "master":
                continue
            name = ts.param
            cshape = list(ts.shape)
            if ts.tp_split == "row":
                cshape[0], cshape[1] = cshape[1], cshape[0]
            row_elems = ts.elements // cshape[0]
            cshape[0] = (h.end - h.begin) // 4 // row_elems
            count = (h.end - h.begin) // 4
            if initialize:
                if "norm" in name:
                    canon = np.ones(count, dtype=np.float32)
                else:
                    out_proj = ".attn.o." in name or ".mlp.down." in name
                    std = (INIT_STD / math.sqrt(2.0 * depth_layers)
                           if out_proj else INIT_STD)
                    canon = initial_values(self.job.engine.init_seed, name,
                                           h.begin // 4, count, std)
                canon = torch.from_numpy(canon).reshape(cshape).to(
                    self.device)
            else:
                canon = torch.zeros(cshape, dtype=torch.float32,
                                    device=self.device)
            p = _Param(name, ts.tp_split,
                       [id_of[f"{name}:{k}"] for k in st.PARAM_KINDS],
                       h.begin, h.end, tuple(cshape), None, None, None, None,
                       _owned_elements(self.layout, self.me, h.tensor,
                                       h.begin, h.end))
            p.master = p.swap(canon).contiguous().requires_grad_(True)
            p.weight = p.master.detach().to(torch.bfloat16)
            p.adam_m = torch.zeros_like(p.master.detach())
            p.adam_v = torch.zeros_like(p.master.detach())
            self.param_index[name] = len(self.params)
            self.params.append(p)
        if self.scalars_id < 0:
            raise ValueError(f"the layout gives plan rank {self.me} no "
                             f"{st.TRAIN_STATE_TENSOR}")
        e, t = self.job.engine, self.job.training
        self.scalars = [st.STATE_FORMAT, 0, 0, e.data_seed, e.init_seed,
                        t.global_batch, t.seq_len, 0]
        if self.precision == "fp16":
            self.scalars[st.SCALAR_LOSS_SCALE] = LossScale().encode()

    def _create_groups(self, generation: int, store_address: str,
                       listen_host: str, timeout_s: float) -> None:
        """The plan's groups in one global order (the reference engine's); a
        rank creates those it is in, in that order, so two groups'
        rendezvous never wait on each other."""
        layout, plan, model = self.layout, self.plan, self.job.model
        specs: List[Tuple[str, List[int]]] = [
            ("world", list(range(len(layout.ranks))))]
        for ti, t in enumerate(plan.templates):
            for r in range(t.replicas):
                for s, stage in enumerate(t.stages):
                    if stage.tp == 1:
                        continue
                    specs.append((f"tp/{ti}/{r}/{s}",
                                  [layout.rank_of[(ti, r, s, k)]
                                   for k in range(stage.tp)]))
            for s, stage in enumerate(t.stages):
                if model.moe_layers_in(stage.layer_begin, stage.layer_end) == 0 \
                        or stage.tp * t.replicas == 1:
                    continue
                specs.append((f"experts/{ti}/{s}",
                              [layout.rank_of[(ti, r, s, k)]
                               for r in range(t.replicas)
                               for k in range(stage.tp)]))
        holders: Dict[int, List[int]] = {}
        for g, rank in enumerate(layout.ranks):
            for h in rank.holdings:
                if self.tensors[h.tensor].kind == "master":
                    holders.setdefault(h.tensor, []).append(g)
        by_holders: Dict[Tuple[int, ...], List[int]] = {}
        for tid in sorted(holders):
            by_holders.setdefault(tuple(holders[tid]), []).append(tid)
        dp_names: Dict[Tuple[int, ...], int] = {}
        for gi, (members, ids) in enumerate(sorted(by_holders.items())):
            if self.me in members:
                gg = _GradGroup(members, [], [], 0)
                for tid in ids:
                    gg.params.append(self.param_index[self.tensors[tid].param])
                    gg.offsets.append(gg.elements)
                    gg.elements += self.tensors[tid].elements
                self.grad_groups.append(gg)
            if len(members) > 1:
                specs.append((f"dp/{gi}", list(members)))
                dp_names[members] = gi
        parse_store_address(store_address)
        try:
            base = open_job_store(store_address, generation_prefix(generation),
                                  timeout_s)
            device = dist.ProcessGroupGloo.create_device(hostname=listen_host)
            by_members = {gg.members: gg for gg in self.grad_groups}
            nccl = collective_backend(self.device) == "nccl"
            for name, members in specs:
                if self.me not in members:
                    continue
                if nccl and name != "world":
                    g = nccl_group(base, name, members.index(self.me),
                                   len(members), timeout_s)
                else:
                    g = gloo_group(base, name, members.index(self.me),
                                   len(members), device, timeout_s)
                if name == "world":
                    self.world = g
                elif name.startswith("tp/"):
                    self.tp_group = g
                elif name.startswith("experts/"):
                    self.experts = g
                else:
                    by_members[tuple(members)].group = g
        except RuntimeError as e:
            raise TrainingError(
                f"plan rank {self.me}: building the process groups of "
                f"generation {generation} failed: {_first_line(e)}") from e

    # -- the model ---------------------------------------------------------

    def _p(self, name: str) -> _Param:
        return self.params[self.param_index[name]]

    def _w(self, name: str) -> torch.Tensor:
        return self.params[self.param_index[name]].master

    def _cw(self, name: str) -> torch.Tensor:
        """The weight a matrix multiply reads: the fp32 master, or its
        16-bit copy (bf16: the layout's weight) with the gradient going to
        the master."""
        p = self.params[self.param_index[name]]
        if not self.low:
            return p.master
        return _LowPrecisionWeight.apply(
            p.master, p.weight if self.dtype == torch.bfloat16 else p.half)

    def _lp(self, x):
        return x.to(self.dtype) if self.low else x

    def _linear(self, x, name):
        return torch.matmul(self._lp(x), self._cw(name).t())

    def _rms_norm(self, x, name):
        if self.low:
            x = x.float()
        r = torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + NORM_EPS)
        return x * r * self._w(name)

    def _to_tp(self, x):
        return _CopyToTp.apply(x, self.tp_group) if self.tp_group else x

    def _from_tp(self, x):
        return _ReduceFromTp.apply(x, self.tp_group) if self.tp_group else x

    def _swiglu(self, x, prefix):
        return self._linear(F.silu(self._linear(x, prefix + "gate.weight")) *
                            self._linear(x, prefix + "up.weight"),
                            prefix + "down.weight")

    def _embed(self, tokens):
        e = self._p("embedding.weight")
        rows = e.master.size(0)
        v0 = e.begin // 4 // self.job.model.hidden
        local = tokens - v0
        mine = (local >= 0).logical_and(local < rows)
        x = F.embedding(local.clamp(0, rows - 1), e.master)
        x = x * mine.unsqueeze(-1).to(torch.float32)
        return self._from_tp(x)

    def _block(self, layer, h):
        p = f"layers.{layer}."
        b, s = h.size(0), h.size(1)
        hd = self.job.model.head_dim
        x = self._to_tp(self._rms_norm(h, p + "input_norm.weight"))

        def heads(t, n):
            return t.view(b, s, n, hd).transpose(1, 2)

        def rope(t):
            x1, x2 = t.narrow(-1, 0, hd // 2), t.narrow(-1, hd // 2, hd // 2)
            return t * self.rope_cos + torch.cat([-x2, x1], -1) * self.rope_sin

        q = rope(heads(self._linear(x, p + "attn.q.weight"), self.heads_local))
        k = rope(heads(self._linear(x, p + "attn.k.weight"),
                       self.kv_heads_local))
        v = heads(self._linear(x, p + "attn.v.weight"), self.kv_heads_local)
        group = self.heads_local // self.kv_heads_local
        if group > 1:
            k = k.repeat_interleave(group, 1)
            v = v.repeat_interleave(group, 1)
        if self.low:
            q, k, v = self._lp(q), self._lp(k), self._lp(v)
        scores = torch.matmul(q, k.transpose(-2, -1)) / math.sqrt(hd)
        if self.low:
            scores = scores.float()
        mask = self.causal if s == self.causal.size(0) else \
            torch.ones(s, s, dtype=torch.bool, device=h.device).triu(1)
        scores = scores.masked_fill(mask, float("-inf"))
        a = torch.matmul(self._lp(torch.softmax(scores, -1)), v)
        a = a.transpose(1, 2).reshape(b, s, self.heads_local * hd)
        h = h + self._from_tp(self._linear(a, p + "attn.o.weight"))
        x = self._rms_norm(h, p + "post_norm.weight")
        if self.job.model.is_moe_layer(layer):
            return h + self._moe_mlp(layer, x)
        return h + self._from_tp(self._swiglu(self._to_tp(x), p + "mlp."))

    def _moe_mlp(self, layer, x):
        p = f"layers.{layer}."
        moe = self.job.model.moe
        b, s, h = x.shape
        n = b * s
        out = torch.zeros_like(x)
        for e in range(moe.shared_experts):
            out = out + self._from_tp(self._swiglu(self._to_tp(x),
                                                   f"{p}shared.{e}."))
        xs = x.reshape(n, h)
        logits = self._linear(xs, p + "router.weight")
        top, idx = logits.topk(moe.top_k, -1)
        w = torch.softmax(top, -1)
        # One dispatch of tokens, weights and expert ids together: a single
        # collective per layer keeps every rank's backward in one order.
        # (fp32 whatever the precision: expert ids are exact in it.)
        packed = torch.cat([xs.float(), w.float(),
                            idx.to(torch.float32).detach()], -1)
        replicas = self.tmpl.replicas
        info = _ExpertGroup(self.experts, self.stage.tp, replicas,
                            self.role.replica)
        every = _GatherTokens.apply(packed, info) if self.experts else packed
        X = every.narrow(1, 0, h)
        W = every.narrow(1, h, moe.top_k)
        I = every.narrow(1, h + moe.top_k, moe.top_k).detach().to(torch.int64)
        g = self.role.replica * self.stage.tp + self.role.tp_rank
        edp_rank = g // (self.stage.ep * self.stage.etp)
        # Zero terms tie y to X and W on every rank, so each rank's backward
        # runs the same collectives even when no token picked its experts.
        y = X * 0.0 + W.sum() * 0.0
        rows = torch.arange(replicas * n, device=x.device) // n
        mine = (rows.remainder(self.stage.edp) == edp_rank).unsqueeze(1)
        for e in range(moe.num_experts):
            ep = f"{p}experts.{e}."
            if ep + "gate.weight" not in self.param_index:
                continue
            hit = ((I == e).logical_and(mine)).nonzero()
            if hit.size(0) == 0:
                continue
            t, j = hit.select(1, 0), hit.select(1, 1)
            we = W[t, j].unsqueeze(1)
            y = y.index_add(0, t, (self._swiglu(X.index_select(0, t), ep) *
                                   we).to(y.dtype))
        routed = _CombineTokens.apply(y, info) if self.experts else y
        return out + routed.reshape(b, s, h)

    def _head_loss(self, h, targets):
        x = self._to_tp(self._rms_norm(h, "final_norm.weight"))
        logits = self._linear(x, "lm_head.weight")
        if self.tp_group:
            logits = _GatherFromTp.apply(logits, self.tp_group,
                                         self.role.tp_rank, self.stage.tp)
        tokens = self.job.training.global_batch * self.job.training.seq_len
        if self.low:
            logits = logits.float()
        return F.cross_entropy(logits.reshape(-1, logits.size(-1)),
                               targets.reshape(-1), reduction="sum") / tokens

    # -- an iteration ------------------------------------------------------

    def _sync_gradients(self):
        for gg in self.grad_groups:
            buf = torch.zeros(gg.elements, dtype=torch.float32,
                              device=self.device)
            for i, pi in enumerate(gg.params):
                p = self.params[pi]
                if p.split == "replicated" and self.role.tp_rank != 0:
                    continue
                g = p.master.grad
                c = (p.swap(g).contiguous() if g is not None
                     else torch.zeros(p.canonical_shape, device=self.device))
                buf.narrow(0, gg.offsets[i] + p.begin // 4,
                           c.numel()).copy_(c.reshape(-1))
            if gg.group is not None:
                _all_reduce(gg.group, buf)
            for i, pi in enumerate(gg.params):
                p = self.params[pi]
                c = buf.narrow(0, gg.offsets[i] + p.begin // 4,
                               (p.end - p.begin) // 4).reshape(
                                   p.canonical_shape)
                p.master.grad = p.swap(c).contiguous()

    @torch.no_grad()
    def _owned_gradient_squares(self) -> float:
        """This rank's share of the squared global gradient norm: the sum of
        squares of the synced gradient elements it owns (_Param.owned)."""
        # Summed on the device in float64, in the order a Python float
        # would be, read once.
        total = torch.zeros((), dtype=torch.float64, device=self.device)
        for p in self.params:
            if not p.owned:
                continue
            g = p.master.grad
            if p.owned == [(0, (p.end - p.begin) // 4)]:
                total = total + g.to(torch.float64).square().sum()
                continue
            c = p.swap(g).contiguous().reshape(-1).to(torch.float64)
            for b, e in p.owned:
                total = total + c.narrow(0, b, e - b).square().sum()
        return total.item()

    @torch.no_grad()
    def _gradients_finite(self) -> bool:
        """Whether every synced gradient element is finite (fp16: an
        overflow skips the step)."""
        flags = [p.master.grad.isfinite().all() for p in self.params]
        return bool(torch.stack(flags).all().item()) if flags else True

    @torch.no_grad()
    def _optimizer_step(self, grad_scale: float = 1.0):
        c = self.job.engine
        # The step counter is the migrated scalars' (SCALAR_STEP), so a
        # switched run takes the same learning rates as an unswitched one.
        t = self.scalars[st.SCALAR_STEP] + 1
        lr = c.learning_rate_at(t)
        bc1 = 1.0 - c.adam_beta1 ** t
        bc2 = 1.0 - c.adam_beta2 ** t
        for p in self.params:
            g = p.master.grad
            if grad_scale != 1.0:
                g = g * grad_scale
            p.adam_m.mul_(c.adam_beta1).add_(g, alpha=1.0 - c.adam_beta1)
            p.adam_v.mul_(c.adam_beta2).addcmul_(g, g, value=1.0 - c.adam_beta2)
            denom = (p.adam_v / bc2).sqrt_().add_(c.adam_eps)
            update = (p.adam_m / bc1).div_(denom)
            if c.weight_decay > 0:
                update.add_(p.master.detach(), alpha=c.weight_decay)
            p.master.detach().sub_(update * lr)
            # In place: the canonical views (migration) keep seeing it.
            p.weight.copy_(p.master.detach())
            p.master.grad = None

    def _tokens(self, first_sample: int, targets: bool) -> torch.Tensor:
        s = self.corpus.samples(first_sample, self.tmpl.micro_batch_size)
        return torch.from_numpy(s[:, 1:] if targets else s[:, :-1]
                                ).contiguous().to(self.device)

    @property
    def loss_scale(self) -> Optional[LossScale]:
        """fp16: the dynamic loss scale (in the scalars); else None."""
        if self.precision != "fp16":
            return None
        return LossScale.decode(self.scalars[st.SCALAR_LOSS_SCALE])

    @property
    def iteration(self) -> int:
        return self.scalars[st.SCALAR_STEP]

    def run_iteration(self, stop_requested: bool = False) -> IterationResult:
        """One iteration of the whole global batch (this rank's part): a
        collective over every rank of the plan."""
        start = time.monotonic()
        t, role = self.tmpl, self.role
        ti, r, s = role.template, role.replica, role.stage
        depth = t.depth
        first = self.scalars[st.SCALAR_CURSOR]
        for tj in range(ti + 1):
            o = self.plan.templates[tj]
            for rj in range(r if tj == ti else o.replicas):
                first += o.micro_batches_of(rj) * o.micro_batch_size
        mbs = t.micro_batch_size
        micro = t.micro_batches_of(r)
        seq, hidden = self.job.training.seq_len, self.job.model.hidden
        tp_here = self.stage.tp
        tp_prev = t.stages[s - 1].tp if s > 0 else 1
        tp_next = t.stages[s + 1].tp if s + 1 < depth else 1
        iter_tag = (self.scalars[st.SCALAR_STEP] % 1024) << 20
        rank_of = self.layout.rank_of
        host = torch.device("cpu")
        scaler = self.loss_scale
        if self.precision == "fp16":
            with torch.no_grad():
                for p in self.params:
                    p.half = p.master.detach().to(self.dtype)
        sends = []
        inputs: List[Optional[torch.Tensor]] = [None] * micro
        outputs: List[Optional[torch.Tensor]] = [None] * micro
        loss_share = 0.0

        def forward(mb):
            nonlocal loss_share
            sample = first + mb * mbs
            computing = self.pacer.start()
            if s == 0:
                h = self._embed(self._tokens(sample, False))
            else:
                x = torch.empty(mbs, seq, hidden)
                self.world.recv([x], rank_of[(ti, r, s - 1,
                                              role.tp_rank % tp_prev)],
                                iter_tag | (mb << 1)).wait(COLLECTIVE_TIMEOUT)
                computing = self.pacer.start()  # the wait is not compute
                x = x.to(self.device).requires_grad_(True)
                inputs[mb] = x
                h = x
            for layer in range(self.stage.layer_begin, self.stage.layer_end):
                h = self._block(layer, h)
            if s == depth - 1:
                outputs[mb] = self._head_loss(h, self._tokens(sample, True))
                loss_share += outputs[mb].item()
                self.pacer.pace(computing)
            else:
                outputs[mb] = h
                # (Over the Gloo world group: through host memory, fp32.)
                out = h.detach().float().to(host).contiguous()
                self.pacer.pace(computing)
                for j in range(role.tp_rank, tp_next, tp_here):
                    sends.append((out, self.world.send(
                        [out], rank_of[(ti, r, s + 1, j)],
                        iter_tag | (mb << 1))))

        def backward(mb):
            computing = self.pacer.start()
            if s == depth - 1:
                if scaler is not None:
                    (outputs[mb] * scaler.scale).backward()
                else:
                    outputs[mb].backward()
            else:
                g = torch.empty(mbs, seq, hidden)
                self.world.recv([g], rank_of[(ti, r, s + 1,
                                              role.tp_rank % tp_next)],
                                iter_tag | (mb << 1) | 1).wait(COLLECTIVE_TIMEOUT)
                computing = self.pacer.start()
                outputs[mb].backward(g.to(self.device))
            self.pacer.pace(computing)
            outputs[mb] = None
            if s > 0:
                g = inputs[mb].grad.float().to(host).contiguous()
                for j in range(role.tp_rank, tp_prev, tp_here):
                    sends.append((g, self.world.send(
                        [g], rank_of[(ti, r, s - 1, j)],
                        iter_tag | (mb << 1) | 1)))
                inputs[mb] = None

        try:
            # 1F1B: warm-up forwards, then one forward and one backward,
            # then the remaining backwards.
            warmup = min(depth - s - 1, micro)
            f = b = 0
            while f < warmup:
                forward(f)
                f += 1
            while f < micro:
                forward(f)
                backward(b)
                f += 1
                b += 1
            while b < micro:
                backward(b)
                b += 1
            for _, work in sends:
                work.wait(COLLECTIVE_TIMEOUT)
            sends.clear()
            self._sync_gradients()
            # The global loss (every pipeline's last stage adds its share),
            # the agreement to stop here (any rank that was asked) and, when
            # clipping, the squared global gradient norm (each rank's owned
            # elements).
            clip = self.job.engine.grad_clip_norm > 0
            loss = torch.tensor(
                [loss_share if s == depth - 1 and role.tp_rank == 0 else 0.0,
                 1.0 if stop_requested else 0.0,
                 self._owned_gradient_squares() if clip else 0.0,
                 0.0 if scaler is None or self._gradients_finite() else 1.0],
                dtype=torch.float64)
            _all_reduce(self.world, loss)
        except RuntimeError as e:
            raise TrainingError(
                f"plan rank {self.me} (template {ti} replica {r} stage {s} "
                f"tp rank {role.tp_rank}): iteration {self.iteration + 1} "
                f"failed: {_first_line(e)}") from e
        stepping = self.pacer.start()
        overflow = loss[3].item() > 0
        if scaler is None:
            self._optimizer_step(
                self.job.engine.clip_scale(math.sqrt(loss[2].item()))
                if clip else 1.0)
        else:
            # fp16: the gradients are the loss scale's multiple; an
            # overflow anywhere skips the step on every rank (the iteration
            # still counts and its samples are used) and halves the scale.
            if overflow:
                for p in self.params:
                    p.master.grad = None
            else:
                unscale = 1.0 / scaler.scale
                self._optimizer_step(
                    (self.job.engine.clip_scale(
                        math.sqrt(loss[2].item()) * unscale)
                     if clip else 1.0) * unscale)
            scaler.update(overflow)
            self.scalars[st.SCALAR_LOSS_SCALE] = scaler.encode()
        self.pacer.pace(stepping)
        self.scalars[st.SCALAR_STEP] += 1
        self.scalars[st.SCALAR_CURSOR] += self.job.training.global_batch
        return IterationResult(self.scalars[st.SCALAR_STEP], loss[0].item(),
                               loss[1].item() > 0, time.monotonic() - start,
                               self.job.training.global_batch * seq,
                               overflow)

    # -- state in the canonical layout ------------------------------------

    def state_bytes(self) -> int:
        return self.layout.bytes_on(self.me)

    def save_state(self) -> Dict[Tuple[int, int, int], bytes]:
        """This rank's holdings, canonical bytes: {(tensor, begin, end):
        bytes}."""
        out: Dict[Tuple[int, int, int], bytes] = {}
        for p in self.params:
            for k, part in enumerate(p.parts()):
                ts = self.tensors[p.ids[k]]
                begin, end = p.kind_range(ts)
                c = p.swap(part).contiguous().cpu()
                if c.dtype == torch.bfloat16:
                    c = c.view(torch.int16)
                out[(p.ids[k], begin, end)] = c.numpy().tobytes()
        out[(self.scalars_id, 0, 8 * st.NUM_SCALARS)] = np.asarray(
            self.scalars, dtype="<i8").tobytes()
        return out

    def holdings(self):
        return self.role.holdings

    @torch.no_grad()
    def load_state(self, pieces: Dict[Tuple[int, int, int], bytes]) -> None:
        """Replaces the state with `pieces` (as save_state gives them).
        ValueError naming what does not fit; nothing changes then."""
        key = (self.scalars_id, 0, 8 * st.NUM_SCALARS)
        if key not in pieces:
            raise ValueError(f"LoadState: no {st.TRAIN_STATE_TENSOR}")
        sc = np.frombuffer(pieces[key], dtype="<i8").tolist()
        if sc[st.SCALAR_FORMAT] != st.STATE_FORMAT:
            raise ValueError(f"LoadState: state format {sc[0]}, expected "
                             f"{st.STATE_FORMAT}")
        e, t = self.job.engine, self.job.training
        if (sc[st.SCALAR_DATA_SEED] != e.data_seed or
                sc[st.SCALAR_GLOBAL_BATCH] != t.global_batch or
                sc[st.SCALAR_SEQ_LEN] != t.seq_len):
            raise ValueError(
                f"LoadState: the state was trained with data_seed "
                f"{sc[st.SCALAR_DATA_SEED]}, global_batch "
                f"{sc[st.SCALAR_GLOBAL_BATCH]}, seq_len "
                f"{sc[st.SCALAR_SEQ_LEN]}; this job has {e.data_seed}, "
                f"{t.global_batch}, {t.seq_len}")
        if self.precision == "fp16":
            LossScale.decode(sc[st.SCALAR_LOSS_SCALE])  # ValueError if not
        views = []
        for p in self.params:
            for k, part in enumerate(p.parts()):
                ts = self.tensors[p.ids[k]]
                begin, end = p.kind_range(ts)
                data = pieces.get((p.ids[k], begin, end))
                if data is None or len(data) != end - begin:
                    raise ValueError(f"LoadState: no bytes [{begin}, {end}) "
                                     f"of {ts.name}")
                dtype = np.int16 if part.dtype == torch.bfloat16 else \
                    np.float32
                v = torch.from_numpy(np.frombuffer(data, dtype=dtype).copy())
                if part.dtype == torch.bfloat16:
                    v = v.view(torch.bfloat16)
                views.append((part, p.swap(v.reshape(p.canonical_shape))))
        for part, v in views:
            part.copy_(v)
        self.scalars = sc


def _first_line(e: BaseException) -> str:
    return str(e).split("\n", 1)[0]
