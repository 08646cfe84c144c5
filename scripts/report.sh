#!/usr/bin/env bash
# Report: scripts/report.sh RUN_DIR...   Executes notebooks/analyze_run.ipynb for one run folder
# (or compare_runs.ipynb for several) and writes an HTML report next to the runs; prints its path.
set -euo pipefail
if [ $# -eq 0 ]; then echo "usage: scripts/report.sh RUN_DIR..." >&2; exit 2; fi
source "$(dirname "${BASH_SOURCE[0]}")/bootstrap.sh"
exec python -m rl.report "$@"
