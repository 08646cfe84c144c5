"""hintrl: teacher-student textual-feedback RL for Mixture-of-Experts students.

The distribution is named `hintrl`; its import packages are `rl`, `teacher`, `student` and
`kernels` (the design card's layout). Hugging Face ships an unrelated `kernels` package, which is
why the distribution name is not `kernels` (see tests/test_kernels_name_clash.py).
"""
import os
import shutil

from setuptools import find_packages, setup


def _kernel_extensions():
    """Routing-kernel extensions (kernels/csrc, docs/kernels.md): kernels._C for CPU, always, and
    kernels._cuda when torch is a CUDA build and nvcc is found (CUDA_HOME, else PATH)."""
    try:
        import torch
        from torch.utils.cpp_extension import BuildExtension, CppExtension, CUDAExtension
    except ImportError:  # metadata-only runs (e.g. egg_info without torch): nothing to compile
        return [], {}
    csrc = os.path.join("kernels", "csrc")
    cxx = ["-O3", "-std=c++20"]
    # -fopenmp: at::parallel_for's inline OpenMP region runs our loops on torch's threads. Without
    # it (HINTRL_CPU_OPENMP=0, for `python -m kernels.diagnose --rebuild`) the loops run serially.
    if os.environ.get("HINTRL_CPU_OPENMP", "1") != "0":
        openmp_compile, openmp_link = ["-fopenmp"], ["-fopenmp"]
    else:
        openmp_compile, openmp_link = ["-fopenmp-simd"], []      # the simd pragmas only, no runtime
    exts = [CppExtension("kernels._C", [os.path.join(csrc, f) for f in ("moe_bindings.cpp", "moe_cpu.cpp", "attention_cpu.cpp")],
                         extra_compile_args={"cxx": cxx + openmp_compile}, extra_link_args=openmp_link)]
    cuda_home = os.environ.get("CUDA_HOME") or os.environ.get("CUDA_PATH")
    nvcc = os.path.join(cuda_home, "bin", "nvcc") if cuda_home else shutil.which("nvcc")
    if torch.version.cuda and nvcc and os.path.exists(nvcc) and os.environ.get("HINTRL_NO_CUDA") != "1":
        os.environ.setdefault("TORCH_CUDA_ARCH_LIST", "9.0")
        exts.append(CUDAExtension("kernels._cuda",
                                  [os.path.join(csrc, f) for f in ("moe_cuda.cu", "moe_cuda_ops.cpp")],
                                  extra_compile_args={"cxx": cxx, "nvcc": ["-O3", "-std=c++20", "-lineinfo"]}))
    return exts, {"build_ext": BuildExtension.with_options(use_ninja=True)}


_EXT_MODULES, _CMDCLASS = _kernel_extensions()

setup(
    name="hintrl",
    version="0.1.0",
    description="Targeted textual-feedback RL (teacher hints + on-policy distillation) for MoE students",
    python_requires=">=3.10",
    packages=find_packages(include=["rl", "rl.*", "teacher", "teacher.*", "student", "student.*",
                                    "kernels", "kernels.*"]),
    install_requires=[
        "torch>=2.13,<=2.14.1",
        "deepspeed>=0.19,<0.20",
        "transformers>=5.24,<5.25",  # tested minor: student/lean.py reads internals (tests/test_transformers_contract.py)
        "numpy",
        "tensorboard",
        "omegaconf>=2.3",
        "tqdm",
        "safetensors",
        "reasoning-gym",
        "math-verify",            # leak guard: hints equivalent to the answer as expressions
    ],
    package_data={"teacher": ["prompts/*.txt"]},   # the default teacher prompt
    extras_require={
        "dev": ["pytest", "pytest-timeout", "pandas", "matplotlib", "nbformat", "nbclient", "nbconvert", "ipykernel",
                "champ-dataset"],        # the bring-your-own-data example (rl/champ.py)
        "vllm": ["vllm>=0.33"],
        "flash": ["flash-attn"],
        "gguf": ["gguf", "accelerate"],           # teacher.kind=hf with a .gguf model
        "serve": ["transformers[serving]"],       # `transformers serve` (scripts/serve_teacher.sh on CPU)
        "bench": ["trl==1.16.*"],                 # benchmarks/rl.py: TRL GRPO and SDPO contenders
    },
    ext_modules=_EXT_MODULES,
    cmdclass=_CMDCLASS,
)
