"""The job's training state in the canonical layout (docs/engines.md).

Every tensor of the state, in the fixed order the migration library uses
(the tensor id is the index): each parameter as four tensors (the bf16
weight, its fp32 master copy and Adam's two moments), then the replicated
int64 scalars of the training state. The agent lays these out over a plan
and sends each rank its holdings (PrepareRequest.layout); an engine only
names and shapes them, as `Describe` reports.
"""

from __future__ import annotations

import dataclasses
from typing import List

from arachne_torch.job import Model

EMBEDDING_LAYER = -1  # lives on every first stage
HEAD_LAYER = -2       # final norm + LM head, on every last stage
EVERY_GPU_LAYER = -3  # every GPU of a plan holds it

# The parameter kinds in their order, and bytes per element of each.
PARAM_KINDS = ("weight", "master", "adam_m", "adam_v")
BYTES_PER_ELEMENT = {"weight": 2, "master": 4, "adam_m": 4, "adam_v": 4,
                     "scalars": 8}

TRAIN_STATE_TENSOR = "train_state:scalars"
# The int64 scalars of "train_state:scalars", as the reference engine keeps
# them, so a state moves between the two engines.
NUM_SCALARS = 8
SCALAR_FORMAT, SCALAR_STEP, SCALAR_CURSOR, SCALAR_DATA_SEED = 0, 1, 2, 3
SCALAR_INIT_SEED, SCALAR_GLOBAL_BATCH, SCALAR_SEQ_LEN = 4, 5, 6
# The last slot, which the reference engine neither sets nor reads (it
# carries it): arachne_torch's fp16 dynamic loss scale (device.LossScale;
# 0 = none).
SCALAR_LOSS_SCALE = 7
STATE_FORMAT = 1


@dataclasses.dataclass(frozen=True)
class StateTensor:
    name: str          # "layers.3.mlp.down.weight:adam_m"
    kind: str          # one of BYTES_PER_ELEMENT
    layer: int         # block, EMBEDDING_LAYER, HEAD_LAYER or EVERY_GPU_LAYER
    expert: int        # routed expert, -1 for everything else
    shape: tuple       # logical PyTorch shape ([out, in] for linears)
    tp_split: str      # "replicated", "column" (dim 0) or "row" (dim 1)

    @property
    def elements(self) -> int:
        n = 1
        for d in self.shape:
            n *= d
        return n

    @property
    def bytes(self) -> int:
        return self.elements * BYTES_PER_ELEMENT[self.kind]

    @property
    def param(self) -> str:
        """The parameter's name, without the ":kind" suffix."""
        return self.name.rsplit(":", 1)[0]


def model_state(model: Model) -> List[StateTensor]:
    """The state of `model` (LLaMA / Qwen shape: GQA attention, SwiGLU MLP,
    untied head; MoE blocks with a router, shared and routed experts)."""
    out: List[StateTensor] = []

    def add(name, layer, expert, shape, split):
        for kind in PARAM_KINDS:
            out.append(StateTensor(f"{name}:{kind}", kind, layer, expert,
                                   tuple(shape), split))

    def swiglu(prefix, layer, expert, ffn):
        add(prefix + "gate.weight", layer, expert, (ffn, h), "column")
        add(prefix + "up.weight", layer, expert, (ffn, h), "column")
        add(prefix + "down.weight", layer, expert, (h, ffn), "row")

    h = model.hidden
    q = model.num_heads * model.head_dim
    kv = model.num_kv_heads * model.head_dim
    add("embedding.weight", EMBEDDING_LAYER, -1, (model.vocab, h), "column")
    for layer in range(model.num_layers):
        p = f"layers.{layer}."
        add(p + "input_norm.weight", layer, -1, (h,), "replicated")
        add(p + "attn.q.weight", layer, -1, (q, h), "column")
        add(p + "attn.k.weight", layer, -1, (kv, h), "column")
        add(p + "attn.v.weight", layer, -1, (kv, h), "column")
        add(p + "attn.o.weight", layer, -1, (h, q), "row")
        add(p + "post_norm.weight", layer, -1, (h,), "replicated")
        if model.is_moe_layer(layer):
            moe = model.moe
            add(p + "router.weight", layer, -1, (moe.num_experts, h),
                "replicated")
            for s in range(moe.shared_experts):
                swiglu(f"{p}shared.{s}.", layer, -1, moe.shared_ffn)
            for e in range(moe.num_experts):
                swiglu(f"{p}experts.{e}.", layer, e, moe.expert_ffn)
        else:
            swiglu(p + "mlp.", layer, -1, model.ffn)
    add("final_norm.weight", HEAD_LAYER, -1, (h,), "replicated")
    add("lm_head.weight", HEAD_LAYER, -1, (model.vocab, h), "column")
    out.append(StateTensor(TRAIN_STATE_TENSOR, "scalars", EVERY_GPU_LAYER, -1,
                           (NUM_SCALARS,), "replicated"))
    return out
