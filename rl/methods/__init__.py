"""The registry of training methods (`method.name`): one file per method, each a `Method` with its
own config section (rl/methods/base.py says what a method may do). A new method is its file and
one line below (student/registry.py: imported only when a run names it)."""
from __future__ import annotations

from rl.config import MethodConfig
from rl.methods.base import Method, StepContext
from student.registry import Registry

METHODS: Registry[type[Method]] = Registry("method.name", {
    "grpo": "rl.methods.grpo:GRPO",
    "hint_distill": "rl.methods.hint_distill:HintDistill",
    "corrected_replay": "rl.methods.corrected_replay:CorrectedReplay",
    "self_distill": "rl.methods.self_distill:SelfDistill",
    "teacher_distill": "rl.methods.teacher_distill:TeacherDistill",
    "oracle": "rl.methods.oracle:Oracle",
})


def get_method(name: str) -> type[Method]:
    return METHODS[name]


__all__ = ["METHODS", "Method", "MethodConfig", "StepContext", "get_method"]
