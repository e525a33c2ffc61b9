"""Shared fixtures of arachne_torch's tests (pytest; ctest runs them with
the generated protos on PYTHONPATH)."""

import pytest

from arachne.v1 import planner_pb2


def tiny_gpt_proto(**moe):
    """tiny-gpt of profiles/models.yaml, as the agent sends it; with `moe`
    fields, tiny-moe."""
    m = planner_pb2.Model(name="tiny-moe" if moe else "tiny-gpt",
                          num_layers=4, hidden=128, num_heads=8,
                          num_kv_heads=4, head_dim=16, ffn=256, vocab=512,
                          mlp="swiglu")
    for k, v in moe.items():
        setattr(m.moe, k, v)
    return m


TINY_MOE = dict(num_experts=4, top_k=2, expert_ffn=128, shared_experts=1,
                shared_expert_ffn=128, dense_first_layers=1)


@pytest.fixture
def tiny_gpt():
    return tiny_gpt_proto()


@pytest.fixture
def tiny_moe():
    return tiny_gpt_proto(**TINY_MOE)
