"""The MoE student policy: model registry, byte-level tokenizer, our experts implementation."""
from student import experts as _experts  # noqa: F401  (registers "hintrl" in transformers' ExpertsInterface)
from student.model import ARCHITECTURES, StudentConfig, build_student, count_parameters
from student.tokenizer import ByteTokenizer

__all__ = ["ARCHITECTURES", "ByteTokenizer", "StudentConfig", "build_student", "count_parameters"]
