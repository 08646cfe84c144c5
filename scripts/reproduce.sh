#!/usr/bin/env bash
# Reproduce a study folder: scripts/reproduce.sh EXPERIMENT_DIR [--seeds 0,1,2] [--arms a,b] [--jobs 2] [--fresh]
# Runs every arm x seed its study.yaml declares (one warm-start per seed, shared), then writes the
# results table into the folder's README.md, results/summary.json and results.png (rl/study.py);
# a folder with a sweep.yaml then rebuilds the sweep's table and sweep.png (rl/sweep.py).
set -euo pipefail
source "$(dirname "${BASH_SOURCE[0]}")/bootstrap.sh"
cd "$HINTRL_ROOT"
python -m rl.study "$@"
if [[ $# -gt 0 && -f "$1/sweep.yaml" ]]; then
    python -m rl.sweep "$1"
fi
