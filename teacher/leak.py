"""Leak guard: a hint that states the whole answer is dropped and counted.

A hint may carry part of the answer (a digit, a prefix): that is what makes it actionable for a
small model. It must not carry all of it, or distillation would teach copying from the context
instead of solving. Numbers are compared by value ("47.0" leaks 47, "147" does not); other
answers by their whitespace- and case-normalised text as a whole word sequence.
"""
from __future__ import annotations

import re
from dataclasses import dataclass
from fractions import Fraction

_NUMBER = re.compile(r"(?<![\w.])[-+]?\d+(?:\.\d+)?(?:/\d+)?(?![\w])")


def _as_number(text: str) -> Fraction | None:
    text = text.strip().replace(" ", "")
    try:
        return Fraction(text)
    except (ValueError, ZeroDivisionError):
        return None


def _normalise(text: str) -> str:
    return " ".join(re.findall(r"\w+|[^\w\s]", text.lower()))


def leaks_answer(hint: str, answer: str) -> bool:
    """True when `hint` states `answer` in full (numerically or as normalised text)."""
    target = _as_number(answer)
    if target is not None:
        # A signed answer is also leaked by its magnitude next to a sign word or sign character.
        for m in _NUMBER.finditer(hint):
            value = _as_number(m.group())
            if value == target:
                return True
            if target < 0 and value == -target and re.search(r"(minus|negative|-)\s*$", hint[:m.start()]):
                return True
        return False
    norm_answer = _normalise(answer)
    return bool(norm_answer) and f" {norm_answer} " in f" {_normalise(hint)} "


@dataclass
class LeakGuard:
    """Filters hints and keeps the counts the run logs (`hint/leak_rate`)."""
    written: int = 0
    dropped: int = 0

    def filter(self, hint_text: str | None, answer: str | None) -> str | None:
        if not hint_text:
            return None
        self.written += 1
        if answer is not None and leaks_answer(hint_text, answer):
            self.dropped += 1
            return None
        return hint_text

    def take_counts(self) -> tuple[int, int]:
        """(written, dropped) since the last call; resets, so each step logs its own rate."""
        counts = (self.written, self.dropped)
        self.written = self.dropped = 0
        return counts
