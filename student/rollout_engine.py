"""What generates a run's rollouts (`rollout.engine`), one registry entry per kind:

    local   the trainer's own no-gradient policy on the rollout model (the lean forward where the
            family has one, else transformers')
    vllm    a vLLM engine process on a copy of the weights (student/vllm_policy.py)

An engine is opened once per rank from an `EngineRequest` and gives the trainer three things:

    engine = ROLLOUT_ENGINES[cfg.rollout.engine](request)
    engine.policy                        generates and scores without gradient (student/policy.py)
    engine.push_weights(module, label)   after an optimizer step, before the next rollout: seconds taken
    engine.close()

An engine with weights of its own (`pushes_weights`) is sent them after every update, and the
trainer logs the time as `time/weight_sync_s`; the local engine reads the rollout model itself and
has nothing to push. A dead, failed or hung engine raises `RolloutEngineError` naming its log, which
the launcher reports without a traceback (the run resumes from its last checkpoint).

A new kind is a class with that shape, registered as `"package.module:Class"`; it reads its
settings from the run's `rollout` section (vLLM's are `rollout.vllm`, a section of the schema).
"""
from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, ClassVar, Protocol

import torch

from student.policy import Policy
from student.registry import Registry


class RolloutEngineError(RuntimeError):
    """The rollout engine is gone, failed or hung; the message names its log."""


@dataclass
class EngineRequest:
    """What a rank opens its rollout engine with."""
    module: torch.nn.Module      # the rollout model: full weights (a gathered copy under ZeRO-3 or EP)
    local: Policy                # the trainer's no-gradient policy on it, for what an engine cannot do
    settings: Any                # the run's `rollout` config section
    log_path: Path               # where an engine process writes its log
    dtype: str                   # student.dtype
    seed: int                    # this rank's sampling seed
    pad_id: int
    banned_ids: tuple[int, ...]  # never sampled, never scored


class RolloutEngine(Protocol):
    pushes_weights: ClassVar[bool]
    policy: Policy

    def push_weights(self, module: torch.nn.Module, label: str) -> float: ...

    def close(self) -> None: ...


class LocalRollout:
    """The trainer's own policy: it reads the rollout model, so an update needs no push."""
    pushes_weights = False

    def __init__(self, request: EngineRequest):
        self.policy = request.local

    def push_weights(self, module: torch.nn.Module, label: str) -> float:
        return 0.0

    def close(self) -> None:
        pass


ROLLOUT_ENGINES: Registry[Callable[[EngineRequest], RolloutEngine]] = Registry("rollout.engine", {
    "local": "student.rollout_engine:LocalRollout",
    "vllm": "student.vllm_policy:VLLMRollout",
})
