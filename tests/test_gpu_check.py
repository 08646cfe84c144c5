"""What of the GPU path can be checked without a GPU: the prepared check's dry run, the accelerator
the scripts choose, CUDA random states in checkpoints, and the attention settings."""
import os
import shutil
import stat
import subprocess
import warnings

import pytest
import torch

from conftest import ROOT
from rl.checkpoint import restore_cuda_rng
from rl.config import ConfigError
from rl.configure import load_config


def _run(cmd, cwd=ROOT, env=None):
    return subprocess.run(cmd, cwd=cwd, env=env, capture_output=True, text=True, timeout=120)


def test_the_gpu_check_dry_run_lists_every_step_within_one_device_command():
    out = _run(["bash", "scripts/gpu_check.sh", "--dry-run"])
    assert out.returncode == 0, out.stderr
    steps = [line.split()[3] for line in out.stdout.splitlines() if line.startswith("[gpu_check] would run")]
    assert steps == ["build", "kernel_tests", "extension_errors", "moe_bench", "default_train", "gpu_resume",
                     "large_student", "vllm"]
    assert "every input is present" in out.stdout
    limit = int(next(line for line in out.stdout.splitlines() if "add up to" in line).split("add up to ")[1].split("s")[0])
    assert limit <= 600


def test_the_gpu_check_dry_run_names_a_missing_input(tmp_path):
    # a copy of the tree without one of the step's inputs
    for part in ("scripts", "setup.py", "kernels", "benchmarks", "tests", "experiments"):
        src = ROOT / part
        (shutil.copytree if src.is_dir() else shutil.copy)(src, tmp_path / part)
    (tmp_path / "tests" / "test_kernels_cuda.py").unlink()
    out = _run(["bash", "scripts/gpu_check.sh", "--dry-run"], cwd=tmp_path)
    assert out.returncode == 1
    assert "kernel_tests: missing input tests/test_kernels_cuda.py" in out.stderr


def _fake_gpu_path(tmp_path) -> str:
    """PATH with a stand-in nvidia-smi first, which names an H200 (the check's steps then run here)."""
    fake = tmp_path / "bin"
    fake.mkdir()
    smi = fake / "nvidia-smi"
    smi.write_text("#!/bin/sh\necho 'NVIDIA H200'\n")
    smi.chmod(smi.stat().st_mode | stat.S_IEXEC)
    return f"{fake}:{os.environ['PATH']}"


def test_the_gpu_check_packs_every_result_after_each_step(tmp_path):
    """One step run for real against a stand-in nvidia-smi (it fails here: no CUDA): the failure is
    in summary.md, and gpu-check.tar.gz holds the step's log and the summary."""
    import tarfile

    out_dir = tmp_path / "out"
    env = dict(os.environ, PATH=_fake_gpu_path(tmp_path), OUT=str(out_dir), GPU_CHECK_STEPS="moe_bench")
    out = _run(["bash", "scripts/gpu_check.sh"], env=env)
    assert out.returncode == 0, out.stderr
    assert "| moe_bench | failed (1) |" in (out_dir / "summary.md").read_text()
    with tarfile.open(out_dir / "gpu-check.tar.gz") as archive:
        names = {n.lstrip("./") for n in archive.getnames()}
    assert {"summary.md", "moe_bench.log"} <= names and "gpu-check.tar.gz" not in names


def test_the_gpu_check_skips_vllm_with_its_reason_where_it_cannot_be_installed(tmp_path):
    """A GPU machine without network and without .venv-vllm: the vllm step says why it did not run
    (summary "skipped: ...") instead of failing in pip."""
    out_dir = tmp_path / "out"
    dead = "http://127.0.0.1:9"          # no network: every request is refused at once
    env = dict(os.environ, PATH=_fake_gpu_path(tmp_path), OUT=str(out_dir), GPU_CHECK_STEPS="vllm",
               HINTRL_VLLM_VENV=str(tmp_path / "no-venv"), https_proxy=dead, HTTPS_PROXY=dead)
    out = _run(["bash", "scripts/gpu_check.sh"], env=env)
    assert out.returncode == 0, out.stderr
    summary = (out_dir / "summary.md").read_text()
    assert ("| vllm | skipped: no vLLM environment here and PyPI unreachable, so vLLM cannot be installed "
            "(scripts/bootstrap_vllm.sh) |") in summary
    assert "torch 2." in summary                    # which torch the check ran


def _cpu_extension_built() -> bool:
    from kernels import ops
    return ops.CPU_EXTENSION_ERROR is None


@pytest.mark.skipif(not _cpu_extension_built(), reason="kernels._C is not built")
def test_the_extension_diagnosis_finds_the_check_raising_here_and_names_the_runtimes():
    """kernels/diagnose.py, the gpu_check step for the GPU machine where a failing check crashed:
    here (one toolchain) the probe raises, and the report names the C++ runtime each part loads."""
    out = _run([os.sys.executable, "-m", "kernels.diagnose"])
    assert out.returncode == 0, out.stdout + out.stderr
    assert "raised RuntimeError: permute: offsets do not fit ids" in out.stdout
    loaded = out.stdout.split("loaded by a process importing torch and kernels:")[1]
    assert "libstdc++" in loaded and "TWO COPIES" not in loaded
    assert "verdict: the check raises in this environment" in out.stdout


@pytest.mark.slow
@pytest.mark.skipif(not _cpu_extension_built(), reason="kernels._C is not built")
def test_the_extension_rebuilt_without_openmp_links_no_openmp_runtime_and_still_raises():
    from kernels.diagnose import rebuild_without_openmp

    raised, what = rebuild_without_openmp()
    assert raised, what
    links = what.split("the rebuilt extension links:")[1]
    assert "libstdc++" in links and "libgomp" not in links


@pytest.mark.parametrize("gpu_visible", [False, True])
def test_the_scripts_pick_deepspeeds_cpu_accelerator_only_without_a_gpu(tmp_path, gpu_visible):
    fake = tmp_path / "bin"
    fake.mkdir()
    smi = fake / "nvidia-smi"
    # a stand-in for the driver's tool: what nvidia-smi -L prints with one GPU, or an error without
    smi.write_text("#!/bin/sh\necho 'GPU 0: NVIDIA H200 (UUID: GPU-0)'\n" if gpu_visible else "#!/bin/sh\nexit 9\n")
    smi.chmod(smi.stat().st_mode | stat.S_IEXEC)
    env = {k: v for k, v in os.environ.items() if k != "DS_ACCELERATOR"}
    env["PATH"] = f"{fake}:{env['PATH']}"
    out = _run(["bash", "-c", 'source scripts/bootstrap.sh && echo "accelerator=${DS_ACCELERATOR:-deepspeed-picks}"'],
               env=env)
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip().splitlines()[-1] == ("accelerator=deepspeed-picks" if gpu_visible else "accelerator=cpu")


def test_cuda_random_states_are_restored_or_their_absence_said(tmp_path):
    restore_cuda_rng(None, tmp_path)                 # a CPU run's checkpoint: nothing to restore
    if torch.cuda.is_available():
        pytest.skip("the no-GPU branch")
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        restore_cuda_rng([torch.zeros(16, dtype=torch.uint8)], tmp_path)
    assert any("no GPU is visible" in str(w.message) and "not bit-identical" in str(w.message) for w in caught)


def test_flash_attention_needs_its_extra_and_leaves_the_lean_forward(tmp_path):
    import importlib.util

    (tmp_path / "config.yaml").write_text("")
    with pytest.raises(ConfigError, match=r"student.attn_implementation='flash'.*flash_attention_2"):
        load_config(tmp_path, ["student.attn_implementation=flash"])
    if importlib.util.find_spec("flash_attn") is None:
        with pytest.raises(ConfigError, match=r"flash_attention_2 needs the flash-attn package.*\.\[flash\]"):
            load_config(tmp_path, ["student.attn_implementation=flash_attention_2"])
    # the lean forward computes attention itself, so a model asking for flash-attention runs on transformers'
    from student import ByteTokenizer, StudentConfig, build_student
    from student.lean import unsupported

    model = build_student(StudentConfig(hidden_size=32, num_heads=2, num_kv_heads=1, num_layers=1), ByteTokenizer())
    assert unsupported(model) is None
    model.config._attn_implementation = "flash_attention_2"
    assert "flash_attention_2" in unsupported(model)


def test_the_lean_forwards_gpu_attention_equals_its_cpu_attention():
    """On CUDA the lean forward attends through torch SDPA (fused kernels); on the CPU through two
    matmuls. Same inputs, same result: grouped-query heads, padding and prefix masks, fp32."""
    from student import ByteTokenizer, StudentConfig, build_student
    from student.lean import LeanForward

    torch.manual_seed(0)
    lean = LeanForward(build_student(StudentConfig(), ByteTokenizer()))
    n, h, hkv, s, t, d = 3, 4, 2, 5, 9, 32
    q, k, v = torch.randn(n, h, s, d), torch.randn(n, hkv, t, d), torch.randn(n, hkv, t, d)
    bias = torch.zeros(n, 1, s, t)
    bias[:, :, :, :2] = float("-inf")            # left padding
    bias[0, :, :, 7:] = float("-inf")            # a row that may not see the last keys
    assert torch.allclose(lean._attention(q, k, v, bias), lean._attention_sdpa(q, k, v, bias), atol=1e-6)
