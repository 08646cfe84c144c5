#!/usr/bin/env bash
# One prepared GPU check, sized to fit a short GPU session: build the CUDA extension for the
# visible GPU, run the GPU tests and the CPU kernel tests, then a short MoE benchmark on CUDA.
# Usage: scripts/gpu_check.sh            (results: benchmarks/results/moe-cuda.{json,md}, copied to $OUT if set)
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$ROOT"
if [ -x .venv/bin/python ]; then export PATH="$ROOT/.venv/bin:$PATH"; else source scripts/bootstrap.sh; fi
export CUDA_HOME="${CUDA_HOME:-$(dirname "$(dirname "$(command -v nvcc)")")}"
t0=$(date +%s)
stamp() { echo "[gpu_check +$(( $(date +%s) - t0 ))s] $*"; }

stamp "GPU: $(nvidia-smi --query-gpu=name,memory.total --format=csv,noheader | head -1)"
arch=$(python -c "import torch; c = torch.cuda.get_device_capability(); print(f'{c[0]}.{c[1]}')")
stamp "building kernels (TORCH_CUDA_ARCH_LIST=$arch)"
TORCH_CUDA_ARCH_LIST="$arch" MAX_JOBS="${MAX_JOBS:-8}" python setup.py build_ext --inplace > /tmp/hintrl_build.log 2>&1 \
  || { tail -50 /tmp/hintrl_build.log; exit 1; }
python -m kernels.info

stamp "tests"
timeout 120 python -m pytest -q -p no:cacheprovider tests/test_kernels_cuda.py tests/test_kernels_ops.py

stamp "benchmark"
timeout 150 python -m benchmarks.moe --device cuda --iters 3
if [ -n "${OUT:-}" ]; then cp benchmarks/results/moe-cuda.* "$OUT"/; fi

# The vLLM rollout engine (rollout.engine=vllm): its environment with the CUDA vllm wheel, its
# tests, and rollout throughput against our generate and transformers' (benchmarks/rollout.py).
stamp "vLLM environment"
if timeout 300 bash scripts/bootstrap_vllm.sh; then
  stamp "vLLM engine tests"
  timeout 240 python -m pytest -q -p no:cacheprovider tests/test_vllm_engine.py || true
  stamp "rollout benchmark"
  timeout 240 python -m benchmarks.rollout --repeats 2 || true
  if [ -n "${OUT:-}" ]; then cp benchmarks/results/rollout-cuda.* "$OUT"/ 2>/dev/null || true; fi
else
  stamp "could not set up .venv-vllm: skipped the vLLM checks"
fi
stamp "done"
