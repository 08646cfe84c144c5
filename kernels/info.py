"""`python -m kernels.info`: which backend each op runs on, per device, and why."""
from __future__ import annotations

import torch

from kernels import ops


def report() -> str:
    lines = [f"torch {torch.__version__} (CUDA build: {torch.version.cuda or 'no'}, "
             f"GPU visible: {torch.cuda.is_available()})"]
    for device in ("cpu", "cuda"):
        name, why = ops.backend(device)
        for op in ops.OPS:
            if op == "grouped_mm" and device == "cpu" and name == "cpu-ext":
                lines.append(f"{device:4s} {op:18s} {name:8s} {why} (experts spread over the threads)")
            elif op == "grouped_mm":
                native = "torch grouped_mm" if ops._NATIVE_GROUPED_MM is not None else "per-expert loop"
                lines.append(f"{device:4s} {op:18s} {native} (fp32/bf16/fp16, 16-byte aligned; else per-expert loop)")
            else:
                lines.append(f"{device:4s} {op:18s} {name:8s} {why}")
        fused = "cpu-ext  fp32 without autograd (decoding); else torch" if name == "cpu-ext" else f"torch    {why}"
        lines.append(f"{device:4s} {'decode_attention':18s} {fused if device == 'cpu' else 'torch    CPU-only kernel'}")
    return "\n".join(lines)


if __name__ == "__main__":
    print(report())
