#!/usr/bin/env bash
# Reproduce a study folder: scripts/reproduce.sh EXPERIMENT_DIR [--seeds 0,1,2] [--arms a,b] [--jobs 2] [--fresh]
# Runs every arm x seed its study.yaml declares (one warm-start per seed, shared), then writes the
# results table into the folder's README.md, results/summary.json and results.png (rl/study.py).
set -euo pipefail
source "$(dirname "${BASH_SOURCE[0]}")/bootstrap.sh"
cd "$HINTRL_ROOT"
exec python -m rl.study "$@"
