"""The learning-rate schedule (warm-up, then constant or cosine) and gradient
clipping by global L2 norm, as the reference engine computes them
(worker_agent/engine/engine.cc; test/engine/reference_engine_test.cc checks
the same values there)."""

import math
from types import SimpleNamespace

import pytest
import torch

from arachne_torch.job import BadRequest, EngineConfig, Job
from arachne_torch.layout import Holding
from arachne_torch.trainer import _owned_elements

from test_engine_process import one_rank_trainer, prepare
from test_engine_process import store  # noqa: F401 (a fixture)
from test_job import request


def test_constant_is_the_warm_up_then_the_learning_rate():
    c = EngineConfig()
    assert [c.learning_rate_at(t) for t in (1, 2, 4, 5, 1000)] == \
        pytest.approx([2.5e-4, 5e-4, 1e-3, 1e-3, 1e-3], rel=1e-15)
    assert EngineConfig(warmup_iterations=0).learning_rate_at(1) == 1e-3


def test_cosine_decays_from_the_peak_to_the_minimum():
    c = EngineConfig(lr_schedule="cosine", decay_iterations=12,
                     min_learning_rate=1e-4)
    c.validate()
    got = [c.learning_rate_at(t) for t in (2, 4, 6, 8, 11, 12, 13, 10**6)]
    want = [5e-4, 1e-3, 1e-4 + 0.45e-3 * (1 + math.cos(math.pi / 4)),
            5.5e-4, 1e-4 + 0.45e-3 * (1 + math.cos(math.pi * 7 / 8)),
            1e-4, 1e-4, 1e-4]
    assert got == pytest.approx(want, rel=1e-12)
    # Without a warm-up, step 1 is already a quarter of the way down.
    c = EngineConfig(warmup_iterations=0, lr_schedule="cosine",
                     decay_iterations=4)
    assert c.learning_rate_at(1) == pytest.approx(
        0.5e-3 * (1 + math.cos(math.pi / 4)), rel=1e-12)


def test_clip_scale_is_clip_grad_norms():
    assert EngineConfig().clip_scale(1e9) == 1.0
    c = EngineConfig(grad_clip_norm=1.0)
    assert c.clip_scale(0.5) == 1.0
    assert c.clip_scale(4.0) == 1.0 / (4.0 + 1e-6)


@pytest.mark.parametrize("fields,message", [
    (dict(lr_schedule="linear"),
     "engine.lr_schedule: must be \"constant\" or \"cosine\", got \"linear\""),
    (dict(lr_schedule="cosine"),
     "engine.decay_iterations: must be > warmup_iterations (4) with "
     "lr_schedule \"cosine\", got 0"),
    (dict(lr_schedule="cosine", decay_iterations=4),
     "engine.decay_iterations: must be > warmup_iterations (4) with "
     "lr_schedule \"cosine\", got 4"),
    (dict(lr_schedule="cosine", decay_iterations=1000000001),
     "engine.decay_iterations: must be <= 1000000000, got 1000000001"),
    (dict(lr_schedule="cosine", decay_iterations=10, min_learning_rate=0.002),
     "engine.min_learning_rate: must be in [0, learning_rate (0.001)], got "
     "0.002"),
    (dict(lr_schedule="cosine", decay_iterations=10, min_learning_rate=-1),
     "engine.min_learning_rate: must be in [0, learning_rate (0.001)], got "
     "-1"),
    (dict(decay_iterations=10),
     "engine.decay_iterations: must be 0 (unset) unless lr_schedule is "
     "\"cosine\", got 10"),
    (dict(min_learning_rate=0.0001),
     "engine.min_learning_rate: must be 0 (unset) unless lr_schedule is "
     "\"cosine\", got 0.0001"),
    (dict(grad_clip_norm=-1),
     "engine.grad_clip_norm: must be 0 (off) or a finite number in "
     "(0, 1000000], got -1"),
    (dict(grad_clip_norm=float("inf")),
     "engine.grad_clip_norm: must be 0 (off) or a finite number in "
     "(0, 1000000], got inf"),
    (dict(grad_clip_norm=float("nan")),
     "engine.grad_clip_norm: must be 0 (off) or a finite number in "
     "(0, 1000000], got nan"),
])
def test_bad_schedules_and_clips_are_refused(tiny_gpt, fields, message):
    r = request(tiny_gpt)
    for k, v in fields.items():
        setattr(r.engine, k, v)
    with pytest.raises(BadRequest) as e:
        Job.from_request(r)
    assert str(e.value) == message


def test_the_fields_come_from_the_request(tiny_gpt):
    r = request(tiny_gpt)
    r.engine.lr_schedule, r.engine.decay_iterations = "cosine", 100
    r.engine.min_learning_rate, r.engine.grad_clip_norm = 1e-5, 0.5
    e = Job.from_request(r).engine
    assert (e.lr_schedule, e.decay_iterations, e.min_learning_rate,
            e.grad_clip_norm) == ("cosine", 100, 1e-5, 0.5)
    e = Job.from_request(request(tiny_gpt)).engine
    assert (e.lr_schedule, e.decay_iterations, e.min_learning_rate,
            e.grad_clip_norm) == ("constant", 0, 0.0, 0.0)


def test_each_element_is_owned_by_the_lowest_rank_holding_it():
    # Tensor 0 (64 fp32 elements): rank 0 holds its first half, rank 1 its
    # second half (TP 2), rank 2 all of it (replicated or another template),
    # rank 3 the middle half; tensor 1 is rank 1's and rank 3's.
    def rank(*hs):
        return SimpleNamespace(holdings=[Holding(*h) for h in hs])
    layout = SimpleNamespace(ranks=[
        rank((0, 0, 128)), rank((0, 128, 256), (1, 0, 64)), rank((0, 0, 256)),
        rank((0, 64, 192), (1, 0, 64))])
    assert _owned_elements(layout, 0, 0, 0, 128) == [(0, 32)]
    assert _owned_elements(layout, 1, 0, 128, 256) == [(0, 32)]
    assert _owned_elements(layout, 2, 0, 0, 256) == []
    assert _owned_elements(layout, 3, 0, 64, 192) == []
    assert _owned_elements(layout, 1, 1, 0, 64) == [(0, 16)]
    assert _owned_elements(layout, 3, 1, 0, 64) == []
    # A rank above a gap owns the gap only.
    layout.ranks[1] = rank((0, 160, 256))
    assert _owned_elements(layout, 2, 0, 0, 256) == [(32, 40)]


def test_clipping_scales_the_gradient_by_max_over_its_norm(store):  # noqa: F811
    # One iteration without clipping: Adam's first moment is (1 - beta1) g,
    # so the gradient and its norm follow from it; with clipping the moment
    # is that times max / (norm + 1e-6) and the second that squared.
    off = one_rank_trainer(prepare(41, store))
    loss_off = off.run_iteration().loss
    r = prepare(42, store)
    r.engine.grad_clip_norm = 0.25
    on = one_rank_trainer(r)
    loss_on = on.run_iteration().loss
    assert loss_on == loss_off  # clipping acts after the forward
    b1 = off.job.engine.adam_beta1
    norm = math.sqrt(sum(float((p.adam_m.double() / (1 - b1)).square().sum())
                         for p in off.params))
    assert norm > 0.5, norm  # clipping does act
    scale = 0.25 / (norm + 1e-6)
    for p, q in zip(off.params, on.params):
        torch.testing.assert_close(q.adam_m, p.adam_m * scale, rtol=1e-5,
                                   atol=1e-12)
        torch.testing.assert_close(q.adam_v, p.adam_v * scale * scale,
                                   rtol=1e-5, atol=1e-18)
    # Above the norm nothing changes, bit for bit.
    r = prepare(43, store)
    r.engine.grad_clip_norm = norm * 2
    same = one_rank_trainer(r)
    same.run_iteration()
    for p, q in zip(off.params, same.params):
        assert torch.equal(p.master, q.master)
