"""Dataset teacher: the problem's own human-written hints (e.g. CHAMP's, `task.source: jsonl`).

A problem file may give each problem a list of hints, written by people who solved it (rl/champ.py
converts CHAMP's). This teacher gives a failed attempt the first of them, aimed at the last
assistant message; a problem without hints gets none. The hints do not depend on the attempt, so
this is the untargeted baseline for the rule and language-model teachers. `teacher.max_hint_chars`
still caps the text (CHAMP's hints run to a sentence or two: raise it for them).

`teacher.decoy: true` is a control: the problem's decoy hint instead (`HintRequest.decoys`), where
its task writes one: rl/hidden_rule.py's states a wrong convention. Where every problem shares one
rule, a shuffled hint (teacher/shuffled.py) would state the right rule and control nothing.
"""
from __future__ import annotations

from teacher.base import Hint, HintRequest, TeacherConfig, target_index


class DatasetTeacher:
    def __init__(self, cfg: TeacherConfig):
        self.cfg = cfg

    def write_hints(self, requests: list[HintRequest]) -> list[Hint | None]:
        hints = []
        for req in requests:
            texts = req.decoys if self.cfg.decoy else req.hints
            hints.append(Hint(target_index(req), texts[0][: self.cfg.max_hint_chars])
                         if texts and texts[0].strip() else None)
        return hints

