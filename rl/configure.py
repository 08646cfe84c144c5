"""Loading a run's configuration: schema defaults (rl/config.py) ← experiment YAML (with `base:`
layers) ← command-line `key=value`, then validation.

Loading happens once, in `load_config`; an unknown key, a wrong type or malformed YAML stops the
run before any work with one line naming the source and the key. The resolved config is saved in
the run folder. Validation looks names up in the registries (methods, environments, eval suites,
tasks), so this module sits above them; the schema below them imports none.
"""
from __future__ import annotations

import copy
import dataclasses
import functools
import math
import re
from pathlib import Path
from typing import Any

import yaml
from omegaconf import DictConfig, ListConfig, OmegaConf
from omegaconf.errors import ConfigKeyError, OmegaConfBaseException
from omegaconf.nodes import BooleanNode

from rl.config import ConfigError, MethodConfig, RunConfig
from student.model import STUDENT_FAMILIES
from student.rollout_engine import ROLLOUT_ENGINES
from teacher.base import TEACHERS
from teacher.prompt import PromptTemplate


def _describe(err: OmegaConfBaseException) -> str:
    key = getattr(err, "full_key", None)
    msg = (str(err).splitlines() or [type(err).__name__])[0]
    if isinstance(err, ConfigKeyError):
        return f"unknown key '{key}'"
    return f"key '{key}': {msg}" if key else msg


def _missing_values(layer: Any, prefix: str = "") -> None:
    """`???` is OmegaConf's "missing": a merge skips it, so the value typed would be dropped unsaid."""
    for key, value in (layer.items() if isinstance(layer, dict) else ()):
        if isinstance(value, str) and value == "???":
            raise ConfigError(f"key '{prefix}{key}': '???' (OmegaConf's missing value) is not a value")
        _missing_values(value, f"{prefix}{key}.")


def _check_layer(base: DictConfig, layer: Any, prefix: str = "") -> None:
    """What OmegaConf's merge would report without the key, or take silently: a scalar (or list)
    where a section or a mapping belongs, a list or mapping as a value of a typed mapping, and an
    integer other than 0 or 1 for a bool (OmegaConf reads any integer as true). Unknown keys are
    left to the merge, which names them."""
    if not isinstance(layer, dict):
        return
    for key, value in layer.items():
        if not isinstance(key, str) or key not in base:
            continue
        full, node = f"{prefix}{key}", base._get_node(key)
        if isinstance(node, DictConfig):
            section = dataclasses.is_dataclass(node._metadata.object_type)
            if value is not None and not isinstance(value, dict):
                raise ConfigError(f"key '{full}' is a {'section' if section else 'mapping'}: give it keys "
                                  f"({full}.KEY=VALUE or {full}={{KEY: VALUE}}), not {type(value).__name__} {value!r}")
            if section:
                _check_layer(node, value, f"{full}.")
            elif value and node._metadata.element_type in (int, float, bool, str):
                # A typed mapping (task.mix: name -> float): OmegaConf lets a list or mapping in.
                for name, item in value.items():
                    if isinstance(item, (dict, list)):
                        raise ConfigError(f"key '{full}.{name}': {type(item).__name__} {item!r} is not a "
                                          f"{node._metadata.element_type.__name__}")
        elif isinstance(node, ListConfig):
            # A list of names (eval.suites): OmegaConf reports a mapping without the key, takes a
            # nested list, and reads a bare word as a list's wrong type.
            if value is not None and not isinstance(value, list):
                raise ConfigError(f"key '{full}' is a list: give it [NAME, ...], not {type(value).__name__} {value!r}")
            for item in value or ():
                if isinstance(item, (dict, list)):
                    raise ConfigError(f"key '{full}': {type(item).__name__} {item!r} in it is not a name")
        elif isinstance(node, BooleanNode) and type(value) is int and value not in (0, 1):
            raise ConfigError(f"key '{full}': {value} is not a bool (true or false)")


@functools.lru_cache(maxsize=None)
def _structured(cls: type) -> DictConfig:
    """OmegaConf.structured(cls), built once (~15 ms for RunConfig): callers only read it, or copy
    it (OmegaConf.merge copies its first argument)."""
    return OmegaConf.structured(cls)


@functools.lru_cache(maxsize=None)
def _defaults() -> DictConfig:
    """The schema defaults, the method section typed by its default method; load_config copies it."""
    cfg = OmegaConf.structured(RunConfig)
    cfg.method = _method_schema(cfg, cfg.method.name)
    return cfg


def _method_schema(cfg: DictConfig, name: str) -> DictConfig:
    """cfg's method section retyped as method `name`'s config: keys that method also has keep the
    values set for them, the others (another method's) are dropped. A value still at the old
    method's default is not kept: methods default shared keys differently (self_distill's
    distill_kl is jsd, hint_distill's reverse), and the new method's default applies. An unknown
    name keeps the common keys (validate() names the error)."""
    from rl.methods import METHODS

    schema = _structured(METHODS[name].Config if name in METHODS else MethodConfig)
    old = cfg.method.name
    old_defaults = _structured(METHODS[old].Config if old in METHODS else MethodConfig)
    kept = {k: v for k, v in OmegaConf.to_container(cfg.method).items()
            if k in schema and (k not in old_defaults or v != old_defaults[k])}
    return OmegaConf.merge(schema, {**kept, "name": name})


REPLACED = ("task.buckets", "task.mix", "warmstart.mix")    # a layer that sets one replaces it whole


def _merge(base: DictConfig, layer: Any, source: str) -> DictConfig:
    """Merge one layer. A layer that switches `method.name` first retypes the method section (so its
    keys are checked against that method), and one that switches `task.name` without giving
    `task.config` starts from an empty one (the old task's settings would not fit the new task).
    The bucket set and the mixes (REPLACED) are replaced, not merged key by key: `warmstart.mix:
    {easy: 1}` over a base's `{easy: 1, hard: 1}` means the easy bucket alone."""
    try:
        layer = OmegaConf.create(layer) if not isinstance(layer, DictConfig) else layer
        plain = OmegaConf.to_container(layer, resolve=False)
        _missing_values(plain)
        _check_layer(base, plain)
        method_name = OmegaConf.select(layer, "method.name", default=None)
        retype = method_name is not None and method_name != base.method.name
        replaced = [key for key in REPLACED if OmegaConf.select(layer, key, default=None) is not None]
        task_name = OmegaConf.select(layer, "task.name", default=None)
        new_task = (task_name is not None and task_name != base.task.name
                    and OmegaConf.select(layer, "task.config", default=None) is None)
        if retype or replaced or new_task:
            base = OmegaConf.merge(base, {})          # one copy: the changes must not touch the caller's config
            if retype:
                base.method = _method_schema(base, str(method_name))
                _check_layer(base, plain)             # again, against the method's own keys
            for key in replaced:
                section, name = key.split(".")
                base[section][name] = {}
            if new_task:
                base.task.config = {}
        return OmegaConf.merge(base, layer)
    except ConfigError as err:
        raise ConfigError(f"{source}: {err}") from None
    except OmegaConfBaseException as err:
        message = _describe(err)
        if isinstance(err, ConfigKeyError) and str(getattr(err, "full_key", "")).startswith("method."):
            message += (f" (method {base.method.name!r} has: {', '.join(sorted(base.method))}; "
                        "each method's keys are in rl/methods/<name>.py)")
        raise ConfigError(f"{source}: {message}") from None
    except (TypeError, ValueError) as err:      # OmegaConf's own, e.g. merging a list into a mapping
        raise ConfigError(f"{source}: {str(err).splitlines()[0]}") from None


def _choice(value: str, valid, key: str) -> None:
    if value not in valid:
        raise ConfigError(f"{key}={value!r} is not valid; choose one of {sorted(valid)}")


def validate(cfg: RunConfig) -> None:
    """Checks that need more than a type: names looked up in registries, positive sizes."""
    import reasoning_gym
    from rl.environments import ENVIRONMENTS
    from rl.methods import METHODS

    _validate_numbers(cfg)
    for key, ok, what in RANGES:
        value = _get(cfg, key)
        if not ok(value):
            raise ConfigError(f"{key} must be {what} (got {value!r})")
    _choice(cfg.task.source, {"reasoning_gym", "jsonl"}, "task.source")
    _choice(cfg.task.match, {"math", "exact"}, "task.match")
    _choice(cfg.task.render, {"question", "expression"}, "task.render")
    _choice(cfg.task.reward, {"binary", "partial"}, "task.reward")
    if cfg.task.source == "jsonl":
        _validate_jsonl(cfg)
    else:
        _choice(cfg.task.name, reasoning_gym.factory.DATASETS, "task.name")
        _validate_buckets(cfg)
    _validate_files(cfg)
    _choice(cfg.task.environment, ENVIRONMENTS, "task.environment")
    needs = ENVIRONMENTS[cfg.task.environment].reads_task
    if needs is not None and (cfg.task.name, cfg.task.render) not in needs:
        reads = " or ".join(f"task.name={name} with task.render={render}" for name, render in needs)
        raise ConfigError(f"task.environment={cfg.task.environment} reads {reads} "
                          f"(not {cfg.task.name}, {cfg.task.render})")
    _choice(cfg.method.name, METHODS, "method.name")
    for key, valid in type(cfg.method).CHOICES.items():
        _choice(getattr(cfg.method, key), set(valid), f"method.{key}")
    _choice(cfg.student.arch, STUDENT_FAMILIES, "student.arch")
    _prepare_student_checkpoint(cfg)
    _own_checks(cfg.student)
    _choice(cfg.teacher.kind, TEACHERS, "teacher.kind")
    if cfg.warmstart.teacher:
        _choice(cfg.warmstart.teacher, TEACHERS, "warmstart.teacher")
    _own_checks(cfg.teacher)
    _choice(cfg.rollout.engine, ROLLOUT_ENGINES, "rollout.engine")
    _own_checks(cfg.rollout.vllm)
    _check_family_supports(cfg)
    _choice(cfg.warmstart.decay, {"none", "cosine", "linear"}, "warmstart.decay")
    _choice(cfg.student.attn_implementation, {"sdpa", "eager", "flash_attention_2"}, "student.attn_implementation")
    if cfg.student.attn_implementation == "flash_attention_2":
        import importlib.util

        if importlib.util.find_spec("flash_attn") is None:
            raise ConfigError("student.attn_implementation=flash_attention_2 needs the flash-attn package, "
                              "which needs a GPU: pip install -e '.[flash]' (or keep sdpa, which takes torch's "
                              "flash kernel on a GPU for bf16)")
    if cfg.teacher.prompt_template:
        try:
            PromptTemplate.load(cfg.teacher.prompt_template)
        except (OSError, ValueError) as err:
            raise ConfigError(f"teacher.prompt_template: {err}") from None
    _choice(cfg.deepspeed.dtype, {"fp32", "bf16"}, "deepspeed.dtype")
    _choice(cfg.deepspeed.zero_stage, {0, 1, 2, 3}, "deepspeed.zero_stage")
    if not cfg.rollout.temperature > 0:
        raise ConfigError(f"rollout.temperature={cfg.rollout.temperature} must be > 0 (greedy decoding is "
                          "for evaluation; RL samples)")
    if cfg.trainer.steps > 0 and cfg.rollout.attempts_per_prompt < 2:
        raise ConfigError(f"rollout.attempts_per_prompt={cfg.rollout.attempts_per_prompt}: group-relative "
                          "advantages need at least 2 attempts per prompt")
    _own_checks(cfg.method)
    _validate_scale(cfg)


def _positive(v) -> bool:
    return v > 0


def _not_negative(v) -> bool:
    return v >= 0


# Numbers beyond their type (and what the trainer would otherwise fail on, or silently misread).
RANGES: tuple[tuple[str, Any, str], ...] = (
    *((key, _positive, "positive") for key in (
        "rollout.prompts_per_step", "rollout.attempts_per_prompt", "rollout.max_new_tokens", "rollout.max_turns",
        "task.eval_size", "task.train_size", "trainer.eval_every", "trainer.checkpoint_every",
        "trainer.keep_checkpoints", "warmstart.batch_size", "teacher.max_new_tokens", "teacher.batch_size",
        "teacher.concurrency", "teacher.max_hint_chars", "teacher.timeout_s", "student.hidden_size",
        "student.num_layers", "student.num_heads", "student.num_kv_heads", "student.num_experts", "student.top_k",
        "student.expert_width", "student.max_positions", "rollout.vllm.threads", "rollout.vllm.kv_cache_gb",
        "rollout.vllm.startup_timeout_s", "rollout.vllm.request_timeout_s", "rollout.vllm.bucket_mb")),
    *((key, _not_negative, ">= 0") for key in (
        "trainer.steps", "warmstart.steps", "trainer.lr", "warmstart.lr", "trainer.warmup_steps",
        "warmstart.warmup_steps", "trainer.weight_decay", "trainer.log_rollouts", "trainer.max_nonfinite_steps",
        "trainer.threads", "teacher.temperature", "teacher.retries", "teacher.backoff_s", "teacher.cooldown_s",
        "student.router_aux_loss_coef", "deepspeed.gradient_clipping", "deepspeed.param_persistence_threshold",
        "rollout.vllm.max_engine_vocab", "eval.pass_k", "student.upcycle_experts", "student.upcycle_noise")),
    ("warmstart.hint_fraction", lambda v: 0 <= v <= 1, "in [0, 1]"),
    ("warmstart.hint_fraction_by_bucket", lambda v: all(0 <= f <= 1 for f in v.values()), "fractions in [0, 1]"),
    ("warmstart.min_lr_ratio", lambda v: 0 <= v <= 1, "in [0, 1]"),
    ("trainer.eval_at", lambda v: all(isinstance(i, int) and i >= 1 for i in v), "RL steps >= 1"),
    ("launcher.master_port", lambda v: 0 <= v <= 65535, "a port in [0, 65535] (0 = a free one)"),
)


def _get(cfg: RunConfig, key: str) -> Any:
    for name in key.split("."):
        cfg = getattr(cfg, name)
    return cfg


def _leaves(obj: Any, prefix: str = ""):
    """(dotted key, value) for every field of a config dataclass, sections walked."""
    for f in dataclasses.fields(obj):
        value = getattr(obj, f.name)
        if dataclasses.is_dataclass(value):
            yield from _leaves(value, f"{prefix}{f.name}.")
        else:
            yield f"{prefix}{f.name}", value


def _validate_numbers(cfg: RunConfig) -> None:
    """No NaN or infinity anywhere (a learning rate, a timeout, a temperature...), and integers
    that fit the 64 bits torch and the launchers take."""
    for key, value in _leaves(cfg):
        if isinstance(value, float) and not math.isfinite(value):
            raise ConfigError(f"{key}={value} must be a finite number")
        if isinstance(value, int) and not isinstance(value, bool) and not -2**63 <= value < 2**63:
            raise ConfigError(f"{key}={value} is out of range (a 64-bit integer)")


def _check_family_supports(cfg: RunConfig) -> None:
    """The student's family runs on the paths the config asks for (its registry entry says which)."""
    name = cfg.student.family()
    family = STUDENT_FAMILIES[name]
    where = f"student.checkpoint is a {name} model" if cfg.student.checkpoint else f"student.arch={name}"
    if cfg.rollout.engine == "vllm" and not family.vllm:
        served = [n for n in STUDENT_FAMILIES if STUDENT_FAMILIES[n].vllm]
        raise ConfigError(f"rollout.engine=vllm serves the families {served}, and {where}: use rollout.engine=local")
    if cfg.deepspeed.expert_parallel_size > 1 and not family.expert_parallel:
        raise ConfigError(f"deepspeed.expert_parallel_size={cfg.deepspeed.expert_parallel_size}: {where}, whose "
                          "experts are not sharded; set it to 1")


def _prepare_student_checkpoint(cfg: RunConfig) -> None:
    """A `student.checkpoint` GGUF (a path or pkg://) is de-quantised, and with
    `student.upcycle_experts` upcycled, once (student/pretrained.py); the run's config then names the
    prepared folder, whose name says what it came from, and upcycle_experts is 0 (it is done)."""
    from student.pretrained import student_folder

    s = cfg.student
    if s.upcycle_experts and not s.checkpoint:
        raise ConfigError("student.upcycle_experts upcycles student.checkpoint (a dense model), which is not set")
    try:
        folder = student_folder(s.checkpoint, s.upcycle_experts, s.top_k, s.upcycle_noise, cfg.seed)
    except (OSError, ValueError) as err:
        message = (str(err).splitlines() or [type(err).__name__])[0]
        raise ConfigError(f"student.checkpoint={s.checkpoint!r}: {message}") from None
    s.checkpoint, s.upcycle_experts = folder, 0


def _own_checks(component) -> None:
    """A component's config checks itself (its `check()`: the problems, each naming its key)."""
    problems = component.check()
    if problems:
        raise ConfigError("; ".join(problems))


def _validate_jsonl(cfg: RunConfig) -> None:
    """The problem file is read and checked now (a bad line is named before any compute); its
    `bucket` fields are the buckets the mixes may name."""
    from rl.jsonl_task import JsonlError, bucket_of, load_problems, split_held_out

    t = cfg.task
    if not t.path:
        raise ConfigError("task.source=jsonl needs task.path: a JSON-lines file of problems (rl/jsonl_task.py)")
    _choice(t.render, {"question"}, "task.render (task.source=jsonl)")
    if t.buckets:
        raise ConfigError("task.buckets: with task.source=jsonl the buckets are the file's 'bucket' fields; "
                          "remove task.buckets")
    try:
        problems = load_problems(t.path)
        names = sorted({bucket_of(p) for p in problems})
        for name in names:
            split_held_out([p for p in problems if bucket_of(p) == name], t.eval_size, t.eval_seed)
    except JsonlError as err:
        raise ConfigError(str(err)) from None
    _validate_mixes(cfg, set(names))


def _validate_files(cfg: RunConfig) -> None:
    """task.files (training sources) and eval.private (private eval sets) are problem files, read
    and checked now; eval.suites name registered suites."""
    from rl.evals import SUITES
    from rl.jsonl_task import JsonlError, load_problems

    for key, (name, path) in [*(("task.files", kv) for kv in cfg.task.files.items()),
                              *(("eval.private", kv) for kv in cfg.eval.private.items())]:
        if not name.replace("-", "_").isidentifier():
            raise ConfigError(f"{key}.{name}: a source name is letters, digits, '_' or '-'")
        try:
            load_problems(path)
        except JsonlError as err:
            raise ConfigError(f"{key}.{name}: {err}") from None
    cfg.eval.suites = list(cfg.eval.suites)
    if not cfg.eval.suites:
        raise ConfigError(f"eval.suites is empty: list at least one of {sorted(SUITES)}")
    for suite in cfg.eval.suites:
        _choice(suite, SUITES, "eval.suites")
    if "private" in cfg.eval.suites and not cfg.eval.private:
        raise ConfigError("eval.suites lists 'private' but eval.private names no set (name: a JSON-lines file)")


def _validate_mixes(cfg: RunConfig, names: set[str]) -> None:
    clash = sorted(set(cfg.task.files) & names)
    if clash:
        raise ConfigError(f"task.files names {clash}, which are buckets of the task already: name the files otherwise")
    names = names | set(cfg.task.files)
    for key, mix in (("task.mix", cfg.task.mix), ("warmstart.mix", cfg.warmstart.mix)):
        unknown = sorted(set(mix) - names)
        if unknown:
            raise ConfigError(f"{key} names {unknown}, not buckets of the task ({sorted(names)})")
        if any(not math.isfinite(w) or w < 0 for w in mix.values()) or (mix and sum(mix.values()) <= 0):
            raise ConfigError(f"{key}={dict(mix)}: weights must be >= 0 and finite, with a positive sum")
    unknown = sorted(set(cfg.warmstart.hint_fraction_by_bucket) - names)
    if unknown:
        raise ConfigError(f"warmstart.hint_fraction_by_bucket names {unknown}, not buckets of the task ({sorted(names)})")


def _validate_buckets(cfg: RunConfig) -> None:
    """Every bucket's settings make a valid generator; mixes name existing buckets with weights >= 0."""
    import reasoning_gym

    from rl.tasks import render_prompt

    _, dataset_config_cls = reasoning_gym.factory.DATASETS[cfg.task.name]
    known = {f.name for f in dataclasses.fields(dataset_config_cls)} - {"seed", "size"}
    for name, own in (cfg.task.buckets or {"": {}}).items():
        key = f"task.buckets.{name}" if name else "task.config"
        if not isinstance(own, dict):
            raise ConfigError(f"{key} must be a mapping of generator settings, got {own!r}")
        settings = {**cfg.task.config, **own}
        for setting in settings:
            if setting not in known:
                where = key if setting in own else "task.config"
                why = ("the run sets it from seed / task.eval_seed, task.train_size / task.eval_size"
                       if setting in ("seed", "size") else
                       f"not a setting of reasoning-gym's {cfg.task.name!r} (it has: {', '.join(sorted(known))})")
                raise ConfigError(f"{where}: unknown key '{setting}' ({where}.{setting}): {why}")
        try:
            getattr(dataset_config_cls(**settings), "validate", lambda: None)()
            # One problem, made and rendered as the run will (a setting of the wrong type, say
            # min_digits: 1.5, passes validate() and fails here).
            render_prompt(reasoning_gym.create_dataset(cfg.task.name, seed=0, size=1, **settings)[0], cfg.task.render)
        except Exception as err:          # noqa: BLE001  (a third-party generator: anything it raises)
            message = (str(err).splitlines() or [type(err).__name__])[0]
            raise ConfigError(f"{key}: {message} (settings of reasoning-gym's {cfg.task.name!r}, "
                              f"task.render={cfg.task.render})") from None
    _validate_mixes(cfg, set(cfg.task.buckets) or {"all"})


def _validate_scale(cfg: RunConfig) -> None:
    ds, launch = cfg.deepspeed, cfg.launcher
    for key in ("launcher.nproc_per_node", "launcher.nnodes"):
        if _get(cfg, key) < 1:
            raise ConfigError(f"{key}={_get(cfg, key)} must be >= 1")
    if not 0 <= launch.node_rank < launch.nnodes:
        raise ConfigError(f"launcher.node_rank={launch.node_rank} must be in [0, launcher.nnodes)")
    if launch.nnodes > 1 and not launch.hostfile and launch.master_port == 0:
        raise ConfigError("launcher.nnodes > 1 with torchrun needs launcher.master_port (the same on every node)")
    world = launch.nproc_per_node * launch.nnodes
    # Every rank takes an equal slice of each global batch (whole prompt groups for RL).
    for key in ("rollout.prompts_per_step", "warmstart.batch_size"):
        section, name = key.split(".")
        if getattr(getattr(cfg, section), name) % world:
            raise ConfigError(f"{key}={getattr(getattr(cfg, section), name)} must be divisible by the "
                              f"number of ranks ({world} = launcher.nproc_per_node x launcher.nnodes)")
    ga = ds.gradient_accumulation_steps
    for key, rows in (("rollout.prompts_per_step", cfg.rollout.prompts_per_step * cfg.rollout.attempts_per_prompt),
                      ("warmstart.batch_size", cfg.warmstart.batch_size)):
        if ga < 1 or (rows // world) % ga:
            raise ConfigError(f"deepspeed.gradient_accumulation_steps={ga} must divide each rank's rows "
                              f"for {key} ({rows // world})")
    if ds.offload_param and ds.zero_stage != 3:
        raise ConfigError("deepspeed.offload_param needs deepspeed.zero_stage=3")
    if ds.offload_optimizer and ds.zero_stage == 0:
        raise ConfigError("deepspeed.offload_optimizer needs deepspeed.zero_stage >= 1")
    ep = ds.expert_parallel_size
    if ep < 1 or world % ep or cfg.student.num_experts % ep:
        raise ConfigError(f"deepspeed.expert_parallel_size={ep} must divide the number of ranks ({world}) "
                          f"and student.num_experts ({cfg.student.num_experts})")
    if ep > 1 and ds.zero_stage not in (1, 2):
        raise ConfigError(f"deepspeed.expert_parallel_size={ep} runs with deepspeed.zero_stage 1 or 2 "
                          f"(got {ds.zero_stage}); docs/expert_parallel.md explains why not 0 or 3")


_KEY = re.compile(r"[^\s.=\[\]{}'\"]+(\.[^\s.=\[\]{}'\"]+)*")    # a.b.c: no empty parts, spaces, brackets


def _nested(path: list[str], value: Any) -> dict:
    return {path[0]: _nested(path[1:], value) if len(path) > 1 else value}


class _YamlLoader(yaml.SafeLoader):
    """yaml.safe_load, but a key given twice in one mapping is an error (PyYAML keeps the last)."""

    def construct_mapping(self, node, deep=False):
        if isinstance(node, yaml.MappingNode):
            seen = set()
            for key_node, _ in node.value:
                key = self.construct_object(key_node, deep=True)
                try:
                    duplicate = key in seen
                    seen.add(key)
                except TypeError:                     # unhashable: the constructor below names it
                    break
                if duplicate:
                    raise yaml.constructor.ConstructorError(
                        "while constructing a mapping", node.start_mark, f"duplicate key {key!r}", key_node.start_mark)
        return super().construct_mapping(node, deep=deep)


def _text_keys(layer: Any, source: str, prefix: str = "") -> None:
    """Every key is text: YAML reads `1:`, `null:` or `yes:` as a number, None or a bool."""
    for key, value in (layer.items() if isinstance(layer, dict) else ()):
        if not isinstance(key, str):
            raise ConfigError(f"{source}: key '{prefix}{key}': YAML reads this name as {type(key).__name__}, "
                              "not text; put it in quotes")
        _text_keys(value, source, f"{prefix}{key}.")


def _merge_experiment(cfg: DictConfig, folder: Path, seen: tuple[Path, ...], name: str = "config.yaml") -> DictConfig:
    """Merge folder/config.yaml (or folder/`name`) onto cfg; a top-level `base: ../other` (relative
    to the folder) merges that experiment's config first, so a variant states only what it changes."""
    path = folder / name
    if not path.is_file():
        raise ConfigError(f"{path}: no such file (an experiment folder holds config.yaml)")
    if path.resolve() in seen:
        raise ConfigError(f"{path}: 'base' chain loops back to itself")
    try:
        layer = yaml.load(path.read_text(encoding="utf-8"), Loader=_YamlLoader) or {}
    except UnicodeDecodeError as err:
        raise ConfigError(f"{path}: not UTF-8 text (byte {err.start}: {err.reason})") from None
    except yaml.YAMLError as err:
        mark = getattr(err, "problem_mark", None)
        where = f" line {mark.line + 1}, column {mark.column + 1}" if mark else ""
        problem = str(getattr(err, "problem", None) or err).splitlines()[0]
        raise ConfigError(f"{path}:{where} malformed YAML: {problem}") from None
    if not isinstance(layer, dict):
        raise ConfigError(f"{path}: top level must be a mapping of sections, got {type(layer).__name__}")
    _text_keys(layer, str(path))
    base = layer.pop("base", None)
    if base is not None:
        if not isinstance(base, str):
            raise ConfigError(f"{path}: 'base' must be a path to another experiment folder")
        cfg = _merge_experiment(cfg, (folder / base), seen + (path.resolve(),))
    return _merge(cfg, layer, str(path))


def load_config(experiment_dir: str | Path | None = None, overrides: list[str] = ()) -> RunConfig:
    """Schema defaults ← `experiment_dir/config.yaml` (or a .yaml file named directly) ← `overrides`
    ("a.b=value" strings). Any
    problem is one ConfigError of one line (a value with a line break in it is shown escaped)."""
    try:
        return _load_config(experiment_dir, overrides)
    except ConfigError as err:
        if "\n" in str(err) or "\r" in str(err):
            raise ConfigError(str(err).replace("\r", "\\r").replace("\n", "\\n")) from None
        raise


def _load_config(experiment_dir: str | Path | None, overrides: list[str]) -> RunConfig:
    cfg = copy.deepcopy(_defaults())
    config_name = "config.yaml"
    if experiment_dir is not None and Path(experiment_dir).suffix in (".yaml", ".yml") and Path(experiment_dir).is_file():
        # A config file of another name (an export's hintrl_config.yaml): its folder is the experiment's.
        experiment_dir, config_name = Path(experiment_dir).parent, Path(experiment_dir).name
    if experiment_dir is not None:
        cfg = _merge_experiment(cfg, Path(experiment_dir), seen=(), name=config_name)
        if not cfg.experiment:
            cfg.experiment = Path(experiment_dir).resolve().name
    for item in overrides:
        try:
            item.encode("utf-8")
        except UnicodeEncodeError:       # bytes that are not UTF-8 on the command line (surrogate-escaped)
            raise ConfigError(f"command line {item!r}: not UTF-8 text") from None
        if "=" not in item:
            raise ConfigError(f"command line {item!r}: an override looks like key=value")
        key, raw = item.split("=", 1)
        if not _KEY.fullmatch(key):
            raise ConfigError(f"command line {item!r}: {key!r} is not a key (dotted names, e.g. trainer.steps=50)")
        try:
            if isinstance(OmegaConf.select(cfg, key, default=None), str):
                # Text fields take the text as typed: YAML would read run_name=off as False.
                layer = OmegaConf.create(_nested(key.split("."), raw))
            else:
                layer = OmegaConf.from_dotlist([item])
        except OmegaConfBaseException as err:
            raise ConfigError(f"command line {item!r}: {_describe(err)}") from None
        except (yaml.YAMLError, ValueError) as err:    # the value's YAML: an unclosed bracket, `!!float x`, ...
            problem = str(getattr(err, "problem", None) or err).splitlines()[0]
            raise ConfigError(f"command line {item!r}: key '{key}': malformed value {raw!r} ({problem})") from None
        cfg = _merge(cfg, layer, f"command line {item!r}")
    try:
        run_cfg: RunConfig = OmegaConf.to_object(cfg)   # resolves ${...} interpolations
    except OmegaConfBaseException as err:
        raise ConfigError(_describe(err)) from None
    for key, value in _leaves(run_cfg):
        if isinstance(value, str) and "\0" in value:       # no path, name or argument holds one
            raise ConfigError(f"{key}={value!r}: text with a NUL character")
    if run_cfg.task.path and not Path(run_cfg.task.path).is_absolute():   # saved absolute, as below
        run_cfg.task.path = str((Path(experiment_dir or ".") / run_cfg.task.path).resolve())
    for files in (run_cfg.task.files, run_cfg.eval.private):    # saved absolute, as task.path
        for name, path in files.items():
            if not Path(path).is_absolute():
                files[name] = str((Path(experiment_dir or ".") / path).resolve())
    template = run_cfg.teacher.prompt_template
    if template and not Path(template).is_absolute():
        # Named relative to the experiment folder; saved absolute, so a resumed run still finds it.
        run_cfg.teacher.prompt_template = str((Path(experiment_dir or ".") / template).resolve())
    for key in type(run_cfg.method).PATHS:       # a method's files, e.g. teacher_distill's teacher model
        path = getattr(run_cfg.method, key)
        if path and not Path(path).is_absolute():
            setattr(run_cfg.method, key, str((Path(experiment_dir or ".") / path).resolve()))
    validate(run_cfg)
    return run_cfg
