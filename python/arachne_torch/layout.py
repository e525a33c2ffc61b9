"""A plan's state layout as the agent sends it (PrepareRequest.layout,
computed by the migration library from the state this engine describes):
every GPU of the plan in plan-rank order, its role and the canonical byte
ranges of the state it holds. The engine computes no layout of its own, so
its holdings are by construction the ones the migration schedule moves.
"""

from __future__ import annotations

import dataclasses
from typing import Dict, List, Sequence, Tuple

from arachne_torch.job import BadRequest, Plan
from arachne_torch.state import StateTensor


@dataclasses.dataclass(frozen=True)
class Holding:
    tensor: int
    begin: int
    end: int


@dataclasses.dataclass(frozen=True)
class RankLayout:
    node: str
    index: int
    template: int
    replica: int
    stage: int
    tp_rank: int
    holdings: Tuple[Holding, ...]


class Layout:
    def __init__(self, ranks: Sequence[RankLayout]):
        self.ranks = list(ranks)
        self.rank_of: Dict[Tuple[int, int, int, int], int] = {
            (r.template, r.replica, r.stage, r.tp_rank): g
            for g, r in enumerate(self.ranks)}

    def plan_rank_of_gpu(self, node: str, index: int) -> int:
        for g, r in enumerate(self.ranks):
            if r.node == node and r.index == index:
                return g
        return -1

    def bytes_on(self, g: int) -> int:
        return sum(h.end - h.begin for h in self.ranks[g].holdings)

    @staticmethod
    def from_proto(msg, plan: Plan, tensors: List[StateTensor],
                   field: str = "layout") -> "Layout":
        """Reads and checks it against the plan and the state: every role
        inside the plan, every holding a range inside its tensor."""
        if not msg.ranks:
            raise BadRequest(f"{field}.ranks: required (the agent sends the "
                             "plan's layout), got none")
        ranks = []
        for g, r in enumerate(msg.ranks):
            w = f"{field}.ranks[{g}]"
            if not 0 <= r.template_index < len(plan.templates):
                raise BadRequest(f"{w}.template_index: must be in 0.."
                                 f"{len(plan.templates) - 1}, got "
                                 f"{r.template_index}")
            t = plan.templates[r.template_index]
            if not 0 <= r.replica < t.replicas:
                raise BadRequest(f"{w}.replica: must be in 0..{t.replicas - 1}"
                                 f", got {r.replica}")
            if not 0 <= r.stage < t.depth:
                raise BadRequest(f"{w}.stage: must be in 0..{t.depth - 1}, "
                                 f"got {r.stage}")
            tp = t.stages[r.stage].tp
            if not 0 <= r.tp_rank < tp:
                raise BadRequest(f"{w}.tp_rank: must be in 0..{tp - 1}, got "
                                 f"{r.tp_rank}")
            holds = []
            for i, h in enumerate(r.holdings):
                if not 0 <= h.tensor < len(tensors):
                    raise BadRequest(f"{w}.holdings[{i}].tensor: must be in "
                                     f"0..{len(tensors) - 1}, got {h.tensor}")
                size = tensors[h.tensor].bytes
                if not 0 <= h.begin < h.end <= size:
                    raise BadRequest(
                        f"{w}.holdings[{i}]: [{h.begin}, {h.end}) is not a "
                        f"byte range of {tensors[h.tensor].name} ({size} "
                        "bytes)")
                holds.append(Holding(h.tensor, h.begin, h.end))
            ranks.append(RankLayout(r.gpu.node, r.gpu.index, r.template_index,
                                    r.replica, r.stage, r.tp_rank,
                                    tuple(holds)))
        layout = Layout(ranks)
        if len(layout.rank_of) != len(ranks):
            raise BadRequest(f"{field}.ranks: two GPUs have the same role")
        return layout
