"""Rule teacher: a targeted hint from the verifier's reference and the attempt, no model needed.

In a multi-message episode it targets the message a per-step verifier found first wrong
(`HintRequest.first_wrong`) and compares it with what that message should have been
(`HintRequest.expected`, e.g. the correct tool call); otherwise the last answer and the reference.

It points at the first place the attempt goes wrong and gives the correct prefix up to and
including that character ("starts with -4"). A tiny student can copy such a hint into its answer,
which is what makes the hinted distribution a better teacher; range, sign or "too large" hints
gave a 1M-parameter student nothing in exploratory runs made before this repository (one seed
each, not recorded here). When the prefix would be the whole answer,
it gives the last character instead ("ends with 7"); the leak guard still drops any hint that
states the whole answer (a one-character answer cannot be hinted without giving it away).

`teacher.reveal=all_but_last` is the stronger, partial-solution hint of QuestA (arXiv 2507.13266):
every character of the reference but the last ("starts with 104" for 1047), whatever the attempt.
"""
from __future__ import annotations

from teacher.base import Hint, HintRequest, TeacherConfig, message_text, target_index


def first_mismatch(attempt: str, reference: str) -> int:
    """Index of the first character where `attempt` departs from `reference` (len if equal)."""
    for i, (a, r) in enumerate(zip(attempt, reference)):
        if a != r:
            return i
    return min(len(attempt), len(reference))


def targeted_hint(attempt: str, reference: str, reveal: str = "mismatch") -> str | None:
    attempt, reference = attempt.strip(), reference.strip()
    if not reference or attempt == reference:
        return None
    if reveal == "all_but_last":
        return f"starts with {reference[:-1]}" if len(reference) > 1 else None
    i = first_mismatch(attempt, reference)
    if i >= len(reference):          # attempt is the answer plus extra characters
        return f"ends after {reference[-1]}"
    if i + 1 < len(reference):
        return f"starts with {reference[:i + 1]}"
    return f"ends with {reference[-1]}"


class RuleTeacher:
    def __init__(self, cfg: TeacherConfig):
        self.cfg = cfg

    def write_hints(self, requests: list[HintRequest]) -> list[Hint | None]:
        hints: list[Hint | None] = []
        for req in requests:
            target = target_index(req)
            # The expected message when a per-step verifier gave one, else the reference answer.
            reference = req.expected if target == req.first_wrong and req.expected else req.reference
            text = None
            if reference is not None:
                text = targeted_hint(message_text(req.messages[target]), reference, self.cfg.reveal)
            hints.append(Hint(target, text[: self.cfg.max_hint_chars]) if text else None)
        return hints

