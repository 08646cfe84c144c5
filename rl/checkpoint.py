"""Checkpoints that resume bit-identically: DeepSpeed state plus everything random or stateful.

DeepSpeed saves model, optimizer and scheduler (one optimizer partition per rank under ZeRO);
its client state adds the step, the task cursor and the trainer's own `state` (e.g. the compute
budget's totals); `write(path)` adds files of the trainer's (e.g. the self-teacher's weights,
rl/teacher_weights.py) before the tag counts as complete; every rank writes its own RNG states
(torch and the trainer's `random.Random`: ranks sample different streams) to `rng_rank<r>.pt`.
Tags are `step_0000100`; the newest `keep` are kept. A run resumes on the number of ranks it was
saved with (ZeRO partitions are per rank).
"""
from __future__ import annotations

import random
import shutil
from pathlib import Path
from typing import Callable

import torch

from rl import distributed as dist
from student.expert_parallel import load_expert_shard, save_expert_shard


def _tag(step: int) -> str:
    return f"step_{step:07d}"


def list_tags(ckpt_dir: Path) -> list[str]:
    if not ckpt_dir.is_dir():
        return []
    return sorted(p.name for p in ckpt_dir.iterdir() if p.is_dir() and p.name.startswith("step_"))


def _rng_file(path: Path, rank: int) -> Path:
    return path / f"rng_rank{rank}.pt"


def save(engine, ckpt_dir: Path, step: int, cursor: int, rng: random.Random, keep: int,
         state: dict | None = None, write: Callable[[Path], None] | None = None) -> Path:
    """Collective: every rank calls it."""
    path = ckpt_dir / _tag(step)
    client_state = {"step": step, "task_cursor": cursor, "world_size": dist.world_size(), **(state or {})}
    engine.save_checkpoint(str(ckpt_dir), tag=_tag(step), client_state=client_state)
    save_expert_shard(engine.module, path)      # expert parallelism: this EP rank's experts
    if write is not None:
        write(path)
    states = {"py_rng": rng.getstate(), "torch_rng": torch.get_rng_state()}
    if torch.cuda.is_available():
        # GPU sampling (torch.rand on the device) draws from the CUDA generators, not the CPU one
        states["cuda_rng"] = torch.cuda.get_rng_state_all()
    torch.save(states, _rng_file(path, dist.rank()))
    dist.barrier()   # every rank's files are written before old tags go
    if dist.rank() == 0:
        for old in list_tags(ckpt_dir)[:-keep]:
            shutil.rmtree(ckpt_dir / old, ignore_errors=True)
    return path


def restore_cuda_rng(saved: list[torch.Tensor] | None, path: Path) -> None:
    """Put the CUDA generators back as saved. A checkpoint from a CPU run resumed on a GPU has none
    (the GPU stream then starts from the seed); one from a GPU run resumed without a GPU cannot
    continue that stream, which is said, not hidden."""
    if saved is None:
        return
    if not torch.cuda.is_available():
        import warnings

        warnings.warn(f"{path} holds CUDA random states but no GPU is visible: sampling continues on the CPU "
                      f"generator, so this resume is not bit-identical to the GPU run")
        return
    if len(saved) != torch.cuda.device_count():
        raise RuntimeError(f"{path} holds random states of {len(saved)} GPU(s) and {torch.cuda.device_count()} "
                           f"are visible: resume with the same CUDA_VISIBLE_DEVICES")
    torch.cuda.set_rng_state_all(saved)


def load(engine, ckpt_dir: Path, rng: random.Random) -> tuple[int, int, dict, Path]:
    """Restore the newest checkpoint; returns (step, task cursor, client state, its folder)."""
    tags = list_tags(ckpt_dir)
    if not tags:
        raise FileNotFoundError(f"no checkpoint under {ckpt_dir} to resume from")
    path = ckpt_dir / tags[-1]
    rng_file = _rng_file(path, dist.rank())
    saved = len(list(path.glob("rng_rank*.pt")))
    if saved != dist.world_size():
        raise RuntimeError(f"{path} was saved by {saved} rank(s) and this run has {dist.world_size()}: "
                           "resume with the launcher settings the run was started with")
    loaded, client_state = engine.load_checkpoint(str(ckpt_dir), tag=tags[-1])
    if loaded is None:
        raise RuntimeError(f"DeepSpeed could not load checkpoint {path}")
    load_expert_shard(engine.module, path)
    states = torch.load(rng_file, weights_only=False)
    rng.setstate(states["py_rng"])
    torch.set_rng_state(states["torch_rng"])
    restore_cuda_rng(states.get("cuda_rng"), path)
    return client_state["step"], client_state["task_cursor"], client_state, path
