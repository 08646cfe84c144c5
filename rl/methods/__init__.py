"""The registry of training methods (`method.name`): one file per method, each a `Method` with its
own config section (rl/methods/base.py says what a method may do)."""
from __future__ import annotations

from rl.config import MethodConfig
from rl.methods.base import Method, StepContext
from rl.methods.corrected_replay import CorrectedReplay
from rl.methods.grpo import GRPO
from rl.methods.hint_distill import HintDistill
from rl.methods.oracle import Oracle
from rl.methods.self_distill import SelfDistill
from rl.methods.teacher_distill import TeacherDistill

METHODS: dict[str, type[Method]] = {m.name: m for m in (GRPO, HintDistill, CorrectedReplay, SelfDistill,
                                                        TeacherDistill, Oracle)}


def get_method(name: str) -> type[Method]:
    if name not in METHODS:
        raise KeyError(f"method.name={name!r} is unknown; choose one of {sorted(METHODS)}")
    return METHODS[name]


__all__ = ["METHODS", "Method", "MethodConfig", "StepContext", "get_method"]
