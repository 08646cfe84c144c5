"""The shuffled-hint control: every request gets a hint the teacher wrote for *another* problem.

A hint method that gains because its hints carry information should lose the gain here; one that
gains from the extra generation, scoring or context alone keeps it. The donor is the next request
in the batch (cyclically) about a different problem that got a hint, so the shuffle needs no random
state (a resumed run shuffles exactly as the uninterrupted one) and never hands a problem its own
hint back.
"""
from __future__ import annotations

from teacher.base import Hint, HintRequest, Teacher, target_index


def from_other_problem(problems: list[str], texts: list[str | None]) -> list[str | None]:
    """Per item, the text of the next item (cyclically) about a different problem that has one."""
    n, out = len(problems), []
    for i in range(n):
        donors = ((i + k) % n for k in range(1, n))
        out.append(next((texts[j] for j in donors if problems[j] != problems[i] and texts[j]), None))
    return out


class ShuffledTeacher:
    def __init__(self, inner: Teacher):
        self.inner = inner

    def write_hints(self, requests: list[HintRequest]) -> list[Hint | None]:
        hints = self.inner.write_hints(requests)
        texts = from_other_problem([r.messages[0]["content"] for r in requests],
                                   [h.text if h is not None else None for h in hints])
        return [None if text is None else Hint(target_index(r), text) for r, text in zip(requests, texts)]
