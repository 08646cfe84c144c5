#!/usr/bin/env bash
# Benchmarks (not timed tests). Usage: scripts/bench.sh <name> [args...]
#   moe   MoE layer fwd+bwd and routing steps, ours vs transformers eager/grouped_mm
#         (python -m benchmarks.moe --help); writes benchmarks/results/moe-<device>.{json,md}
set -euo pipefail
source "$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)/bootstrap.sh"
cd "$HINTRL_ROOT"
name="${1:-}"
shift || true
case "$name" in
  moe) exec python -m benchmarks.moe "$@" ;;
  *) echo "usage: scripts/bench.sh <benchmark> [args...]; valid benchmarks: moe" >&2; exit 2 ;;
esac
