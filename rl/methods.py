"""The registry of training methods (`method.name`).

A method is data, not a trainer subclass: the trainer reads one step in data order and asks the
method which optional stages to run. Adding a method = one entry here + its loss terms.
"""
from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class Method:
    name: str
    uses_teacher: bool        # ask the teacher for hints on failed attempts and distil toward them
    summary: str


METHODS: dict[str, Method] = {m.name: m for m in [
    Method("grpo", False,
           "group-relative advantages (Dr. GRPO), PPO-clip, token-level normalisation; no hints"),
    Method("hint_distill", True,
           "grpo + on-policy KL toward the same policy conditioned on a teacher's hint, "
           "on the failed attempt's target message"),
]}


def get_method(name: str) -> Method:
    if name not in METHODS:
        raise KeyError(f"method.name={name!r} is unknown; choose one of {sorted(METHODS)}")
    return METHODS[name]
