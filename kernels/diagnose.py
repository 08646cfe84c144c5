"""`python -m kernels.diagnose [--rebuild]`: does a failing check inside the CPU extension raise?

On one GPU machine (torch 2.11 from its image, the extension built by another g++ than torch's
own) a `TORCH_CHECK` failing inside `kernels._C` killed the process with SIGSEGV instead of
raising a RuntimeError; here it raises. This gathers what tells the causes apart, each in its own
child process so that a crash is reported rather than suffered:

1. the probe: one op called with inconsistent arguments (permute with offsets that do not fit its
   ids); it must raise RuntimeError. A death is reported with its signal, and where gdb exists,
   with a native backtrace.
2. who built what: the compilers recorded in the extensions and in torch's own libraries
   (`.comment`), the C++ and OpenMP runtimes each links (`ldd`), and the copies a process that
   imports both actually loads (/proc/self/maps). Two libstdc++ or libgomp copies in one process
   is the first suspect.
3. with `--rebuild`, when the probe did not raise: the CPU extension built again into a scratch
   copy without `-fopenmp` (HINTRL_CPU_OPENMP=0 in setup.py), and the probe rerun against it: if
   that one raises, the OpenMP runtime the extension links is the cause.

Writes a plain-text report to stdout; exit status 0 when the probe raised, 1 when it did not.
"""
from __future__ import annotations

import argparse
import os
import re
import shutil
import signal
import subprocess
import sys
import tempfile
from pathlib import Path

PACKAGE = Path(__file__).resolve().parent
ROOT = PACKAGE.parent

# The probe: expert 0 has two slots, the offsets leave it one (tests/test_kernels_ops.py holds the
# same call to raising).
PROBE = """
import torch
from kernels import _C, ops
assert ops.CPU_EXTENSION_ERROR is None, ops.CPU_EXTENSION_ERROR
print("extension:", _C.__file__)
try:
    torch.ops.hintrl.permute(torch.ones(2, 4), torch.tensor([[0, 1], [0, 1]]),
                             torch.tensor([0, 1, 4], dtype=torch.int32), 1)
except RuntimeError as err:
    print("raised RuntimeError:", str(err).splitlines()[0])
else:
    print("returned without an error")
"""

LOADED = """
import re, torch
from kernels import ops
libs = sorted({line.split()[-1] for line in open("/proc/self/maps")
               if re.search(r"lib(stdc\\+\\+|gomp|iomp|omp|gcc_s)[-.]", line)})
print("\\n".join(libs))
"""

RUNTIMES = re.compile(r"lib(stdc\+\+|gomp|iomp5|omp|gcc_s|c10|torch_cpu)[.-]")


def _run(cmd: list[str], env: dict | None = None, timeout: int = 120) -> subprocess.CompletedProcess:
    return subprocess.run(cmd, capture_output=True, text=True, timeout=timeout, env=env)


def _child_env(first: Path = ROOT) -> dict[str, str]:
    """This environment with `first` ahead of any PYTHONPATH given, empty parts left out."""
    parts = [str(first), *filter(None, os.environ.get("PYTHONPATH", "").split(os.pathsep))]
    return dict(os.environ, PYTHONPATH=os.pathsep.join(parts))


def probe(pythonpath: Path = ROOT) -> tuple[bool, str]:
    """(raised, what happened) for the probe run in a child with `pythonpath` first."""
    out = _run([sys.executable, "-X", "faulthandler", "-c", PROBE], env=_child_env(pythonpath))
    if out.returncode < 0:
        name = signal.Signals(-out.returncode).name
        return False, f"died with {name}\n{_tail(out.stderr, 25)}" + _backtrace(env)
    if out.returncode:
        return False, f"exited {out.returncode}\n{_tail(out.stderr, 25)}"
    return "raised RuntimeError" in out.stdout, out.stdout.strip()


def _backtrace(env: dict) -> str:
    """gdb's native backtrace of the probe, where gdb exists."""
    if shutil.which("gdb") is None:
        return "\n(no gdb here: no native backtrace)"
    out = _run(["gdb", "-batch", "-ex", "run", "-ex", "bt 40", "--args", sys.executable, "-c", PROBE], env=env,
               timeout=300)
    frames = [line for line in out.stdout.splitlines() if line.startswith("#") or "signal" in line.lower()]
    return "\nnative backtrace (gdb):\n" + "\n".join(frames[-45:])


def _tail(text: str, n: int) -> str:
    return "\n".join(text.strip().splitlines()[-n:])


def _comment(path: Path) -> str:
    """The compilers recorded in a shared library's .comment section."""
    if shutil.which("readelf") is None:
        return "(no readelf)"
    out = _run(["readelf", "-p", ".comment", str(path)])
    found = sorted({m.group(1).strip() for m in re.finditer(r"\]\s+(.*)", out.stdout)})
    return "; ".join(found) or "(no .comment)"


def _links(path: Path) -> list[str]:
    """The runtimes a shared library links, as the loader resolves them (ldd)."""
    if shutil.which("ldd") is None:
        return ["(no ldd)"]
    return [line.strip() for line in _run(["ldd", str(path)]).stdout.splitlines() if RUNTIMES.search(line)]


def linkage() -> str:
    import torch

    torch_lib = Path(torch.__file__).parent / "lib"
    lines = [f"python {sys.version.split()[0]}, torch {torch.__version__} (CUDA {torch.version.cuda or 'none'}), "
             f"g++ on PATH: {_run(['g++', '--version']).stdout.splitlines()[0] if shutil.which('g++') else 'none'}",
             f"CXX={os.environ.get('CXX', '(unset)')}"]
    for lib in [*sorted(PACKAGE.glob("_*.so")), *sorted(torch_lib.glob("libc10.so")), *sorted(torch_lib.glob("libtorch_cpu.so"))]:
        lines.append(f"{lib.name}: built by {_comment(lib)}")
        lines += [f"    {link}" for link in _links(lib)]
    bundled = sorted(p.name for p in torch_lib.glob("lib*") if re.match(r"lib(gomp|iomp5|stdc\+\+)", p.name))
    lines.append(f"runtimes bundled with torch: {bundled or 'none'}")
    loaded = _run([sys.executable, "-c", LOADED], env=_child_env())
    libs = loaded.stdout.split() if loaded.returncode == 0 else [f"(failed: {_tail(loaded.stderr, 3)})"]
    lines.append("loaded by a process importing torch and kernels:")
    lines += [f"    {lib}" for lib in libs]
    for runtime in ("libstdc++", "libgomp"):
        copies = {Path(lib).resolve() for lib in libs if Path(lib).name.startswith(runtime)}
        if len(copies) > 1:
            lines.append(f"    TWO COPIES of {runtime} in one process: {sorted(map(str, copies))}")
    return "\n".join(lines)


def rebuild_without_openmp() -> tuple[bool, str]:
    """Build kernels._C without -fopenmp into a scratch copy and probe it."""
    scratch = Path(tempfile.mkdtemp(prefix="hintrl-noomp-"))
    try:
        shutil.copy(ROOT / "setup.py", scratch)
        shutil.copytree(PACKAGE, scratch / "kernels", ignore=shutil.ignore_patterns("*.so", "__pycache__", "build"))
        env = dict(os.environ, HINTRL_CPU_OPENMP="0", HINTRL_NO_CUDA="1")
        build = subprocess.run([sys.executable, "setup.py", "build_ext", "--inplace"], cwd=scratch, env=env,
                               capture_output=True, text=True, timeout=900)
        if build.returncode:
            return False, f"the rebuild failed:\n{_tail(build.stdout + build.stderr, 20)}"
        links = [f"    {link}" for lib in (scratch / "kernels").glob("_C*.so") for link in _links(lib)]
        raised, what = probe(scratch)
        return raised, "\n".join(["the rebuilt extension links:", *links, what])
    finally:
        shutil.rmtree(scratch, ignore_errors=True)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rebuild", action="store_true", help="when the probe does not raise, build the CPU "
                        "extension without -fopenmp in a scratch copy and probe that")
    args = parser.parse_args(argv)
    raised, what = probe()
    print(f"## the probe (a failing TORCH_CHECK in kernels._C)\n{what}\n", flush=True)
    print(f"## who built and loads what\n{linkage()}\n", flush=True)
    if args.rebuild and not raised:
        rebuilt, what = rebuild_without_openmp()
        print(f"## the probe against kernels._C built without -fopenmp\n{what}\n")
        if rebuilt:
            print("verdict: without -fopenmp the check raises; the OpenMP runtime the extension links is the cause")
    print(f"verdict: the check {'raises' if raised else 'does NOT raise'} in this environment")
    return 0 if raised else 1


if __name__ == "__main__":
    sys.exit(main())
