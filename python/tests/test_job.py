"""Reading a job: every refusal names the field and the value."""

import pytest

from arachne.v1 import agent_pb2, planner_pb2
from arachne_torch.job import BadRequest, EngineConfig, Job, Model, Plan, Training
from arachne_torch import state as st


def request(model, global_batch=16, seq_len=32):
    r = agent_pb2.PrepareRequest()
    r.model_spec.CopyFrom(model)
    r.training.seq_len = seq_len
    r.training.global_batch = global_batch
    return r


def plan(stages, replicas=1, mbs=4, total=4, tiling=None):
    p = planner_pb2.Plan()
    t = p.templates.add()
    t.replicas, t.micro_batch_size, t.total_micro_batches = replicas, mbs, total
    for tp, b, e in stages:
        s = t.stages.add()
        s.tp = tp
        s.layers.extend([b, e])
        if tiling:
            s.expert_tiling.ep, s.expert_tiling.etp, s.expert_tiling.edp = tiling
    return p


def test_defaults_are_the_reference_engines(tiny_gpt):
    job = Job.from_request(request(tiny_gpt))
    assert job.engine == EngineConfig(1e-3, 4, 0.9, 0.95, 1e-6, 0.0, 1, 1)
    assert job.training == Training(32, 16)
    assert job.model.num_kv_heads == 4 and job.model.head_dim == 16


def test_zero_training_fields_take_the_planners_defaults(tiny_gpt):
    r = request(tiny_gpt)
    r.ClearField("training")
    assert Job.from_request(r).training == Training(2048, 2048)


@pytest.mark.parametrize("field,value,message", [
    ("num_layers", 0, "model_spec.num_layers: must be in 1..1024, got 0"),
    ("hidden", -5, "model_spec.hidden: must be in 1..65536, got -5"),
    ("num_kv_heads", 3,
     "model_spec.num_kv_heads: must divide num_heads (8), got 3"),
    ("head_dim", 15,
     "model tiny-gpt.head_dim: must be even for rotary embeddings, got 15"),
    ("vocab", 1, "model_spec.vocab: must be in 2..4194304, got 1"),
])
def test_bad_models_are_refused_naming_the_field(tiny_gpt, field, value,
                                                  message):
    setattr(tiny_gpt, field, value)
    with pytest.raises(BadRequest) as e:
        Job.from_request(request(tiny_gpt))
    assert str(e.value) == message


def test_a_model_the_planner_accepts_but_this_engine_cannot_build(tiny_gpt):
    tiny_gpt.attention = "mla"
    with pytest.raises(BadRequest) as e:
        Job.from_request(request(tiny_gpt))
    assert str(e.value) == (
        "model tiny-gpt: arachne_torch trains LLaMA-shaped models (GQA "
        "attention, SwiGLU MLP, untied embeddings); this one has attention "
        "\"mla\", mlp \"swiglu\", tied_embeddings false")


def test_a_model_named_only_by_reference_is_refused():
    r = agent_pb2.PrepareRequest()
    r.model.name = "llama3-8b"
    with pytest.raises(BadRequest) as e:
        Job.from_request(r)
    assert str(e.value) == (
        "model_spec: required (the agent resolves catalog models and "
        "config.json files before it asks an engine), got only model.name "
        "\"llama3-8b\"")


@pytest.mark.parametrize("field,value,message", [
    ("learning_rate", 0.0,
     "engine.learning_rate: must be a finite number > 0, got 0.0"),
    ("adam_beta1", 1.0, "engine.adam_beta1: must be in [0, 1), got 1.0"),
    ("adam_eps", float("nan"),
     "engine.adam_eps: must be a finite number > 0, got nan"),
    ("warmup_iterations", -1, "engine.warmup_iterations: must be >= 0, got -1"),
])
def test_bad_engine_configs_are_refused(tiny_gpt, field, value, message):
    r = request(tiny_gpt)
    setattr(r.engine, field, value)
    with pytest.raises(BadRequest) as e:
        Job.from_request(r)
    assert str(e.value) == message


@pytest.mark.parametrize("p,message", [
    (plan([(3, 0, 4)]),
     "plan.templates[0].stages[0].tp: 3 does not divide the model's num_heads "
     "(8)"),
    (plan([(1, 0, 2), (1, 3, 4)]),
     "plan.templates[0].stages[1].layers: must start at layer 2 and hold at "
     "least one, got [3, 4)"),
    (plan([(1, 0, 3)]),
     "plan.templates[0].stages: cover layers [0, 3), the model has 4"),
    (plan([(1, 0, 4)], mbs=4, total=2),
     "plan: its micro-batches hold 8 samples per iteration, the global batch "
     "is 16"),
    (plan([(1, 0, 4)], replicas=4, mbs=8, total=2),
     "plan.templates[0]: micro_batch_size 8 and total_micro_batches 2 must "
     "give every one of its 4 replicas a micro-batch"),
])
def test_plans_this_engine_cannot_run_are_refused(tiny_gpt, p, message):
    job = Job.from_request(request(tiny_gpt))
    with pytest.raises(BadRequest) as e:
        Plan.from_proto(p, job)
    assert str(e.value) == message


def test_moe_tilings_are_checked(tiny_moe):
    job = Job.from_request(request(tiny_moe))
    with pytest.raises(BadRequest) as e:
        Plan.from_proto(plan([(2, 0, 4)], tiling=(1, 1, 1)), job)
    assert str(e.value) == ("plan.templates[0].stages[0].expert_tiling: ep x "
                            "etp x edp = 1 must equal the stage's 2 GPUs")
    with pytest.raises(BadRequest) as e:
        Plan.from_proto(plan([(2, 0, 4)], replicas=2, mbs=4, total=4,
                             tiling=(1, 3, 1)), job)
    assert "ep x etp x edp = 3 must equal the stage's 4 GPUs" in str(e.value)
    p = Plan.from_proto(plan([(2, 0, 4)], replicas=2, mbs=4, total=4,
                             tiling=(2, 2, 1)), job)
    assert p.templates[0].stages[0].ep == 2


def test_the_state_lists_every_parameter_four_times_then_the_scalars(
        tiny_gpt, tiny_moe):
    dense = st.model_state(Model.from_proto(tiny_gpt))
    # embedding, 4 blocks x (2 norms, q, k, v, o, gate, up, down), final
    # norm, head: 39 parameters; x4 kinds, + the scalars.
    assert len(dense) == 39 * 4 + 1
    assert dense[0] == st.StateTensor("embedding.weight:weight", "weight", -1,
                                      -1, (512, 128), "column")
    assert dense[-1] == st.StateTensor("train_state:scalars", "scalars", -3,
                                       -1, (8,), "replicated")
    assert sum(t.bytes for t in dense) == 10108736
    moe = st.model_state(Model.from_proto(tiny_moe))
    names = [t.name for t in moe]
    assert "layers.0.mlp.gate.weight:master" in names
    assert "layers.0.router.weight:master" not in names
    down = moe[names.index("layers.1.experts.3.down.weight:adam_v")]
    assert (down.layer, down.expert, down.shape, down.tp_split) == \
        (1, 3, (128, 128), "row")
