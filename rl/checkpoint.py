"""Checkpoints that resume bit-identically and survive being killed at any moment.

A checkpoint is DeepSpeed's state (model, optimizer and scheduler; one optimizer partition per rank
under ZeRO) plus everything random or stateful of ours, per rank:

    checkpoints/step_0000100/   mp_rank_00_model_states.pt, zero_pp_rank_*_optim_states.pt (DeepSpeed)
                                expert_shard_ep*.pt            (expert parallelism)
                                teacher_weights.safetensors    (files of the trainer's: `write`)
                                state_rank<r>.json             step, task cursor, trainer state, Python RNG
                                rng_rank<r>.safetensors        torch (and CUDA) generator states
                                manifest.json                  every file's size and blake2b, step,
                                                               world size, config hash

**Atomic**: every rank writes into `partial-step_0000100/`; when all have finished (a barrier),
rank 0 writes the manifest, renames the folder to `step_0000100/` and only then deletes tags
beyond the newest `keep`. A save killed at any point leaves at most a `partial-*` folder (removed
by the next save), never a half-written `step_*`. `load` verifies the newest tag's manifest and
falls back to the one before with a one-line warning naming what was wrong (missing, truncated or
altered files), moving the unusable tag aside as `unusable-step_*`.

**No pickle of ours**: JSON and safetensors; DeepSpeed's own files are read with
weights_only=True (student/safe_load.py), so a checkpoint from elsewhere cannot run code.

A run resumes on the number of ranks it was saved with (ZeRO partitions are per rank).
"""
from __future__ import annotations

import errno
import hashlib
import json
import os
import random
import re
import shutil
import sys
from pathlib import Path
from typing import Callable

import torch
from safetensors.torch import load_file, save_file

from rl import distributed as dist
from rl import failpoints
from student.expert_parallel import load_expert_shard, save_expert_shard
from student.safe_load import weights_only_loads

MANIFEST = "manifest.json"
PARTIAL = "partial-"        # a save in progress (or killed): never loaded
UNUSABLE = "unusable-"      # a tag that failed verification, kept for a look and never loaded
_TAG = re.compile(r"step_\d{7}")


class CheckpointError(RuntimeError):
    """A checkpoint could not be written, or none of a run's checkpoints can be loaded."""


def _tag(step: int) -> str:
    return f"step_{step:07d}"


def list_tags(ckpt_dir: Path) -> list[str]:
    """Complete checkpoints' tags, oldest first (partial and unusable folders are not tags)."""
    if not ckpt_dir.is_dir():
        return []
    return sorted(p.name for p in ckpt_dir.iterdir() if p.is_dir() and _TAG.fullmatch(p.name))


def _digest(path: Path) -> str:
    h = hashlib.blake2b(digest_size=16)
    with path.open("rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            h.update(block)
    return h.hexdigest()


def _fsync(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def _write_manifest(path: Path, step: int, meta: dict) -> None:
    files = {}
    for f in sorted(p for p in path.rglob("*") if p.is_file()):
        _fsync(f)   # a kill -9 loses nothing the kernel has; a power cut would, without this
        files[str(f.relative_to(path))] = {"bytes": f.stat().st_size, "blake2b": _digest(f)}
    manifest = {"step": step, "world_size": dist.world_size(), **meta, "files": files}
    tmp = path / (MANIFEST + ".tmp")
    tmp.write_text(json.dumps(manifest, indent=1))
    _fsync(tmp)
    os.replace(tmp, path / MANIFEST)


def _save_rank_state(path: Path, step: int, cursor: int, rng: random.Random, state: dict) -> None:
    version, internal, gauss = rng.getstate()
    rank = dist.rank()
    info = {"step": step, "task_cursor": cursor, "world_size": dist.world_size(), "trainer": state,
            "py_rng": [version, list(internal), gauss]}
    (path / f"state_rank{rank}.json").write_text(json.dumps(info))
    tensors = {"torch_rng": torch.get_rng_state()}
    if torch.cuda.is_available():
        # GPU sampling (torch.rand on the device) draws from the CUDA generators, not the CPU one
        tensors.update({f"cuda_rng_{i}": s for i, s in enumerate(torch.cuda.get_rng_state_all())})
    save_file(tensors, str(path / f"rng_rank{rank}.safetensors"))


def _bytes_of(path: Path) -> int:
    return sum(f.stat().st_size for f in path.rglob("*") if f.is_file()) if path.is_dir() else 0


def _write_failed(err: Exception, ckpt_dir: Path, partial: Path, tag: str) -> CheckpointError:
    """The error a failed save stops the run with: where, how much space it needs and has, and which
    checkpoint is still good."""
    tags = list_tags(ckpt_dir)
    previous = f"{ckpt_dir / tags[-1]} is intact (resume=true continues from it)" if tags else \
        "there is no earlier checkpoint"
    needed = _bytes_of(ckpt_dir / tags[-1]) if tags else _bytes_of(partial)
    shutil.rmtree(partial, ignore_errors=True)
    try:
        free = shutil.disk_usage(ckpt_dir).free
    except OSError:
        free = None
    full = getattr(err, "errno", None) in (errno.ENOSPC, errno.EDQUOT, errno.EFBIG) or \
        (free is not None and free < needed)
    what = "the disk is full" if full else f"{type(err).__name__}: {err}"
    space = f"; a checkpoint of this run takes about {needed / 2**20:.1f} MiB" + \
        (f" and {free / 2**20:.1f} MiB are free there" if free is not None else "")
    return CheckpointError(f"checkpoint {tag} could not be written to {ckpt_dir} ({what}){space}; {previous}")


def save(engine, ckpt_dir: Path, step: int, cursor: int, rng: random.Random, keep: int,
         state: dict | None = None, write: Callable[[Path], None] | None = None,
         meta: dict | None = None) -> Path:
    """Collective: every rank calls it. `write(folder)` adds the trainer's own files; `meta` goes
    into the manifest (e.g. the config's hash)."""
    tag = _tag(step)
    final, partial = ckpt_dir / tag, ckpt_dir / (PARTIAL + tag)
    if dist.rank() == 0:
        ckpt_dir.mkdir(exist_ok=True)     # not parents: a run folder deleted mid-run stays gone
        for stale in ckpt_dir.glob(PARTIAL + "*"):      # left by a save that was killed
            shutil.rmtree(stale, ignore_errors=True)
    dist.barrier()
    try:
        engine.save_checkpoint(str(ckpt_dir), tag=partial.name, save_latest=False)
        failpoints.reach("checkpoint.after_deepspeed", step)
        save_expert_shard(engine.module, partial)       # expert parallelism: this EP rank's experts
        if write is not None:
            write(partial)
        failpoints.reach("checkpoint.after_trainer_files", step)
        _save_rank_state(partial, step, cursor, rng, state or {})
        failpoints.reach("checkpoint.after_rank_state", step)
    except (OSError, RuntimeError) as err:   # torch.save reports a failed write as RuntimeError
        raise _write_failed(err, ckpt_dir, partial, tag) from err
    dist.barrier()   # every rank's files are complete before the manifest covers them
    if dist.rank() == 0:
        try:
            _write_manifest(partial, step, meta or {})
        except OSError as err:
            raise _write_failed(err, ckpt_dir, partial, tag) from err
        failpoints.reach("checkpoint.after_manifest", step)
        if final.exists():   # the same step saved again, after a fall-back past an unusable tag
            replaced = ckpt_dir / (PARTIAL + "replaced-" + tag)
            os.replace(final, replaced)
            os.replace(partial, final)
            shutil.rmtree(replaced, ignore_errors=True)
        else:
            os.replace(partial, final)
        _fsync(ckpt_dir)
        failpoints.reach("checkpoint.after_rename", step)
        for old in list_tags(ckpt_dir)[:-keep]:
            shutil.rmtree(ckpt_dir / old, ignore_errors=True)
            failpoints.reach("checkpoint.during_cleanup", step)
    dist.barrier()
    return final


def verify(path: Path) -> str | None:
    """None when the folder is a complete checkpoint, as its manifest lists it; else what is wrong."""
    try:
        manifest = json.loads((path / MANIFEST).read_text())
        files, step = manifest["files"], manifest["step"]
    except FileNotFoundError:
        return f"no {MANIFEST} (a save that did not finish, or a checkpoint of an older hintrl)"
    except (ValueError, KeyError, TypeError) as err:
        return f"{MANIFEST} is unreadable ({type(err).__name__})"
    if _tag(step) != path.name:
        return f"{MANIFEST} says step {step}"
    for name, want in files.items():
        f = path / name
        if not f.is_file():
            return f"{name} is missing"
        size = f.stat().st_size
        if size != want["bytes"]:
            return f"{name} has {size} bytes, {want['bytes']} were written (truncated or overwritten)"
        if _digest(f) != want["blake2b"]:
            return f"{name} differs from what was written (checksum mismatch: corrupted)"
    return None


def _warn(message: str) -> None:
    if dist.rank() == 0:
        print(f"[checkpoint] {message}", file=sys.stderr, flush=True)


def newest_usable(ckpt_dir: Path) -> tuple[Path | None, list[tuple[Path, str]]]:
    """The newest checkpoint that verifies, and each newer one that did not with what is wrong."""
    skipped = []
    for tag in reversed(list_tags(ckpt_dir)):
        problem = verify(ckpt_dir / tag)
        if problem is None:
            return ckpt_dir / tag, skipped
        skipped.append((ckpt_dir / tag, problem))
    return None, skipped


def restore_cuda_rng(saved: list[torch.Tensor] | None, path: Path) -> None:
    """Put the CUDA generators back as saved. A checkpoint from a CPU run resumed on a GPU has none
    (the GPU stream then starts from the seed); one from a GPU run resumed without a GPU cannot
    continue that stream, which is said, not hidden."""
    if not saved:
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


def load(engine, ckpt_dir: Path, rng: random.Random) -> tuple[int, int, dict, Path] | None:
    """Restore the newest complete checkpoint; returns (step, task cursor, trainer state, its
    folder), or None when the run has no checkpoint yet (it starts over). Unusable newer tags are
    named in a warning and moved aside; if every tag is unusable that is an error, not a restart."""
    # Rank 0 reads and hashes every file once for all ranks, and moves unusable tags aside.
    path, skipped = dist.from_main(newest_usable(ckpt_dir) if dist.rank() == 0 else None)
    for bad, problem in skipped:
        _warn(f"unusable, moved aside as {UNUSABLE}*: {bad}: {problem}")
    if path is not None and skipped:
        _warn(f"resuming from {path} instead")
    if path is None:
        if skipped:
            raise CheckpointError(f"no usable checkpoint under {ckpt_dir}: "
                                  + "; ".join(f"{bad}: {problem}" for bad, problem in skipped))
        return None
    manifest = json.loads((path / MANIFEST).read_text())
    if manifest["world_size"] != dist.world_size():
        raise CheckpointError(f"{path} was saved by {manifest['world_size']} rank(s) and this run has "
                              f"{dist.world_size()}: resume with the launcher settings the run was started with")
    if dist.rank() == 0:
        for bad, _ in skipped:
            os.replace(bad, bad.with_name(UNUSABLE + bad.name))
    with weights_only_loads(path):
        loaded, _ = engine.load_checkpoint(str(ckpt_dir), tag=path.name)
        if loaded is None:
            raise CheckpointError(f"DeepSpeed could not load checkpoint {path}")
        load_expert_shard(engine.module, path)
    info = json.loads((path / f"state_rank{dist.rank()}.json").read_text())
    version, internal, gauss = info["py_rng"]
    rng.setstate((version, tuple(internal), gauss))
    tensors = load_file(str(path / f"rng_rank{dist.rank()}.safetensors"))
    torch.set_rng_state(tensors["torch_rng"])
    restore_cuda_rng([tensors[k] for k in sorted((k for k in tensors if k.startswith("cuda_rng_")),
                                                  key=lambda k: int(k.rsplit("_", 1)[1]))], path)
    dist.barrier()
    return info["step"], info["task_cursor"], info["trainer"], path
