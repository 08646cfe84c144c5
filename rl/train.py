"""Command line: `python -m rl.train EXPERIMENT_DIR [key=value ...]` (what scripts/train.sh runs).

Loads the experiment's config with overrides, picks the run folder, trains, and prints where the
run went. Config errors end the run before any work, with one line naming the key.

With `launcher.nproc_per_node` or `launcher.nnodes` above 1, this process only resolves the run
folder and re-runs the same command under torchrun (or DeepSpeed's launcher when
`launcher.hostfile` is set), passing the resolved `run_name` so every rank writes to one folder.
"""
from __future__ import annotations

import argparse
import os
import shlex
import subprocess
import sys
import time
from pathlib import Path

from rl.config import ConfigError, RunConfig
from rl.configure import load_config
from rl.checkpoint import list_tags


def resolve_run_dir(cfg: RunConfig) -> Path:
    """Sets cfg.run_name; with resume=true, finds the run (named, or the newest with a checkpoint).
    A named run with no checkpoint yet starts over, so `resume=true run_name=X` always works."""
    base = Path(cfg.output_dir) / cfg.experiment
    if cfg.resume:
        if cfg.run_name:
            candidates = [base / cfg.run_name]
        else:
            candidates = sorted((d for d in base.glob("*") if d.is_dir()),
                                key=lambda d: d.stat().st_mtime, reverse=True)
        for run_dir in candidates:
            if list_tags(run_dir / "checkpoints"):
                cfg.run_name = run_dir.name
                return run_dir
        if cfg.run_name:
            # Named, without a checkpoint: killed before its first one (or never started), so the
            # trainer starts it over; an automatic restart may always pass resume=true.
            return base / cfg.run_name
        raise ConfigError(f"resume=true: no run with a checkpoint under {base} (name one with run_name=...)")
    if not cfg.run_name:
        cfg.run_name = f"{time.strftime('%Y%m%d-%H%M%S')}-{cfg.method.name}-s{cfg.seed}"
    run_dir = base / cfg.run_name
    if (run_dir / "metrics.jsonl").exists():
        raise ConfigError(f"run folder {run_dir} already holds a run: pass resume=true to continue "
                          "it, or another run_name")
    return run_dir


def launch_command(cfg: RunConfig, experiment: str, overrides: list[str]) -> list[str]:
    """The launcher command that starts every rank of this node with the same arguments."""
    from rl.distributed import free_port

    L = cfg.launcher
    port = L.master_port or free_port()
    child = [*overrides, f"run_name={cfg.run_name}"]
    if L.hostfile:
        # DeepSpeed's launcher reaches the other hosts itself (pdsh/ssh); slots come from the hostfile.
        return [str(Path(sys.executable).with_name("deepspeed")), f"--hostfile={L.hostfile}", f"--num_nodes={L.nnodes}",
                f"--master_addr={L.master_addr}", f"--master_port={port}",
                "--module", "rl.train", experiment, *child]
    return [sys.executable, "-m", "torch.distributed.run", f"--nproc_per_node={L.nproc_per_node}",
            f"--nnodes={L.nnodes}", f"--node_rank={L.node_rank}", f"--master_addr={L.master_addr}",
            f"--master_port={port}", "-m", "rl.train", experiment, *child]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m rl.train", description=__doc__.splitlines()[0])
    parser.add_argument("experiment", help="experiment folder holding config.yaml")
    parser.add_argument("overrides", nargs="*", help="config overrides, e.g. trainer.steps=50")
    args = parser.parse_args(argv)
    try:
        cfg = load_config(args.experiment, args.overrides)
        launched = "LOCAL_RANK" in os.environ          # we are a rank started by a launcher
        if not launched and cfg.launcher.nnodes > 1 and not cfg.run_name:
            raise ConfigError("launcher.nnodes > 1: pass the same run_name=... on every node")
        run_dir = resolve_run_dir(cfg)
        if cfg.resume and (run_dir / "config.yaml").is_file():
            # A resumed run keeps the config it started with; overrides still apply on top.
            cfg = load_config(run_dir, args.overrides)
            cfg.run_name = run_dir.name
        world = cfg.launcher.nproc_per_node * cfg.launcher.nnodes
        if launched and int(os.environ.get("WORLD_SIZE", world)) != world:
            # The config's batch checks assume its own rank count (rl/configure.py::_validate_scale).
            raise ConfigError(f"the launcher started {os.environ['WORLD_SIZE']} ranks but launcher.nproc_per_node x "
                              f"launcher.nnodes = {world}; set them to match")
    except ConfigError as err:
        print(f"config error: {err}", file=sys.stderr)
        return 2

    try:   # a read-only or missing output folder stops here, before any work
        run_dir.mkdir(parents=True, exist_ok=True)
        probe = run_dir / f".write-test-{os.getpid()}"
        probe.write_text("")
        probe.unlink()
    except OSError as err:
        print(f"run folder error: cannot write {run_dir}: {err.strerror or err}", file=sys.stderr)
        return 1

    # After a resume's reload: `resume=true` alone relaunches a run on the ranks it was saved with.
    if world > 1 and not launched:
        cmd = launch_command(cfg, args.experiment, args.overrides)
        print(f"run folder: {run_dir}\nlaunching: {shlex.join(cmd)}", flush=True)
        return subprocess.call(cmd)

    from rl.trainer import Trainer   # heavy imports only once the config is known to be good
    from rl.checkpoint import CheckpointError
    from rl.jsonl_task import JsonlError
    from student.safe_load import UnsafeCheckpointError
    from student.rollout_engine import RolloutEngineError

    try:
        trainer = Trainer(cfg, run_dir)
        if trainer.is_main:
            family = trainer.rollout.module.config.model_type       # a checkpoint's own, not student.arch's default
            print(f"run folder: {run_dir}  ({trainer.n_params / 1e6:.2f}M-parameter {family} "
                  f"student, method {cfg.method.name}, seed {cfg.seed}, {trainer.world} rank(s), "
                  f"ZeRO-{cfg.deepspeed.zero_stage})", flush=True)
        final = trainer.train()
    except RolloutEngineError as err:
        # The engine is gone or wedged: stop with its message (which names its log), not a traceback.
        print(f"rollout engine error: {err}\nrun folder: {run_dir} (resume=true continues from its last "
              f"checkpoint)", file=sys.stderr)
        return 1
    except (CheckpointError, UnsafeCheckpointError) as err:
        print(f"checkpoint error: {err}", file=sys.stderr)
        return 1
    except JsonlError as err:       # a problem file that the eval sets leave nothing of (rl/tasks.py)
        print(f"task error: {err}", file=sys.stderr)
        return 2
    except OSError as err:
        if run_dir.exists() and not str(err.filename or "").startswith(str(run_dir)):
            raise     # not the run folder's trouble
        what = (f"{run_dir} was deleted while the run was going (its checkpoints with it)" if not run_dir.exists()
                else f"cannot write {err.filename}: {err.strerror or err}; resume=true continues from the last "
                     "checkpoint once it can be written")
        print(f"run folder error: {what}", file=sys.stderr)
        return 1
    if trainer.is_main and cfg.trainer.export_to:
        from rl.export import export     # reads the final checkpoint, which every rank has written

        print(f"exported the final model to {export(run_dir, run_dir / cfg.trainer.export_to)}", flush=True)
    if trainer.is_main:
        summary = ", ".join(f"{k}={v:.3f}" for k, v in final.items())
        print(f"done: {summary}\nrun folder: {run_dir}\n"
              f"  tensorboard --logdir {run_dir.parent}", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
