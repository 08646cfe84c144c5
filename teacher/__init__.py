"""Hint writers behind one small protocol; knows nothing of training."""
from teacher.base import TEACHERS, Hint, HintRequest, Teacher, TeacherConfig, build_teacher
from teacher.leak import LeakGuard, leaks_answer
from teacher.shuffled import ShuffledTeacher
from teacher import rule as _rule  # noqa: F401  (registers "rule")
from teacher import dataset as _dataset  # noqa: F401  (registers "dataset")
from teacher import hf as _hf  # noqa: F401  (registers "hf")
from teacher import openai_api as _openai_api  # noqa: F401  (registers "openai")

__all__ = ["TEACHERS", "Hint", "HintRequest", "LeakGuard", "ShuffledTeacher", "Teacher", "TeacherConfig",
           "build_teacher", "leaks_answer"]
