"""The teacher protocol: chat messages + verifier feedback in, `Hint(target_index, text)` out.

The teacher package knows nothing of training: it sees plain chat messages (dicts with "role"
and "content"), the verifier's feedback text and, when the task has one, the reference answer,
which a teacher may read but must never reveal (see `teacher.leak`).
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Callable, Protocol


@dataclass
class HintRequest:
    messages: list[dict]          # [{"role": "user"|"assistant", "content": str}, ...]
    feedback: str                 # the verifier's words about the attempt
    reference: str | None = None  # reference answer, for the teacher's eyes only


@dataclass
class Hint:
    target_index: int             # index into HintRequest.messages of the message to redo
    text: str


@dataclass
class TeacherConfig:
    kind: str = "rule"            # key of TEACHERS
    max_hint_chars: int = 80      # longer hints are cut: a hint is a nudge, not a solution


class Teacher(Protocol):
    def write_hints(self, requests: list[HintRequest]) -> list[Hint | None]:
        """One hint (or None: nothing useful to say) per request, in order."""
        ...


TEACHERS: dict[str, Callable[[TeacherConfig], Teacher]] = {}


def register_teacher(name: str):
    def deco(factory):
        TEACHERS[name] = factory
        return factory
    return deco


def build_teacher(cfg: TeacherConfig) -> Teacher:
    if cfg.kind not in TEACHERS:
        raise ValueError(f"teacher.kind={cfg.kind!r} is unknown; choose one of {sorted(TEACHERS)}")
    return TEACHERS[cfg.kind](cfg)


def last_assistant_index(messages: list[dict]) -> int:
    for i in range(len(messages) - 1, -1, -1):
        if messages[i]["role"] == "assistant":
            return i
    raise ValueError("a hint request needs at least one assistant message to target")
