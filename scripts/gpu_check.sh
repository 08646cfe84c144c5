#!/usr/bin/env bash
# One prepared GPU check, sized for one short GPU session (one 10-minute command on a fresh machine):
# build the CUDA kernels for the visible GPU, test them, diagnose the CPU extension's error path,
# benchmark the MoE layer, train the default experiment on CUDA, resume on CUDA, a few ZeRO-2 bf16
# steps of a ~200M-parameter student, and the vLLM rollout engine. Each step has its own time limit
# and log; a failing step is recorded and the next runs; a step that cannot run on this machine
# (exit 77, e.g. vLLM without network) is recorded as skipped with its reason.
#
#   scripts/gpu_check.sh             run everything; results in $OUT (the device tool's folder) or
#                                    benchmarks/results/gpu-check/: summary.md, <step>.log, gpu-check.tar.gz (all of it), and the
#                                    benchmarks' moe-<gpu>/ (moe-cuda.{json,md} and the per-operator profiles), train-<gpu>.json, rollout-<gpu>.{json,md}
#   scripts/gpu_check.sh --dry-run   print each step and its command, check that every input exists;
#                                    needs no GPU (tests/test_gpu_check.py runs it)
# Environment: .venv if there is one; else, on a machine without network, its python3 plus the
# wheels in .whl (scripts/gpu_wheels.sh prepares them here; carry .whl with the device call);
# else scripts/bootstrap.sh.
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$ROOT"
DRY=0
[ "${1:-}" = "--dry-run" ] && DRY=1
RESULTS="${OUT:-$ROOT/benchmarks/results/gpu-check}"
t0=$(date +%s)
missing=0
budget=0          # the steps' limits together: one device command may run 600 s
summary=()

if [ "$DRY" = 1 ]; then
  gpu="dry-run"
  PY=python3
  if [ -x .venv/bin/python ]; then echo "[gpu_check] environment: .venv"
  elif [ -d .whl ]; then echo "[gpu_check] environment: python3 + the wheels in .whl ($(ls .whl | wc -l))"
  else echo "[gpu_check] environment: none yet; scripts/bootstrap.sh would need network (scripts/gpu_wheels.sh prepares .whl for a machine without)"
  fi
else
  mkdir -p "$RESULTS"
  if [ -x .venv/bin/python ]; then
    export PATH="$ROOT/.venv/bin:$PATH"
  elif [ -d .whl ]; then
    # a bare GPU machine without network: its python3 (torch included) plus the wheels
    # scripts/gpu_wheels.sh prepared and the device call carried
    python3 -m pip install -q --no-index --no-deps --no-compile --target /tmp/hintrl-site .whl/*.whl
    export PYTHONPATH="/tmp/hintrl-site:$ROOT" DS_ACCELERATOR=cuda
    # `python` for the steps: a wrapper, not a symlink (a symlinked venv python loses its venv)
    mkdir -p /tmp/hintrl-bin && printf '#!/bin/sh\nexec %s "$@"\n' "$(command -v python3)" > /tmp/hintrl-bin/python
    chmod +x /tmp/hintrl-bin/python && export PATH="/tmp/hintrl-bin:$PATH"
  else
    source scripts/bootstrap.sh
  fi
  PY=python
  export CUDA_HOME="${CUDA_HOME:-$(dirname "$(dirname "$(command -v nvcc)")")}"
  # a short name for result files: h200, h100, a100, ... (else the whole name, simplified)
  gpu=$(nvidia-smi --query-gpu=name --format=csv,noheader | head -1 | tr 'A-Z' 'a-z' \
        | grep -oE '[a-z][0-9]{2,4}[a-z]?' | head -1 || true)
  gpu=${gpu:-gpu}
  # the torch the GPU path runs: the image's own where it has one (setup.py's pin is not applied to
  # it: the wheels go in with --no-deps), so every summary says which it was
  torch_line=$($PY -c "import torch; print(f'torch {torch.__version__}, CUDA {torch.version.cuda}; setup.py pins 2.13-2.14.1')" 2>&1 | tail -1 || true)
fi
TMP=$(mktemp -d)

# step NAME TIMEOUT_S "INPUTS" COMMAND: run COMMAND (a bash string) under its own time limit,
# its output in $RESULTS/NAME.log; INPUTS (paths, space-separated) must exist.
step() {
  local name=$1 limit=$2 inputs=$3 cmd=$4 start rc
  # GPU_CHECK_STEPS="build gpu_resume ...": only these (e.g. to rerun what failed in less device time)
  if [ -n "${GPU_CHECK_STEPS:-}" ] && [[ " $GPU_CHECK_STEPS " != *" $name "* ]]; then return 0; fi
  budget=$((budget + limit))
  for path in $inputs; do
    if [ ! -e "$path" ]; then echo "[gpu_check] $name: missing input $path" >&2; missing=$((missing + 1)); fi
  done
  if [ "$DRY" = 1 ]; then
    echo "[gpu_check] would run $name (limit ${limit}s): $cmd"
    return 0
  fi
  echo "[gpu_check +$(( $(date +%s) - t0 ))s] $name"
  start=$(date +%s)
  set +e
  timeout "$limit" bash -c "$cmd" > "$RESULTS/$name.log" 2>&1
  rc=$?
  set -e
  local took=$(( $(date +%s) - start ))
  tail -5 "$RESULTS/$name.log"
  local result
  case $rc in
    0) result=ok ;;
    124) result="timed out" ;;
    77) result="skipped: $(tail -1 "$RESULTS/$name.log")" ;;
    *) result="failed ($rc)" ;;
  esac
  summary+=("| $name | $result | ${took}s |")
  pack
}

# summary.md and gpu-check.tar.gz (every result and log of $RESULTS in one file, for a device
# tool that brings back only a few), both rewritten after every step: a check cut short by the
# device command's limit still leaves the archive of every step it finished.
pack() {
  {
    echo "# gpu_check on $(nvidia-smi --query-gpu=name --format=csv,noheader | head -1), $(date -u +%Y-%m-%d)"
    echo
    echo "$torch_line"
    echo
    echo "| step | result | time |"
    echo "|---|---|---|"
    printf '%s\n' "${summary[@]}"
  } > "$RESULTS/summary.md"
  tar -czf "$TMP/gpu-check.tar.gz" -C "$RESULTS" --exclude=gpu-check.tar.gz . && mv "$TMP/gpu-check.tar.gz" "$RESULTS/"
}

step build 90 "setup.py kernels/csrc" \
  'arch=$(python -c "import torch; c = torch.cuda.get_device_capability(); print(f\"{c[0]}.{c[1]}\")")
   TORCH_CUDA_ARCH_LIST="$arch" MAX_JOBS="${MAX_JOBS:-8}" python setup.py build_ext --inplace && python -m kernels.info'

# the CUDA kernels against their references and the CPU build; our experts against transformers'
# eager on every MoE family the CPU tests cover, on CUDA too. The one test whose failing check once
# crashed the process instead of raising runs apart, in the next step.
step kernel_tests 60 "tests/test_kernels_cuda.py tests/test_kernels_ops.py tests/test_experts_parity.py" \
  "$PY -m pytest -q -p no:cacheprovider tests/test_kernels_cuda.py tests/test_kernels_ops.py tests/test_experts_parity.py \
   --deselect tests/test_kernels_ops.py::test_permute_rejects_offsets_of_other_ids"

# does a failing TORCH_CHECK in the CPU extension raise here? Where not: a native backtrace, who
# built and loads which C++ and OpenMP runtime, and a rebuild without -fopenmp (kernels/diagnose.py)
step extension_errors 40 "kernels/diagnose.py" \
  "$PY -m kernels.diagnose --rebuild && $PY -m pytest -q -p no:cacheprovider \
   tests/test_kernels_ops.py::test_permute_rejects_offsets_of_other_ids"

# rows and per-operator profiles written into the results as they are measured: a time limit loses
# only the rows it did not reach
step moe_bench 120 "benchmarks/moe.py" \
  "$PY -m benchmarks.moe --device cuda --iters 3 --profile --out '$RESULTS/moe-$gpu'"

# the default experiment on CUDA for a few hundred steps (CPU: experiments/default/README.md)
step default_train 60 "experiments/default/config.yaml experiments/default/compare_engines.py" \
  "$PY -m rl.train experiments/default warmstart.steps=200 trainer.steps=100 trainer.eval_every=100 \
   output_dir=$TMP/runs run_name=gpu && $PY experiments/default/compare_engines.py $TMP/runs/default/gpu \
   --out '$RESULTS/train-$gpu.json'"

# resume on CUDA: a run stopped mid-RL and resumed equals the uninterrupted one, sample for sample
# (the checkpoint carries the CUDA generators' states, rl/checkpoint.py)
step gpu_resume 100 "tests/test_train_e2e.py" \
  "$PY -m pytest -q -p no:cacheprovider 'tests/test_train_e2e.py::test_resume_mid_rl_is_bit_identical[hint_distill-ema]'"

# a ~200M-parameter student (benchmarks/rollout.py's largest) for a few ZeRO-2 bf16 steps
step large_student 45 "experiments/default/config.yaml" \
  "$PY -m rl.train experiments/default student.hidden_size=1024 student.num_layers=8 student.num_heads=16 \
   student.num_kv_heads=8 student.num_experts=16 student.expert_width=448 deepspeed.zero_stage=2 \
   deepspeed.dtype=bf16 warmstart.steps=3 trainer.steps=3 trainer.eval_every=3 task.eval_size=16 \
   output_dir=$TMP/runs run_name=large"

# the vLLM rollout engine (rollout.engine=vllm): its environment, its tests, rollout throughput;
# skipped where it can be neither found nor installed (a GPU machine without network)
step vllm 75 "scripts/bootstrap_vllm.sh tests/test_vllm_engine.py benchmarks/rollout.py" \
  "if [ ! -f \"\${HINTRL_VLLM_VENV:-.venv-vllm}/.hintrl-installed\" ] && ! $PY -c \"import urllib.request; \
   urllib.request.urlopen('https://pypi.org/simple/vllm/', timeout=5)\" 2>/dev/null; then
     echo 'no vLLM environment here and PyPI unreachable, so vLLM cannot be installed (scripts/bootstrap_vllm.sh)'
     exit 77
   fi
   bash scripts/bootstrap_vllm.sh && $PY -m pytest -q -p no:cacheprovider tests/test_vllm_engine.py \
   && $PY -m benchmarks.rollout --repeats 2 --out '$RESULTS' && mv '$RESULTS/rollout-cuda.json' '$RESULTS/rollout-$gpu.json' \
   && mv '$RESULTS/rollout-cuda.md' '$RESULTS/rollout-$gpu.md'"

if [ "$DRY" = 1 ]; then
  rm -rf "$TMP"
  echo "[gpu_check] the steps' limits add up to ${budget}s (one device command: 600 s)"
  [ "$budget" -le 600 ] || { echo "[gpu_check] dry run: over one device command's 600 s" >&2; exit 1; }
  [ "$missing" = 0 ] || { echo "[gpu_check] dry run: $missing input(s) missing" >&2; exit 1; }
  echo "[gpu_check] dry run: every input is present"
  exit 0
fi
pack
rm -rf "$TMP"
cat "$RESULTS/summary.md"
echo "[gpu_check +$(( $(date +%s) - t0 ))s] done; results in $RESULTS"
