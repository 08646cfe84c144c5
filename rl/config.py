"""The run configuration's schema: typed dataclasses, one per section, embedding the components'
own (student, teacher, vLLM engine). Defaults live only here (and in the component configs); an
experiment's `config.yaml` states only what it changes, and code reads attributes, never
`.get(key, default)`. Loading (YAML layers, command-line overrides, merging, validation) is
rl/configure.py's job: this module imports no other part of rl/, so every part may import it.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, ClassVar

from omegaconf import OmegaConf

from student.model import StudentConfig
from student.vllm_policy import EngineSettings
from teacher.base import TeacherConfig


@dataclass
class TaskConfig:
    name: str = "basic_arithmetic"           # any reasoning-gym dataset
    config: dict[str, Any] = field(default_factory=dict)   # its generator's settings
    render: str = "question"                 # "question" or "expression" (metadata, shorter)
    reward: str = "binary"                   # "binary": 1 only when the verifier says fully correct; "partial": its score
    eval_seed: int = 1_000_000               # held-out problems come from this seed, never trained
    eval_size: int = 200                     # held-out problems per difficulty bucket
    train_size: int = 1_000_000              # virtual size of the training stream (wraps)
    buckets: dict[str, Any] = field(default_factory=dict)   # difficulty buckets: name -> settings over `config`
                                             # (own generator and held-out set each; rl/tasks.py)
    mix: dict[str, float] = field(default_factory=dict)     # RL draws buckets by these weights; {} = all alike
    files: dict[str, str] = field(default_factory=dict)     # more training sources: name -> a JSON-lines file in the task
                                             # format (e.g. `python -m rl.mine` output), relative to the experiment folder;
                                             # trained on, never held out; `task.mix` weighs them like buckets
    source: str = "reasoning_gym"            # "reasoning_gym" (task.name) or "jsonl": your own problems (rl/jsonl_task.py)
    path: str = ""                           # source=jsonl: the problem file, relative to the experiment folder
    match: str = "math"                      # source=jsonl: "math" (math-verify) or "exact" text
    environment: str = "answer"              # what answers between messages (rl/environments/): "answer" = one
                                             # message, the task's verifier; "calculator" = a calc tool, "chain" = a
                                             # partial result per message (both chain_sum, rl/environments/)


@dataclass
class MethodConfig:
    """Keys every method has; each method's config (rl/methods/<name>.py) subclasses this with its
    own. The `method` section is typed by `method.name`: a key the chosen method does not have is
    an error naming it."""
    name: str = "hint_distill"               # key of rl.methods.METHODS
    clip_eps: float = 0.2                    # PPO-clip range
    adv_std_norm: bool = False               # False = Dr. GRPO (no std normalisation)
    loss_norm: str = "token"                 # one divisor per step: "token" = real completion tokens (DAPO),
                                             # "constant" = rows x rollout.max_new_tokens (Dr. GRPO)

    CHOICES: ClassVar[dict[str, tuple]] = {"loss_norm": ("token", "constant")}
    PATHS: ClassVar[tuple[str, ...]] = ()    # keys naming files: relative = to the experiment folder, saved absolute

    def check(self) -> list[str]:
        """Problems beyond a key's type and CHOICES (a method's config adds its own)."""
        return [f"method.clip_eps={self.clip_eps} must be > 0"] if self.clip_eps <= 0 else []


@dataclass
class RolloutConfig:
    prompts_per_step: int = 16
    attempts_per_prompt: int = 8             # G, the group size
    max_new_tokens: int = 8                  # per message
    temperature: float = 1.0
    max_turns: int = 1                       # assistant messages per episode (environments with tools)
    engine: str = "local"                    # what generates: "local" (the trainer's own policy, the lean
                                             # forward) or "vllm" (a vLLM engine process, weights pushed
                                             # after every update)
    vllm: EngineSettings = field(default_factory=EngineSettings)   # student/vllm_policy.py


@dataclass
class WarmstartConfig:
    steps: int = 0                           # supervised steps on demonstrations before RL
    batch_size: int = 64
    lr: float = 1e-3
    warmup_steps: int = 20
    hint_fraction: float = 0.5               # share of demonstrations with a hint in context
    hint_fraction_by_bucket: dict[str, float] = field(default_factory=dict)   # per bucket, over hint_fraction
    decay: str = "none"                      # after warmup: "none" (constant lr), "cosine" or "linear" down to
    min_lr_ratio: float = 0.1                # lr x this at the last warm-start step (a constant rate kept
                                             # reshaping what a warm-start taught: experiments/hidden-rule)
    mix: dict[str, float] = field(default_factory=dict)     # buckets demonstrations come from; {} = task.mix
    # Who writes the demonstrations' hints: "" = the run's teacher (teacher.*); or a teacher.kind
    # for warm-start only, e.g. "rule" when the run's teacher is a model too slow for
    # steps x batch_size x hint_fraction requests (experiments/llm-teacher).
    teacher: str = ""


@dataclass
class TrainerConfig:
    steps: int = 100                         # RL steps (after warm-start)
    lr: float = 1e-4
    warmup_steps: int = 10
    weight_decay: float = 0.0
    eval_every: int = 50                     # in steps, counting warm-start steps
    eval_at: list[int] = field(default_factory=list)   # RL steps (1 = RL's first) evaluated besides: a curve
                                             # fine early, where a fast method's tokens-to-target is read
    checkpoint_every: int = 100
    keep_checkpoints: int = 2
    log_rollouts: int = 8                    # attempts per step written to rollouts.jsonl
    log_problems: bool = True                # every problem of a step, with all its attempts, to problems.jsonl (rl.mine)
    max_nonfinite_steps: int = 3             # consecutive NaN/inf losses before stopping
    threads: int = 0                         # torch threads per rank; 0 = cores / ranks
    export_to: str = ""                      # after the last step, export the model (scripts/export.sh's
                                             # format) to this folder inside the run folder; "" = don't


@dataclass
class EvalConfig:
    """What the periodic evaluation (every trainer.eval_every steps) and `scripts/eval.sh` run:
    suites of rl/evals/. Every eval set reported here is kept out of training (rl/contamination.py)."""
    suites: list[str] = field(default_factory=lambda: ["hinted", "reference_logprob"])   # names in rl.evals.SUITES
    private: dict[str, str] = field(default_factory=dict)  # private eval sets (suites private, reference_logprob):
                                             # name -> a JSON-lines file in the task format (e.g. mined), relative to
                                             # the experiment folder; kept out of training even if no suite reads them
    pass_k: int = 8                          # suite reference_logprob: sampled episodes per problem at
                                             # rollout.temperature for eval/pass@k; 0 = no sampling


@dataclass
class DeepSpeedConfig:
    """Maps onto a DeepSpeed config (rl/engine.py::deepspeed_config); every key is typed here, so
    a key DeepSpeed would silently ignore is an error instead."""
    zero_stage: int = 0                      # 0-3; 3 partitions parameters (generation uses a synced full copy)
    dtype: str = "fp32"                      # "fp32" or "bf16"
    gradient_clipping: float = 1.0
    gradient_accumulation_steps: int = 1
    offload_optimizer: bool = False          # optimizer state in CPU memory (ZeRO 1-3)
    offload_param: bool = False              # parameters in CPU memory (ZeRO 3)
    param_persistence_threshold: int = 100_000   # ZeRO-3 keeps smaller parameters whole on every rank
    expert_parallel_size: int = 1            # ranks the experts of each MoE layer are spread over


@dataclass
class LauncherConfig:
    """More than one rank: rl.train re-launches itself under torchrun (or DeepSpeed's launcher
    with a hostfile). Multi-node with torchrun: run the same command on every node with its
    node_rank, the same master_addr and an explicit run_name; output_dir on a shared filesystem."""
    nproc_per_node: int = 1                  # ranks per node
    nnodes: int = 1
    node_rank: int = 0
    master_addr: str = "127.0.0.1"
    master_port: int = 0                     # 0 = a free port (single node only)
    hostfile: str = ""                       # DeepSpeed hostfile ("host slots=N" lines): use the deepspeed launcher


@dataclass
class RunConfig:
    seed: int = 0
    output_dir: str = "runs"
    experiment: str = ""                     # filled from the experiment folder's name
    run_name: str = ""                       # "" = time stamp + method + seed
    resume: bool = False                     # continue run_name (or the newest run) from its last checkpoint
    task: TaskConfig = field(default_factory=TaskConfig)
    student: StudentConfig = field(default_factory=StudentConfig)
    teacher: TeacherConfig = field(default_factory=TeacherConfig)
    method: MethodConfig = field(default_factory=MethodConfig)
    rollout: RolloutConfig = field(default_factory=RolloutConfig)
    warmstart: WarmstartConfig = field(default_factory=WarmstartConfig)
    trainer: TrainerConfig = field(default_factory=TrainerConfig)
    eval: EvalConfig = field(default_factory=EvalConfig)
    deepspeed: DeepSpeedConfig = field(default_factory=DeepSpeedConfig)
    launcher: LauncherConfig = field(default_factory=LauncherConfig)


class ConfigError(ValueError):
    """A config problem, phrased for the person who wrote the config."""


def to_yaml(cfg: RunConfig) -> str:
    return OmegaConf.to_yaml(OmegaConf.structured(cfg))
