"""What a training method is: its own config section, the stages it adds to a step, its loss terms.

The trainer runs every RL step as one pipeline over a `Batch` (rl/batch.py):

    rollout -> verify -> advantages -> method.extend (its stages) -> per micro-batch:
        policy.score(need=method.train_need(...)) -> method.loss(...) -> backward -> optimizer step

A method is one file in rl/methods/ with a `Method` subclass and its `Config` dataclass (a subclass
of `rl.config.MethodConfig`, whose keys every method shares); one line in rl/methods/__init__.py's registry
makes it a `method.name`. `extend` may attach teacher targets to rows, add rows (their source, weight,
group and routes set), or do nothing; it must leave `batch.advantages_N` set for every row. `loss`
sees one micro-batch and the step's normaliser (rl/losses.py) and returns additive terms.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Callable, ClassVar

import torch

from rl.batch import Batch
from rl.config import MethodConfig
from student.policy import Policy, Scores


@dataclass
class StepContext:
    """What a method's stages may use:

    policy          the student without gradient (rollouts, regenerations), its work counted in
                    the step's budget (rl/budget.py)
    teacher_policy  the self-teacher's weights (`method.teacher_weights`, rl/teacher_weights.py;
                    the student itself when live), counted too
    diagnostic      the student without gradient, not counted: forwards that only measure
    teacher         the hint writer (teacher/), with its leak guard
    tok, tasks, cfg the tokenizer, the task source, the run config
    env             the task's environment (rl/environments/): continues an episode from any message
    sampling        the rollout's sampling settings
    metered(policy) the policy with its work counted in the step's budget (a method's own models)
    lap(name)       closes the timing of the stage just run as time/<name>_s
    """
    policy: Policy
    teacher_policy: Policy
    diagnostic: Policy
    teacher: object
    guard: object
    tok: object
    tasks: object
    cfg: object
    sampling: object
    metered: Callable[[Policy], Policy]
    lap: Callable[[str], None]
    env: object = None


class Method:
    name: ClassVar[str]
    summary: ClassVar[str]
    Config: ClassVar[type] = MethodConfig
    # False: the method trains on the problems' reference answers, not on rollouts (the oracle,
    # rl/methods/oracle.py). The trainer's RL step then draws the step's problems, asks the method's
    # `references(group, tok, env, device)` for rows with `prompt_ids`, `completion_ids_NC`,
    # `mask_NC`, `n` and `select(index)`, and trains on them with `loss` (rl/trainer.py::reference_step):
    # no rollout, verify, advantages or `extend`.
    generates: ClassVar[bool] = True

    def __init__(self, cfg: MethodConfig):
        self.cfg = cfg

    def teacher_weights(self) -> tuple[str, float]:
        """(mode, ema_rate): whose weights `ctx.teacher_policy` runs on (rl/teacher_weights.py);
        the live student unless the method's config says otherwise."""
        return "live", 0.0

    def extend(self, batch: Batch, ctx: StepContext) -> dict[str, float]:
        """The method's own stages on the verified batch; returns their metrics."""
        return {}

    def train_need(self, micro: Batch) -> str:
        """What the training forward of this micro-batch must return (student.policy.NEEDS)."""
        return "logprobs"

    def loss(self, micro: Batch, scores: Scores, norm: float) -> tuple[torch.Tensor, dict[str, float]]:
        raise NotImplementedError
