#!/usr/bin/env bash
# Train: scripts/train.sh [EXPERIMENT_DIR] [key=value ...]   (default: experiments/default)
# Bootstraps .venv on first use, then runs `python -m rl.train`.
set -euo pipefail
source "$(dirname "${BASH_SOURCE[0]}")/bootstrap.sh"
cd "$HINTRL_ROOT"
experiment="experiments/default"
if [ $# -gt 0 ] && [[ "$1" != *=* ]]; then experiment="$1"; shift; fi
exec python -m rl.train "$experiment" "$@"
