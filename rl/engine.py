"""DeepSpeed engine for the student: process group, DeepSpeed config, optimizer and schedule.

The optimizer is torch AdamW (DeepSpeed's C++ Adam does not resume bit-identically on CPU).
The schedule covers both phases of a run, so one engine and one checkpoint format serve
warm-start and RL alike: linear warm-up to `warmstart.lr`, then linear warm-up to `trainer.lr`.
"""
from __future__ import annotations

import os
import socket

import torch


def _free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def init_distributed() -> None:
    """One process group per run: gloo on CPU, NCCL on GPUs; single-process runs need no launcher."""
    import deepspeed
    from deepspeed.accelerator import get_accelerator

    if "WORLD_SIZE" not in os.environ:
        # Not started by a launcher: a one-rank group on a free loopback port, so that several
        # runs (or a run and the tests) can share a machine.
        os.environ.update(RANK="0", LOCAL_RANK="0", WORLD_SIZE="1", MASTER_ADDR="127.0.0.1",
                          MASTER_PORT=str(_free_port()))
    accel = get_accelerator()
    if accel.device_name() == "cpu":
        # DeepSpeed JIT-compiles a shared-memory all-reduce op (75-115 s) on CPU at first init;
        # gloo serves our ranks well, so mark that op unavailable instead of paying for it.
        builder = accel.create_op_builder("ShareMemCommBuilder")
        if builder is not None:
            deepspeed.ops.__compatible_ops__[builder.NAME] = False
    if not torch.distributed.is_initialized():
        deepspeed.init_distributed(dist_backend="gloo" if accel.device_name() == "cpu" else "nccl")


def deepspeed_config(cfg) -> dict:
    ds = cfg.deepspeed
    return {
        "train_micro_batch_size_per_gpu": 1,   # batches are built by the trainer, not DeepSpeed
        "gradient_accumulation_steps": ds.gradient_accumulation_steps,
        "gradient_clipping": ds.gradient_clipping,
        "zero_optimization": {"stage": ds.zero_stage},
        "bf16": {"enabled": ds.dtype == "bf16"},
        "steps_per_print": 10**9,
        "wall_clock_breakdown": False,
    }


def lr_at(step: int, cfg) -> float:
    """Absolute learning rate at optimizer step `step` (0-based) of the whole run."""
    ws, tr = cfg.warmstart, cfg.trainer
    if step < ws.steps:
        return ws.lr * min(1.0, (step + 1) / max(1, ws.warmup_steps))
    rl_step = step - ws.steps
    return tr.lr * min(1.0, (rl_step + 1) / max(1, tr.warmup_steps))


def build_engine(model: torch.nn.Module, cfg):
    import deepspeed

    init_distributed()
    optimizer = torch.optim.AdamW(model.parameters(), lr=1.0, betas=(0.9, 0.999), eps=1e-8,
                                  weight_decay=cfg.trainer.weight_decay)
    # The optimizer's base lr is 1, so the factor IS the lr. A plain function, not a callable
    # object: LambdaLR checkpoints an object's __dict__ and would restore the old config on
    # resume, silently ignoring a changed trainer.lr.
    scheduler = torch.optim.lr_scheduler.LambdaLR(optimizer, lambda step: lr_at(step, cfg))
    engine, optimizer, _, scheduler = deepspeed.initialize(
        model=model, optimizer=optimizer, lr_scheduler=scheduler, config=deepspeed_config(cfg))
    return engine, optimizer, scheduler
