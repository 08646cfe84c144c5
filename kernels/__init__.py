"""hintrl routing kernels for Mixture-of-Experts layers (top-k gating, expert counts, permute,
unpermute-combine) plus a grouped GEMM wrapper.

This package knows nothing of RL or transformers and depends on torch only. `kernels.ops` is the one
Python entry point; `kernels.reference` holds the pure-PyTorch definitions the kernels are tested
against; `python -m kernels.info` reports which backend each op runs on. The distribution that ships
this package is `hintrl`, not Hugging Face's unrelated `kernels` (see tests/test_kernels_name_clash.py).
Importing this package is cheap: the compiled extensions load on `import kernels.ops`.
"""

__all__ = ["ops", "reference"]
