"""Command line: `python -m rl.train EXPERIMENT_DIR [key=value ...]` (what scripts/train.sh runs).

Loads the experiment's config with overrides, picks the run folder, trains, and prints where the
run went. Config errors end the run before any work, with one line naming the key.
"""
from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

from rl.config import ConfigError, RunConfig, load_config
from rl.checkpoint import list_tags


def resolve_run_dir(cfg: RunConfig) -> Path:
    """Sets cfg.run_name; with resume=true, finds the run (named, or the newest with a checkpoint)."""
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
        raise ConfigError(f"resume=true: no run with a checkpoint under {base}"
                          + (f" named {cfg.run_name!r}" if cfg.run_name else ""))
    if not cfg.run_name:
        cfg.run_name = f"{time.strftime('%Y%m%d-%H%M%S')}-{cfg.method.name}-s{cfg.seed}"
    run_dir = base / cfg.run_name
    if (run_dir / "metrics.jsonl").exists():
        raise ConfigError(f"run folder {run_dir} already holds a run: pass resume=true to continue "
                          "it, or another run_name")
    return run_dir


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m rl.train", description=__doc__.splitlines()[0])
    parser.add_argument("experiment", help="experiment folder holding config.yaml")
    parser.add_argument("overrides", nargs="*", help="config overrides, e.g. trainer.steps=50")
    args = parser.parse_args(argv)
    try:
        cfg = load_config(args.experiment, args.overrides)
        if cfg.launcher.nproc_per_node != 1 or cfg.launcher.nnodes != 1:
            raise ConfigError("launcher: multi-rank runs are not available yet; "
                              "use launcher.nproc_per_node=1 launcher.nnodes=1")
        run_dir = resolve_run_dir(cfg)
        if cfg.resume:
            # A resumed run keeps the config it started with; overrides still apply on top.
            cfg = load_config(run_dir, args.overrides)
            cfg.run_name = run_dir.name
    except ConfigError as err:
        print(f"config error: {err}", file=sys.stderr)
        return 2

    from rl.trainer import Trainer   # heavy imports only once the config is known to be good

    trainer = Trainer(cfg, run_dir)
    print(f"run folder: {run_dir}  ({trainer.n_params / 1e6:.2f}M-parameter {cfg.student.arch} "
          f"student, method {cfg.method.name}, seed {cfg.seed})", flush=True)
    final = trainer.train()
    summary = ", ".join(f"{k}={v:.3f}" for k, v in final.items())
    print(f"done: {summary}\nrun folder: {run_dir}\n"
          f"  tensorboard --logdir {run_dir.parent}", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
