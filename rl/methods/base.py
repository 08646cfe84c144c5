"""What a training method is: its own config section, the stages it adds to a step, its loss terms.

The trainer runs every RL step as one pipeline over a `Batch` (rl/batch.py):

    rollout -> verify -> advantages -> method.extend (its stages) -> per micro-batch:
        policy.score(need=method.train_need(...)) -> method.loss(...) -> backward -> optimizer step

A method is one file in rl/methods/ with a `Method` subclass and its `Config` dataclass (a subclass
of `rl.config.MethodConfig`, whose keys every method shares); registering it in rl/methods/__init__.py makes
it a `method.name`. `extend` may attach teacher targets to rows, add rows (their source, weight,
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
    """What a method's stages may use: the no-gradient policy (rollouts, teacher scoring), the
    teacher and its leak guard, the tokenizer, the task source, the run config, and `lap(name)`,
    which closes the timing of the stage just run as time/<name>_s."""
    policy: Policy
    teacher: object
    guard: object
    tok: object
    tasks: object
    cfg: object
    lap: Callable[[str], None]


class Method:
    name: ClassVar[str]
    summary: ClassVar[str]
    Config: ClassVar[type] = MethodConfig

    def __init__(self, cfg: MethodConfig):
        self.cfg = cfg

    def extend(self, batch: Batch, ctx: StepContext) -> dict[str, float]:
        """The method's own stages on the verified batch; returns their metrics."""
        return {}

    def train_need(self, micro: Batch) -> str:
        """What the training forward of this micro-batch must return (student.policy.NEEDS)."""
        return "logprobs"

    def loss(self, micro: Batch, scores: Scores, norm: float) -> tuple[torch.Tensor, dict[str, float]]:
        raise NotImplementedError
