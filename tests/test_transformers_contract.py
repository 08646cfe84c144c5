"""What our code reads from transformers' modules and configs, named, for every family that reads it.

The lean forward (student/lean.py) runs the decoder on the transformers modules' own parameters,
reading module attributes that are no public API: they can move in any minor release, which is
why setup.py pins transformers to the tested minor. The same holds, to a lesser degree, for our
experts forward and gating (student/experts.py), router replay (student/router_replay.py) and
expert parallelism (student/expert_parallel.py). This file builds a tiny model of each family and
checks that every attribute is still there with the kind we use (a parameter or tensor of the
rank we index, a callable, a flag); on a transformers version where one moved, it says which, who
reads it and what to do. That the values mean what we assume (same arithmetic) is held by
tests/test_lean.py and tests/test_experts_parity.py, which compare against transformers' forward.
"""
from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path

import pytest
import torch
import transformers
from transformers import AutoModelForCausalLM

from student import ByteTokenizer, StudentConfig
from student.expert_parallel import experts_modules
from student.experts import find_routers
from student.model import STUDENT_FAMILIES, model_config

LEAN_FAMILIES = [name for name in STUDENT_FAMILIES if STUDENT_FAMILIES[name].lean_forward]

ROOT = Path(__file__).resolve().parents[1]
LEAN, EXPERTS, REPLAY, EP, ROLLOUT = ("student/lean.py", "student/experts.py", "student/router_replay.py",
                                      "student/expert_parallel.py", "rl/rollout.py")
REMEDY = {
    LEAN: "set student.lean_forward=false or update student/lean.py",
    ROLLOUT: "set student.lean_forward=false or update rl/rollout.py",
    EXPERTS: "set student.experts_implementation=eager and student.lean_forward=false, or update student/experts.py",
    REPLAY: "update student/router_replay.py (the trainer records routes at every rollout)",
    EP: "set deepspeed.expert_parallel_size=1 or update student/expert_parallel.py",
}


def pinned_minor() -> str:
    """The transformers minor setup.py pins (`transformers>=A.B,<A.B+1`)."""
    pin = re.search(r'"transformers>=(\d+\.\d+)(?:\.\d+)?,<(\d+\.\d+)"', (ROOT / "setup.py").read_text())
    assert pin, "setup.py no longer pins transformers as `transformers>=A.B,<A.C`"
    return pin.group(1)


# ---------------------------------------------------------------------------- kinds
@dataclass(frozen=True)
class Kind:
    what: str                       # "param", "tensor", "module", "callable", "bool", "int", "float", "str"
    rank: int | None = None
    optional: bool = False          # None is a valid value (e.g. Mixtral's head_dim)

    def mismatch(self, value) -> str | None:
        """None if `value` is of this kind, else what it is instead."""
        if value is None:
            return None if self.optional else "None"
        ok = {
            "param": lambda v: isinstance(v, torch.nn.Parameter) and v.dim() == self.rank,
            "tensor": lambda v: isinstance(v, torch.Tensor) and v.dim() == self.rank,
            "module": lambda v: isinstance(v, torch.nn.Module),
            "modules": lambda v: isinstance(v, torch.nn.ModuleList),
            "callable": callable,
            "bool": lambda v: isinstance(v, bool),
            "int": lambda v: isinstance(v, int) and not isinstance(v, bool),
            "float": lambda v: isinstance(v, (int, float)) and not isinstance(v, bool),
            "str": lambda v: isinstance(v, str),
        }[self.what](value)
        if ok:
            return None
        if isinstance(value, torch.Tensor):
            return f"a {type(value).__name__} of rank {value.dim()}"
        return f"a {type(value).__name__}"

    def __str__(self):
        return (f"a {self.what} of rank {self.rank}" if self.rank is not None else f"a {self.what}") + (
            " or None" if self.optional else "")


PARAM1, PARAM2, PARAM3 = Kind("param", 1), Kind("param", 2), Kind("param", 3)
MODULE, CALLABLE, BOOL, INT, FLOAT, STR = (Kind("module"), Kind("callable"), Kind("bool"), Kind("int"),
                                           Kind("float"), Kind("str"))

# ---------------------------------------------------------------------------- what is read
# (path from the CausalLM, kind, who reads it). "L" stands for each decoder layer's index: routed
# layers for MOE_LAYER, dense layers (Qwen3-MoE mlp_only_layers) for DENSE_LAYER.
LEAN_MODEL = [
    ("model", MODULE, LEAN), ("model.embed_tokens", MODULE, LEAN), ("model.embed_tokens.weight", PARAM2, LEAN),
    ("model.layers", Kind("modules"), LEAN), ("model.rotary_emb.inv_freq", Kind("tensor", 1), LEAN),
    ("model.rotary_emb.attention_scaling", FLOAT, LEAN), ("model.norm.weight", PARAM1, LEAN),
    ("lm_head.weight", PARAM2, LEAN),
]
LEAN_LAYER = [
    ("model.layers.L.self_attn.q_proj.weight", PARAM2, LEAN), ("model.layers.L.self_attn.k_proj.weight", PARAM2, LEAN),
    ("model.layers.L.self_attn.v_proj.weight", PARAM2, LEAN), ("model.layers.L.self_attn.o_proj.weight", PARAM2, LEAN),
    ("model.layers.L.input_layernorm.weight", PARAM1, LEAN),
    ("model.layers.L.post_attention_layernorm.weight", PARAM1, LEAN),
    ("model.layers.L.mlp", MODULE, LEAN),
]
QK_NORM = [("model.layers.L.self_attn.q_norm.weight", PARAM1, LEAN),
           ("model.layers.L.self_attn.k_norm.weight", PARAM1, LEAN)]
LEAN_MOE_LAYER = [
    ("model.layers.L.mlp.gate.weight", PARAM2, LEAN), ("model.layers.L.mlp.experts", MODULE, LEAN),
    ("model.layers.L.mlp.experts.num_experts", INT, LEAN), ("model.layers.L.mlp.experts.has_bias", BOOL, LEAN),
]
LEAN_DENSE_LAYER = [("model.layers.L.mlp.gate_proj", CALLABLE, LEAN), ("model.layers.L.mlp.up_proj", CALLABLE, LEAN),
                    ("model.layers.L.mlp.down_proj", CALLABLE, LEAN), ("model.layers.L.mlp.act_fn", CALLABLE, LEAN)]
# Config fields the lean forward reads, per family: those it reads with a default (getattr) are
# listed where the family's config has them today, so a rename cannot silently turn them off.
LEAN_CONFIG = {
    "qwen3_moe": [("model_type", STR, LEAN), ("num_attention_heads", INT, LEAN), ("num_key_value_heads", INT, LEAN),
                  ("head_dim", INT, LEAN), ("hidden_size", INT, LEAN), ("rms_norm_eps", FLOAT, LEAN),
                  ("num_experts_per_tok", INT, LEAN), ("norm_topk_prob", BOOL, LEAN),
                  ("sliding_window", Kind("int", optional=True), LEAN), ("use_sliding_window", BOOL, LEAN),
                  ("attention_bias", BOOL, LEAN), ("num_experts", INT, ROLLOUT)],
    "mixtral": [("model_type", STR, LEAN), ("num_attention_heads", INT, LEAN), ("num_key_value_heads", INT, LEAN),
                ("head_dim", Kind("int", optional=True), LEAN), ("hidden_size", INT, LEAN),
                ("rms_norm_eps", FLOAT, LEAN), ("num_experts_per_tok", INT, LEAN),
                ("sliding_window", Kind("int", optional=True), LEAN), ("router_jitter_noise", FLOAT, LEAN),
                ("num_local_experts", INT, ROLLOUT)],
}

# Routers and experts of every family student.model builds (student/experts.py's forward and gating,
# router replay, expert parallelism).
MOE_LAYER = [
    ("model.layers.L.mlp.gate", MODULE, EXPERTS), ("model.layers.L.mlp.gate.weight", PARAM2, EXPERTS),
    ("model.layers.L.mlp.gate.hidden_dim", INT, EXPERTS), ("model.layers.L.mlp.gate.top_k", INT, REPLAY),
    ("model.layers.L.mlp.experts.num_experts", INT, EXPERTS), ("model.layers.L.mlp.experts.has_gate", BOOL, EXPERTS),
    ("model.layers.L.mlp.experts.has_bias", BOOL, EXPERTS), ("model.layers.L.mlp.experts.is_transposed", BOOL, EXPERTS),
    ("model.layers.L.mlp.experts.has_post_expert_norm", BOOL, EXPERTS),
    ("model.layers.L.mlp.experts.down_proj", PARAM3, EXPERTS), ("model.layers.L.mlp.experts.act_fn", CALLABLE, EXPERTS),
]
GATED_EXPERTS = [("model.layers.L.mlp.experts.gate_up_proj", PARAM3, EXPERTS),
                 ("model.layers.L.mlp.experts._apply_gate", CALLABLE, EXPERTS)]
UNGATED_EXPERTS = [("model.layers.L.mlp.experts.up_proj", PARAM3, EXPERTS)]
# norm_topk_prob is read with a default (renormalise); where a family's router has it, it must stay.
ROUTER_NORM = {"qwen3_moe": True, "qwen2_moe": True, "olmoe": True, "mixtral": False}


def _model(family: str) -> torch.nn.Module:
    cfg = StudentConfig(arch=family, hidden_size=32, num_layers=2, num_heads=4, num_kv_heads=2, num_experts=4,
                        top_k=2, expert_width=16, max_positions=64)
    config = model_config(cfg, ByteTokenizer())
    if hasattr(config, "mlp_only_layers"):
        config.mlp_only_layers = [1]    # a dense layer too (Qwen3-MoE checkpoints may have them)
    torch.manual_seed(0)
    return AutoModelForCausalLM.from_config(config, experts_implementation="hintrl")


def _get(obj, path: str):
    for part in path.split("."):
        obj = obj[int(part)] if part.isdigit() else getattr(obj, part)
    return obj


def _layers(model, routed: bool) -> list[int]:
    return [i for i, layer in enumerate(model.model.layers) if hasattr(layer.mlp, "experts") == routed]


def _problems(family: str, obj, specs, layers=(None,)) -> list[str]:
    """Every spec `obj` fails, as the message a user reads."""
    version, minor, out = transformers.__version__, pinned_minor(), []
    for layer in layers:
        for path, kind, reader in specs:
            path = path.replace(".L.", f".{layer}.")
            supports = ("the lean forward supports" if reader in (LEAN, ROLLOUT) else "hintrl is tested with")
            tail = f"which {reader} reads; {supports} transformers {minor}; {REMEDY[reader]}"
            try:
                value = _get(obj, path)
            except (AttributeError, IndexError, TypeError):
                out.append(f"transformers {version}: {family} no longer has {path} {tail}")
                continue
            got = kind.mismatch(value)
            if got is not None:
                out.append(f"transformers {version}: {family} has {path} as {got}, not {kind}, {tail}")
    return out


@pytest.fixture(scope="module")
def models():
    return {family: _model(family) for family in sorted(STUDENT_FAMILIES)}


def test_installed_transformers_is_the_tested_minor():
    minor = pinned_minor()
    assert re.match(rf"{re.escape(minor)}(\.|$)", transformers.__version__), (
        f"transformers {transformers.__version__} is installed; setup.py pins {minor}, the minor whose module "
        "internals student/lean.py reads (this file names them). Install the pinned version, or check this file "
        "and tests/test_lean.py against the new one and move the pin.")


@pytest.mark.parametrize("family", LEAN_FAMILIES)
def test_lean_forward_finds_what_it_reads(models, family):
    assert family in LEAN_CONFIG, (f"student/lean.py supports {family}: name the config fields it reads for it "
                                   "in LEAN_CONFIG here")
    model = models[family] if family in models else _model(family)
    layer = LEAN_LAYER + (QK_NORM if STUDENT_FAMILIES[family].qk_norm else [])
    problems = (_problems(family, model, LEAN_MODEL) + _problems(family, model.config, LEAN_CONFIG[family])
                + _problems(family, model, layer, range(len(model.model.layers)))
                + _problems(family, model, LEAN_MOE_LAYER, _layers(model, routed=True))
                + _problems(family, model, LEAN_DENSE_LAYER, _layers(model, routed=False)))
    assert not problems, "\n".join(problems)
    # The shapes the lean forward's stacked q/k/v projection and per-head norms assume.
    c, a = model.config, model.model.layers[0].self_attn
    d = getattr(c, "head_dim", None) or c.hidden_size // c.num_attention_heads
    assert (a.q_proj.weight.shape[0], a.k_proj.weight.shape[0], a.v_proj.weight.shape[0]) == (
        c.num_attention_heads * d, c.num_key_value_heads * d, c.num_key_value_heads * d), (
        f"transformers {transformers.__version__}: {family}'s q/k/v projections are no longer (heads * head_dim, "
        f"hidden), which student/lean.py stacks; {REMEDY[LEAN]}")
    if STUDENT_FAMILIES[family].qk_norm:
        assert a.q_norm.weight.shape == (d,) and a.k_norm.weight.shape == (d,)
    assert model.model.rotary_emb.inv_freq.shape == (d // 2,)


@pytest.mark.parametrize("family", sorted(STUDENT_FAMILIES))
def test_experts_and_routers_have_what_we_read(models, family):
    model = models[family]
    routed = _layers(model, routed=True)
    assert routed, f"transformers {transformers.__version__}: no {family} layer has mlp.experts any more"
    experts = model.model.layers[routed[0]].mlp.experts
    specs = MOE_LAYER + (GATED_EXPERTS if experts.has_gate else UNGATED_EXPERTS)
    if ROUTER_NORM[family]:
        specs = specs + [("model.layers.L.mlp.gate.norm_topk_prob", BOOL, EXPERTS)]
    problems = _problems(family, model, specs, routed)
    assert not problems, "\n".join(problems)

    # find_routers goes by class name (...TopKRouter), and rl/engine.py takes the router's parent as
    # the MoE block (a ZeRO-3 leaf).
    found = find_routers(model)
    assert [r for _, r in found] == [model.model.layers[i].mlp.gate for i in routed], (
        f"transformers {transformers.__version__}: student.experts.find_routers no longer finds {family}'s routers "
        f"by class name ({type(model.model.layers[routed[0]].mlp.gate).__name__}); update student/experts.py")
    # Router replay hooks the router's output: (logits (N, E), weights (N, K), ids (N, K)).
    router = model.model.layers[routed[0]].mlp.gate
    with torch.no_grad():
        out = type(router).forward(router, torch.randn(5, model.config.hidden_size))
    e, k = router.weight.shape[0], router.top_k
    assert isinstance(out, tuple) and [tuple(t.shape) for t in out] == [(5, e), (5, k), (5, k)], (
        f"transformers {transformers.__version__}: {family}'s router no longer returns (logits, weights, ids), "
        f"which {REPLAY} and {EXPERTS} read; update them")
    # Expert parallelism finds the experts modules by their stacked tensors and shards every one.
    found_experts = [m for _, m in experts_modules(model)]
    assert found_experts == [model.model.layers[i].mlp.experts for i in routed], (
        f"transformers {transformers.__version__}: {EP} no longer finds {family}'s experts modules; {REMEDY[EP]}")
    for name, p in experts.named_parameters(recurse=False):
        assert p.dim() >= 1 and p.size(0) == experts.num_experts, (
            f"transformers {transformers.__version__}: {family} experts.{name} is {tuple(p.shape)}, not stacked "
            f"(E, ...), which {EP} shards; {REMEDY[EP]}")


def test_a_missing_attribute_says_who_reads_it_and_what_to_do(models):
    # The message a user gets on a transformers version where an attribute moved.
    model = models["qwen3_moe"]
    problems = _problems("qwen3_moe", model, [("model.rotary_emb.no_such_thing", FLOAT, LEAN),
                                              ("model.norm.weight", Kind("param", 2), LEAN)])
    minor = pinned_minor()
    assert problems == [
        f"transformers {transformers.__version__}: qwen3_moe no longer has model.rotary_emb.no_such_thing which "
        f"student/lean.py reads; the lean forward supports transformers {minor}; set student.lean_forward=false "
        "or update student/lean.py",
        f"transformers {transformers.__version__}: qwen3_moe has model.norm.weight as a Parameter of rank 1, not a "
        f"param of rank 2, which student/lean.py reads; the lean forward supports transformers {minor}; "
        "set student.lean_forward=false or update student/lean.py",
    ]
