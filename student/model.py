"""Build the MoE student policy from config: a registry of transformers MoE families.

Every family maps the same handful of size knobs (hidden, layers, heads, experts, top-k, expert
width) onto its own transformers config class, so an experiment switches family with one key
(`student.arch=mixtral`) and nothing else changes.
"""
from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Callable

import torch
import transformers
from transformers import AutoModelForCausalLM, PreTrainedModel

from student.experts import use_hintrl_gating
from student.registry import Registry
from student.tokenizer import KINDS as TOKENIZERS, ByteTokenizer, Tokenizer


@dataclass
class StudentConfig:
    arch: str = "qwen3_moe"          # key of STUDENT_FAMILIES
    checkpoint: str = ""             # HF folder to load instead of building from config
    upcycle_experts: int = 0         # > 0: checkpoint is a dense model, upcycled to this many experts of
    upcycle_noise: float = 0.0       # top_k (student/upcycle.py), with this relative noise on each copy
    tokenizer: str = "byte"          # "byte" (built in code, for students from scratch) or "auto" (the
                                     # checkpoint's own tokenizer and chat template; student/chat_tokenizer.py)
    hidden_size: int = 128
    num_layers: int = 4
    num_heads: int = 4
    num_kv_heads: int = 2
    num_experts: int = 8
    top_k: int = 2
    expert_width: int = 256          # intermediate size of one expert MLP
    max_positions: int = 256
    router_aux_loss_coef: float = 0.001
    experts_implementation: str = "hintrl"  # transformers ExpertsInterface name: "hintrl" (ours), "eager", "grouped_mm"
    router_replay: bool = True       # training forward reuses the experts chosen at rollout time
    lean_forward: bool = True        # run on student/lean.py where the family allows (else transformers' forward)
    attn_implementation: str = "sdpa"   # transformers' forward: "sdpa" (torch takes its flash kernel on a GPU
                                        # for bf16), "eager", "flash_attention_2" (the `flash` extra, GPU only;
                                        # the lean forward computes attention itself, so it steps aside)
    dtype: str = "float32"

    DTYPES = ("float32", "float", "bfloat16", "float16", "half", "float64", "double")

    def check(self) -> list[str]:
        """Problems beyond a key's type (sizes are checked positive by the config loader first):
        combinations that would otherwise fail at the first forward. The family is the registry's
        to check (STUDENT_FAMILIES)."""
        from transformers.integrations.moe import ExpertsInterface

        problems = []
        if self.tokenizer not in TOKENIZERS:
            problems.append(f"student.tokenizer={self.tokenizer!r} is not valid; choose one of {list(TOKENIZERS)}")
        elif self.tokenizer == "auto" and not self.checkpoint:
            problems.append("student.tokenizer=auto reads the tokenizer of student.checkpoint, which is not set")
        if self.dtype not in self.DTYPES:
            problems.append(f"student.dtype={self.dtype!r} is not valid; choose one of {sorted(self.DTYPES)}")
        implementations = {"eager", *ExpertsInterface._global_mapping}
        if self.experts_implementation not in implementations:
            problems.append(f"student.experts_implementation={self.experts_implementation!r} is not valid; "
                            f"choose one of {sorted(implementations)}")
        if self.num_heads % self.num_kv_heads:
            problems.append(f"student.num_heads={self.num_heads} must be a multiple of student.num_kv_heads="
                            f"{self.num_kv_heads} (each key/value head serves a group of query heads)")
        if self.top_k > self.num_experts:
            problems.append(f"student.top_k={self.top_k} must be <= student.num_experts={self.num_experts}")
        head_dim = self.hidden_size // self.num_heads
        if head_dim < 2 or head_dim % 2:
            problems.append(f"student.hidden_size={self.hidden_size} / student.num_heads={self.num_heads} gives "
                            f"heads of {head_dim} dimensions; rotary embeddings need an even number")
        if self.arch == "olmoe" and self.hidden_size % self.num_heads:
            problems.append(f"student.hidden_size={self.hidden_size} must be a multiple of student.num_heads="
                            f"{self.num_heads} for student.arch=olmoe")
        if self.checkpoint:
            problems += self.checkpoint_problems()
        return problems

    # StudentConfig size knob -> the transformers config keys that hold it (the first present is read)
    CHECKPOINT_KEYS = {"hidden_size": ("hidden_size",), "num_layers": ("num_hidden_layers",),
                       "num_heads": ("num_attention_heads",), "num_kv_heads": ("num_key_value_heads",),
                       "num_experts": ("num_experts", "num_local_experts"), "top_k": ("num_experts_per_tok",),
                       "expert_width": ("moe_intermediate_size", "intermediate_size"),
                       "max_positions": ("max_position_embeddings",)}

    def checkpoint_config(self) -> dict:
        """The checkpoint folder's config.json, read without the weights."""
        return json.loads((Path(self.checkpoint) / "config.json").read_text())

    def family(self) -> str:
        """The family this config builds: the checkpoint's `model_type` where a checkpoint is set
        (it brings its own), else `arch`."""
        return self.checkpoint_config().get("model_type") if self.checkpoint else self.arch

    def checkpoint_problems(self) -> list[str]:
        """A checkpoint brings its own family and shape (its config.json, read without the weights):
        a size knob or `arch` set to something else than both the default and the checkpoint's
        value would be silently ignored, so it is refused, and so is a family not registered."""
        try:
            config = self.checkpoint_config()
        except (OSError, ValueError) as err:
            return [f"student.checkpoint={self.checkpoint!r}: no readable config.json ({err})"]
        problems, defaults = [], StudentConfig()
        family = config.get("model_type")
        if family not in STUDENT_FAMILIES:
            problems.append(f"student.checkpoint={self.checkpoint!r} is a {family!r} model; a student is one of "
                            f"the registered MoE families {STUDENT_FAMILIES.names()}")
        elif self.arch not in (defaults.arch, family):
            problems.append(f"student.arch={self.arch} but student.checkpoint is a {family} model; "
                            "remove student.arch (the checkpoint sets it)")
        vocab = config.get("vocab_size")
        if self.tokenizer == "byte" and vocab is not None and vocab != ByteTokenizer().vocab_size:
            problems.append(f"student.checkpoint={self.checkpoint!r} has a vocabulary of {vocab} tokens, the byte "
                            f"tokenizer {ByteTokenizer().vocab_size}: set student.tokenizer=auto to use the "
                            "checkpoint's own tokenizer")
        for knob, keys in self.CHECKPOINT_KEYS.items():
            theirs = next((config[k] for k in keys if k in config), None)
            ours = getattr(self, knob)
            if theirs is not None and ours not in (getattr(defaults, knob), theirs):
                problems.append(f"student.{knob}={ours} but the checkpoint's {keys[0]} is {theirs}; remove "
                                f"student.{knob} (student.checkpoint brings its own size)")
        return problems


def _common(cfg: StudentConfig, tok: ByteTokenizer) -> dict:
    return dict(
        vocab_size=tok.vocab_size, hidden_size=cfg.hidden_size, num_hidden_layers=cfg.num_layers,
        num_attention_heads=cfg.num_heads, num_key_value_heads=cfg.num_kv_heads,
        max_position_embeddings=cfg.max_positions, num_experts_per_tok=cfg.top_k,
        router_aux_loss_coef=cfg.router_aux_loss_coef, pad_token_id=tok.pad_id,
        bos_token_id=tok.bos_id, eos_token_id=tok.eos_id, tie_word_embeddings=True,
    )


def _qwen3_moe(cfg, tok):
    return transformers.Qwen3MoeConfig(**_common(cfg, tok), num_experts=cfg.num_experts,
                                       moe_intermediate_size=cfg.expert_width,
                                       intermediate_size=cfg.expert_width, norm_topk_prob=True,
                                       head_dim=cfg.hidden_size // cfg.num_heads)


def _qwen2_moe(cfg, tok):
    return transformers.Qwen2MoeConfig(**_common(cfg, tok), num_experts=cfg.num_experts,
                                       moe_intermediate_size=cfg.expert_width,
                                       shared_expert_intermediate_size=cfg.expert_width,
                                       intermediate_size=cfg.expert_width)


def _mixtral(cfg, tok):
    return transformers.MixtralConfig(**_common(cfg, tok), num_local_experts=cfg.num_experts,
                                      intermediate_size=cfg.expert_width)


def _olmoe(cfg, tok):
    return transformers.OlmoeConfig(**_common(cfg, tok), num_experts=cfg.num_experts,
                                    intermediate_size=cfg.expert_width)


@dataclass(frozen=True)
class StudentFamily:
    """One MoE family a student can be (`student.arch`, or a checkpoint's `model_type`): how a
    StudentConfig becomes the family's transformers config, and which of the project's paths run
    it. Each flag states what the tests hold, not what might work: a config asking a family for a
    path it lacks is refused by name (rl/configure.py), the lean forward steps aside (student/lean.py)."""
    transformers_config: Callable[[StudentConfig, Tokenizer], transformers.PretrainedConfig]
    lean_forward: bool               # student/lean.py runs it (else transformers' forward, every family)
    qk_norm: bool = False            # its attention RMS-normalises queries and keys per head (Qwen3)
    expert_parallel: bool = True     # deepspeed.expert_parallel_size > 1 shards its experts
    vllm: bool = False               # rollout.engine=vllm serves it: weights pushed, routes returned


# student.arch -> the family (student/registry.py); a new family is one entry here plus its tests
# (tests/test_lean.py, test_expert_parallel.py and test_vllm_engine.py read these flags). vLLM's
# OLMoE has no tied output embedding, which every student here has: served, it samples another
# distribution (log-probs nats away on the same weights), so the engine is refused for it.
STUDENT_FAMILIES: Registry[StudentFamily] = Registry("student.arch", {
    "qwen3_moe": StudentFamily(_qwen3_moe, lean_forward=True, qk_norm=True, vllm=True),
    "qwen2_moe": StudentFamily(_qwen2_moe, lean_forward=False, vllm=True),
    "mixtral": StudentFamily(_mixtral, lean_forward=True, vllm=True),
    "olmoe": StudentFamily(_olmoe, lean_forward=False),
})


def model_config(cfg: StudentConfig, tok: ByteTokenizer) -> transformers.PretrainedConfig:
    return STUDENT_FAMILIES[cfg.arch].transformers_config(cfg, tok)


def build_tokenizer(cfg: StudentConfig) -> Tokenizer:
    """`student.tokenizer`: "byte" (built in code, for students trained from scratch) or "auto" (the
    tokenizer and chat template of the `student.checkpoint` folder)."""
    if cfg.tokenizer == "byte":
        return ByteTokenizer()
    if cfg.tokenizer == "auto":
        if not cfg.checkpoint:
            raise ValueError("student.tokenizer=auto reads the tokenizer of student.checkpoint, which is not set")
        from student.chat_tokenizer import ChatTokenizer
        return ChatTokenizer.from_pretrained(cfg.checkpoint)
    raise ValueError(f"student.tokenizer={cfg.tokenizer!r} is unknown; choose one of {list(TOKENIZERS)}")


def build_student(cfg: StudentConfig, tok: Tokenizer) -> PreTrainedModel:
    """A randomly initialised MoE causal LM (or `cfg.checkpoint` when set).

    Initialisation draws from torch's global RNG, so callers seed first for reproducible runs.
    """
    dtype = getattr(torch, cfg.dtype)
    kwargs = dict(attn_implementation=cfg.attn_implementation,
                  experts_implementation=cfg.experts_implementation, dtype=dtype)
    if cfg.checkpoint:
        model = AutoModelForCausalLM.from_pretrained(cfg.checkpoint, **kwargs)
    else:
        model = AutoModelForCausalLM.from_config(model_config(cfg, tok), **kwargs)
    if cfg.experts_implementation == "hintrl":
        use_hintrl_gating(model)     # the routers' top-k on our gating kernel too
    return model


def count_parameters(model: torch.nn.Module) -> int:
    return sum(p.numel() for p in model.parameters())
