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

# Exported students load in vLLM (only where vllm is installed: pip install -e ".[vllm]").
if python -c "import vllm" 2>/dev/null; then
  stamp "vLLM loads an exported student"
  tmp=$(mktemp -d)
  timeout 240 python -m rl.train experiments/default warmstart.steps=2 trainer.steps=1 task.eval_size=8 \
    output_dir="$tmp/runs" run_name=gpu > /dev/null
  python -m rl.export "$tmp/runs/default/gpu" "$tmp/hf"
  timeout 240 python - "$tmp/hf" <<'PY'
import sys
from vllm import LLM, SamplingParams
llm = LLM(model=sys.argv[1], enforce_eager=True, gpu_memory_utilization=0.2)
out = llm.generate(["3 + 4 = ?"], SamplingParams(max_tokens=4, temperature=0))
print("vllm generated:", repr(out[0].outputs[0].text))
PY
else
  stamp "vllm not installed: skipped the export-loads-in-vLLM check"
fi
stamp "done"
