"""The run folder: resolved config, TensorBoard events, metrics.jsonl and rollouts.jsonl.

    runs/<experiment>/<run>/config.yaml       the resolved config (what actually ran)
                            events.out.tfevents.*
                            metrics.jsonl     one object per step: {"step": n, "train/...": ...}
                            rollouts.jsonl    sampled attempts with reward, feedback and hint
                            problems.jsonl    every problem of an RL step with all its attempts (rl.mine reads it)
                            eval_sets.json    the prompt hashes of every eval set the run reports
                            checkpoints/

On resume, lines past the checkpoint's step are dropped first, so the files read as if the run
had never stopped. A run killed mid-write leaves a partial last line, which is dropped too; the
truncated file replaces the old one by rename, so a kill during the truncation loses nothing.
"""
from __future__ import annotations

import json
import os
from pathlib import Path

from rl import failpoints


class LogError(ValueError):
    """A run log line that is neither a JSON object nor the cut-short last line."""


def log_lines(path: Path):
    """(line number, object) of each line of a JSON-lines log of the run folder (metrics.jsonl,
    rollouts.jsonl, problems.jsonl), in order. Every reader of these logs reads them here, so all
    agree: a cut-short last line (the one being written, or a run killed mid-write) is skipped,
    any other line that is not a JSON object raises LogError naming the file and line, blank
    lines are ignored, and a missing file has no lines."""
    try:
        lines = path.read_text(encoding="utf-8").splitlines()
    except FileNotFoundError:
        return
    except (OSError, UnicodeDecodeError) as err:
        raise LogError(f"{path}: cannot read it ({getattr(err, 'strerror', None) or err})") from None
    for number, line in enumerate(lines, start=1):
        if not line.strip():
            continue
        try:
            record = json.loads(line)
        except json.JSONDecodeError as err:
            if number == len(lines):
                return
            raise LogError(f"{path}:{number}: not JSON ({err.msg} at column {err.colno})") from None
        if not isinstance(record, dict):
            raise LogError(f"{path}:{number}: not a JSON object")
        yield number, record


def read_log(path: Path) -> list[dict]:
    """The objects of a run log (log_lines says what is skipped and what is an error)."""
    return [record for _, record in log_lines(path)]


def is_run_folder(path: Path) -> bool:
    """A folder the trainer wrote: its resolved config and its metrics or checkpoints."""
    return (path / "config.yaml").is_file() and ((path / "metrics.jsonl").is_file() or (path / "checkpoints").is_dir())


def _truncate_jsonl(path: Path, last_step: int) -> None:
    if not path.exists():
        return
    lines = path.read_text().splitlines()
    kept = []
    for number, line in enumerate(lines, 1):
        try:
            record = json.loads(line)
        except ValueError:
            if number == len(lines):    # the line a kill cut short
                break
            raise ValueError(f"{path}:{number} is not JSON; the run log is damaged") from None
        if record["step"] <= last_step:
            kept.append(line)
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_text("".join(line + "\n" for line in kept))
    failpoints.reach("runlog.before_replace")
    os.replace(tmp, path)


class RunLogger:
    def __init__(self, run_dir: Path, config_yaml: str, resume_step: int | None = None):
        self.run_dir = run_dir
        run_dir.mkdir(parents=True, exist_ok=True)
        tmp = run_dir / "config.yaml.tmp"   # by rename: a resume reads it back, so never half a file
        tmp.write_text(config_yaml)
        os.replace(tmp, run_dir / "config.yaml")
        self.metrics_path = run_dir / "metrics.jsonl"
        self.rollouts_path = run_dir / "rollouts.jsonl"
        self.problems_path = run_dir / "problems.jsonl"
        if resume_step is not None:
            for path in (self.metrics_path, self.rollouts_path, self.problems_path):
                _truncate_jsonl(path, resume_step)
        from torch.utils.tensorboard import SummaryWriter   # here: the log readers above stay light (rl/runs.py)
        self.tb = SummaryWriter(str(run_dir), purge_step=None if resume_step is None else resume_step + 1)

    def log_metrics(self, step: int, metrics: dict[str, float]) -> None:
        with self.metrics_path.open("a") as f:
            f.write(json.dumps({"step": step, **metrics}) + "\n")
        for key, value in metrics.items():
            self.tb.add_scalar(key, value, step)

    def log_rollouts(self, step: int, records: list[dict], path: Path | None = None) -> None:
        with (path or self.rollouts_path).open("a") as f:
            for rec in records:
                # default=str: a task entry's metadata may hold what JSON has no type for
                f.write(json.dumps({"step": step, **rec}, default=str) + "\n")

    def log_problems(self, step: int, records: list[dict]) -> None:
        self.log_rollouts(step, records, self.problems_path)

    def write_json(self, name: str, value) -> None:
        tmp = self.run_dir / f"{name}.tmp"
        tmp.write_text(json.dumps(value, indent=1, sort_keys=True))
        os.replace(tmp, self.run_dir / name)

    def close(self) -> None:
        self.tb.flush()
        self.tb.close()
