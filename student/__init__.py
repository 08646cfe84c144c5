"""The MoE student policy: model registry, byte-level tokenizer."""
from student.model import ARCHITECTURES, StudentConfig, build_student, count_parameters
from student.tokenizer import ByteTokenizer

__all__ = ["ARCHITECTURES", "ByteTokenizer", "StudentConfig", "build_student", "count_parameters"]
