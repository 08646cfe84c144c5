#!/usr/bin/env bash
# Test: scripts/test.sh [pytest args]   Bootstraps .venv on first use, then runs the whole suite.
set -euo pipefail
source "$(dirname "${BASH_SOURCE[0]}")/bootstrap.sh"
cd "$HINTRL_ROOT"
exec python -m pytest -q "${@:-tests}"
