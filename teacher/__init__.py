"""Hint writers behind one small protocol; knows nothing of training."""
from teacher.base import TEACHERS, Hint, HintRequest, Teacher, TeacherConfig
from teacher.leak import LeakGuard, leaks_answer
from teacher.shuffled import ShuffledTeacher
from teacher import rule as _rule  # noqa: F401  (registers "rule")
from teacher import dataset as _dataset  # noqa: F401  (registers "dataset")
from teacher import hf as _hf  # noqa: F401  (registers "hf")
from teacher import openai_api as _openai_api  # noqa: F401  (registers "openai")


def build_teacher(cfg: TeacherConfig) -> Teacher:
    """The teacher `cfg.kind` names, behind the shuffling control when `cfg.shuffle` asks for it.
    Here, not in teacher/base.py: the kinds and the shuffler import base, so base builds none."""
    if cfg.kind not in TEACHERS:
        raise ValueError(f"teacher.kind={cfg.kind!r} is unknown; choose one of {sorted(TEACHERS)}")
    teacher = TEACHERS[cfg.kind](cfg)
    return ShuffledTeacher(teacher) if cfg.shuffle else teacher


__all__ = ["TEACHERS", "Hint", "HintRequest", "LeakGuard", "ShuffledTeacher", "Teacher", "TeacherConfig",
           "build_teacher", "leaks_answer"]
