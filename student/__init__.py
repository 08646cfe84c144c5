"""The MoE student policy: model registry, byte-level tokenizer, our experts implementation."""
from student import experts as _experts  # noqa: F401  (registers "hintrl" in transformers' ExpertsInterface)
from student.model import STUDENT_FAMILIES, StudentConfig, build_student, count_parameters
from student.tokenizer import ByteTokenizer

__all__ = ["STUDENT_FAMILIES", "ByteTokenizer", "StudentConfig", "build_student", "count_parameters"]
