"""Dataset teacher: the problem's own human-written hints (e.g. CHAMP's, `task.source: jsonl`).

A problem file may give each problem a list of hints, written by people who solved it (rl/champ.py
converts CHAMP's). This teacher gives a failed attempt the first of them, aimed at the last
assistant message; a problem without hints gets none. The hints do not depend on the attempt, so
this is the untargeted baseline for the rule and language-model teachers. `teacher.max_hint_chars`
still caps the text (CHAMP's hints run to a sentence or two: raise it for them).
"""
from __future__ import annotations

from teacher.base import Hint, HintRequest, TeacherConfig, register_teacher, target_index


class DatasetTeacher:
    def __init__(self, cfg: TeacherConfig):
        self.cfg = cfg

    def write_hints(self, requests: list[HintRequest]) -> list[Hint | None]:
        return [Hint(target_index(req), req.hints[0][: self.cfg.max_hint_chars])
                if req.hints and req.hints[0].strip() else None for req in requests]


register_teacher("dataset")(DatasetTeacher)
