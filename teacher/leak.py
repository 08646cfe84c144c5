"""Leak guard: a hint that states the whole answer is dropped and counted.

A hint may carry part of the answer (a digit, a prefix): that is what makes it actionable for a
small model. It must not carry all of it, or distillation would teach copying from the context
instead of solving. Three checks, for any teacher:

1. numbers by value: "47.0", "4.7e1" and "94/2" leak 47; "147" and "4.7" do not;
2. other answers by their whitespace- and case-normalised text as a whole word sequence;
3. math expressions by meaning, with math-verify: a LaTeX span ($\\frac{94}{2}$, \\boxed{..})
   or an arithmetic span ("40 + 7", "(x+1)^2") equivalent to the answer leaks it. A span that
   restates the problem ("9 + 8" for the problem "9 + 8") says nothing new and is kept.
"""
from __future__ import annotations

import re
import threading
from dataclasses import dataclass
from fractions import Fraction
from functools import lru_cache

_NUMBER = re.compile(r"(?<![\w.])[-+]?\d+(?:\.\d+)?(?:[eE][-+]?\d+)?(?:/\d+)?(?![\w])")
# An operand is a number or a lone letter (a variable, not the end of a word like "with").
_OPERAND = r"\(*\s*(?:\d+(?:\.\d+)?|(?<![a-zA-Z])[a-zA-Z](?![a-zA-Z]))\s*\)*(?:\s*\^\s*\d+)?"
_EXPRESSION = re.compile(rf"-?\s*{_OPERAND}(?:\s*[-+*/×÷^]\s*{_OPERAND})+")
_LATEX = re.compile(r"\$\$?(.+?)\$\$?|\\\((.+?)\\\)|\\\[(.+?)\\\]|(\\boxed\{.+?\}|\\d?frac\{.+?\}\{.+?\})")


def _as_number(text: str) -> Fraction | None:
    text = text.strip().replace(" ", "")
    try:
        return Fraction(text)
    except (ValueError, ZeroDivisionError):
        return None


def _normalise(text: str) -> str:
    return " ".join(re.findall(r"\w+|[^\w\s]", text.lower()))


def _squash(text: str) -> str:
    return re.sub(r"\s+", "", text)


def _states_number(hint: str, target: Fraction) -> bool:
    # A signed answer is also leaked by its magnitude next to a sign word or sign character.
    for m in _NUMBER.finditer(hint):
        value = _as_number(m.group())
        if value == target:
            return True
        if target < 0 and value == -target and re.search(r"(minus|negative|-)\s*$", hint[:m.start()]):
            return True
    return False


def _math_spans(hint: str) -> list[str]:
    spans = [next(g for g in m.groups() if g) for m in _LATEX.finditer(hint)]
    plain = _LATEX.sub(" ", hint)
    return spans + [m.group().strip() for m in _EXPRESSION.finditer(plain)]


@lru_cache(maxsize=4096)
def _parse(text: str):
    from math_verify import ExprExtractionConfig, LatexExtractionConfig, parse
    # math-verify's timeout uses signal.alarm, which only the main thread may set.
    timeout = 5 if threading.current_thread() is threading.main_thread() else None
    wrapped = text if text.startswith(("$", "\\")) else f"${text}$"
    return parse(wrapped, extraction_config=[LatexExtractionConfig(), ExprExtractionConfig()],
                 parsing_timeout=timeout)


def _states_expression(hint: str, answer: str, problem: str | None) -> bool:
    spans = [s for s in _math_spans(hint) if not (problem and _squash(s) in _squash(problem))]
    if not spans:
        return False
    from math_verify import verify
    gold = _parse(answer)
    if not gold:
        return False
    timeout = 5 if threading.current_thread() is threading.main_thread() else None
    return any(verify(gold, pred, timeout_seconds=timeout) for pred in map(_parse, spans) if pred)


def leaks_answer(hint: str, answer: str, problem: str | None = None) -> bool:
    """True when `hint` states `answer` in full: numerically, as normalised text, or as an
    equivalent expression that is not the problem itself."""
    target = _as_number(answer)
    if target is not None and _states_number(hint, target):
        return True
    if target is None:
        norm_answer = _normalise(answer)
        if norm_answer and f" {norm_answer} " in f" {_normalise(hint)} ":
            return True
    return _states_expression(hint, answer, problem)


@dataclass
class LeakGuard:
    """Filters hints and keeps the counts the run logs (`hint/leak_rate`)."""
    written: int = 0
    dropped: int = 0

    def filter(self, hint_text: str | None, answer: str | None, problem: str | None = None) -> str | None:
        if not hint_text:
            return None
        self.written += 1
        if answer is not None and leaks_answer(hint_text, answer, problem):
            self.dropped += 1
            return None
        return hint_text

    def take_counts(self) -> tuple[int, int]:
        """(written, dropped) since the last call; resets, so each step logs its own rate."""
        counts = (self.written, self.dropped)
        self.written = self.dropped = 0
        return counts
