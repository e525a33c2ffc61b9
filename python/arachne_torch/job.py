"""What a job trains, read from the engine protocol's messages.

The agent sends the job resolved (PrepareRequest.model_spec, .training,
.engine; a plan as the planner writes it), so these classes only read and
check it: every check names the field and the value, the way the reference
engine words it, and raises `BadRequest` (INVALID_ARGUMENT on the wire)
before anything is built.
"""

from __future__ import annotations

import dataclasses
import math
import os
from typing import List, Optional, Tuple


class BadRequest(ValueError):
    """A request this engine refuses: the message names the field."""


# Bounds that keep one rank's state within what a machine can hold and
# every loop bounded; the planner's catalog models are far inside them.
MAX_LAYERS = 1024
MAX_HIDDEN = 1 << 16
MAX_VOCAB = 1 << 22
MAX_EXPERTS = 1024
MAX_SEQ_LEN = 1 << 17
MAX_GLOBAL_BATCH = 1 << 20
MAX_TOKEN_FILE_PATH = 4096  # bytes (agent.proto TokenFile.path)
MAX_DECAY_ITERATIONS = 1000000000  # EngineConfig::kMaxDecayIterations
MAX_GRAD_CLIP_NORM = 1e6  # EngineConfig::kMaxGradClipNorm


def _int_in(field: str, value: int, lo: int, hi: int) -> int:
    if not (lo <= value <= hi):
        raise BadRequest(f"{field}: must be in {lo}..{hi}, got {value}")
    return value


@dataclasses.dataclass(frozen=True)
class Moe:
    num_experts: int
    top_k: int
    expert_ffn: int
    shared_experts: int
    shared_ffn: int          # shared_expert_ffn, or expert_ffn when 0
    dense_first_layers: int


@dataclasses.dataclass(frozen=True)
class Model:
    name: str
    num_layers: int
    hidden: int
    num_heads: int
    num_kv_heads: int
    head_dim: int
    ffn: int
    vocab: int
    moe: Optional[Moe]

    def is_moe_layer(self, layer: int) -> bool:
        return self.moe is not None and layer >= self.moe.dense_first_layers

    def moe_layers_in(self, begin: int, end: int) -> int:
        if self.moe is None:
            return 0
        return max(0, end - max(begin, self.moe.dense_first_layers))

    @staticmethod
    def from_proto(m) -> "Model":
        """From an arachne.v1.Model (model_spec). This engine trains the
        LLaMA / Qwen shape: GQA attention, SwiGLU MLP, untied embeddings."""
        name = m.name or "model_spec"
        if not m.name:
            raise BadRequest("model_spec.name: required, got none")
        if len(m.name) > 256:
            raise BadRequest(f"model_spec.name: at most 256 characters, "
                             f"got {len(m.name)}")
        if m.attention not in ("", "gqa") or m.mlp not in ("", "swiglu") or \
                m.tied_embeddings:
            raise BadRequest(
                f"model {name}: arachne_torch trains LLaMA-shaped models (GQA "
                f"attention, SwiGLU MLP, untied embeddings); this one has "
                f"attention \"{m.attention or 'gqa'}\", mlp "
                f"\"{m.mlp or 'swiglu'}\", tied_embeddings "
                f"{str(m.tied_embeddings).lower()}")
        layers = _int_in("model_spec.num_layers", m.num_layers, 1, MAX_LAYERS)
        hidden = _int_in("model_spec.hidden", m.hidden, 1, MAX_HIDDEN)
        heads = _int_in("model_spec.num_heads", m.num_heads, 1, hidden)
        kv = m.num_kv_heads or heads
        _int_in("model_spec.num_kv_heads", kv, 1, heads)
        if heads % kv != 0:
            raise BadRequest(f"model_spec.num_kv_heads: must divide num_heads "
                             f"({heads}), got {kv}")
        head_dim = m.head_dim or hidden // heads
        _int_in("model_spec.head_dim", head_dim, 2, MAX_HIDDEN)
        if head_dim % 2 != 0:
            raise BadRequest(f"model {name}.head_dim: must be even for rotary "
                             f"embeddings, got {head_dim}")
        ffn = _int_in("model_spec.ffn", m.ffn, 1, 1 << 20)
        vocab = _int_in("model_spec.vocab", m.vocab, 2, MAX_VOCAB)
        moe = None
        if m.HasField("moe") and m.moe.num_experts > 0:
            e = m.moe
            n = _int_in("model_spec.moe.num_experts", e.num_experts, 1,
                        MAX_EXPERTS)
            k = _int_in("model_spec.moe.top_k", e.top_k, 1, n)
            effn = _int_in("model_spec.moe.expert_ffn", e.expert_ffn, 1,
                           1 << 20)
            shared = _int_in("model_spec.moe.shared_experts", e.shared_experts,
                             0, MAX_EXPERTS)
            sffn = _int_in("model_spec.moe.shared_expert_ffn",
                           e.shared_expert_ffn, 0, 1 << 20) or effn
            dense = _int_in("model_spec.moe.dense_first_layers",
                            e.dense_first_layers, 0, layers)
            moe = Moe(n, k, effn, shared, sffn, dense)
        return Model(m.name, layers, hidden, heads, kv, head_dim, ffn, vocab,
                     moe)


@dataclasses.dataclass(frozen=True)
class Training:
    seq_len: int
    global_batch: int

    @staticmethod
    def from_proto(t) -> "Training":
        # Zero takes the planner's defaults (planner.proto TrainingConfig).
        seq = _int_in("training.seq_len", t.seq_len or 2048, 1, MAX_SEQ_LEN)
        gb = _int_in("training.global_batch", t.global_batch or 2048, 1,
                     MAX_GLOBAL_BATCH)
        return Training(seq, gb)


@dataclasses.dataclass(frozen=True)
class TokenFile:
    """engine.token_file: a flat little-endian array of token ids
    (arachne_torch.corpus.TokenFileCorpus reads it). `validate` checks the
    fields only; the file itself is checked where the corpus is made
    (Prepare), before training starts."""
    path: str
    token_bytes: int

    def validate(self) -> None:
        f = "engine.token_file"
        n = len(self.path.encode("utf-8", "surrogateescape"))
        if n == 0:
            raise BadRequest(f"{f}.path: required (an absolute path), got "
                             "none")
        if n > MAX_TOKEN_FILE_PATH:
            raise BadRequest(f"{f}.path: at most {MAX_TOKEN_FILE_PATH} bytes, "
                             f"got {n} bytes (\"{self.path[:64]}...\")")
        if "\0" in self.path:
            raise BadRequest(f"{f}.path: must not contain a NUL byte, got "
                             f"{self.path[:256]!r}")
        if not os.path.isabs(self.path):
            raise BadRequest(f"{f}.path: must be an absolute path, got "
                             f"\"{self.path}\"")
        if self.token_bytes not in (2, 4):
            raise BadRequest(f"{f}.token_bytes: must be 2 (uint16) or 4 "
                             f"(uint32), got {self.token_bytes}")


@dataclasses.dataclass(frozen=True)
class EngineConfig:
    """The reference engine's hyper-parameters and defaults
    (worker_agent/engine/engine.h), so both engines train the same job."""
    learning_rate: float = 1e-3
    warmup_iterations: int = 4
    adam_beta1: float = 0.9
    adam_beta2: float = 0.95
    adam_eps: float = 1e-6
    weight_decay: float = 0.0
    data_seed: int = 1
    init_seed: int = 1
    token_file: Optional[TokenFile] = None  # None: the synthetic corpus
    # After the warm-up: "constant" or "cosine" (a half-cosine from
    # learning_rate at warmup_iterations to min_learning_rate at
    # decay_iterations, then min_learning_rate); decay_iterations and
    # min_learning_rate are the cosine's only (0 otherwise).
    lr_schedule: str = "constant"
    decay_iterations: int = 0
    min_learning_rate: float = 0.0
    # Clip the gradient to this global L2 norm (0 = off).
    grad_clip_norm: float = 0.0

    @staticmethod
    def from_proto(e) -> "EngineConfig":
        d = EngineConfig()
        kw = {f.name: (getattr(e, f.name) if e.HasField(f.name)
                       else getattr(d, f.name))
              for f in dataclasses.fields(EngineConfig)
              if f.name != "token_file"}
        # (Protos generated before agent.proto had token_file lack it.)
        if "token_file" in e.DESCRIPTOR.fields_by_name and \
                e.HasField("token_file"):
            kw["token_file"] = TokenFile(e.token_file.path,
                                         e.token_file.token_bytes)
        c = EngineConfig(**kw)
        c.validate()
        return c

    def validate(self) -> None:
        def bad(field, v, want):
            return BadRequest(f"engine.{field}: must be {want}, got {v}")
        if not (self.learning_rate > 0 and math.isfinite(self.learning_rate)):
            raise bad("learning_rate", self.learning_rate,
                      "a finite number > 0")
        if self.warmup_iterations < 0:
            raise bad("warmup_iterations", self.warmup_iterations, ">= 0")
        if not 0 <= self.adam_beta1 < 1:
            raise bad("adam_beta1", self.adam_beta1, "in [0, 1)")
        if not 0 <= self.adam_beta2 < 1:
            raise bad("adam_beta2", self.adam_beta2, "in [0, 1)")
        if not (self.adam_eps > 0 and math.isfinite(self.adam_eps)):
            raise bad("adam_eps", self.adam_eps, "a finite number > 0")
        if not (self.weight_decay >= 0 and math.isfinite(self.weight_decay)):
            raise bad("weight_decay", self.weight_decay,
                      "a finite number >= 0")
        # The schedule and clipping: the reference engine's checks and words
        # (worker_agent/engine/engine.cc), its numbers as absl::StrCat
        # writes them (%g).
        cosine = self.lr_schedule == "cosine"
        if not cosine and self.lr_schedule != "constant":
            v = self.lr_schedule
            raise BadRequest("engine.lr_schedule: must be \"constant\" or "
                             f"\"cosine\", got \"{v[:64]}"
                             + ("...\"" if len(v) > 64 else "\""))
        if cosine:
            if self.decay_iterations <= self.warmup_iterations:
                raise bad("decay_iterations", self.decay_iterations,
                          f"> warmup_iterations ({self.warmup_iterations}) "
                          "with lr_schedule \"cosine\"")
            if self.decay_iterations > MAX_DECAY_ITERATIONS:
                raise bad("decay_iterations", self.decay_iterations,
                          f"<= {MAX_DECAY_ITERATIONS}")
            if not 0 <= self.min_learning_rate <= self.learning_rate:
                raise bad("min_learning_rate", f"{self.min_learning_rate:g}",
                          f"in [0, learning_rate ({self.learning_rate:g})]")
        else:
            if self.decay_iterations != 0:
                raise bad("decay_iterations", self.decay_iterations,
                          "0 (unset) unless lr_schedule is \"cosine\"")
            if self.min_learning_rate != 0:
                raise bad("min_learning_rate", f"{self.min_learning_rate:g}",
                          "0 (unset) unless lr_schedule is \"cosine\"")
        if not 0 <= self.grad_clip_norm <= MAX_GRAD_CLIP_NORM:
            raise bad("grad_clip_norm", f"{self.grad_clip_norm:g}",
                      "0 (off) or a finite number in (0, 1000000]")
        if self.token_file is not None:
            self.token_file.validate()

    def learning_rate_at(self, step: int) -> float:
        """The learning rate of optimizer step `step` (1-based), as the
        reference engine's EngineConfig::LearningRateAt."""
        w = self.warmup_iterations
        if step < w or self.lr_schedule != "cosine":
            return self.learning_rate * min(1.0, step / max(1, w))
        if step >= self.decay_iterations:
            return self.min_learning_rate
        progress = (step - w) / (self.decay_iterations - w)
        return self.min_learning_rate + 0.5 * (
            self.learning_rate - self.min_learning_rate) * (
                1.0 + math.cos(math.pi * progress))

    def clip_scale(self, norm: float) -> float:
        """The factor the gradient is scaled by at global L2 norm `norm`
        (torch.nn.utils.clip_grad_norm_'s; 1 when clipping is off)."""
        if self.grad_clip_norm <= 0:
            return 1.0
        return min(1.0, self.grad_clip_norm / (norm + 1e-6))


@dataclasses.dataclass(frozen=True)
class Job:
    model: Model
    training: Training
    engine: EngineConfig

    @staticmethod
    def from_request(r, where: str = "") -> "Job":
        """From a request carrying model_spec / training / engine (Prepare,
        Describe). A model named by reference only is the agent's to
        resolve: the engine needs it spelled out."""
        if not r.HasField("model_spec"):
            name = r.model.name if r.HasField("model") else ""
            raise BadRequest(
                "model_spec: required (the agent resolves catalog models "
                "and config.json files before it asks an engine), got "
                + (f"only model.name \"{name[:64]}\"" if name else "none"))
        return Job(Model.from_proto(r.model_spec),
                   Training.from_proto(r.training),
                   EngineConfig.from_proto(r.engine))


@dataclasses.dataclass(frozen=True)
class Stage:
    tp: int
    layer_begin: int
    layer_end: int
    ep: int
    etp: int
    edp: int


@dataclasses.dataclass(frozen=True)
class Template:
    replicas: int
    micro_batch_size: int
    total_micro_batches: int
    stages: Tuple[Stage, ...]

    @property
    def depth(self) -> int:
        return len(self.stages)

    def micro_batches_of(self, replica: int) -> int:
        """Replica `replica`'s share of the template's micro-batches."""
        m, r = divmod(self.total_micro_batches, self.replicas)
        return m + (1 if replica < r else 0)


@dataclasses.dataclass(frozen=True)
class Plan:
    templates: Tuple[Template, ...]

    @staticmethod
    def from_proto(p, job: Job, field: str = "plan") -> "Plan":
        """Reads a plan and checks what this engine needs of it (the
        reference engine's CheckReferencePlan, in the same words)."""
        m = job.model
        templates: List[Template] = []
        if not p.templates:
            raise BadRequest(f"{field}.templates: required, got none")
        samples = 0
        for ti, t in enumerate(p.templates):
            w = f"{field}.templates[{ti}]"
            replicas = _int_in(w + ".replicas", t.replicas, 1, 1 << 16)
            if t.HasField("total_micro_batches"):
                total = t.total_micro_batches
            elif t.HasField("micro_batches"):
                total = t.micro_batches * replicas
            else:
                raise BadRequest(f"{w}.total_micro_batches: required, got "
                                 "none")
            mbs = t.micro_batch_size
            if mbs <= 0 or total < replicas:
                raise BadRequest(
                    f"{w}: micro_batch_size {mbs} and total_micro_batches "
                    f"{total} must give every one of its {replicas} "
                    "replicas a micro-batch")
            stages = []
            if not t.stages:
                raise BadRequest(f"{w}.stages: required, got none")
            for si, s in enumerate(t.stages):
                ws = f"{w}.stages[{si}]"
                if len(s.layers) != 2:
                    raise BadRequest(f"{ws}.layers: must be [begin, end), "
                                     f"got {list(s.layers)}")
                tp = s.tp
                for what, n in (("num_heads", m.num_heads),
                                ("num_kv_heads", m.num_kv_heads),
                                ("ffn", m.ffn), ("vocab", m.vocab)):
                    if tp <= 0 or n % tp != 0:
                        raise BadRequest(f"{ws}.tp: {tp} does not divide the "
                                         f"model's {what} ({n})")
                tiling = s.expert_tiling
                stage = Stage(tp, s.layers[0], s.layers[1],
                              tiling.ep or 1, tiling.etp or 1, tiling.edp or 1)
                if m.moe_layers_in(stage.layer_begin, stage.layer_end) > 0:
                    if stage.ep * stage.etp * stage.edp != tp * replicas:
                        raise BadRequest(
                            f"{ws}.expert_tiling: ep x etp x edp = "
                            f"{stage.ep * stage.etp * stage.edp} must equal "
                            f"the stage's {tp * replicas} GPUs")
                    if m.moe.expert_ffn % stage.etp != 0:
                        raise BadRequest(
                            f"{ws}.expert_tiling.etp: {stage.etp} does not "
                            f"divide expert_ffn ({m.moe.expert_ffn})")
                    if m.moe.shared_experts > 0 and m.moe.shared_ffn % tp:
                        raise BadRequest(
                            f"{ws}.tp: {tp} does not divide "
                            f"shared_expert_ffn ({m.moe.shared_ffn})")
                    if total % replicas != 0:
                        raise BadRequest(
                            f"{w}.total_micro_batches: {total} is not a "
                            f"multiple of its {replicas} replicas, which its "
                            f"MoE stage {si} needs")
                stages.append(stage)
            expect = 0
            for si, s in enumerate(stages):
                if s.layer_begin != expect or s.layer_end <= s.layer_begin:
                    raise BadRequest(
                        f"{w}.stages[{si}].layers: must start at layer "
                        f"{expect} and hold at least one, got "
                        f"[{s.layer_begin}, {s.layer_end})")
                expect = s.layer_end
            if expect != m.num_layers:
                raise BadRequest(f"{w}.stages: cover layers [0, {expect}), "
                                 f"the model has {m.num_layers}")
            samples += mbs * total
            templates.append(Template(replicas, mbs, total, tuple(stages)))
        if samples != job.training.global_batch:
            raise BadRequest(
                f"{field}: its micro-batches hold {samples} samples per "
                f"iteration, the global batch is {job.training.global_batch}")
        return Plan(tuple(templates))
