#!/usr/bin/env bash
# Test: scripts/test.sh [pytest args]   Bootstraps .venv on first use, then runs the whole suite
# (or what the args select).   scripts/test.sh -m "not slow"   leaves out the tests marked slow.
set -euo pipefail
source "$(dirname "${BASH_SOURCE[0]}")/bootstrap.sh"
cd "$HINTRL_ROOT"
# The vLLM rollout engine's own environment, for tests/test_vllm_engine.py (HINTRL_NO_VLLM=1 skips
# creating it; those tests then skip).
[ -n "${HINTRL_NO_VLLM:-}" ] || bash scripts/bootstrap_vllm.sh
# No path among the args (none at all, or only options such as -m "not slow"): pytest.ini's
# testpaths (tests/) applies, since this runs from the folder holding pytest.ini.
exec python -m pytest -q "$@"
