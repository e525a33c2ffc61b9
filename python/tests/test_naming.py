"""Bring your own model (arachne_torch.naming, arachne_torch.convert): a
state dict under a user's names imports into a canonical checkpoint the
engine restores, reads back bitwise, exports back to the same tensors, and
a Trainer on it computes what a plain PyTorch forward pass written with
Hugging Face's names computes (the mapping and the rotary convention)."""

import json
import math
import os
import subprocess
import sys

import numpy as np
import pytest
import torch
import torch.nn.functional as F

from arachne_torch import checkpoint as ckpt
from arachne_torch import convert, naming
from arachne_torch import state as st
from arachne_torch.job import BadRequest, Model
from arachne_torch.naming import NamingError

from conftest import TINY_MOE, tiny_gpt_proto
from test_engine_process import one_rank_trainer, prepare
from test_engine_process import store  # noqa: F401 (a fixture)

JOB = dict(data_seed=7, init_seed=11, global_batch=16, seq_len=32)
HF = naming.builtin_rules("huggingface")


def hf_state_dict(model: Model, style="llama", seed=0):
    """Random weights under Hugging Face's names: llama (dense and the
    dense layers of an MoE model), mixtral or qwen2_moe MoE blocks."""
    g = torch.Generator().manual_seed(seed)
    h, hd = model.hidden, model.head_dim
    sd = {}

    def w(name, *shape, std=0.05):
        sd[name] = torch.randn(*shape, generator=g) * std

    def norm(name):
        sd[name] = 1.0 + 0.1 * torch.randn(h, generator=g)

    def mlp(p, ffn, names=("gate_proj", "up_proj", "down_proj")):
        w(f"{p}{names[0]}.weight", ffn, h)
        w(f"{p}{names[1]}.weight", ffn, h)
        w(f"{p}{names[2]}.weight", h, ffn)

    w("model.embed_tokens.weight", model.vocab, h, std=1.0)
    for i in range(model.num_layers):
        p = f"model.layers.{i}."
        norm(p + "input_layernorm.weight")
        w(p + "self_attn.q_proj.weight", model.num_heads * hd, h)
        w(p + "self_attn.k_proj.weight", model.num_kv_heads * hd, h)
        w(p + "self_attn.v_proj.weight", model.num_kv_heads * hd, h)
        w(p + "self_attn.o_proj.weight", h, model.num_heads * hd)
        norm(p + "post_attention_layernorm.weight")
        if not model.is_moe_layer(i):
            mlp(p + "mlp.", model.ffn)
        elif style == "mixtral":
            m = model.moe
            w(p + "block_sparse_moe.gate.weight", m.num_experts, h)
            for e in range(m.num_experts):
                mlp(f"{p}block_sparse_moe.experts.{e}.", m.expert_ffn,
                    ("w1", "w3", "w2"))
        else:
            m = model.moe
            w(p + "mlp.gate.weight", m.num_experts, h, std=0.5)
            for e in range(m.num_experts):
                mlp(f"{p}mlp.experts.{e}.", m.expert_ffn)
            assert m.shared_experts <= 1
            if m.shared_experts:
                mlp(p + "mlp.shared_expert.", m.shared_ffn)
    norm("model.norm.weight")
    w("lm_head.weight", model.vocab, h)
    return sd


# -- a reference forward pass with Hugging Face's names ---------------------

def rms_norm(x, w, eps=1e-5):
    return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + eps) * w


def rotate_half(x):  # transformers' LlamaAttention
    x1, x2 = x.chunk(2, dim=-1)
    return torch.cat((-x2, x1), dim=-1)


def hf_loss(sd, model: Model, tokens, targets, theta=10000.0):
    """Mean cross entropy of a LLaMA (Qwen2-MoE blocks where the model has
    MoE layers), as transformers' modeling_llama computes it."""
    b, s = tokens.shape
    nh, nkv, hd = model.num_heads, model.num_kv_heads, model.head_dim
    inv_freq = 1.0 / theta ** (torch.arange(0, hd, 2).double() / hd)
    freqs = torch.outer(torch.arange(s).double(), inv_freq)
    emb = torch.cat((freqs, freqs), dim=-1)
    cos, sin = emb.cos().float(), emb.sin().float()
    mask = torch.full((s, s), float("-inf")).triu(1)

    def lin(x, name):
        return x @ sd[name].t()

    def mlp(x, p):
        return lin(F.silu(lin(x, p + "gate_proj.weight")) *
                   lin(x, p + "up_proj.weight"), p + "down_proj.weight")

    x = sd["model.embed_tokens.weight"][tokens]
    for i in range(model.num_layers):
        p = f"model.layers.{i}."
        y = rms_norm(x, sd[p + "input_layernorm.weight"])
        q = lin(y, p + "self_attn.q_proj.weight").view(b, s, nh, hd)
        k = lin(y, p + "self_attn.k_proj.weight").view(b, s, nkv, hd)
        v = lin(y, p + "self_attn.v_proj.weight").view(b, s, nkv, hd)
        q, k, v = (t.transpose(1, 2) for t in (q, k, v))
        q = q * cos + rotate_half(q) * sin
        k = k * cos + rotate_half(k) * sin
        k = k[:, :, None].expand(b, nkv, nh // nkv, s, hd).reshape(
            b, nh, s, hd)  # repeat_kv
        v = v[:, :, None].expand(b, nkv, nh // nkv, s, hd).reshape(
            b, nh, s, hd)
        a = torch.softmax(q @ k.transpose(2, 3) / math.sqrt(hd) + mask, -1)
        a = (a @ v).transpose(1, 2).reshape(b, s, nh * hd)
        x = x + lin(a, p + "self_attn.o_proj.weight")
        y = rms_norm(x, sd[p + "post_attention_layernorm.weight"])
        if not model.is_moe_layer(i):
            x = x + mlp(y, p + "mlp.")
            continue
        # Qwen2-MoE with norm_topk_prob: softmax, top-k, renormalized.
        flat = y.reshape(b * s, -1)
        probs = torch.softmax(lin(flat, p + "mlp.gate.weight"), -1)
        w, idx = probs.topk(model.moe.top_k, -1)
        w = w / w.sum(-1, keepdim=True)
        out = mlp(flat, p + "mlp.shared_expert.") \
            if model.moe.shared_experts else torch.zeros_like(flat)
        for e in range(model.moe.num_experts):
            t, j = (idx == e).nonzero(as_tuple=True)
            out = out.index_add(0, t, mlp(flat[t], f"{p}mlp.experts.{e}.") *
                                w[t, j, None])
        x = x + out.reshape(b, s, -1)
    logits = lin(rms_norm(x, sd["model.norm.weight"]), "lm_head.weight")
    return F.cross_entropy(logits.reshape(-1, logits.size(-1)),
                           targets.reshape(-1)).item()


# -- import, read back, export ----------------------------------------------

def import_(sd, model, tmp_path, rules=HF, sub="ckpt"):
    out = str(tmp_path / sub)
    path = naming.import_state_dict(sd, model, rules, out, **JOB)
    return out, path


def test_hugging_face_llama_imports_reads_back_bitwise_and_exports(
        tmp_path, tiny_gpt):
    model = Model.from_proto(tiny_gpt)
    sd = hf_state_dict(model)
    sd["model.layers.0.self_attn.rotary_emb.inv_freq"] = torch.ones(8)
    out, path = import_(sd, model, tmp_path)
    assert os.listdir(out) == ["shard-import-0.bin"]
    assert path == os.path.join(out, "shard-import-0.bin")
    tensors = st.model_state(model)
    full = ckpt.read_checkpoint(out, tensors, model.name)
    names = naming.map_names({k: v.shape for k, v in sd.items()}, model, HF)
    assert len(names) == len(sd) - 1  # inv_freq is dropped
    user_of = {c: u for u, c in names.items()}
    for i, t in enumerate(tensors):
        b = bytes(full[i])
        if t.kind == "scalars":
            assert np.frombuffer(b, "<i8").tolist() == [
                st.STATE_FORMAT, 0, 0, 7, 11, 16, 32, 0]
            continue
        src = sd[user_of[t.param]]
        if t.tp_split == "row":  # o, down: canonical bytes are transposed
            assert ".attn.o." in t.name or ".down." in t.name
            src = src.t().contiguous()
        if t.kind == "master":
            assert b == src.numpy().tobytes()
        elif t.kind == "weight":
            assert b == src.to(torch.bfloat16).view(torch.int16).numpy() \
                .tobytes()
        else:
            assert b == bytes(t.bytes)
    back = naming.export_state_dict(out, model, HF)
    assert list(back) == [k for k in sd if "inv_freq" not in k] or \
        set(back) == set(sd) - {"model.layers.0.self_attn.rotary_emb.inv_freq"}
    for k, v in back.items():
        assert v.dtype == torch.float32 and torch.equal(v, sd[k]), k


@pytest.mark.parametrize("style,shared", [("qwen2_moe", 1), ("mixtral", 0)])
def test_moe_names_import_and_export(tmp_path, style, shared):
    moe = dict(TINY_MOE, shared_experts=shared,
               shared_expert_ffn=TINY_MOE["shared_expert_ffn"] * shared)
    model = Model.from_proto(tiny_gpt_proto(**moe))
    sd = hf_state_dict(model, style)
    out, _ = import_(sd, model, tmp_path)
    names = naming.map_names({k: v.shape for k, v in sd.items()}, model, HF)
    if style == "mixtral":
        assert names["model.layers.1.block_sparse_moe.experts.3.w3.weight"] \
            == "layers.1.experts.3.up.weight"
        assert names["model.layers.2.block_sparse_moe.gate.weight"] == \
            "layers.2.router.weight"
    else:
        assert names["model.layers.3.mlp.shared_expert.down_proj.weight"] \
            == "layers.3.shared.0.down.weight"
        assert names["model.layers.1.mlp.experts.0.gate_proj.weight"] == \
            "layers.1.experts.0.gate.weight"
    assert names["model.layers.0.mlp.gate_proj.weight"] == \
        "layers.0.mlp.gate.weight"  # the dense first layer
    # Exporting, "huggingface" writes Qwen-MoE names; "mixtral" Mixtral's.
    back = naming.export_state_dict(out, model, naming.builtin_rules(
        "mixtral" if style == "mixtral" else "huggingface"))
    assert set(back) == set(sd)
    for k, v in back.items():
        assert torch.equal(v, sd[k]), k


def test_a_custom_rule_file_maps_its_own_naming(tmp_path, tiny_gpt):
    model = Model.from_proto(tiny_gpt)
    hf = hf_state_dict(model)
    rename = {"model.embed_tokens.weight": "tok.weight",
              "model.norm.weight": "norm_f.weight",
              "lm_head.weight": "out.weight"}
    parts = {"self_attn.q_proj": "attention.wq",
             "self_attn.k_proj": "attention.wk",
             "self_attn.v_proj": "attention.wv",
             "self_attn.o_proj": "attention.wo",
             "mlp.gate_proj": "ffn.w1", "mlp.up_proj": "ffn.w3",
             "mlp.down_proj": "ffn.w2", "input_layernorm": "attn_norm",
             "post_attention_layernorm": "ffn_norm"}
    sd = {}
    for k, v in hf.items():
        if k in rename:
            sd[rename[k]] = v
            continue
        i, rest = k[len("model.layers."):].split(".", 1)
        sd[f"blocks.{i}.{parts[rest[:-len('.weight')]]}"] = v
    rules = [
        {"pattern": r"^tok\.weight$", "canonical": "embedding.weight"},
        {"pattern": r"^blocks\.(\d+)\.attention\.w([qkvo])$",
         "canonical": "layers.{1}.attn.{2}.weight"},
        {"pattern": r"^blocks\.(?P<i>\d+)\.ffn\.w1$",
         "canonical": "layers.{i}.mlp.gate.weight"},
        {"user": "blocks.{i}.ffn.w3", "canonical": "layers.{i}.mlp.up.weight"},
        {"pattern": r"blocks\.(\d+)\.ffn\.w2",
         "canonical": "layers.{1}.mlp.down.weight"},
        {"pattern": r"^blocks\.(\d+)\.attn_norm$",
         "canonical": "layers.{1}.input_norm.weight"},
        {"pattern": r"^blocks\.(\d+)\.ffn_norm$",
         "canonical": "layers.{1}.post_norm.weight"},
        {"pattern": r"^norm_f\.weight$", "canonical": "final_norm.weight"},
        {"pattern": r"^out\.weight$", "canonical": "lm_head.weight",
         "user": "out.weight"},
    ]
    (tmp_path / "rules.json").write_text(json.dumps(rules))
    loaded = naming.load_rules(str(tmp_path / "rules.json"))
    out, _ = import_(sd, model, tmp_path, loaded)
    full = ckpt.read_checkpoint(out, st.model_state(model), model.name)
    i = [t.name for t in st.model_state(model)].index(
        "layers.2.attn.k.weight:master")
    assert bytes(full[i]) == hf["model.layers.2.self_attn.k_proj.weight"] \
        .numpy().tobytes()
    back = naming.export_state_dict(out, model, loaded)
    assert set(back) == set(sd)
    assert all(torch.equal(back[k], sd[k]) for k in sd)


# -- errors -----------------------------------------------------------------

def refusal(sd, model, rules=HF):
    with pytest.raises(NamingError) as e:
        naming.map_names({k: tuple(v.shape) for k, v in sd.items()}, model,
                         rules)
    assert isinstance(e.value, BadRequest) and isinstance(e.value, ValueError)
    return str(e.value)


def test_each_mapping_error_names_the_parameter(tiny_gpt):
    model = Model.from_proto(tiny_gpt)
    good = hf_state_dict(model)

    sd = dict(good, **{"model.layers.0.self_attn.q_proj.bias":
                       torch.zeros(128)})
    assert refusal(sd, model) == (
        "parameter 'model.layers.0.self_attn.q_proj.bias' (shape [128]): no "
        f"rule maps it (tried {len(HF)} rules; give a rule file with "
        "--rules, or a rule with canonical null to drop it)")

    sd = dict(good)
    del sd["model.layers.2.mlp.up_proj.weight"]
    del sd["lm_head.weight"]
    assert refusal(sd, model) == (
        "canonical parameter 'layers.2.mlp.up.weight' (shape [256, 128]) of "
        "model tiny-gpt: no parameter maps to it (1 more missing)")

    sd = dict(good)
    sd["model.layers.1.self_attn.k_proj.weight"] = torch.zeros(128, 64)
    assert refusal(sd, model) == (
        "parameter 'model.layers.1.self_attn.k_proj.weight' has shape "
        "[128, 64]; it maps to 'layers.1.attn.k.weight', which is [64, 128] "
        "([out, in], as nn.Linear.weight) in model tiny-gpt")

    sd = dict(good, **{"model.layers.4.input_layernorm.weight":
                       torch.ones(128)})
    assert refusal(sd, model) == (
        "parameter 'model.layers.4.input_layernorm.weight' (shape [128]) "
        "maps to 'layers.4.input_norm.weight' by rule 1 of built-in rules "
        "huggingface (pattern \"^model\\.layers\\.(?P<i>[0-9]+)\\."
        "input_layernorm\\.weight$\" -> \"layers.{i}.input_norm.weight\"), "
        "which model tiny-gpt does not have (layers 0..3)")

    rules = HF + naming.rules_from_json(
        [{"pattern": r"^extra\.(\d+)\.q$", "canonical":
          "layers.{1}.attn.q.weight"}], "extra.json")
    sd = dict(good, **{"extra.0.q": torch.zeros(128, 128)})
    assert refusal(sd, model, rules) == (
        "parameters 'model.layers.0.self_attn.q_proj.weight' and 'extra.0.q' "
        "both map to 'layers.0.attn.q.weight'")

    # The MoE model's router, for a dense model.
    sd = dict(good, **{"model.layers.1.mlp.gate.weight": torch.zeros(4, 128)})
    assert "maps to 'layers.1.router.weight' by rule 13 of built-in rules " \
        "huggingface" in refusal(sd, model)


def test_bad_values_and_arguments_are_refused_before_writing(tmp_path,
                                                             tiny_gpt):
    model = Model.from_proto(tiny_gpt)
    sd = hf_state_dict(model)
    sd["model.layers.3.mlp.down_proj.weight"][5, 7] = float("nan")
    with pytest.raises(NamingError) as e:
        import_(sd, model, tmp_path)
    assert str(e.value) == (
        "parameter 'model.layers.3.mlp.down_proj.weight' (shape [128, 256]):"
        f" element {5 * 256 + 7} is nan, not a finite number")
    assert os.listdir(tmp_path / "ckpt") == []  # nothing left behind

    sd = hf_state_dict(model)
    sd["model.norm.weight"] = torch.ones(128, dtype=torch.int64)
    with pytest.raises(NamingError) as e:
        import_(sd, model, tmp_path)
    assert str(e.value) == ("parameter 'model.norm.weight' (shape [128]) has "
                            "dtype torch.int64; weights must be floating "
                            "point")

    with pytest.raises(BadRequest) as e:
        naming.import_state_dict(hf_state_dict(model), model, HF,
                                 str(tmp_path / "x"), **dict(JOB, seq_len=0))
    assert str(e.value) == "seq_len: must be an integer in 1..131072, got 0"

    out, _ = import_(hf_state_dict(model), model, tmp_path)
    with pytest.raises(BadRequest) as e:
        import_(hf_state_dict(model), model, tmp_path)
    assert str(e.value) == (f"out: {out} already holds shard files; give a "
                            "new or empty directory")


@pytest.mark.parametrize("rules,message", [
    ({"pattern": "a"}, "rule 0 of r.json: \"canonical\" is required (a "
     "template, or null to drop what it matches)"),
    ([{"pattern": "(", "canonical": "x"}], "rule 0 of r.json: pattern \"(\" "
     "is not a regular expression: missing ), unterminated subpattern at "
     "position 0"),
    ([{"pattern": r"^a\.(\d+)$", "canonical": "layers.{2}.attn.q.weight"}],
     "rule 0 of r.json: canonical \"layers.{2}.attn.q.weight\": field {2}: "
     "the pattern has 1 group(s)"),
    ([{"pattern": r"^a\.(?P<i>\d+)$", "canonical": "layers.{j}.x"}],
     "rule 0 of r.json: canonical \"layers.{j}.x\": field {j}: the pattern "
     "has no group named \"j\" (it has ['i'])"),
    ([{"canonical": "x", "pattern": "a", "weight": 2}],
     "rule 0 of r.json: unknown key \"weight\" (keys: pattern, canonical, "
     "user)"),
    ([{"canonical": "x"}], "rule 0 of r.json: needs \"pattern\" (a regular "
     "expression) or \"user\" (a template), got neither"),
])
def test_bad_rule_files_name_the_rule(rules, message):
    if isinstance(rules, dict):
        rules = [rules]
    with pytest.raises(NamingError) as e:
        naming.rules_from_json(rules, "r.json")
    assert str(e.value) == message


def test_a_rule_that_cannot_be_inverted_is_named_on_export(tmp_path,
                                                           tiny_gpt):
    model = Model.from_proto(tiny_gpt)
    sd = hf_state_dict(model)
    rules = naming.rules_from_json(
        [{"pattern": r"^model\.embed_tokens\.weight|wte$",
          "canonical": "embedding.weight"}], "r.json") + HF
    out, _ = import_(sd, model, tmp_path, rules)
    # The HF rule after it still names the embedding.
    assert "model.embed_tokens.weight" in naming.export_state_dict(
        out, model, rules)
    only = naming.rules_from_json(
        [{"pattern": r"^(?:wte|tok)$", "canonical": "embedding.weight"}],
        "r.json") + HF[1:]
    with pytest.raises(NamingError) as e:
        naming.export_state_dict(out, model, only)
    assert str(e.value) == (
        "canonical parameter 'embedding.weight' (shape [512, 128]): no rule "
        "gives a name that maps to it; rule 0 of r.json (pattern "
        "\"^(?:wte|tok)$\" -> \"embedding.weight\") cannot be inverted: give "
        "it a \"user\" template")


# -- the engine computes what the Hugging Face model computes ---------------

@pytest.mark.parametrize("moe", [None, TINY_MOE])
def test_a_trainer_on_the_import_matches_the_hugging_face_forward(
        tmp_path, store, moe):  # noqa: F811 (the fixture)
    r = prepare(31 if moe is None else 32, store)
    if moe is not None:
        r.model_spec.CopyFrom(tiny_gpt_proto(**moe))
        rank = r.layout.ranks[0]
        del rank.holdings[:]
        for i, x in enumerate(st.model_state(Model.from_proto(r.model_spec))):
            rank.holdings.add(tensor=i, begin=0, end=x.bytes)
    trainer = one_rank_trainer(r)
    model = trainer.job.model
    sd = hf_state_dict(model, "qwen2_moe", seed=3)
    out, _ = import_(sd, model, tmp_path)
    full = ckpt.read_checkpoint(out, trainer.tensors, model.name)
    trainer.load_state({(h.tensor, h.begin, h.end):
                        bytes(full[h.tensor][h.begin:h.end])
                        for h in trainer.holdings()})
    samples = torch.from_numpy(trainer.corpus.samples(0, 16))
    want = hf_loss(sd, model, samples[:, :-1], samples[:, 1:])
    got = trainer.run_iteration().loss
    assert got == pytest.approx(want, rel=2e-5), (got, want)
    assert trainer.iteration == 1


# -- the command ---------------------------------------------------------------

def tiny_config(**extra):
    return dict({"architectures": ["LlamaForCausalLM"],
                 "num_hidden_layers": 4, "hidden_size": 128,
                 "num_attention_heads": 8, "num_key_value_heads": 4,
                 "head_dim": 16, "intermediate_size": 256, "vocab_size": 512,
                 "rope_theta": 10000.0, "rms_norm_eps": 1e-5,
                 "hidden_act": "silu", "tie_word_embeddings": False},
                **extra)


def test_a_config_json_gives_the_model_and_warns_where_math_differs(
        tmp_path, tiny_gpt):
    d = tmp_path / "tiny-llama"
    d.mkdir()
    (d / "config.json").write_text(json.dumps(tiny_config()))
    model, warnings, arch = convert.load_model(str(d / "config.json"), None)
    assert arch == "LlamaForCausalLM"
    assert warnings == []
    assert model == Model.from_proto(tiny_gpt).__class__(
        "tiny-llama", 4, 128, 8, 4, 16, 256, 512, None)
    (d / "config.json").write_text(json.dumps(tiny_config(
        rope_theta=500000.0)))
    _, warnings, _ = convert.load_model(str(d), None)
    assert warnings == [f"--config {d}/config.json: rope_theta is 500000.0; "
                        "this engine's rotary embedding uses 10000"]
    moe = tiny_config(architectures=["Qwen3MoeForCausalLM"], num_experts=4,
                      num_experts_per_tok=2, moe_intermediate_size=128,
                      mlp_only_layers=[0], norm_topk_prob=True)
    (d / "config.json").write_text(json.dumps(moe))
    model, warnings, arch = convert.load_model(str(d), None)
    assert convert.DEFAULT_RULES[arch] == "qwen_moe"
    assert warnings == [] and model.moe.num_experts == 4 and \
        model.moe.dense_first_layers == 1 and model.moe.expert_ffn == 128
    with pytest.raises(convert.UsageError) as e:
        convert.load_model(None, '{"name": "x", "num_layers": 0}')
    assert str(e.value) == ("--model-spec: model_spec.num_layers: must be in "
                            "1..1024, got 0")


def test_the_command_imports_and_exports(tmp_path, tiny_gpt, capsys):
    model = Model.from_proto(tiny_gpt)
    sd = hf_state_dict(model)
    torch.save(sd, tmp_path / "model.bin")
    spec = json.dumps({"name": "tiny-gpt", "num_layers": 4, "hidden": 128,
                       "num_heads": 8, "num_kv_heads": 4, "head_dim": 16,
                       "ffn": 256, "vocab": 512})
    (tmp_path / "spec.json").write_text(spec)
    assert convert.main([
        "import", "--model-spec", str(tmp_path / "spec.json"),
        "--state-dict", str(tmp_path / "model.bin"), "--out",
        str(tmp_path / "ckpt"), "--data-seed", "7", "--init-seed", "11",
        "--global-batch", "16", "--seq-len", "32"]) == 0
    for out in ("back.bin", "back.safetensors"):
        assert convert.main([
            "export", "--checkpoint", str(tmp_path / "ckpt"), "--model-spec",
            spec, "--out", str(tmp_path / out)]) == 0
        back = torch.load(tmp_path / out) if out.endswith(".bin") else \
            convert.read_safetensors(str(tmp_path / out))
        assert set(back) == set(sd)
        assert all(torch.equal(back[k], sd[k]) for k in sd)
    # A safetensors input imports the same bytes.
    assert convert.main([
        "import", "--model-spec", spec, "--state-dict",
        str(tmp_path / "back.safetensors"), "--out", str(tmp_path / "ckpt2"),
        "--data-seed", "7", "--init-seed", "11", "--global-batch", "16",
        "--seq-len", "32"]) == 0
    assert (tmp_path / "ckpt2" / "shard-import-0.bin").read_bytes() == \
        (tmp_path / "ckpt" / "shard-import-0.bin").read_bytes()
    capsys.readouterr()
    assert convert.main([
        "import", "--model-spec", spec, "--state-dict",
        str(tmp_path / "model.bin"), "--out", str(tmp_path / "c3"),
        "--data-seed", "7", "--init-seed", "11", "--global-batch", "0",
        "--seq-len", "32"]) == 2
    assert capsys.readouterr().err == \
        "convert: --global-batch: must be in 1..1048576, got 0\n"
    assert convert.main([
        "import", "--model-spec", spec, "--state-dict",
        str(tmp_path / "none.bin"), "--out", str(tmp_path / "c3"),
        "--data-seed", "7", "--init-seed", "11", "--global-batch", "16",
        "--seq-len", "32"]) == 2
    assert capsys.readouterr().err == \
        f"convert: --state-dict: {tmp_path}/none.bin: no such file\n"
    del sd["lm_head.weight"]
    torch.save(sd, tmp_path / "short.bin")
    assert convert.main([
        "import", "--model-spec", spec, "--state-dict",
        str(tmp_path / "short.bin"), "--out", str(tmp_path / "c4"),
        "--data-seed", "7", "--init-seed", "11", "--global-batch", "16",
        "--seq-len", "32"]) == 1
    assert capsys.readouterr().err == (
        "convert: canonical parameter 'lm_head.weight' (shape [512, 128]) of "
        "model tiny-gpt: no parameter maps to it\n")


def test_the_command_exits_2_on_a_bad_flag_value(tmp_path):
    p = subprocess.run(
        [sys.executable, "-m", "arachne_torch.convert", "import",
         "--config", str(tmp_path / "missing.json"), "--state-dict", "x",
         "--out", "y", "--data-seed", "1", "--init-seed", "1",
         "--global-batch", "1", "--seq-len", "1"],
        capture_output=True, text=True, timeout=60)
    assert p.returncode == 2
    assert p.stderr == (f"convert: --config: {tmp_path}/missing.json: cannot "
                        "read: No such file or directory\n")
