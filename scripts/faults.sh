#!/usr/bin/env bash
# The fault-injection suite and its report: scripts/faults.sh [pytest args]
# Runs tests/faults/ (kill -9 at seeded moments incl. inside checkpoint writes and on one rank of a
# two-rank ZeRO-3 run, a disk filling up, read-only and vanished run folders, corrupted checkpoints,
# a planted malicious pickle, teacher endpoint faults, config fuzzing), each trial recording what it
# did (benchmarks/results/faults-trials.jsonl), and writes benchmarks/results/faults.md from them. The
# same tests run in scripts/test.sh's slow tier.
# Mounts small tmpfs file systems for the disk tests (root, as in CI's container; skipped without).
set -euo pipefail
source "$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)/bootstrap.sh"
cd "$HINTRL_ROOT"
records=benchmarks/results/faults-trials.jsonl
rm -f "$records"
log=$(mktemp)
start=$(date +%s)
set +e
HINTRL_FAULTS_RECORD="$records" python -m pytest -q -p no:cacheprovider -rs tests/faults "$@" 2>&1 | tee "$log"
rc=${PIPESTATUS[0]}
set -e
python -m benchmarks.faults_report "$records" --pytest-log "$log" --seconds $(( $(date +%s) - start )) \
  --out benchmarks/results/faults.md
rm -f "$log"
exit "$rc"
