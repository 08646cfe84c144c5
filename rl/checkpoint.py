"""Checkpoints that resume bit-identically: DeepSpeed state plus everything random or stateful.

DeepSpeed saves model, optimizer and scheduler; the client state adds the step, the task cursor
and the RNG states (torch and the trainer's own `random.Random`). Tags are `step_0000100`; the
newest `keep` are kept.
"""
from __future__ import annotations

import random
import shutil
from pathlib import Path

import torch


def _tag(step: int) -> str:
    return f"step_{step:07d}"


def list_tags(ckpt_dir: Path) -> list[str]:
    if not ckpt_dir.is_dir():
        return []
    return sorted(p.name for p in ckpt_dir.iterdir() if p.is_dir() and p.name.startswith("step_"))


def save(engine, ckpt_dir: Path, step: int, cursor: int, rng: random.Random, keep: int) -> Path:
    client_state = {"step": step, "task_cursor": cursor, "py_rng": rng.getstate(),
                    "torch_rng": torch.get_rng_state()}
    engine.save_checkpoint(str(ckpt_dir), tag=_tag(step), client_state=client_state)
    for old in list_tags(ckpt_dir)[:-keep]:
        shutil.rmtree(ckpt_dir / old, ignore_errors=True)
    return ckpt_dir / _tag(step)


def load(engine, ckpt_dir: Path, rng: random.Random) -> tuple[int, int]:
    """Restore the newest checkpoint; returns (step, task cursor)."""
    tags = list_tags(ckpt_dir)
    if not tags:
        raise FileNotFoundError(f"no checkpoint under {ckpt_dir} to resume from")
    path, client_state = engine.load_checkpoint(str(ckpt_dir), tag=tags[-1])
    if path is None:
        raise RuntimeError(f"DeepSpeed could not load checkpoint {ckpt_dir / tags[-1]}")
    rng.setstate(client_state["py_rng"])
    torch.set_rng_state(client_state["torch_rng"])
    return client_state["step"], client_state["task_cursor"]
