"""The few collectives the trainer needs beyond DeepSpeed's, written for one rank or many alike.

With one process (or before the process group exists) every function returns its input.
"""
from __future__ import annotations

import socket

import torch
import torch.distributed as tdist


def free_port() -> int:
    """A TCP port free on the loopback interface right now, for a process group's rendezvous (or a
    local server). Another process may take it before it is bound again: pass it on promptly."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def _active() -> bool:
    return tdist.is_available() and tdist.is_initialized() and tdist.get_world_size() > 1


def rank() -> int:
    return tdist.get_rank() if _active() else 0


def world_size() -> int:
    return tdist.get_world_size() if _active() else 1


def all_ranks(flag: bool) -> bool:
    """True only if `flag` is True on every rank."""
    if not _active():
        return flag
    t = torch.tensor([1.0 if flag else 0.0])
    tdist.all_reduce(t, op=tdist.ReduceOp.MIN)
    return bool(t.item())


def sum_over_ranks(values: dict[str, float]) -> dict[str, float]:
    """Per-key sums; every rank must pass the same keys (counts, not rates)."""
    if not _active():
        return dict(values)
    keys = sorted(values)
    t = torch.tensor([float(values[k]) for k in keys], dtype=torch.float64)
    tdist.all_reduce(t)
    return dict(zip(keys, t.tolist()))


def mean_over_ranks(metrics: dict[str, float], summed: tuple[str, ...] = ("loss/",)) -> dict[str, float]:
    """Per-key means over the ranks that report the key (some metrics are conditional); keys that
    start with a `summed` prefix are added up instead (each rank's loss terms are its share of the
    step's objective, rl/losses.py)."""
    if not _active():
        return metrics
    gathered: list[dict] = [None] * tdist.get_world_size()
    tdist.all_gather_object(gathered, metrics)
    keys = sorted(set().union(*gathered))
    return {k: sum(m[k] for m in gathered if k in m) / (1 if k.startswith(summed) else sum(k in m for m in gathered))
            for k in keys}


def from_main(value):
    """Rank 0's `value` on every rank (a picklable object: work one rank does for all)."""
    if not _active():
        return value
    box = [value]
    tdist.broadcast_object_list(box, src=0)
    return box[0]


def barrier() -> None:
    if _active():
        tdist.barrier()


def shutdown() -> None:
    """Destroy the process group while the interpreter is whole. A rank that exits with it alive
    can abort (SIGABRT, "terminate called without an active exception"): gloo's worker threads
    still hold tensors when Python tears down. Local to this rank (no collective), so it is safe at
    exit even when another rank has died; registered with atexit by rl/engine.py."""
    if tdist.is_available() and tdist.is_initialized():
        tdist.destroy_process_group()
