"""Converts a model's weights to and from the canonical checkpoint format.

    python3 -m arachne_torch.convert import \\
        (--config config.json | --model-spec spec.json) \\
        --state-dict model.bin [--rules rules.json | --builtin NAME] \\
        --out ckpt/ --data-seed N --init-seed N --global-batch N --seq-len N
    python3 -m arachne_torch.convert export --checkpoint ckpt/ \\
        (--config config.json | --model-spec spec.json) \\
        [--rules rules.json | --builtin NAME] --out model.bin

The model comes from a Hugging Face config.json (read here as the planner
reads one, for the architectures this engine trains) or from
--model-spec: the fields of an arachne.v1.Model as JSON (a file, or the
JSON text itself), exactly what the agent sends the engine as
PrepareRequest.model_spec. --state-dict is a torch.save'd state dict, a
.safetensors file, or a *.index.json of either kind's shards. export
writes torch.save of {name: fp32 tensor}, or a .safetensors file when
--out ends so. Bad arguments exit 2 naming the flag and the value.
"""

from __future__ import annotations

import argparse
import json
import os
import struct
import sys
from typing import Dict, List, Optional

import numpy as np
import torch

from arachne_torch import naming
from arachne_torch.checkpoint import CheckpointError
from arachne_torch.job import BadRequest, Model

# The architectures of a config.json this engine trains, as the planner
# names them (planner_service/io/model_io.cc), and their MoE keys.
LLAMA_LIKE = ("LlamaForCausalLM", "MistralForCausalLM", "Qwen2ForCausalLM",
              "Qwen3ForCausalLM")
MOE_ARCHITECTURES = ("MixtralForCausalLM", "Qwen3MoeForCausalLM")

# What the engine computes with (trainer.py); a config.json that says
# otherwise describes another function of the same weights.
ENGINE_ROPE_THETA = 10000.0
ENGINE_NORM_EPS = 1e-5


class UsageError(Exception):
    """A bad flag value: exit 2 with the message."""


def _int_key(config: dict, where: str, keys, default=None) -> int:
    for k in keys:
        if k in config:
            v = config[k]
            if isinstance(v, bool) or not isinstance(v, int) or v < 0:
                raise BadRequest(f"{where}: {k}: must be a non-negative "
                                 f"integer, got {json.dumps(v)}")
            return v
    if default is None:
        alt = " (or " + ", ".join(f"\"{k}\"" for k in keys[1:]) + ")" \
            if len(keys) > 1 else ""
        raise BadRequest(f"{where}: missing required key \"{keys[0]}\"{alt}")
    return default


def model_spec_from_hf_config(config: dict, name: str, where: str):
    """An arachne.v1.Model from a parsed config.json, as the planner reads
    it for the architectures this engine trains, plus the warnings of the
    keys where the engine computes differently."""
    from arachne.v1 import planner_pb2
    if not isinstance(config, dict):
        raise BadRequest(f"{where}: must be a JSON object")
    archs = config.get("architectures")
    if not isinstance(archs, list) or not archs or \
            not isinstance(archs[0], str):
        raise BadRequest(f"{where}: architectures: must list at least one "
                         f"architecture, got {json.dumps(archs)}")
    arch = archs[0]
    if arch not in LLAMA_LIKE + MOE_ARCHITECTURES:
        raise BadRequest(
            f"{where}: architectures: \"{arch}\" is not one arachne_torch "
            f"trains; it trains {', '.join(LLAMA_LIKE + MOE_ARCHITECTURES)}")
    m = planner_pb2.Model(name=name, architecture=arch, mlp="swiglu")
    m.num_layers = _int_key(config, where, ("num_hidden_layers",))
    m.hidden = _int_key(config, where, ("hidden_size",))
    m.num_heads = _int_key(config, where, ("num_attention_heads",))
    m.num_kv_heads = _int_key(config, where, ("num_key_value_heads",),
                              m.num_heads)
    m.vocab = _int_key(config, where, ("vocab_size",))
    m.ffn = _int_key(config, where, ("intermediate_size",))
    if config.get("head_dim") is not None:
        m.head_dim = _int_key(config, where, ("head_dim",))
    m.tied_embeddings = bool(config.get("tie_word_embeddings", False))
    if arch == "MixtralForCausalLM":
        m.moe.num_experts = _int_key(config, where, ("num_local_experts",))
        m.moe.top_k = _int_key(config, where, ("num_experts_per_tok",))
        m.moe.expert_ffn = m.ffn
    elif arch == "Qwen3MoeForCausalLM":
        m.moe.num_experts = _int_key(config, where, ("num_experts",))
        m.moe.top_k = _int_key(config, where, ("num_experts_per_tok",))
        m.moe.expert_ffn = _int_key(config, where, ("moe_intermediate_size",))
        step = _int_key(config, where, ("decoder_sparse_step",), 1)
        if step != 1:
            raise BadRequest(f"{where}: decoder_sparse_step: unsupported value "
                             f"{step}: interleaved dense and MoE layers cannot "
                             "be modelled; only 1 (every layer MoE)")
        dense = config.get("mlp_only_layers") or []
        if dense != list(range(len(dense))):
            raise BadRequest(f"{where}: mlp_only_layers: unsupported value "
                             f"{json.dumps(dense)}: only a leading run of "
                             "dense layers [0, 1, ..., k-1] can be modelled")
        m.moe.dense_first_layers = len(dense)
    warnings = []
    theta = config.get("rope_theta", ENGINE_ROPE_THETA)
    if theta != ENGINE_ROPE_THETA:
        warnings.append(f"rope_theta is {theta}; this engine's rotary "
                        f"embedding uses {ENGINE_ROPE_THETA:g}")
    if config.get("rope_scaling"):
        warnings.append(f"rope_scaling {json.dumps(config['rope_scaling'])} "
                        "is not applied by this engine")
    eps = config.get("rms_norm_eps", ENGINE_NORM_EPS)
    if eps != ENGINE_NORM_EPS:
        warnings.append(f"rms_norm_eps is {eps}; this engine's RMSNorm uses "
                        f"{ENGINE_NORM_EPS:g}")
    act = config.get("hidden_act", "silu")
    if act != "silu":
        warnings.append(f"hidden_act is \"{act}\"; this engine's SwiGLU uses "
                        "silu")
    if arch == "Qwen3MoeForCausalLM" and not config.get("norm_topk_prob",
                                                        False):
        warnings.append("norm_topk_prob is false; this engine's router "
                        "normalizes the top-k weights (softmax over the top-k "
                        "logits)")
    if config.get("sliding_window") and config.get("use_sliding_window",
                                                   True):
        warnings.append(f"sliding_window {config['sliding_window']}: this "
                        "engine attends over the whole sequence")
    return m, [f"{where}: {w}" for w in warnings]


def model_name_from_path(path: str) -> str:
    """The planner's ModelNameFromPath: the file's stem, or its folder's
    name for a file named config.*."""
    stem = os.path.splitext(os.path.basename(path))[0]
    if stem == "config":
        d = os.path.basename(os.path.dirname(os.path.abspath(path)))
        if d and d not in (".", ".."):
            return d
    return stem


# The built-in rule set a config.json's architecture names by default.
DEFAULT_RULES = {"MixtralForCausalLM": "mixtral",
                 "Qwen3MoeForCausalLM": "qwen_moe"}


def load_model(config: Optional[str], model_spec: Optional[str]):
    """(Model, warnings) from --config or --model-spec; the Model's
    architecture (config.json's, or the spec's "architecture" field) picks
    the default rule set."""
    from google.protobuf import json_format
    from arachne.v1 import planner_pb2
    if (config is None) == (model_spec is None):
        raise UsageError("give exactly one of --config (a Hugging Face "
                         "config.json) and --model-spec (arachne.v1.Model "
                         "fields as JSON)")
    if config is not None:
        path = os.path.join(config, "config.json") if os.path.isdir(config) \
            else config
        data = _read_json("--config", path)
        spec, warnings = model_spec_from_hf_config(
            data, model_name_from_path(path), f"--config {path}")
    else:
        flag = "--model-spec"
        if model_spec.lstrip().startswith("{"):
            try:
                data = json.loads(model_spec)
            except json.JSONDecodeError as e:
                raise UsageError(f"{flag}: invalid JSON at column {e.colno}: "
                                 f"{e.msg}") from None
        else:
            data = _read_json(flag, model_spec)
        spec, warnings = planner_pb2.Model(), []
        try:
            json_format.ParseDict(data, spec)
        except json_format.ParseError as e:
            raise UsageError(f"{flag}: not arachne.v1.Model fields: {e}") \
                from None
    try:
        return Model.from_proto(spec), warnings, spec.architecture
    except BadRequest as e:
        src = "--config" if config is not None else "--model-spec"
        raise UsageError(f"{src}: {e}") from None


def _read_json(flag: str, path: str):
    try:
        with open(path, encoding="utf-8") as f:
            text = f.read()
    except OSError as e:
        raise UsageError(f"{flag}: {path}: cannot read: {e.strerror}") \
            from None
    try:
        return json.loads(text)
    except json.JSONDecodeError as e:
        raise UsageError(f"{flag}: {path}:{e.lineno}:{e.colno}: invalid "
                         f"JSON: {e.msg}") from None


# -- safetensors (the format is simple: an 8-byte little-endian header
# length, a JSON header of {name: {dtype, shape, data_offsets}}, the bytes).

_ST_DTYPES = {"F32": (np.float32, torch.float32),
              "F16": (np.float16, torch.float16),
              "BF16": (np.int16, torch.bfloat16),
              "F64": (np.float64, torch.float64)}


def read_safetensors(path: str) -> Dict[str, torch.Tensor]:
    with open(path, "rb") as f:
        data = f.read()
    if len(data) < 8:
        raise BadRequest(f"{path}: not a safetensors file (shorter than 8 "
                         "bytes)")
    (n,) = struct.unpack_from("<Q", data, 0)
    try:
        header = json.loads(data[8:8 + n])
    except (ValueError, UnicodeDecodeError):
        raise BadRequest(f"{path}: not a safetensors file (bad header)") \
            from None
    out = {}
    for name, e in header.items():
        if name == "__metadata__":
            continue
        kind = _ST_DTYPES.get(e.get("dtype"))
        if kind is None:
            raise BadRequest(f"{path}: tensor '{name}' has dtype "
                             f"{e.get('dtype')}; weights must be F32, F16, "
                             "BF16 or F64")
        b, end = e["data_offsets"]
        a = np.frombuffer(data, dtype=kind[0], count=(end - b) //
                          np.dtype(kind[0]).itemsize, offset=8 + n + b)
        t = torch.from_numpy(a.copy())
        if kind[1] == torch.bfloat16:
            t = t.view(torch.bfloat16)
        out[name] = t.reshape(e["shape"])
    return out


def write_safetensors(path: str, tensors: Dict[str, torch.Tensor]) -> None:
    header, blobs, at = {}, [], 0
    for name, t in tensors.items():
        b = t.detach().to(torch.float32).contiguous().numpy().tobytes()
        header[name] = {"dtype": "F32", "shape": list(t.shape),
                        "data_offsets": [at, at + len(b)]}
        blobs.append(b)
        at += len(b)
    h = json.dumps(header, separators=(",", ":")).encode()
    h += b" " * (-len(h) % 8)
    with open(path, "wb") as f:
        f.write(struct.pack("<Q", len(h)) + h)
        for b in blobs:
            f.write(b)


def load_state_dict(path: str) -> Dict[str, torch.Tensor]:
    """--state-dict: torch.save'd, .safetensors, or a *.index.json of
    shards (Hugging Face's weight_map)."""
    flag = "--state-dict"
    if not os.path.isfile(path):
        raise UsageError(f"{flag}: {path}: no such file")
    if path.endswith(".index.json"):
        index = _read_json(flag, path)
        wm = index.get("weight_map") if isinstance(index, dict) else None
        if not isinstance(wm, dict):
            raise UsageError(f"{flag}: {path}: no \"weight_map\" object")
        out: Dict[str, torch.Tensor] = {}
        base = os.path.dirname(path)
        for shard in sorted(set(wm.values())):
            part = load_state_dict(os.path.join(base, shard))
            out.update({k: v for k, v in part.items() if wm.get(k) == shard})
        return out
    if path.endswith(".safetensors"):
        try:
            return read_safetensors(path)
        except BadRequest as e:
            raise UsageError(f"{flag}: {e}") from None
    try:
        try:
            sd = torch.load(path, map_location="cpu", weights_only=True)
        except TypeError:  # a torch without weights_only
            sd = torch.load(path, map_location="cpu")
    except Exception as e:  # pickle and zip errors alike
        raise UsageError(f"{flag}: {path}: cannot load with torch.load: "
                         f"{str(e).splitlines()[0] if str(e) else e!r}") \
            from None
    if isinstance(sd, dict) and "state_dict" in sd and \
            isinstance(sd["state_dict"], dict):
        sd = sd["state_dict"]
    return sd


def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="python3 -m arachne_torch.convert",
        description="Converts a model's weights to and from Arachne's "
        "canonical checkpoint (docs/pytorch.md, Bring your own model).")
    sub = p.add_subparsers(dest="command", required=True)

    def common(s):
        s.add_argument("--config", help="a Hugging Face config.json (or its "
                       "folder)")
        s.add_argument("--model-spec", help="arachne.v1.Model fields as "
                       "JSON: a file, or the JSON text")
        s.add_argument("--rules", help="a rule file (JSON list of "
                       "{pattern, canonical[, user]})")
        s.add_argument("--builtin", default=None,
                       help="a built-in rule set: "
                       + ", ".join(sorted(naming.BUILTIN_RULE_SETS))
                       + " (default: mixtral for a MixtralForCausalLM "
                       "config, qwen_moe for Qwen3MoeForCausalLM, else "
                       "huggingface)")
        s.add_argument("--out", required=True)

    i = sub.add_parser("import", help="a state dict -> a canonical "
                       "checkpoint directory")
    common(i)
    i.add_argument("--state-dict", required=True)
    for flag in ("--data-seed", "--init-seed", "--global-batch",
                 "--seq-len"):
        i.add_argument(flag, required=True, type=int)
    e = sub.add_parser("export", help="a canonical checkpoint -> a state "
                       "dict of fp32 masters")
    common(e)
    e.add_argument("--checkpoint", required=True)
    return p


def _rules(args, architecture: str) -> List[naming.Rule]:
    if args.rules is not None and args.builtin is not None:
        raise UsageError("give at most one of --rules and --builtin")
    if args.rules is not None:
        try:
            return naming.load_rules(args.rules)
        except naming.NamingError as e:
            raise UsageError(f"--rules: {e}") from None
    name = args.builtin or DEFAULT_RULES.get(architecture, "huggingface")
    if name not in naming.BUILTIN_RULE_SETS:
        raise UsageError(f"--builtin: no rule set \"{name}\"; there are "
                         + ", ".join(sorted(naming.BUILTIN_RULE_SETS)))
    return naming.builtin_rules(name)


def run(argv: List[str]) -> int:
    args = _parser().parse_args(argv)
    model, warnings, architecture = load_model(args.config, args.model_spec)
    for w in warnings:
        print(f"convert: warning: {w}", file=sys.stderr)
    rules = _rules(args, architecture)
    if args.command == "import":
        for flag, v, lo, hi in (
                ("--data-seed", args.data_seed, 0, (1 << 63) - 1),
                ("--init-seed", args.init_seed, 0, (1 << 63) - 1),
                ("--global-batch", args.global_batch, 1, 1 << 20),
                ("--seq-len", args.seq_len, 1, 1 << 17)):
            if not lo <= v <= hi:
                raise UsageError(f"{flag}: must be in {lo}..{hi}, got {v}")
        sd = load_state_dict(args.state_dict)
        if naming.holds_shards(args.out):
            raise UsageError(f"--out: {args.out} already holds shard files; "
                             "give a new or empty directory")
        path = naming.import_state_dict(
            sd, model, rules, args.out, data_seed=args.data_seed,
            init_seed=args.init_seed, global_batch=args.global_batch,
            seq_len=args.seq_len)
        print(f"convert: wrote {path} ({os.path.getsize(path)} bytes): "
              f"model {model.name}, {len(sd)} tensors, step 0")
    else:
        if not os.path.isdir(args.checkpoint):
            raise UsageError(f"--checkpoint: {args.checkpoint}: no such "
                             "directory")
        sd, scalars = naming.export_with_scalars(args.checkpoint, model,
                                                 rules)
        step = scalars[1]
        if args.out.endswith(".safetensors"):
            write_safetensors(args.out, sd)
        else:
            torch.save(sd, args.out)
        print(f"convert: wrote {args.out}: model {model.name}, {len(sd)} "
              f"fp32 tensors at step {step}")
    return 0


def main(argv: Optional[List[str]] = None) -> int:
    try:
        return run(sys.argv[1:] if argv is None else argv)
    except UsageError as e:
        print(f"convert: {e}", file=sys.stderr)
        return 2
    except (BadRequest, CheckpointError) as e:  # NamingError included
        print(f"convert: {e}", file=sys.stderr)
        return 1


if __name__ == "__main__":
    sys.exit(main())
