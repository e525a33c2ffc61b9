"""`python3 -m arachne_torch.engine`: one training process per GPU, served
to its node's `arachne-agent` over the engine protocol (arachne.v1.Engine,
docs/engines.md) on the Unix socket the agent names.

The contract is the reference engine's: every call carries a generation and
is idempotent; a call out of order or for a stale generation is
FAILED_PRECONDITION naming the generations or the phase it needs; a
malformed request is INVALID_ARGUMENT naming the field. Phase calls are
serialized; Status and Describe answer at any time, training or not.
"""

from __future__ import annotations

import concurrent.futures
import dataclasses
import math
import os
import signal
import sys
import threading
import time
import traceback
from typing import List, Optional

import grpc
import torch

from arachne.v1 import agent_pb2, engine_pb2, engine_pb2_grpc

from arachne_torch import checkpoint as ckpt
from arachne_torch import device as dev
from arachne_torch import state as st
from arachne_torch.job import BadRequest, Job, Plan
from arachne_torch.layout import Layout
from arachne_torch import migration as mig
from arachne_torch.trainer import (Trainer, TrainingError, generation_prefix,
                                   gloo_group, open_job_store,
                                   parse_store_address)

PROTOCOL_VERSION = 1
ENGINE_NAME = "arachne_torch (PyTorch engine)"
FOREVER = 1 << 62

Phase = agent_pb2.Phase


class Refused(Exception):
    """A call answered with `code` and `message` (what and why)."""

    def __init__(self, code: grpc.StatusCode, message: str):
        super().__init__(message)
        self.code = code


def _precondition(message: str) -> Refused:
    return Refused(grpc.StatusCode.FAILED_PRECONDITION, message)


@dataclasses.dataclass(frozen=True)
class Env:
    """What the agent tells its engine (docs/engines.md, "Launch")."""
    socket: str
    node: str
    gpu_type: str
    node_gpus: int
    local_rank: int
    host: str
    virtual_gpus: bool
    # A virtual GPU's speed as a fraction of its CPU rank's (trainer.py,
    # ComputePacer); 1 when the agent sets no ARACHNE_VIRTUAL_GPU_SPEED.
    virtual_gpu_speed: float = 1.0
    # The engine's own options (arachne_torch.device): ARACHNE_TORCH_DEVICE
    # and ARACHNE_TORCH_PRECISION, "auto" when unset.
    device_option: str = "auto"
    precision_option: str = "auto"

    @staticmethod
    def read(environ=os.environ) -> "Env":
        def need(name, max_len=256):
            v = environ.get(name)
            if v is None or v == "":
                raise BadRequest(f"{name}: required, got none")
            if len(v) > max_len:
                raise BadRequest(f"{name}: at most {max_len} characters, got "
                                 f"{len(v)}")
            return v

        def integer(name, lo, hi):
            v = need(name)
            try:
                n = int(v)
            except ValueError:
                n = None
            if n is None or not lo <= n <= hi:
                raise BadRequest(f"{name}: must be an integer in {lo}..{hi}, "
                                 f"got \"{v[:64]}\"")
            return n

        gpus = integer("ARACHNE_NODE_GPUS", 1, 64)
        virtual = need("ARACHNE_VIRTUAL_GPUS")
        if virtual not in ("0", "1"):
            raise BadRequest(f"ARACHNE_VIRTUAL_GPUS: must be 0 or 1, got "
                             f"\"{virtual[:64]}\"")
        speed = 1.0
        text = environ.get("ARACHNE_VIRTUAL_GPU_SPEED")
        if text is not None:
            try:
                speed = float(text)
            except ValueError:
                speed = math.nan
            if not (math.isfinite(speed) and 0 < speed <= 1):
                raise BadRequest("ARACHNE_VIRTUAL_GPU_SPEED: must be a number "
                                 f"in (0, 1], got \"{text[:64]}\"")
            if virtual != "1":
                raise BadRequest("ARACHNE_VIRTUAL_GPU_SPEED: only with "
                                 f"ARACHNE_VIRTUAL_GPUS=1, got \"{text[:64]}\"")
        return Env(need("ARACHNE_ENGINE_SOCKET", 107), need("ARACHNE_NODE"),
                   need("ARACHNE_GPU_TYPE"), gpus,
                   integer("LOCAL_RANK", 0, gpus - 1), need("ARACHNE_HOST"),
                   virtual == "1", speed, dev.device_option(environ),
                   dev.precision_option(environ))


@dataclasses.dataclass
class Generation:
    id: int
    job: Job
    plan: Plan
    tensors: List[st.StateTensor]
    layout: Layout
    plan_rank: int                    # -1: this GPU is not in the plan
    trainer: Optional[Trainer]
    checkpoint_dir: str = ""
    # A switch that migrates: this GPU's share of the schedule, the
    # migration world's group, and the executor stage 1 starts.
    migration: Optional[mig.RankMigration] = None
    migration_group: object = None
    executor: Optional[mig.Executor] = None
    cluster_gpus: tuple = ()  # (node, index) per migration rank


def _timing(seconds=0.0):
    return agent_pb2.PhaseTiming(seconds=seconds)


class EngineRuntime:
    """The phases and the training loop of this process's one rank."""

    def __init__(self, env: Env, device: Optional[dev.DeviceChoice] = None):
        self.env = env
        self.device = device or dev.DeviceChoice("cpu", "default")
        self.op = threading.Lock()          # one phase call at a time
        self.mu = threading.Condition()     # what the loop and Status share
        self.current: Optional[Generation] = None
        self.next: Optional[Generation] = None
        self.phase = Phase.PHASE_IDLE
        self.last_aborted = 0
        # Resident set when the last Prepare began (0: none yet).
        self.switch_start_rss = 0
        # The training loop of the current generation.
        self.thread: Optional[threading.Thread] = None
        self.running = False
        self.run_until = 0
        self.pause_at = 0
        self.pause_requested = False
        self.iteration = 0
        self.loss = 0.0
        self.seconds = 0.0
        self.tokens = 0
        self.error = ""
        self.timings = {k: _timing() for k in (
            "pause", "stage1", "stage2", "rebuild_groups", "rebuild_engines",
            "resume")}

    @property
    def gpu(self) -> str:
        return f"GPU {self.env.local_rank} of node {self.env.node}"

    # -- helpers -----------------------------------------------------------

    def _expect_prepared(self, generation: int) -> None:
        if self.next is None or self.next.id != generation:
            raise _precondition(
                f"generation {generation} is not prepared on node "
                f"{self.env.node} (current "
                f"{self.current.id if self.current else 0}, prepared "
                f"{self.next.id if self.next else 0})")

    def _check_node(self, cluster, field: str) -> None:
        # The agent writes clusters with canonical GPU type ids, as
        # ARACHNE_GPU_TYPE names its own.
        for i, n in enumerate(cluster.nodes):
            if n.name != self.env.node:
                continue
            if n.gpu != self.env.gpu_type or n.gpus != self.env.node_gpus:
                raise BadRequest(
                    f"{field}.nodes[{i}] ({n.name}): {n.gpus} GPUs of "
                    f"type {n.gpu}, but this agent has "
                    f"{self.env.node_gpus} of type {self.env.gpu_type}")
            return
        raise BadRequest(f"{field}: has no node named \"{self.env.node}\" "
                         "(this agent's node)")

    def _join_loop(self) -> None:
        t = self.thread
        if t is not None and t is not threading.current_thread():
            t.join()
        self.thread = None

    def _loop(self) -> None:
        while True:
            with self.mu:
                trainer = self.current.trainer
                it = trainer.iteration
                if it >= self.run_until or self.error:
                    self.running = False
                    self.mu.notify_all()
                    return
                stop = self.pause_requested and it + 1 >= self.pause_at
            try:
                r = trainer.run_iteration(stop)
            except Exception as e:  # a peer died, a timeout: fail this rank
                with self.mu:
                    self.error = str(e) if isinstance(e, TrainingError) else \
                        f"{self.gpu}: {type(e).__name__}: {e}"
                    self.running = False
                    self.phase = Phase.PHASE_FAILED
                    self.mu.notify_all()
                print(f"arachne_torch: {self.error}", file=sys.stderr,
                      flush=True)
                if not isinstance(e, TrainingError):
                    traceback.print_exc()
                return
            with self.mu:
                self.iteration, self.loss = r.iteration, r.loss
                self.seconds, self.tokens = r.seconds, r.tokens
                if r.stop_agreed:
                    self.run_until = min(self.run_until, r.iteration)
                    self.pause_requested = False

    # -- the phases --------------------------------------------------------

    def prepare(self, req) -> agent_pb2.PrepareResponse:
        with self.op:
            if req.generation < 1:
                raise BadRequest(f"generation: must be an integer >= 1, got "
                                 f"{req.generation}")
            with self.mu:
                if self.next is not None:
                    if self.next.id == req.generation:
                        return agent_pb2.PrepareResponse()  # a retry
                    raise _precondition(
                        f"generation {self.next.id} is being prepared on node "
                        f"{self.env.node}; abort it before preparing "
                        f"generation {req.generation}")
                cur = self.current.id if self.current else 0
                if req.generation <= cur or req.generation <= self.last_aborted:
                    raise _precondition(
                        f"generation {req.generation} is not newer than node "
                        f"{self.env.node}'s current generation {cur} (last "
                        f"aborted {self.last_aborted})")
            has_old = req.HasField("old_plan") and len(req.old_plan.templates)
            if bool(has_old) != (req.HasField("old_cluster") and
                                 len(req.old_cluster.nodes) > 0):
                raise BadRequest("old_plan and old_cluster: give both or "
                                 "neither")
            if not has_old and req.generation != 1 and not req.checkpoint_dir:
                raise BadRequest(
                    f"old_plan: generation {req.generation} needs the plan it "
                    "replaces (or a checkpoint_dir to restore from)")
            migrating = bool(has_old) and not req.checkpoint_dir
            self._check_node(req.cluster, "cluster")
            # The switch's memory window starts here (RankStatus.switch_*):
            # its peak from now on is the switch's, not training's before it.
            dev.reset_window_peak()
            self.switch_start_rss = dev.resident_bytes()
            parse_store_address(req.store_address)
            job = Job.from_request(req)
            precision = dev.resolve_precision(
                self.device, req.training.precision,
                self.env.precision_option)
            plan = Plan.from_proto(req.plan, job)
            tensors = st.model_state(job.model)
            layout = Layout.from_proto(req.layout, plan, tensors)
            rank = layout.plan_rank_of_gpu(self.env.node, self.env.local_rank)
            share, group = None, None
            if migrating:
                if not req.HasField("migration"):
                    raise BadRequest(
                        "migration: required when generation "
                        f"{req.generation} migrates from old_plan (the "
                        "agent sends each engine its share of the schedule)")
                share = mig.RankMigration.from_proto(
                    req.migration, tensors,
                    mig.cluster_rank(req.cluster, self.env.node,
                                     self.env.local_rank),
                    mig.cluster_size(req.cluster))
            trainer = None
            t0 = time.monotonic()
            if migrating:
                # First, so every GPU of the new cluster meets here before
                # the plan's own groups (which only some of them join).
                # 60 s, as the plan's groups: well inside the agent's
                # deadline for Prepare, so a peer whose Prepare failed makes
                # this one fail too rather than hang until it is killed.
                try:
                    store = open_job_store(
                        req.store_address,
                        generation_prefix(req.generation) + "/migration", 60)
                    group = gloo_group(
                        store, "world", share.rank, share.world_size,
                        torch.distributed.ProcessGroupGloo.create_device(
                            hostname=self.env.host), 60)
                except RuntimeError as e:
                    raise Refused(
                        grpc.StatusCode.UNAVAILABLE,
                        f"{self.gpu}: building the migration group of "
                        f"generation {req.generation} failed: "
                        f"{str(e).splitlines()[0] if str(e) else e}") from e
            if rank >= 0:
                try:
                    trainer = Trainer(
                        job, plan, tensors, layout, rank, req.generation,
                        req.store_address, self.env.host,
                        initialize=req.generation == 1 and
                        not req.checkpoint_dir,
                        virtual_gpu_speed=self.env.virtual_gpu_speed,
                        device=self.device.device, precision=precision)
                except BadRequest:
                    raise
                except ValueError as e:
                    raise BadRequest(f"layout: {e}") from e
                except TrainingError as e:
                    raise Refused(grpc.StatusCode.UNAVAILABLE, str(e)) from e
            gen = Generation(req.generation, job, plan, tensors, layout, rank,
                             trainer, req.checkpoint_dir, share, group, None,
                             tuple((n.name, i) for n in req.cluster.nodes
                                   for i in range(n.gpus)))
            with self.mu:
                self.next = gen
                for k in ("pause", "stage1", "stage2", "rebuild_engines",
                          "resume"):
                    self.timings[k] = _timing()
                self.timings["rebuild_groups"] = _timing(
                    trainer.groups_seconds if trainer else 0.0)
                if self.current is None:
                    self.phase = Phase.PHASE_PREPARED
                elif self.phase in (Phase.PHASE_STOPPED, Phase.PHASE_FAILED):
                    self.phase = Phase.PHASE_PAUSED
                elif self.phase == Phase.PHASE_RUNNING:
                    self.phase = Phase.PHASE_PREPARED
            print(f"arachne_torch: {self.gpu}: prepared generation "
                  f"{req.generation} (plan rank {rank}, {self.device.device}"
                  f", {precision}) in "
                  f"{time.monotonic() - t0:.3f} s", file=sys.stderr,
                  flush=True)
            if share is None:
                return agent_pb2.PrepareResponse()
            return agent_pb2.PrepareResponse(
                bytes_to_receive=share.bytes_moved(send=False),
                bytes_to_send=share.bytes_moved(send=True),
                bytes_kept=share.bytes_kept)

    def pause(self, req) -> agent_pb2.PauseResponse:
        with self.op:
            if req.at_iteration < 0:
                raise BadRequest(f"at_iteration: must be >= 0, got "
                                 f"{req.at_iteration}")
            timeout = _timeout(req.timeout_s, "timeout_s")
            start = time.monotonic()
            with self.mu:
                self._expect_prepared(req.generation)
                if self.current is None:
                    raise _precondition(
                        f"generation {req.generation} is the job's first: "
                        "nothing to pause")
                if self.phase not in (Phase.PHASE_PREPARED, Phase.PHASE_PAUSED,
                                      Phase.PHASE_STOPPED):
                    if self.phase == Phase.PHASE_FAILED:
                        raise _precondition(
                            f"node {self.env.node}: a rank of generation "
                            f"{self.current.id} failed")
                    return agent_pb2.PauseResponse(iteration=self.iteration)
                self.pause_at = req.at_iteration
                self.pause_requested = self.running
                if not self.mu.wait_for(lambda: not self.running, timeout):
                    raise Refused(
                        grpc.StatusCode.DEADLINE_EXCEEDED,
                        f"node {self.env.node}: the ranks of generation "
                        f"{self.current.id} did not stop within {timeout:g}s")
                self.pause_requested = False
                self.phase = Phase.PHASE_PAUSED
            self._join_loop()
            with self.mu:
                it = self.current.trainer.iteration if self.current.trainer \
                    else 0
                self.timings["pause"] = _timing(time.monotonic() - start)
                return agent_pb2.PauseResponse(iteration=max(it, 0))

    def migrate(self, req) -> agent_pb2.MigrateResponse:
        with self.op:
            if req.stage not in (1, 2):
                raise BadRequest(f"stage: must be 1 or 2, got {req.stage}")
            timeout = _timeout(req.timeout_s, "timeout_s")
            round_timeout = _timeout(req.round_timeout_s, "round_timeout_s") \
                if req.round_timeout_s else timeout
            round_timeout = min(round_timeout, timeout)
            with self.mu:
                self._expect_prepared(req.generation)
                done = Phase.PHASE_MIGRATED1 if req.stage == 1 else \
                    Phase.PHASE_MIGRATED2
                if self.phase == done or self.phase == Phase.PHASE_REBUILT or \
                        (req.stage == 1 and
                         self.phase == Phase.PHASE_MIGRATED2):
                    return agent_pb2.MigrateResponse()  # a retry
                before = (Phase.PHASE_MIGRATED1 if req.stage == 2 else
                          Phase.PHASE_PREPARED if self.current is None else
                          Phase.PHASE_PAUSED)
                if self.phase != before:
                    raise _precondition(
                        f"node {self.env.node}: migration stage {req.stage} "
                        f"of generation {req.generation} needs phase "
                        f"{_phase_name(before)}, the node is "
                        f"{_phase_name(self.phase)}")
                gen = self.next
                if gen.migration is None:
                    # A first generation or a checkpoint restore: nothing
                    # moves between ranks.
                    self.phase = done
                    return agent_pb2.MigrateResponse()
                old = self.current.trainer if self.current else None
            # Off the lock, so Status answers while bytes move; the training
            # loop is stopped (phase paused) and `op` holds other phases off.
            start = time.monotonic()
            try:
                if req.stage == 1:
                    gen.executor = mig.Executor(
                        gen.migration, gen.migration_group,
                        mig.CanonicalState(old) if old else None,
                        mig.CanonicalState(gen.trainer) if gen.trainer
                        else None,
                        gen.tensors,
                        lambda r: "node %s GPU %d" % gen.cluster_gpus[r])
                    gen.executor.copy_kept()
                report = gen.executor.run_stage(req.stage, round_timeout)
            except mig.MigrationError as e:
                print(f"arachne_torch: {self.gpu}: {e}", file=sys.stderr,
                      flush=True)
                raise Refused(getattr(grpc.StatusCode, e.code),
                              f"{self.gpu}: {e}") from e
            with self.mu:
                self.timings[f"stage{req.stage}"] = agent_pb2.PhaseTiming(
                    seconds=time.monotonic() - start,
                    bytes_sent=report.bytes_sent,
                    bytes_received=report.bytes_received)
                self.phase = done
            print(f"arachne_torch: {self.gpu}: migration stage {req.stage} of "
                  f"generation {req.generation}: {report.rounds} rounds, "
                  f"sent {report.bytes_sent} B, received "
                  f"{report.bytes_received} B in {report.seconds:.3f} s",
                  file=sys.stderr, flush=True)
            return agent_pb2.MigrateResponse()

    def rebuild(self, req) -> agent_pb2.RebuildResponse:
        with self.op:
            _timeout(req.timeout_s, "timeout_s")
            with self.mu:
                self._expect_prepared(req.generation)
                if self.phase == Phase.PHASE_REBUILT:
                    return agent_pb2.RebuildResponse()
                # Nothing moves between ranks in this engine (Prepare took
                # only a first generation or a checkpoint restore), so
                # Rebuild follows Prepare, or the no-op stages when the
                # controller ran them.
                before = Phase.PHASE_PREPARED \
                    if self.phase == Phase.PHASE_PREPARED and \
                    self.next.migration is None \
                    else Phase.PHASE_MIGRATED2
                if self.phase != before:
                    raise _precondition(
                        f"node {self.env.node}: rebuilding generation "
                        f"{req.generation} needs phase {_phase_name(before)}"
                        f", the node is {_phase_name(self.phase)}")
                gen = self.next
            start = time.monotonic()
            if gen.executor is not None and gen.executor.new is not None:
                gen.executor.new.commit_scalars()
                sc = gen.trainer.scalars
                if sc[st.SCALAR_FORMAT] != st.STATE_FORMAT:
                    raise _precondition(
                        f"{self.gpu}: the migrated {st.TRAIN_STATE_TENSOR} "
                        f"has state format {sc[st.SCALAR_FORMAT]}, expected "
                        f"{st.STATE_FORMAT}")
            if gen.checkpoint_dir and gen.trainer is not None:
                try:
                    full = ckpt.read_checkpoint(gen.checkpoint_dir,
                                                gen.tensors, gen.job.model.name)
                except ckpt.CheckpointError as e:
                    raise Refused(getattr(grpc.StatusCode, e.code),
                                  str(e)) from e
                pieces = {(h.tensor, h.begin, h.end):
                          bytes(full[h.tensor][h.begin:h.end])
                          for h in gen.trainer.holdings()}
                try:
                    gen.trainer.load_state(pieces)
                except ValueError as e:
                    raise _precondition(str(e)) from e
            with self.mu:
                self.timings["rebuild_engines"] = _timing(
                    time.monotonic() - start)
                self.phase = Phase.PHASE_REBUILT
            return agent_pb2.RebuildResponse()

    def commit(self, req) -> agent_pb2.CommitResponse:
        with self.op:
            with self.mu:
                if self.current is not None and \
                        self.current.id == req.generation and self.next is None:
                    return agent_pb2.CommitResponse()  # a retry
                self._expect_prepared(req.generation)
                if self.phase != Phase.PHASE_REBUILT:
                    raise _precondition(
                        f"node {self.env.node}: generation {req.generation} "
                        f"is not rebuilt (phase {_phase_name(self.phase)})")
                self.current, self.next = self.next, None
                # The switch's executor (and the old state it reads) and
                # the migration world's group are done with.
                self.current.executor = None
                self.current.migration_group = None
                t = self.current.trainer
                self.iteration = t.iteration if t else 0
                if t is None:
                    self.loss = 0.0
                self.error = ""
                self.run_until = 0
                self.phase = Phase.PHASE_STOPPED
            return agent_pb2.CommitResponse()

    def resume(self, req) -> agent_pb2.ResumeResponse:
        with self.op:
            if req.run_until < 0:
                raise BadRequest(f"run_until: must be >= 0, got "
                                 f"{req.run_until}")
            start = time.monotonic()
            with self.mu:
                running = self.running
            if not running:
                self._join_loop()
            with self.mu:
                if self.current is None or self.current.id != req.generation:
                    raise _precondition(
                        f"generation {req.generation} is not current on node "
                        f"{self.env.node} (current "
                        f"{self.current.id if self.current else 0})")
                if self.phase == Phase.PHASE_FAILED or self.error:
                    raise _precondition(
                        f"node {self.env.node}: a rank of generation "
                        f"{req.generation} failed; it cannot resume (switch "
                        "to a new plan instead)")
                if self.next is not None and \
                        self.phase != Phase.PHASE_PREPARED:
                    raise _precondition(
                        f"node {self.env.node}: generation {self.next.id} is "
                        f"mid-switch (phase {_phase_name(self.phase)}); commit "
                        "or abort it first")
                self.run_until = req.run_until or FOREVER
                self.pause_requested = False
                if self.current.trainer is not None and not self.running:
                    self.running = True
                    self.thread = threading.Thread(target=self._loop,
                                                   name="train", daemon=True)
                    self.thread.start()
                if self.next is None:
                    self.phase = Phase.PHASE_RUNNING
                self.timings["resume"] = _timing(time.monotonic() - start)
            return agent_pb2.ResumeResponse()

    def abort(self, req) -> agent_pb2.AbortResponse:
        with self.op:
            with self.mu:
                if self.next is None and req.generation == self.last_aborted:
                    return agent_pb2.AbortResponse()  # a retry
                self._expect_prepared(req.generation)
                self.next = None
                self.last_aborted = req.generation
                if self.current is None:
                    self.phase = Phase.PHASE_IDLE
                elif self.error:
                    self.phase = Phase.PHASE_FAILED
                else:
                    self.phase = Phase.PHASE_RUNNING if self.running else \
                        Phase.PHASE_STOPPED
            print(f"arachne_torch: {self.gpu}: aborted generation "
                  f"{req.generation}", file=sys.stderr, flush=True)
            return agent_pb2.AbortResponse()

    def save_checkpoint(self, req) -> agent_pb2.SaveCheckpointResponse:
        with self.op:
            if req.generation < 1:
                raise BadRequest(f"generation: must be an integer >= 1, got "
                                 f"{req.generation}")
            if not req.dir:
                raise BadRequest("dir: required, got none")
            with self.mu:
                if self.current is None or self.current.id != req.generation:
                    raise _precondition(
                        f"generation {req.generation} is not current on node "
                        f"{self.env.node}")
                if self.running:
                    raise _precondition(
                        f"node {self.env.node}: generation {req.generation} "
                        "is training; pause it (or let it reach run_until) "
                        "first")
                gen = self.current
            if gen.trainer is None:
                return agent_pb2.SaveCheckpointResponse()
            try:
                ckpt.write_shard(req.dir, gen.tensors, self.env.node,
                                 self.env.local_rank, gen.trainer.save_state())
            except OSError as e:
                raise Refused(grpc.StatusCode.UNAVAILABLE,
                              f"checkpoint_dir {req.dir}: cannot write: "
                              f"{e.strerror or e}") from e
            return agent_pb2.SaveCheckpointResponse()

    def status(self) -> agent_pb2.StatusResponse:
        with self.mu:
            out = agent_pb2.StatusResponse(
                current_generation=self.current.id if self.current else 0,
                prepared_generation=self.next.id if self.next else 0,
                phase=self.phase, node=self.env.node,
                gpu_type=self.env.gpu_type, gpus=self.env.node_gpus,
                virtual_gpus=self.env.virtual_gpus)
            t = self.current.trainer if self.current else None
            r = out.ranks.add()
            r.gpu.node, r.gpu.index = self.env.node, self.env.local_rank
            r.in_plan = t is not None
            r.iteration = self.iteration
            r.loss = self.loss
            r.iteration_seconds = self.seconds
            r.tokens_per_second = self.tokens / self.seconds \
                if self.seconds > 0 else 0.0
            r.state_bytes = t.state_bytes() if t else 0
            r.peak_rss_bytes = dev.peak_resident_bytes()
            if self.switch_start_rss > 0:
                r.switch_start_rss_bytes = self.switch_start_rss
                r.switch_peak_rss_bytes = dev.window_peak_resident_bytes()
            r.error = self.error
            r.engine_pid = os.getpid()
            r.device = self.device.device
            if r.in_plan:
                out.iteration, out.loss = self.iteration, self.loss
            for k, v in self.timings.items():
                getattr(out, k).CopyFrom(v)
            return out

    def describe(self, req) -> engine_pb2.DescribeResponse:
        if req.protocol_version != PROTOCOL_VERSION:
            raise _precondition(
                f"protocol_version: the caller speaks engine protocol version "
                f"{req.protocol_version}, this engine (arachne_torch) speaks "
                f"{PROTOCOL_VERSION}")
        used, free = dev.memory(self.device.device)
        out = engine_pb2.DescribeResponse(
            protocol_version=PROTOCOL_VERSION, engine=ENGINE_NAME,
            node=self.env.node, local_rank=self.env.local_rank,
            node_gpus=self.env.node_gpus, device=self.device.device,
            memory_used_bytes=used, memory_free_bytes=free, pid=os.getpid())
        has_job = req.HasField("model_spec") or req.model.name or \
            req.model.hf_config_json
        if has_job:
            job = Job.from_request(req)
            for t in st.model_state(job.model):
                d = out.tensors.add()
                d.name, d.kind = t.name, t.kind
                d.bytes_per_element = st.BYTES_PER_ELEMENT[t.kind]
                d.layer, d.expert = t.layer, t.expert
                d.shape.extend(t.shape)
                d.tp_split = t.tp_split
        return out


def _timeout(seconds: float, field: str) -> float:
    if not seconds >= 0 or seconds != seconds or seconds == float("inf"):
        raise BadRequest(f"{field}: must be >= 0 seconds (0 = 5m), got "
                         f"{seconds}")
    return seconds or 300.0


def _phase_name(p) -> str:
    return agent_pb2.Phase.Name(p)[len("PHASE_"):].lower()


resident_bytes = dev.resident_bytes
available_bytes = dev.available_bytes


class EngineService(engine_pb2_grpc.EngineServicer):
    """arachne.v1.Engine over an EngineRuntime: errors become statuses."""

    def __init__(self, runtime: EngineRuntime):
        self.rt = runtime

    def _call(self, name, context, fn, *args):
        try:
            return fn(*args)
        except Refused as e:
            context.abort(e.code, str(e))
        except BadRequest as e:
            context.abort(grpc.StatusCode.INVALID_ARGUMENT, str(e))
        except Exception as e:  # a bug here: say where, keep serving
            traceback.print_exc()
            context.abort(grpc.StatusCode.INTERNAL,
                          f"{self.rt.gpu}: {name}: {type(e).__name__}: {e}")

    def Describe(self, req, context):
        return self._call("Describe", context, self.rt.describe, req)

    def Prepare(self, req, context):
        return self._call("Prepare", context, self.rt.prepare, req)

    def Pause(self, req, context):
        return self._call("Pause", context, self.rt.pause, req)

    def Migrate(self, req, context):
        return self._call("Migrate", context, self.rt.migrate, req)

    def Rebuild(self, req, context):
        return self._call("Rebuild", context, self.rt.rebuild, req)

    def Commit(self, req, context):
        return self._call("Commit", context, self.rt.commit, req)

    def Resume(self, req, context):
        return self._call("Resume", context, self.rt.resume, req)

    def Abort(self, req, context):
        return self._call("Abort", context, self.rt.abort, req)

    def Status(self, req, context):
        return self._call("Status", context, self.rt.status)

    def SaveCheckpoint(self, req, context):
        return self._call("SaveCheckpoint", context, self.rt.save_checkpoint,
                          req)


def stop_signals() -> int:
    """Installs the SIGTERM and SIGINT handling; returns the file descriptor
    that wait_for_stop_signal reads. The kernel may deliver the signal to
    any thread that does not block it (gRPC's, c10d's), and CPython then
    does not run the handler in the main thread while that thread waits:
    the engine did not stop, a test's teardown waited 30 s for it, and the
    orphan spun a core for the rest of a full suite. So the main thread reads
    the signals' wakeup descriptor, which the C-level handler writes in
    whichever thread takes the signal."""
    read_end, write_end = os.pipe()
    os.set_blocking(write_end, False)
    signal.set_wakeup_fd(write_end)
    for sig in (signal.SIGTERM, signal.SIGINT):
        signal.signal(sig, lambda *_: None)
    return read_end


def wait_for_stop_signal(read_end: int) -> None:
    """Returns once SIGTERM or SIGINT has arrived (stop_signals)."""
    stopping = {int(signal.SIGTERM), int(signal.SIGINT)}
    while not stopping.intersection(os.read(read_end, 64)):
        pass


def main(argv=None) -> int:
    try:
        env = Env.read()
        device = dev.select_device_here(env.virtual_gpus, env.local_rank)
        dev.check_precision_option(env.precision_option, device)
    except BadRequest as e:
        print(f"arachne_torch.engine: {e}", file=sys.stderr)
        return 2
    if device.is_cuda:
        torch.cuda.set_device(torch.device(device.device))
    # Ranks share the node's cores; one intra-op thread each, as the
    # reference engine.
    torch.set_num_threads(1)
    runtime = EngineRuntime(env, device)
    server = grpc.server(concurrent.futures.ThreadPoolExecutor(max_workers=8))
    engine_pb2_grpc.add_EngineServicer_to_server(EngineService(runtime),
                                                 server)
    if server.add_insecure_port(f"unix:{env.socket}") == 0:
        print(f"arachne_torch.engine: ARACHNE_ENGINE_SOCKET: cannot listen on "
              f"\"{env.socket}\"", file=sys.stderr)
        return 2
    stop = stop_signals()
    server.start()
    # After stop_signals: a supervisor that reads this line may stop the
    # engine at once.
    print(f"arachne_torch: {runtime.gpu}: serving arachne.v1.Engine on "
          f"{env.socket} (pid {os.getpid()}, torch {torch.__version__}, "
          f"device {device.device}: {device.why})",
          file=sys.stderr, flush=True)
    wait_for_stop_signal(stop)
    server.stop(grace=1).wait()
    return 0


if __name__ == "__main__":
    sys.exit(main())
