"""Config fuzzing: a few hundred bad values, types and keys through the real loader.

A seeded generator (random.Random(0)) walks the config dataclasses (RunConfig's sections and every
method's own section) and makes, for experiments/default and a few other experiment folders:
unknown keys (typos of real keys, keys from another section or method, made-up ones), values of
the wrong type, numbers out of range (NaN, infinity, 64-bit overflow included), bad choices for
every key that names one, malformed overrides, combinations the validators exist for, and bad
config.yaml files. Each must make `load_config` raise ConfigError (nothing else), with a message
of one line that names the key (for a malformed override, its text). A sample of them, chosen by
the same seed, goes through `python -m rl.train`: exit 2, one stderr line `config error: ...`,
nothing written under output_dir.

Which keys are enumerations, free text or bounded numbers is stated here, not read from
rl/config.py (the test would otherwise check the loader against itself); a key added to the
config dataclasses without a line here fails `test_every_key_is_classified`.
"""
from __future__ import annotations

import dataclasses
import functools
import os
import random
import typing
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path

import pytest
import yaml

from conftest import ROOT, run_cli
from rl.config import ConfigError, RunConfig
from rl.configure import load_config

EXPERIMENTS = ("default", "repro-guide", "targeted-multistep", "llm-teacher")   # default: most cases
CATEGORIES = ("unknown_key", "wrong_type", "out_of_range", "bad_choice", "syntax", "combination", "yaml")

# Keys naming one of a fixed set or a registry: a valid value each, the bad ones are made from it.
EMPTY_MEANS_DEFAULT = {"warmstart.teacher"}      # "" is a valid value: the run's own teacher
ENUMS = {
    "task.render": "question", "task.reward": "binary", "task.source": "reasoning_gym", "task.match": "math",
    "task.name": "basic_arithmetic", "task.environment": "answer", "student.arch": "qwen3_moe",
    "student.experts_implementation": "hintrl", "student.attn_implementation": "sdpa", "student.dtype": "float32",
    "student.tokenizer": "byte",
    "teacher.kind": "rule", "teacher.reveal": "mismatch", "rollout.engine": "local", "deepspeed.dtype": "fp32",
    "method.name": "grpo", "warmstart.teacher": "rule", "warmstart.decay": "cosine",
}
# Text the loader takes as given (paths, names, addresses); some have values it can tell are bad.
FREE_TEXT = {"output_dir", "experiment", "run_name", "task.path", "student.checkpoint", "teacher.prompt_template",
             "teacher.model", "teacher.gguf_file", "teacher.device", "teacher.base_url", "teacher.api_key_env",
             "rollout.vllm.python", "rollout.vllm.cpus", "trainer.export_to", "launcher.master_addr",
             "launcher.hostfile", "method.teacher_path"}
BAD_TEXT = {"teacher.device": ("gpu0", "cuda:x", ""), "rollout.vllm.cpus": ("abc", "1-", "0,,1", "all"),
            "teacher.prompt_template": ("no_such_prompt.txt",), "method.teacher_path": ("no/such/export",)}

# Bad values of every bounded number, from how the code uses it.
P_INT, P_FLOAT, NN_INT, NN_FLOAT = ("0", "-1", "-7"), ("0", "-0.5", "-3.0"), ("-1", "-12"), ("-0.1", "-2.5")
BAD_NUMBERS = {
    **dict.fromkeys((
        "task.eval_size", "task.train_size", "student.hidden_size", "student.num_layers", "student.num_heads",
        "student.num_kv_heads", "student.num_experts", "student.top_k", "student.expert_width", "student.max_positions",
        "teacher.max_hint_chars", "teacher.max_new_tokens", "teacher.batch_size", "teacher.concurrency",
        "rollout.prompts_per_step", "rollout.max_new_tokens", "rollout.max_turns", "rollout.vllm.threads",
        "rollout.vllm.kv_cache_gb", "rollout.vllm.bucket_mb", "warmstart.batch_size", "trainer.eval_every",
        "trainer.checkpoint_every", "trainer.keep_checkpoints", "method.distill_top_k",
        "method.corrections_per_attempt"), P_INT),
    **dict.fromkeys(("teacher.timeout_s", "rollout.vllm.startup_timeout_s", "rollout.vllm.request_timeout_s",
                     "method.clip_eps", "method.is_clip", "method.shape_gamma"), P_FLOAT),
    **dict.fromkeys(("teacher.retries", "rollout.vllm.max_engine_vocab", "warmstart.steps", "warmstart.warmup_steps",
                     "trainer.steps", "trainer.warmup_steps", "trainer.log_rollouts", "trainer.max_nonfinite_steps",
                     "trainer.threads", "deepspeed.param_persistence_threshold", "eval.pass_k",
                     "student.upcycle_experts"), NN_INT),
    **dict.fromkeys(("student.router_aux_loss_coef", "teacher.temperature", "teacher.backoff_s", "teacher.cooldown_s",
                     "warmstart.lr", "trainer.lr", "trainer.weight_decay", "deepspeed.gradient_clipping",
                     "method.pg_coef", "method.distill_coef", "student.upcycle_noise"), NN_FLOAT),
    "rollout.attempts_per_prompt": ("0", "1", "-2"),          # 1: a group needs two (trainer.steps > 0)
    "rollout.temperature": ("0", "-1.0", "-0.01"),
    "warmstart.hint_fraction": ("1.5", "-0.1", "2"),
    "warmstart.min_lr_ratio": ("1.5", "-0.1", "2"),
    "method.ema_rate": ("0", "1.5", "-0.05"),
    "method.guide_quantile": ("0", "1.5", "-0.1"),
    "deepspeed.zero_stage": ("4", "-1", "7"),
    "deepspeed.gradient_accumulation_steps": ("0", "-1", "3"),  # 3 divides no experiment's rows
    "deepspeed.expert_parallel_size": ("0", "-2", "3"),       # 3 divides neither 1 rank nor 8 experts
    "launcher.nproc_per_node": ("0", "-1"),
    "launcher.nnodes": ("0", "-1"),
    "launcher.node_rank": ("1", "-1"),                        # one node: rank 0 only
    "launcher.master_port": ("65536", "70000", "-1"),
}
UNBOUNDED = {"seed", "task.eval_seed"}     # any 64-bit integer is a seed


@dataclass(frozen=True)
class Case:
    category: str
    experiment: str                 # a folder under experiments/, or "" for a written config.yaml
    overrides: tuple[str, ...]
    names: tuple[str, ...]          # the message must contain one of these
    yaml_text: str | bytes | None = None
    literal: bool = False           # names may match inside the quoted source (malformed overrides, files)

    def label(self) -> str:
        where = f"[{self.experiment or 'written config.yaml'}]"
        text = f" config.yaml={self.yaml_text!r}" if self.yaml_text is not None else ""
        return f"{self.category} {where}{text} {list(self.overrides)}"


# --- the schema, from the dataclasses --------------------------------------------------------------

def _kind(t) -> str:
    if t in (bool, int, float, str):
        return t.__name__
    if typing.get_origin(t) is dict:
        return "dict"
    if typing.get_origin(t) is list:
        return "list"
    raise AssertionError(f"a config field of type {t!r}: teach this test about it")


def _walk(cls, prefix=""):
    hints = typing.get_type_hints(cls)
    for f in dataclasses.fields(cls):
        if dataclasses.is_dataclass(hints[f.name]):
            yield from _walk(hints[f.name], f"{prefix}{f.name}.")
        else:
            yield f"{prefix}{f.name}", _kind(hints[f.name])


@functools.lru_cache(maxsize=None)
def schema() -> dict[str, tuple[str, tuple[str, ...]]]:
    """dotted key -> (kind, methods having it; () outside the method section). Every key of every
    section of RunConfig, and every method's own keys."""
    from rl.methods import METHODS

    keys = {key: (kind, ()) for key, kind in _walk(RunConfig) if not key.startswith("method.")}
    for name in sorted(METHODS):
        for key, kind in _walk(METHODS[name].Config, "method."):
            keys[key] = (kind, keys.get(key, (kind, ()))[1] + (name,))
    return keys


@functools.lru_cache(maxsize=None)
def current(experiment: str):
    return load_config(ROOT / "experiments" / experiment)


def _sections() -> list[str]:
    return sorted({k.rsplit(".", 1)[0] for k in schema() if "." in k})


def _siblings(key: str) -> set[str]:
    parent = key.rsplit(".", 1)[0] if "." in key else ""
    return {k.rsplit(".", 1)[-1] for k in schema() if (k.rsplit(".", 1)[0] if "." in k else "") == parent} | (
        set(_sections()) if not parent else set())


def _setup(key: str, experiment: str) -> tuple[str, ...]:
    """Overrides that make `key` exist: a method key needs a method that has it."""
    methods = schema()[key][1]
    if not methods or current(experiment).method.name in methods:
        return ()
    return (f"method.name={methods[0]}",)


def _typo(word: str, rng: random.Random) -> str:
    ops = ["drop", "swap", "double", "replace", "plural", "case"]
    op = rng.choice(ops)
    i = rng.randrange(len(word))
    if op == "drop" and len(word) > 2:
        return word[:i] + word[i + 1:]
    if op == "swap" and len(word) > 2:
        i = min(i, len(word) - 2)
        return word[:i] + word[i + 1] + word[i] + word[i + 2:]
    if op == "double":
        return word[:i] + word[i] + word[i:]
    if op == "replace":
        return word[:i] + rng.choice("qxzjkv") + word[i + 1:]
    if op == "case":
        return word[:i] + word[i].upper() + word[i + 1:]
    return word + "s"


def _default_text(key: str) -> str:
    kind = schema()[key][0]
    return {"bool": "false", "int": "1", "float": "0.5", "str": "x", "dict": "{}", "list": "[]"}[kind]


def _nested_dict(key: str, value) -> dict:
    out = value
    for part in reversed(key.split(".")):
        out = {part: out}
    return out


# --- the generator ---------------------------------------------------------------------------------

def _experiment(rng: random.Random) -> str:
    return "default" if rng.random() < 0.6 else rng.choice(EXPERIMENTS[1:])


def _unknown_keys(rng: random.Random) -> list[Case]:
    keys = sorted(schema())
    cases = []
    for key in rng.sample(keys, 48):                  # a typo of the last part of a real key
        exp = _experiment(rng)
        parent, _, last = key.rpartition(".")
        for _ in range(20):
            bad = _typo(last, rng)
            if bad not in _siblings(key):
                break
        else:
            bad = last + "x"
        full = f"{parent}.{bad}" if parent else bad
        cases.append(Case("unknown_key", exp, _setup(key, exp) + (f"{full}={_default_text(key)}",), (full,)))
    for section in rng.sample(_sections(), 6):        # a typo of a section
        first = section.split(".")[0]
        bad = _typo(first, rng)
        if bad in _siblings(first):
            bad += "x"
        rest = section[len(first):]
        cases.append(Case("unknown_key", _experiment(rng), (f"{bad}{rest}.steps=1",), (bad,)))
    for _ in range(12):                               # a real key in the wrong section
        key = rng.choice([k for k in keys if k.count(".") == 1 and not k.startswith("method.")])
        name = key.split(".")[1]
        target = rng.choice([s for s in ("trainer", "warmstart", "rollout", "teacher", "student", "launcher",
                                         "deepspeed", "task") if name not in _siblings(f"{s}.x")])
        cases.append(Case("unknown_key", _experiment(rng), (f"{target}.{name}={_default_text(key)}",),
                          (f"{target}.{name}",)))
    method_keys = [k for k in keys if k.startswith("method.")]
    for _ in range(8):                                # another method's key
        exp = _experiment(rng)
        own = current(exp).method.name
        key = rng.choice([k for k in method_keys if own not in schema()[k][1]])
        cases.append(Case("unknown_key", exp, (f"{key}={_default_text(key)}",), (key,)))
    for word in ("epochs", "model", "optimizer", "lr", "batch_size", "seeds", "Seed", "runname"):
        cases.append(Case("unknown_key", _experiment(rng), (f"{word}=1",), (word,)))
    for key in ("rollout.vllm.foo.bar", "trainer.schedule.warmup", "student.moe.top_k"):   # deeper than the schema
        cases.append(Case("unknown_key", "default", (f"{key}=1",), (key.rsplit(".", 1)[0],)))
    for setting in ("min_digit", "max_digitz", "operator", "terms", "seed", "size"):       # generator settings
        exp = rng.choice(("default", "repro-guide"))
        cases.append(Case("unknown_key", exp, (f"task.config.{setting}=1",), (f"task.config.{setting}",)))
    cases.append(Case("unknown_key", "targeted-multistep", ("task.buckets.easy.min_term=3",),
                      ("task.buckets.easy.min_term",)))
    return cases


WRONG = {
    "int": ("abc", "1.5", "[1, 2]", "{a: 1}", "true", "null", "", "1e3", "7a"),
    "float": ("abc", "[0.1]", "{a: 1}", "true", "null", "", "1.0.0", "0.5x"),
    "bool": ("maybe", "2", "-1", "10", "[true]", "{a: 1}", "1.5", "null", "tru"),
    "dict": ("[1, 2]", "3", "abc", "true", "[]"),
    "list": ("{a: 1}", "3", "abc", "true", "[[1]]", "[{a: 1}]"),
}


def _wrong_types(rng: random.Random) -> list[Case]:
    cases = []
    keys = sorted(schema())
    for key in rng.sample([k for k in keys if schema()[k][0] in ("int", "float", "bool")], 45):
        exp = _experiment(rng)
        value = rng.choice(WRONG[schema()[key][0]])
        cases.append(Case("wrong_type", exp, _setup(key, exp) + (f"{key}={value}",), (key,)))
    for key in [k for k in keys if schema()[k][0] in ("dict", "list")]:
        for value in rng.sample(WRONG[schema()[key][0]], 3):
            cases.append(Case("wrong_type", _experiment(rng), (f"{key}={value}",), (key,)))
    for key in rng.sample([k for k in keys if schema()[k][0] == "str" and "." in k], 12):
        # Text fields take command-line text as typed; a list or mapping reaches them through
        # their section: teacher={model: [1, 2]}.
        exp = _experiment(rng)
        parent, _, last = key.rpartition(".")
        value = rng.choice(("[1, 2]", "{a: 1}", "[]"))
        cases.append(Case("wrong_type", exp, _setup(key, exp) + (f"{parent}={{{last}: {value}}}",), (key,)))
    for section in rng.sample(_sections(), 8):         # a section given a value
        value = rng.choice(("3", "abc", "[1]", "true", "2.5"))
        cases.append(Case("wrong_type", _experiment(rng), (f"{section}={value}",), (section,)))
    for key in rng.sample([k for k in keys if schema()[k][0] in ("int", "float", "bool", "str")], 6):
        exp = _experiment(rng)                         # a key under a value
        cases.append(Case("wrong_type", exp, _setup(key, exp) + (f"{key}.x=1",), (key,)))
    cases.append(Case("wrong_type", "default", ("task.mix={all: heavy}",), ("task.mix.all",)))
    cases.append(Case("wrong_type", "repro-guide", ("warmstart.mix.easy=[1]",), ("warmstart.mix.easy",)))
    cases.append(Case("wrong_type", "repro-guide", ("task.mix={easy: 1, hard: x}",), ("task.mix.hard",)))
    return cases


def _out_of_range(rng: random.Random) -> list[Case]:
    cases = []
    keys = sorted(schema())
    for key in sorted(BAD_NUMBERS):                    # every bounded number, one or two bad values
        for value in rng.sample(BAD_NUMBERS[key], min(len(BAD_NUMBERS[key]), rng.choice((1, 2)))):
            exp = _experiment(rng)
            cases.append(Case("out_of_range", exp, _setup(key, exp) + (f"{key}={value}",), (key,)))
    for key in rng.sample([k for k in keys if schema()[k][0] == "float"], 12):      # not finite
        exp = _experiment(rng)
        value = rng.choice(("nan", "inf", "-inf", ".nan", "1e400"))
        cases.append(Case("out_of_range", exp, _setup(key, exp) + (f"{key}={value}",), (key,)))
    for key in rng.sample([k for k in keys if schema()[k][0] == "int"], 10):        # past 64 bits
        exp = _experiment(rng)
        value = rng.choice((str(2**64), str(-2**63 - 1), "1" + "0" * 30))
        cases.append(Case("out_of_range", exp, _setup(key, exp) + (f"{key}={value}",), (key,)))
    cases.append(Case("out_of_range", "default", ("task.mix={all: .nan}",), ("task.mix",)))
    cases.append(Case("out_of_range", "repro-guide", ("task.mix={easy: .inf, hard: 1}",), ("task.mix",)))
    cases.append(Case("out_of_range", "repro-guide", ("warmstart.mix={easy: -1}",), ("warmstart.mix",)))
    cases.append(Case("out_of_range", "default", ("task.config.min_digits=0",), ("task.config",)))
    return cases


def _bad_choices(rng: random.Random) -> list[Case]:
    from rl.methods import METHODS

    enums = {key: example for key, example in ENUMS.items()}
    for name in sorted(METHODS):                       # each method's own choices, from its Config
        for key, valid in METHODS[name].Config.CHOICES.items():
            enums.setdefault(f"method.{key}", valid[0])
    cases = []
    for key in sorted(enums):
        example = enums[key]
        bad = ["nope", example.upper(), f"{example}_x", f" {example}", "", "null", "1"]
        if key in EMPTY_MEANS_DEFAULT:
            bad.remove("")
        for value in rng.sample(bad, 2):
            exp = _experiment(rng)
            cases.append(Case("bad_choice", exp, _setup(key, exp) + (f"{key}={value}",), (key,)))
    for key in sorted(BAD_TEXT):
        for value in BAD_TEXT[key][:2]:
            exp = _experiment(rng)
            cases.append(Case("bad_choice", exp, _setup(key, exp) + (f"{key}={value}",), (key,)))
    for value in ("int8", "bf16", "float8_e4m3fn", "torch.float32"):
        cases.append(Case("bad_choice", _experiment(rng), (f"student.dtype={value}",), ("student.dtype",)))
    for value in ("fp16", "bfloat16"):
        cases.append(Case("bad_choice", _experiment(rng), (f"deepspeed.dtype={value}",), ("deepspeed.dtype",)))
    return cases


def _syntax(rng: random.Random) -> list[Case]:
    keys = sorted(schema())
    plain = [k for k in keys if not k.startswith("method.")]
    numbers = [k for k in plain if schema()[k][0] in ("int", "float")]
    texts = [k for k in plain if schema()[k][0] == "str"]
    k, n, n2, t = rng.choice(plain), rng.choice(numbers), rng.choice(numbers), rng.choice(texts)
    section, field = rng.choice([key.split(".") for key in plain if key.count(".") == 1])
    items = [
        (k, ()), (f"={rng.choice(('1', 'x'))}", ()), (f"{section}..{field}=1", ()), (f".{k}=1", ()),
        (f"{k}.=1", ()), (f" {k}=1", ()), (f"{k} =1", ()), (f"{section}[0]=1", ()), (f"{section}.{field}[0]=1", ()),
        ("", ()), ("=", ()), ("==", ()), (f"{n}=[1", (n,)), (f"{n}=[1, 2", (n,)), (f"{n}='1", (n,)),
        (f'{n2}="1', (n2,)), ("task.config={min_digits: 1", ("task.config",)),
        ("task.config={min_digits: [1}", ("task.config",)), ("task.mix={a: 1, a: 2}", ("task.mix",)),
        (f"{n}=${{nope}}", (n,)), (f"{n2}=${{", (n2,)), (f"{t}=${{nope.nothing}}", (t,)), (f"{k}=???", (k,)),
        (f"{n}=1=2", (n,)), (f"{n}=@x", (n,)), (f"{n}=`x`", (n,)), (f"{n2}=*alias", (n2,)),
        (f"{n}=!!python/object:os.system", (n,)), (f"{n2}={{{{", (n2,)), (f"{k}\n=1", ()),
        (f"task.buckets={{hard: {{min_digits: ???}}}}", ("task.buckets",)),
        (f"{n}=\udcff", (n,)), (f"{t}=a\udcffb", (t,)), (f"{section}.\udcff=1", ()),   # argv bytes not UTF-8
        (f"{t}=a\0b", (t,)), ("task.path=x\0", ("task.path",)),                                 # in-process only
        ("teacher.prompt_template=\0", ("teacher.prompt_template",)),
    ]
    return [Case("syntax", _experiment(rng), (item,), (item, *names), literal=True) for item, names in items]


COMBINATIONS = [
    ("default", ("launcher.nproc_per_node=3",), ("launcher.nproc_per_node",)),
    ("default", ("launcher.nproc_per_node=2", "warmstart.batch_size=7"), ("warmstart.batch_size",)),
    ("default", ("launcher.nproc_per_node=2", "deepspeed.expert_parallel_size=2"), ("deepspeed.expert_parallel_size",)),
    ("default", ("launcher.nproc_per_node=2", "deepspeed.zero_stage=2", "deepspeed.expert_parallel_size=3"),
     ("deepspeed.expert_parallel_size",)),
    ("default", ("deepspeed.offload_param=true",), ("deepspeed.offload_param",)),
    ("default", ("deepspeed.offload_param=true", "deepspeed.zero_stage=2"), ("deepspeed.offload_param",)),
    ("default", ("deepspeed.offload_optimizer=true",), ("deepspeed.offload_optimizer",)),
    ("default", ("launcher.nnodes=2",), ("launcher.master_port",)),
    ("default", ("launcher.nnodes=2", "launcher.master_port=29500", "launcher.node_rank=2"), ("launcher.node_rank",)),
    ("default", ("task.environment=calculator",), ("task.environment",)),
    ("default", ("task.environment=chain",), ("task.environment",)),
    ("targeted-multistep", ("task.render=question",), ("task.environment", "task.render")),
    ("default", ("method.distill_estimator=sampled", "method.distill_kl=forward"), ("method.distill_kl",)),
    ("default", ("task.source=jsonl",), ("task.path",)),
    ("default", ("task.source=jsonl", "task.path=no_such.jsonl", "task.render=question"), ("task.path",)),
    ("default", ("task.source=jsonl", "task.path=no_such.jsonl"), ("task.render",)),
    ("default", ("student.top_k=9",), ("student.top_k",)),
    ("default", ("student.num_kv_heads=3",), ("student.num_kv_heads",)),
    ("default", ("student.num_heads=128",), ("student.num_heads",)),
    ("default", ("student.hidden_size=100", "student.num_heads=4", "student.num_kv_heads=1"), ("student.hidden_size",)),
    ("default", ("student.arch=olmoe", "student.hidden_size=130"), ("student.hidden_size",)),
    ("default", ("task.mix={nope: 1}",), ("task.mix",)),
    ("default", ("warmstart.mix={easy: 1}",), ("warmstart.mix",)),
    ("default", ("task.mix={all: 0}",), ("task.mix",)),
    ("default", ("task.buckets={hard: {min_digits: 0}}",), ("task.buckets.hard",)),
    ("default", ("task.buckets={hard: 3}",), ("task.buckets.hard",)),
    ("default", ("task.config={min_digits: 1.5}",), ("task.config",)),
    ("default", ("task.config={operators: ['^']}",), ("task.config",)),
    ("default", ("task.name=leg_counting",), ("task.render",)),
    ("repro-guide", ("task.mix={easy: 1, medium: 1}",), ("task.mix",)),
    ("repro-guide", ("task.buckets={easy: {min_digits: 3, max_digits: 1}}",), ("task.buckets.easy",)),
    ("repro-guide", ("warmstart.mix={}", "task.mix={hard: 1}", "task.buckets={easy: {}}"), ("task.mix",)),
    ("default", ("teacher.kind=openai",), ("teacher.base_url",)),
    ("default", ("teacher.kind=openai", "teacher.base_url=http://127.0.0.1:8000/v1"), ("teacher.model",)),
    ("default", ("teacher.kind=hf",), ("teacher.model",)),
    ("llm-teacher", ("teacher.model=",), ("teacher.model",)),
    ("llm-teacher", ("teacher.prompt_template=missing.txt",), ("teacher.prompt_template",)),
    ("default", ("method.name=teacher_distill",), ("method.teacher_path",)),
    ("default", ("rollout.attempts_per_prompt=1", "trainer.steps=5"), ("rollout.attempts_per_prompt",)),
]


def _combinations(rng: random.Random) -> list[Case]:
    return [Case("combination", exp, overrides, names) for exp, overrides, names in COMBINATIONS]


DEFAULT = str(ROOT / "experiments" / "default")
YAML_FILES = [   # (text, names): names matched in the whole message (the file's path is one)
    ("trainer:\n  steps: [1, 2\n", ("config.yaml: line",)),
    ("trainer:\n  steps: 1\n lr: 2\n", ("config.yaml: line",)),
    ("trainer:\n\tsteps: 1\n", ("config.yaml: line",)),
    ("trainer: steps: 1\n", ("config.yaml: line",)),
    ("run_name: 'abc\n", ("config.yaml: line",)),
    ("seed: 1\nseed: 2\n", ("config.yaml: line 2", "seed")),
    ("trainer:\n  steps: 1\n  steps: 2\n", ("config.yaml: line 3", "steps")),
    ("? [a, b]\n: 1\n", ("config.yaml: line",)),
    ("seed: !!python/object:os.system ls\n", ("config.yaml: line",)),
    ("trainer: *x\n", ("config.yaml: line",)),
    ("- trainer\n- steps\n", ("config.yaml: top level",)),
    ("42\n", ("config.yaml: top level",)),
    ("just text\n", ("config.yaml: top level",)),
    (b"seed: \xff\xfe\n", ("config.yaml: not UTF-8",)),
    ("base: 5\n", ("config.yaml: 'base'",)),
    ("base: ../no_such_experiment\n", ("no_such_experiment/config.yaml",)),
    ("base: .\n", ("config.yaml: 'base'",)),
]
YAML_KEYED = [    # (layer, the key named): written with and without `base:` the default experiment
    ({"seeds": 3}, "seeds"), ({"trainer": {"stepz": 3}}, "trainer.stepz"),
    ({"rollout": {"vllm": {"threadz": 2}}}, "rollout.vllm.threadz"), ({"method": {"name": "grpo", "distill_kl": "jsd"}},
                                                                       "method.distill_kl"),
    ({"trainer": 5}, "trainer"), ({"student": [1]}, "student"), ({1: 2}, "1"), ({None: 2}, "None"),
    ({"trainer": {"steps": "???"}}, "trainer.steps"), ({"resume": 7}, "resume"), ({"trainer": {"lr": float("nan")}},
                                                                                   "trainer.lr"),
    ({"trainer": {"steps": "${nope}"}}, "trainer.steps"), ({"task": {"mix": {"all": None}}}, "task.mix.all"),
    ({"task": {"config": [1, 2]}}, "task.config"), ({"task": {"buckets": {2: {"min_digits": 1}}}}, "task.buckets.2"),
]


def _yaml_cases(rng: random.Random) -> list[Case]:
    cases = [Case("yaml", "", (), names, text, literal=True) for text, names in YAML_FILES]
    for layer, key in YAML_KEYED:
        for base in ({}, {"base": DEFAULT}):
            cases.append(Case("yaml", "", (), (key,), yaml.safe_dump({**base, **layer}, sort_keys=False)))
    texts = [k for k in sorted(schema()) if schema()[k][0] == "str" and not k.startswith("method.")]
    top = [k for k in texts if "." not in k]           # (the command line cannot give these a list)
    for key in top + rng.sample([k for k in texts if "." in k], 8):     # a text field given a list or mapping
        value = rng.choice(([1, 2], {"a": 1}, []))
        base = rng.choice(({}, {"base": DEFAULT}))
        cases.append(Case("yaml", "", (), (key,), yaml.safe_dump({**base, **_nested_dict(key, value)})))
    return cases


@functools.lru_cache(maxsize=None)
def cases() -> tuple[Case, ...]:
    rng = random.Random(0)
    out = []
    for make in (_unknown_keys, _wrong_types, _out_of_range, _bad_choices, _syntax, _combinations, _yaml_cases):
        out += make(rng)
    # The seeded draws can repeat a case by chance (a new key shifts the stream): test each once.
    return tuple(dict.fromkeys(out))


def cli_sample() -> list[Case]:
    """One of every category, chosen by the same seed (each CLI process costs ~7 s of imports)."""
    rng = random.Random(0)
    by_category = {c: [case for case in cases() if case.category == c
                       and not any("\0" in item for item in case.overrides)] for c in CATEGORIES}   # argv: no NUL
    return [case for c in CATEGORIES for case in rng.sample(by_category[c], 1)]


# --- checking one case -----------------------------------------------------------------------------

def _experiment_dir(case: Case, tmp: Path) -> Path:
    if case.yaml_text is None:
        return ROOT / "experiments" / case.experiment
    folder = tmp / f"exp{cases().index(case)}"
    folder.mkdir(parents=True, exist_ok=True)
    data = case.yaml_text if isinstance(case.yaml_text, bytes) else case.yaml_text.encode()
    (folder / "config.yaml").write_bytes(data)
    return folder


def _problem(case: Case, message: str, folder: Path) -> str | None:
    """Why `message` does not do (None: it does), and the name it gave."""
    if "\n" in message or "\r" in message:
        return "the message is more than one line"
    searched = message
    if not case.literal:      # the key must be named by the error itself, not only in the quoted source
        for item in case.overrides:
            searched = searched.replace(f"command line {item!r}", "")
        searched = searched.replace(str(folder / "config.yaml"), "")
    if not any(name in searched for name in _spellings(case)):
        return f"the message names none of {list(case.names)}"
    return None


def _spellings(case: Case) -> list[str]:
    """The names, and as repr() shows them (an override with a line break in it)."""
    return [*case.names, *(repr(n)[1:-1] for n in case.names)]


def _named(case: Case, message: str) -> str:
    return next(name for name in _spellings(case) if name in message)


def _reject(case: Case, tmp: Path) -> tuple[str | None, str]:
    """(what went wrong or None, the message)."""
    folder = _experiment_dir(case, tmp)
    try:
        load_config(folder, list(case.overrides))
    except ConfigError as err:
        return _problem(case, str(err), folder), str(err)
    except Exception as err:          # noqa: BLE001  (the point: nothing but ConfigError may escape)
        return f"raised {type(err).__name__}, not ConfigError: {str(err)[:200]!r}", ""
    return "accepted", ""


# --- tests -----------------------------------------------------------------------------------------

def test_every_key_is_classified():
    """A new config key gets a line here: an enumeration, free text or a bounded number."""
    loose = []
    for key, (kind, _) in schema().items():
        if kind in ("int", "float") and key not in BAD_NUMBERS and key not in UNBOUNDED:
            loose.append(f"{key} ({kind}): add its bad values to BAD_NUMBERS, or it to UNBOUNDED")
        if kind == "str" and key not in ENUMS and key not in FREE_TEXT and not _is_method_choice(key):
            loose.append(f"{key} (str): add it to ENUMS (a valid example) or FREE_TEXT")
    assert not loose, "\n".join(loose)
    stale = (set(BAD_NUMBERS) | UNBOUNDED | set(ENUMS) | FREE_TEXT) - set(schema())
    assert not stale, f"no longer config keys: {sorted(stale)}"


def _is_method_choice(key: str) -> bool:
    from rl.methods import METHODS

    return key.startswith("method.") and any(key[len("method."):] in METHODS[m].Config.CHOICES for m in METHODS)


def test_the_fuzz_covers_every_category_and_section():
    all_cases = cases()
    assert len(all_cases) >= 300, len(all_cases)
    counts = {c: sum(case.category == c for case in all_cases) for c in CATEGORIES}
    assert all(n >= 10 for n in counts.values()), counts
    named = {name for case in all_cases for name in case.names}
    sections = {f.name for f in dataclasses.fields(RunConfig)}
    missing = {s for s in sections if not any(n == s or n.startswith(f"{s}.") for n in named)}
    assert not missing, f"sections no case touches: {sorted(missing)}"
    assert {c.experiment for c in all_cases} >= set(EXPERIMENTS)


def test_fuzzed_configs_are_rejected_with_one_line_naming_the_key(tmp_path, record):
    failures = []
    for case in cases():
        problem, message = _reject(case, tmp_path)
        if problem:
            failures.append(f"{case.label()}: {problem}\n    message: {message!r}")
            record("config", "failed", input=case.label(), category=case.category, problem=problem, message=message)
        else:
            record("config", "rejected", input=case.label(), key=_named(case, message), category=case.category,
                   experiment=case.experiment or "written", message=message)
    assert not failures, f"{len(failures)} of {len(cases())} inputs not rejected as they should be:\n" + \
        "\n".join(failures)


# Values at the edge that the code takes on purpose: the fuzz must not have made the loader refuse them.
LEGITIMATE = [
    ("default", ["trainer.steps=0", "warmstart.steps=0", "rollout.attempts_per_prompt=1"]),
    ("default", ["trainer.lr=0", "warmstart.lr=0", "trainer.weight_decay=0", "trainer.warmup_steps=0"]),
    ("default", ["teacher.temperature=0", "teacher.retries=0", "teacher.backoff_s=0", "teacher.cooldown_s=0"]),
    ("default", ["trainer.threads=0", "trainer.log_rollouts=0", "trainer.max_nonfinite_steps=0",
                 "launcher.master_port=0", "deepspeed.gradient_clipping=0", "rollout.vllm.max_engine_vocab=0"]),
    ("default", ["warmstart.hint_fraction=0"]), ("default", ["warmstart.hint_fraction=1"]),
    ("default", ["eval.pass_k=0"]),                    # no sampling in suite reference_logprob
    ("default", ["method.name=self_distill", "method.ema_rate=1"]),
    ("default", ["seed=-5", "task.eval_seed=1099511627776"]), ("default", [f"seed={2**63 - 1}"]),
    ("default", ["resume=0", "deepspeed.offload_optimizer=1", "deepspeed.zero_stage=1"]),
    ("default", ["resume=yes"]), ("default", ["student.router_aux_loss_coef=0"]),
    ("default", ["student.dtype=bfloat16"]), ("default", ["student.dtype=float16"]),
    ("default", ["student.experts_implementation=eager"]), ("default", ["student.experts_implementation=grouped_mm"]),
    ("default", ["student.hidden_size=130"]),          # heads of 32 (hidden_size // num_heads): the families floor it
    ("default", ["teacher.device=cuda:1"]), ("default", ["rollout.vllm.cpus=0-3,6"]),
    ("default", ["run_name=off", "output_dir=[1", "trainer.export_to=${seed}"]),
    ("default", ["task.config.operators=[+]"]), ("default", ["trainer.steps=0x10"]),
    ("repro-guide", ["warmstart.mix={easy: 1, hard: 0}"]), ("targeted-multistep", ["rollout.max_turns=1"]),
    ("llm-teacher", ["teacher.kind=rule"]),
]


@pytest.mark.parametrize("experiment, overrides", LEGITIMATE, ids=lambda v: v if isinstance(v, str) else " ".join(v))
def test_legitimate_edge_values_still_load(experiment, overrides):
    load_config(ROOT / "experiments" / experiment, overrides)


@pytest.mark.slow
@pytest.mark.timeout(900)
def test_cli_rejects_a_sample_before_writing_anything(tmp_path, record):
    """`python -m rl.train` (a fresh process each, as scripts/train.sh runs it): exit 2, stderr
    exactly the loader's message as one `config error:` line, and no run folder. ~7 s a process
    (torch and transformers load with the config's own imports), so a few run at once."""
    sample = cli_sample()
    runs = []
    for i, case in enumerate(sample):
        folder = _experiment_dir(case, tmp_path)
        _, expected = _reject(case, tmp_path)
        # output_dir first: a bad override stops the loader, and one after it would never apply.
        runs.append((case, expected, tmp_path / f"out{i}", [str(folder), f"output_dir={tmp_path / f'out{i}'}",
                                                            *case.overrides]))
    with ThreadPoolExecutor(max_workers=max(1, min(4, (os.cpu_count() or 1) // 2))) as pool:
        procs = list(pool.map(lambda run: run_cli(run[3], timeout=300), runs))
    failures = []
    for (case, expected, out, _), proc in zip(runs, procs):
        lines = proc.stderr.splitlines()
        problem = None
        if proc.returncode != 2:
            problem = f"exit {proc.returncode}"
        elif len(lines) != 1 or not lines[0].startswith("config error: "):
            problem = f"stderr is not one 'config error:' line: {proc.stderr[-2000:]!r}"
        elif lines[0] != f"config error: {expected}":
            problem = f"stderr {lines[0]!r} is not the loader's message {expected!r}"
        elif "Traceback" in proc.stdout + proc.stderr:
            problem = "a traceback"
        elif out.exists() and any(out.iterdir()):
            problem = f"wrote {sorted(p.name for p in out.rglob('*'))[:5]} under output_dir"
        if problem:
            failures.append(f"{case.label()}: {problem}")
            record("config", "failed", input=case.label(), category=case.category, via="cli", problem=problem)
        else:
            record("config", "rejected", input=case.label(), key=_named(case, lines[0]), category=case.category,
                   via="cli", exit_code=2)
    assert {c.category for c in sample} == set(CATEGORIES)
    assert not failures, "\n".join(failures)
