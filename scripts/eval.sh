#!/usr/bin/env bash
# Evaluate a run, checkpoint or export on named suites (rl/evals/):
#   scripts/eval.sh MODEL --suite NAME [--suite ...] [--json] [--out FILE] [key=value ...]
# Bootstraps .venv on first use, then runs `python -m rl.eval` (--help, --list).
set -euo pipefail
source "$(dirname "${BASH_SOURCE[0]}")/bootstrap.sh"
exec python -m rl.eval "$@"
