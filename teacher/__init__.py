"""Hint writers behind one small protocol; knows nothing of training."""
from teacher.base import TEACHERS, Hint, HintRequest, Teacher, TeacherConfig
from teacher.leak import LeakGuard, leaks_answer
from teacher.shuffled import ShuffledTeacher


def build_teacher(cfg: TeacherConfig) -> Teacher:
    """The teacher `cfg.kind` names, behind the shuffling control when `cfg.shuffle` asks for it.
    Here, not in teacher/base.py: the kinds and the shuffler import base, so base builds none."""
    teacher = TEACHERS[cfg.kind](cfg)
    return ShuffledTeacher(teacher) if cfg.shuffle else teacher


__all__ = ["TEACHERS", "Hint", "HintRequest", "LeakGuard", "ShuffledTeacher", "Teacher", "TeacherConfig",
           "build_teacher", "leaks_answer"]
