#!/usr/bin/env bash
# Export a run's newest (or --step N) checkpoint to a Hugging Face folder that transformers and
# vLLM load: scripts/export.sh RUN_DIR OUT_DIR [--step N]   (python -m rl.export --help)
set -euo pipefail
source "$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)/bootstrap.sh"
if [ $# -lt 2 ]; then
  echo "usage: scripts/export.sh RUN_DIR OUT_DIR [--step N]" >&2; exit 2
fi
exec python -m rl.export "$@"
