"""Bring your own model: a user's parameter names <-> the canonical layout.

A rule set is an ordered list of rules; a rule maps a user's parameter name
(a Python regular expression, matched whole) to a canonical parameter name
(a template whose `{...}` fields are the pattern's groups: `{1}` by number,
`{i}` by name), or to nothing (`canonical: null`: the tensor is dropped on
purpose, e.g. the `rotary_emb.inv_freq` buffers old Hugging Face
checkpoints carry). The first rule whose pattern matches a name decides.

    import_state_dict  user's {name: tensor} -> a canonical checkpoint
                       directory (one shard file) the engine restores from
    export_state_dict  a canonical checkpoint directory (any plan's shards)
                       -> {name: fp32 tensor}, the masters

Every parameter must map exactly once and have the canonical logical shape
([out, in] for linears, as nn.Linear.weight); anything else is a
`NamingError` (a BadRequest, so a ValueError) naming the parameter, its
shape and what was expected.

Hugging Face Llama / Mistral / Qwen2 / Qwen3 names need no permutation:
transformers' LlamaAttention applies rotary embeddings with rotate_half on
the two halves of each head (cos/sin of cat([freqs, freqs])), which is what
trainer.py's `rope` does; the q_proj / k_proj rows are taken as they are
(tests/test_naming.py checks a whole forward pass against a reference
written with the Hugging Face names).
"""

from __future__ import annotations

import dataclasses
import json
import os
import re
import string
import struct
from typing import Dict, List, Mapping, Optional, Sequence, Tuple

import numpy as np
import torch

from arachne_torch import checkpoint as ckpt
from arachne_torch import state as st
from arachne_torch.job import (MAX_GLOBAL_BATCH, MAX_SEQ_LEN, BadRequest,
                               Model)


class NamingError(BadRequest):
    """A state dict or rule set that does not map onto the canonical
    layout: the message names the parameter (or rule) and what was
    expected."""


# ---------------------------------------------------------------------------
# Rules.

_FORMATTER = string.Formatter()


def _fields(template: str) -> List[str]:
    return [f for _, f, _, _ in _FORMATTER.parse(template) if f is not None]


@dataclasses.dataclass
class Rule:
    """One rule: user names matching `pattern` map to `canonical` (None:
    dropped). `user` is the inverse template export uses (derived from the
    pattern when it is plain text and groups)."""
    pattern: "re.Pattern"
    canonical: Optional[str]
    user: Optional[str]
    where: str  # "rule 3 of rules.json", for messages

    def describe(self) -> str:
        return (f"{self.where} (pattern \"{self.pattern.pattern}\" -> "
                f"{json.dumps(self.canonical)})")

    def apply(self, name: str) -> Optional[Tuple[Optional[str]]]:
        """(canonical or None,) when the pattern matches `name`, else
        None."""
        m = self.pattern.fullmatch(name)
        if m is None:
            return None
        if self.canonical is None:
            return (None,)
        return (self.canonical.format(m.group(0), *m.groups(),
                                      **m.groupdict()),)


def _group_number(pattern: "re.Pattern", key: str, where: str) -> int:
    if key.isdigit():
        n = int(key)
        if n > pattern.groups:
            raise NamingError(f"{where}: field {{{key}}}: the pattern has "
                              f"{pattern.groups} group(s)")
        return n
    if key not in pattern.groupindex:
        raise NamingError(f"{where}: field {{{key}}}: the pattern has no "
                          f"group named \"{key}\" (it has "
                          f"{sorted(pattern.groupindex) or 'none'})")
    return pattern.groupindex[key]


def _template_to_regex(template: str) -> str:
    """A pattern for `template`: each {key} matches [0-9]+, named key."""
    out, seen = ["^"], set()
    for literal, field, spec, conv in _FORMATTER.parse(template):
        out.append(re.escape(literal))
        if field is None:
            continue
        if spec or conv or not field.isidentifier():
            raise ValueError(field)
        out.append(f"(?P={field})" if field in seen else
                   f"(?P<{field}>[0-9]+)")
        seen.add(field)
    return "".join(out) + "$"


def _pattern_to_template(pattern: "re.Pattern") -> Optional[str]:
    """The user-name template of a pattern made of text and groups (`{n}`
    per capturing group), or None when it is not one (alternation, classes
    or quantifiers outside groups)."""
    p = pattern.pattern
    i, n, out, group = 0, len(p), [], 0
    if p.startswith("^"):
        i = 1
    end = n
    if p.endswith("\\Z"):
        end = n - 2
    elif p.endswith("$") and not p.endswith("\\$"):
        end = n - 1
    while i < end:
        c = p[i]
        if c == "\\":
            if i + 1 >= end:
                return None
            d = p[i + 1]
            if d.isalnum():
                return None  # \d, \w, \1, ...
            out.append("{{" if d == "{" else "}}" if d == "}" else d)
            i += 2
        elif c == "(":
            depth, j, in_class = 0, i, False
            while j < end:
                x = p[j]
                if x == "\\":
                    j += 2
                    continue
                if in_class:
                    in_class = x != "]"
                elif x == "[":
                    in_class = True
                elif x == "(":
                    if j > i and not p.startswith("(?:", j):
                        return None  # a nested capturing group
                    depth += 1
                elif x == ")":
                    depth -= 1
                    if depth == 0:
                        break
                j += 1
            if j >= end:
                return None
            body = p[i + 1:j]
            if body.startswith("?P<"):
                pass
            elif body.startswith("?"):
                return None  # (?:...), lookarounds: not one value
            group += 1
            if j + 1 < end and p[j + 1] in "?*+{":
                return None
            out.append("{" + str(group) + "}")
            i = j + 1
        elif c in ".[]|*+?{}^$)":
            return None
        else:
            out.append(c)
            i += 1
    return "".join(out)


def make_rule(pattern: Optional[str] = None, canonical: Optional[str] = None,
              user: Optional[str] = None, where: str = "rule") -> Rule:
    """A rule from a regex `pattern` and/or a `user` template
    ("model.layers.{i}.mlp.up_proj.weight"; fields match digits), and the
    `canonical` template (None: names it matches are dropped)."""
    if pattern is None and user is None:
        raise NamingError(f"{where}: needs \"pattern\" (a regular "
                          "expression) or \"user\" (a template), got neither")
    if pattern is None:
        try:
            pattern = _template_to_regex(user)
        except ValueError as e:
            raise NamingError(
                f"{where}: user template \"{user}\": field {{{e}}} must be a "
                "plain name (e.g. {i})") from None
    try:
        rx = re.compile(pattern)
    except re.error as e:
        raise NamingError(f"{where}: pattern \"{pattern}\" is not a regular "
                          f"expression: {e}") from None
    if canonical is not None:
        try:
            fields = _fields(canonical)
        except ValueError as e:
            raise NamingError(f"{where}: canonical template \"{canonical}\": "
                              f"{e}") from None
        for f in fields:
            _group_number(rx, f, f"{where}: canonical \"{canonical}\"")
    if user is not None:
        for f in _fields(user):
            _group_number(rx, f, f"{where}: user \"{user}\"")
    elif pattern is not None:
        user = _pattern_to_template(rx)
    return Rule(rx, canonical, user, where)


def _from_templates(pairs, where) -> List[Rule]:
    return [make_rule(user=u, canonical=c, where=f"rule {k} of {where}")
            for k, (u, c) in enumerate(pairs)]


_HF_L = "model.layers.{i}."
# Hugging Face transformers' names, each (user template, canonical
# template). LlamaForCausalLM, MistralForCausalLM, Qwen2ForCausalLM and
# Qwen3ForCausalLM (and the dense layers of the MoE models):
HF_LLAMA_TEMPLATES: Tuple[Tuple[str, Optional[str]], ...] = (
    ("model.embed_tokens.weight", "embedding.weight"),
    (_HF_L + "input_layernorm.weight", "layers.{i}.input_norm.weight"),
    (_HF_L + "self_attn.q_proj.weight", "layers.{i}.attn.q.weight"),
    (_HF_L + "self_attn.k_proj.weight", "layers.{i}.attn.k.weight"),
    (_HF_L + "self_attn.v_proj.weight", "layers.{i}.attn.v.weight"),
    (_HF_L + "self_attn.o_proj.weight", "layers.{i}.attn.o.weight"),
    (_HF_L + "post_attention_layernorm.weight",
     "layers.{i}.post_norm.weight"),
    (_HF_L + "mlp.gate_proj.weight", "layers.{i}.mlp.gate.weight"),
    (_HF_L + "mlp.up_proj.weight", "layers.{i}.mlp.up.weight"),
    (_HF_L + "mlp.down_proj.weight", "layers.{i}.mlp.down.weight"),
    ("model.norm.weight", "final_norm.weight"),
    ("lm_head.weight", "lm_head.weight"),
    # a buffer older transformers saved with the weights: derived, dropped
    (_HF_L + "self_attn.rotary_emb.inv_freq", None),
)
# Qwen2-MoE / Qwen3-MoE blocks (Qwen2-MoE's one shared expert is shared.0).
HF_QWEN_MOE_TEMPLATES: Tuple[Tuple[str, Optional[str]], ...] = (
    (_HF_L + "mlp.gate.weight", "layers.{i}.router.weight"),
    (_HF_L + "mlp.experts.{e}.gate_proj.weight",
     "layers.{i}.experts.{e}.gate.weight"),
    (_HF_L + "mlp.experts.{e}.up_proj.weight",
     "layers.{i}.experts.{e}.up.weight"),
    (_HF_L + "mlp.experts.{e}.down_proj.weight",
     "layers.{i}.experts.{e}.down.weight"),
    (_HF_L + "mlp.shared_expert.gate_proj.weight",
     "layers.{i}.shared.0.gate.weight"),
    (_HF_L + "mlp.shared_expert.up_proj.weight",
     "layers.{i}.shared.0.up.weight"),
    (_HF_L + "mlp.shared_expert.down_proj.weight",
     "layers.{i}.shared.0.down.weight"),
)
# MixtralForCausalLM blocks: w1 = gate, w3 = up, w2 = down.
HF_MIXTRAL_TEMPLATES: Tuple[Tuple[str, Optional[str]], ...] = (
    (_HF_L + "block_sparse_moe.gate.weight", "layers.{i}.router.weight"),
    (_HF_L + "block_sparse_moe.experts.{e}.w1.weight",
     "layers.{i}.experts.{e}.gate.weight"),
    (_HF_L + "block_sparse_moe.experts.{e}.w3.weight",
     "layers.{i}.experts.{e}.up.weight"),
    (_HF_L + "block_sparse_moe.experts.{e}.w2.weight",
     "layers.{i}.experts.{e}.down.weight"),
)

# The canonical names themselves (a state dict the engine's own layout
# names, e.g. one export_state_dict wrote with these rules).
def _canonical_templates():
    out = [("embedding.weight", "embedding.weight")]
    for suffix in ("input_norm", "attn.q", "attn.k", "attn.v", "attn.o",
                   "post_norm", "mlp.gate", "mlp.up", "mlp.down", "router"):
        t = f"layers.{{i}}.{suffix}.weight"
        out.append((t, t))
    for kind in ("shared", "experts"):
        for proj in ("gate", "up", "down"):
            t = f"layers.{{i}}.{kind}.{{e}}.{proj}.weight"
            out.append((t, t))
    out += [("final_norm.weight", "final_norm.weight"),
            ("lm_head.weight", "lm_head.weight")]
    return tuple(out)


CANONICAL_TEMPLATES: Tuple[Tuple[str, Optional[str]], ...] = \
    _canonical_templates()

# The built-in rule sets. "huggingface" reads every family above (import);
# exporting, it writes Qwen-MoE names for MoE blocks: "mixtral" writes
# Mixtral's.
BUILTIN_RULE_SETS = {
    "huggingface": HF_LLAMA_TEMPLATES + HF_QWEN_MOE_TEMPLATES +
    HF_MIXTRAL_TEMPLATES,
    "llama": HF_LLAMA_TEMPLATES,
    "qwen_moe": HF_LLAMA_TEMPLATES + HF_QWEN_MOE_TEMPLATES,
    "mixtral": HF_LLAMA_TEMPLATES + HF_MIXTRAL_TEMPLATES,
    "canonical": CANONICAL_TEMPLATES,
}


def builtin_rules(name: str = "huggingface") -> List[Rule]:
    if name not in BUILTIN_RULE_SETS:
        raise NamingError(f"rules: no built-in rule set \"{name}\" (there "
                          f"are {', '.join(sorted(BUILTIN_RULE_SETS))})")
    return _from_templates(BUILTIN_RULE_SETS[name], f"built-in rules {name}")


def rules_from_json(data, source: str) -> List[Rule]:
    """Rules from parsed JSON: a list of {"pattern": regex, "canonical":
    template or null, "user": template (optional)}."""
    if not isinstance(data, list) or not data:
        raise NamingError(f"{source}: must be a non-empty JSON list of "
                          "{\"pattern\": ..., \"canonical\": ...} objects, "
                          f"got {type(data).__name__}"
                          + (" (empty)" if data == [] else ""))
    out = []
    for k, item in enumerate(data):
        where = f"rule {k} of {source}"
        if not isinstance(item, dict):
            raise NamingError(f"{where}: must be an object, got "
                              f"{json.dumps(item)[:80]}")
        extra = sorted(set(item) - {"pattern", "canonical", "user"})
        if extra:
            raise NamingError(f"{where}: unknown key \"{extra[0]}\" (keys: "
                              "pattern, canonical, user)")
        if "canonical" not in item:
            raise NamingError(f"{where}: \"canonical\" is required (a "
                              "template, or null to drop what it matches)")
        for key in ("pattern", "canonical", "user"):
            v = item.get(key)
            if v is not None and not isinstance(v, str):
                raise NamingError(f"{where}: \"{key}\" must be a string, got "
                                  f"{json.dumps(v)[:80]}")
        out.append(make_rule(item.get("pattern"), item["canonical"],
                             item.get("user"), where))
    return out


def load_rules(path: str) -> List[Rule]:
    """A rule file (JSON); NamingError naming the file and the rule."""
    try:
        with open(path, encoding="utf-8") as f:
            text = f.read()
    except OSError as e:
        raise NamingError(f"rules {path}: cannot read: {e.strerror}") from None
    try:
        data = json.loads(text)
    except json.JSONDecodeError as e:
        raise NamingError(f"rules {path}:{e.lineno}:{e.colno}: invalid JSON: "
                          f"{e.msg}") from None
    return rules_from_json(data, path)


# ---------------------------------------------------------------------------
# Mapping.

def _shape(shape) -> str:
    return "[" + ", ".join(str(d) for d in shape) + "]"


def canonical_params(model: Model) -> Dict[str, st.StateTensor]:
    """Each parameter of `model` by canonical name (its master tensor), in
    the state's order."""
    return {t.param: t for t in st.model_state(model) if t.kind == "master"}


def _expected(t: st.StateTensor) -> str:
    if len(t.shape) == 2:
        return f"{_shape(t.shape)} ([out, in], as nn.Linear.weight)"
    return _shape(t.shape)


def map_names(shapes: Mapping[str, Sequence[int]], model: Model,
              rules: Sequence[Rule]) -> Dict[str, str]:
    """{user name: canonical name} for the parameters `shapes` names, every
    one of `model`'s exactly once with its canonical shape (names a rule
    drops are left out). NamingError for the first name that maps to
    nothing or to something `model` lacks, two names mapping to one, a
    shape mismatch, then the first canonical parameter nothing maps to."""
    params = canonical_params(model)
    out: Dict[str, str] = {}
    by_canonical: Dict[str, str] = {}
    for name, shape in shapes.items():
        shape = tuple(int(d) for d in shape)
        for rule in rules:
            hit = rule.apply(name)
            if hit is not None:
                break
        else:
            raise NamingError(
                f"parameter '{name}' (shape {_shape(shape)}): no rule maps "
                f"it (tried {len(rules)} rules; give a rule file with "
                "--rules, or a rule with canonical null to drop it)")
        canonical = hit[0]
        if canonical is None:
            continue
        t = params.get(canonical)
        if t is None:
            raise NamingError(
                f"parameter '{name}' (shape {_shape(shape)}) maps to "
                f"'{canonical}' by {rule.describe()}, which model "
                f"{model.name} does not have ({_model_summary(model)})")
        if canonical in by_canonical:
            raise NamingError(
                f"parameters '{by_canonical[canonical]}' and '{name}' both "
                f"map to '{canonical}'")
        if shape != t.shape:
            raise NamingError(
                f"parameter '{name}' has shape {_shape(shape)}; it maps to "
                f"'{canonical}', which is {_expected(t)} in model "
                f"{model.name}")
        by_canonical[canonical] = name
        out[name] = canonical
    missing = [c for c in params if c not in by_canonical]
    if missing:
        t = params[missing[0]]
        more = f" ({len(missing) - 1} more missing)" if len(missing) > 1 \
            else ""
        raise NamingError(
            f"canonical parameter '{missing[0]}' (shape {_shape(t.shape)}) "
            f"of model {model.name}: no parameter maps to it{more}")
    return out


def _model_summary(model: Model) -> str:
    s = f"layers 0..{model.num_layers - 1}"
    if model.moe is not None:
        m = model.moe
        s += (f"; MoE from layer {m.dense_first_layers}, experts "
              f"0..{m.num_experts - 1}, {m.shared_experts} shared")
    return s


def canonical_to_user(model: Model, rules: Sequence[Rule]) -> Dict[str, str]:
    """{canonical name: user name} by inverting `rules` (export): for each
    parameter the first rule whose inverse gives a name that maps back to
    it. NamingError naming the parameter when no rule does."""
    out: Dict[str, str] = {}
    taken: Dict[str, str] = {}
    inverses = []
    for rule in rules:
        if rule.canonical is None or rule.user is None:
            inverses.append(None)
            continue
        keys = {}
        pat = ["^"]
        for literal, field, _, _ in _FORMATTER.parse(rule.canonical):
            pat.append(re.escape(literal))
            if field is None:
                continue
            g = _group_number(rule.pattern, field, rule.where)
            key = f"g{g}"
            pat.append(f"(?P={key})" if key in keys else f"(?P<{key}>[^.]+)")
            keys[key] = g
        inverses.append((re.compile("".join(pat) + "$"), keys))
    for canonical, t in canonical_params(model).items():
        found = None
        skipped = []
        for rule, inv in zip(rules, inverses):
            if rule.canonical is None:
                continue
            if inv is None:
                skipped.append(rule)
                continue
            m = inv[0].fullmatch(canonical)
            if m is None:
                continue
            values = {inv[1][k]: v for k, v in m.groupdict().items()}
            needed = {_group_number(rule.pattern, f, rule.where)
                      for f in _fields(rule.user)}
            if not needed <= set(values):
                skipped.append(rule)  # a group the canonical name lacks
                continue
            names = {name: values.get(n, "")
                     for name, n in rule.pattern.groupindex.items()}
            args = [""] + [values.get(n, "")
                           for n in range(1, rule.pattern.groups + 1)]
            user = rule.user.format(*args, **names)
            for r in rules:  # the name must map back (first match decides)
                hit = r.apply(user)
                if hit is not None:
                    break
            if hit is not None and hit[0] == canonical:
                found = user
                break
        if found is None:
            hint = (f"; {skipped[0].describe()} cannot be inverted: give it "
                    "a \"user\" template") if skipped else ""
            raise NamingError(
                f"canonical parameter '{canonical}' (shape "
                f"{_shape(t.shape)}): no rule gives a name that maps to "
                f"it{hint}")
        if found in taken:
            raise NamingError(f"canonical parameters '{taken[found]}' and "
                              f"'{canonical}' both export as '{found}'")
        taken[found] = canonical
        out[canonical] = found
    return out


# ---------------------------------------------------------------------------
# Import and export.

def _scalar(field: str, v, lo: int, hi: int) -> int:
    if isinstance(v, bool) or not isinstance(v, (int, np.integer)) or \
            not lo <= v <= hi:
        raise BadRequest(f"{field}: must be an integer in {lo}..{hi}, got "
                         f"{v!r}")
    return int(v)


def _as_tensors(state_dict) -> Dict[str, torch.Tensor]:
    if isinstance(state_dict, torch.nn.Module):
        return dict(state_dict.named_parameters())
    if not isinstance(state_dict, Mapping):
        raise NamingError(f"state dict: must map parameter names to "
                          f"tensors, got {type(state_dict).__name__}")
    for k, v in state_dict.items():
        if not isinstance(k, str) or not isinstance(v, torch.Tensor):
            raise NamingError(
                f"state dict: entry {k!r} is a {type(v).__name__}, not a "
                "tensor named by a string")
    return dict(state_dict)


def holds_shards(directory: str) -> bool:
    """Whether `directory` has shard files (read_checkpoint would read them
    together with a new one)."""
    return os.path.isdir(directory) and any(
        f.startswith("shard-") and f.endswith(".bin")
        for f in os.listdir(directory))


def import_state_dict(state_dict, model: Model, rules: Sequence[Rule],
                      out_dir: str, *, data_seed: int, init_seed: int,
                      global_batch: int, seq_len: int,
                      node: str = "import") -> str:
    """Writes `state_dict` (name -> tensor, or an nn.Module's parameters)
    as a canonical checkpoint of `model` in `out_dir`, one shard file with
    every byte of every tensor in canonical byte order (row-parallel
    weights, o and down, transposed): master = the weights in fp32, weight =
    their bf16 rounding, Adam moments zero, the training scalars at step 0
    and cursor 0 with the job's data_seed, init_seed, global_batch and
    seq_len (the engine refuses a state of another job's). Returns the
    file's path. The engine restores it as PrepareRequest.checkpoint_dir."""
    scalars = [st.STATE_FORMAT, 0, 0,
               _scalar("data_seed", data_seed, 0, (1 << 63) - 1),
               _scalar("init_seed", init_seed, 0, (1 << 63) - 1),
               _scalar("global_batch", global_batch, 1, MAX_GLOBAL_BATCH),
               _scalar("seq_len", seq_len, 1, MAX_SEQ_LEN), 0]
    tensors = _as_tensors(state_dict)
    for name, v in tensors.items():
        if not v.is_floating_point():
            raise NamingError(f"parameter '{name}' (shape "
                              f"{_shape(v.shape)}) has dtype {v.dtype}; "
                              "weights must be floating point")
    mapping = map_names({k: tuple(v.shape) for k, v in tensors.items()},
                        model, rules)
    user_of = {c: u for u, c in mapping.items()}
    if holds_shards(out_dir):
        raise BadRequest(f"out: {out_dir} already holds shard files; give a "
                         "new or empty directory")
    os.makedirs(out_dir, exist_ok=True)
    state = st.model_state(model)
    path = os.path.join(out_dir, ckpt.shard_file_name(node, 0))
    tmp = path + ".tmp"
    try:
        _write_import(tmp, state, tensors, user_of, scalars)
    except BaseException:
        if os.path.exists(tmp):
            os.unlink(tmp)
        raise
    os.replace(tmp, path)
    return path


def _write_import(tmp: str, state: List[st.StateTensor],
                  tensors: Dict[str, torch.Tensor], user_of: Dict[str, str],
                  scalars: List[int]) -> None:
    zero_sums: Dict[int, int] = {}
    with open(tmp, "wb") as f:
        f.write(ckpt.MAGIC + struct.pack("<I", len(state)))

        def piece(t: st.StateTensor, data: bytes, summed=None):
            assert len(data) == t.bytes, t.name
            name = t.name.encode()
            f.write(struct.pack("<I", len(name)) + name)
            f.write(struct.pack("<qqQ", 0, len(data), ckpt.checksum(data)
                                if summed is None else summed))
            f.write(data)

        weight_t = None
        for t in state:
            if t.kind == "scalars":
                piece(t, np.asarray(scalars, dtype="<i8").tobytes())
                continue
            if t.kind == "master":
                user = user_of[t.param]
                master = tensors[user].detach().to("cpu", torch.float32) \
                    .contiguous()
                bad = (~torch.isfinite(master)).reshape(-1).nonzero()
                if bad.numel():
                    i = int(bad[0])
                    raise NamingError(
                        f"parameter '{user}' (shape {_shape(master.shape)}): "
                        f"element {i} is {master.reshape(-1)[i].item()}, not "
                        "a finite number")
                if t.tp_split == "row":
                    # canonical byte order: the TP split dimension first, so
                    # row-parallel weights are stored transposed
                    # (migration/core/state_layout.h)
                    master = master.t().contiguous()
                weight = master.to(torch.bfloat16).view(torch.int16)
                # the weight comes first in the state's order
                piece(weight_t, weight.numpy().tobytes())
                piece(t, master.numpy().tobytes())
            elif t.kind == "weight":
                weight_t = t
            else:  # the Adam moments, zero
                if t.bytes not in zero_sums:
                    zero_sums[t.bytes] = ckpt.checksum(bytes(t.bytes))
                piece(t, bytes(t.bytes), zero_sums[t.bytes])


def export_state_dict(checkpoint_dir: str, model: Model,
                      rules: Sequence[Rule]) -> Dict[str, torch.Tensor]:
    """{user name: fp32 tensor} of the masters of the canonical checkpoint
    in `checkpoint_dir` (any plan's shards), named by inverting `rules`.
    CheckpointError as the engine words it for a checkpoint it cannot
    read."""
    return export_with_scalars(checkpoint_dir, model, rules)[0]


def export_with_scalars(checkpoint_dir: str, model: Model,
                        rules: Sequence[Rule]
                        ) -> Tuple[Dict[str, torch.Tensor], List[int]]:
    """export_state_dict, and the checkpoint's training scalars
    (state.py: format, step, cursor, ...)."""
    names = canonical_to_user(model, rules)
    state = st.model_state(model)
    full = ckpt.read_checkpoint(checkpoint_dir, state, model.name)
    out: Dict[str, torch.Tensor] = {}
    scalars: List[int] = []
    for i, t in enumerate(state):
        if t.kind == "scalars":
            scalars = np.frombuffer(bytes(full[i]), dtype="<i8").tolist()
        if t.kind != "master":
            continue
        a = torch.from_numpy(np.frombuffer(bytes(full[i]), dtype="<f4")
                             .copy())
        if t.tp_split == "row":  # stored transposed
            a = a.reshape(t.shape[1], t.shape[0]).t().contiguous()
        out[names[t.param]] = a.reshape(t.shape)
    return out, scalars
