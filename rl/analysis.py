"""Read run folders (rl/runlog.py) into pandas for notebooks and reports.

Pure reading: pandas, yaml and the stdlib only, no torch, so importing it from a notebook or a
report is cheap and never touches a device.

    run = load_run("runs/default/final-hint_distill-s0")
    run.metrics["eval/accuracy"].dropna()          # metrics: one row per step, NaN where not logged
    runs = load_runs(["runs/default"])             # every run folder below runs/default
    compare(runs, "eval/accuracy")                 # mean / std across seeds, per method and step
"""
from __future__ import annotations

import glob
import json
import re
from dataclasses import dataclass
from pathlib import Path

import pandas as pd
import yaml

ROLLOUT_COLUMNS = ["step", "prompt", "answer", "attempt", "reward", "feedback", "hint"]
# Per-layer expert load: the share of routed slots each expert took, one key per
# (layer, expert), e.g. "expert_load/layer0/expert3", written by rl/trainer.py at eval steps.
EXPERT_LOAD_KEY = re.compile(r"^expert_load/layer(\d+)/expert(\d+)$")


@dataclass
class Run:
    name: str
    path: Path
    config: dict
    metrics: pd.DataFrame   # indexed by step; a column per metric key
    rollouts: pd.DataFrame  # one row per sampled attempt

    def config_value(self, dotted: str, default=None):
        """`run.config_value("method.name")`: a value of the resolved config by dotted path."""
        node = self.config
        for part in dotted.split("."):
            if not isinstance(node, dict) or part not in node:
                return default
            node = node[part]
        return node


def _read_jsonl(path: Path) -> list[dict]:
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


def load_run(path) -> Run:
    path = Path(path)
    metrics_path = path / "metrics.jsonl"
    if not metrics_path.is_file():
        raise FileNotFoundError(f"{path} is not a run folder: it has no metrics.jsonl")
    records = _read_jsonl(metrics_path)
    if not records:
        raise ValueError(f"{metrics_path} is empty: the run has not logged a step yet")
    # A step may be logged in more than one line (e.g. train metrics, then eval): merge them.
    metrics = pd.DataFrame(records).groupby("step").last().sort_index()
    rollouts_path = path / "rollouts.jsonl"
    rollouts = (pd.DataFrame(_read_jsonl(rollouts_path)) if rollouts_path.is_file()
                else pd.DataFrame(columns=ROLLOUT_COLUMNS))
    config_path = path / "config.yaml"
    config = yaml.safe_load(config_path.read_text()) if config_path.is_file() else {}
    return Run(name=path.name, path=path, config=config or {}, metrics=metrics, rollouts=rollouts)


def _run_folders(path: Path) -> list[Path]:
    """A run folder is itself; any other folder stands for every run folder below it."""
    if (path / "metrics.jsonl").is_file():
        return [path]
    if not path.is_dir():
        raise FileNotFoundError(f"{path} does not exist")
    found = sorted(p.parent for p in path.rglob("metrics.jsonl"))
    if not found:
        raise FileNotFoundError(f"{path} is not a run folder and holds none (no metrics.jsonl below it)")
    return found


def load_runs(paths) -> list[Run]:
    """Run folders, experiment folders holding runs, or glob patterns of either; each run once."""
    if isinstance(paths, (str, Path)):
        paths = [paths]
    folders: list[Path] = []
    for pattern in map(str, paths):
        matches = sorted(glob.glob(pattern)) if glob.has_magic(pattern) else [pattern]
        if not matches:
            raise FileNotFoundError(f"{pattern} matches no folder")
        for match in matches:
            folders += [f for f in _run_folders(Path(match)) if f not in folders]
    return [load_run(f) for f in folders]


def eval_curve(run: Run, key: str = "eval/accuracy") -> pd.Series:
    """The steps where `key` was logged, and its values there."""
    if key not in run.metrics:
        raise KeyError(f"{run.path}: no {key!r} logged (has: {', '.join(run.metrics.columns)})")
    return run.metrics[key].dropna()


def compare(runs: list[Run], key: str = "eval/accuracy", group_by: str = "method.name") -> pd.DataFrame:
    """Mean, std and number of seeds of `key` per group and step (runs without `key` left out).

    std is the sample std across the group's runs; a group of one run has std 0 (no spread
    measured), so a band plots as the line itself rather than vanishing.
    """
    curves = [eval_curve(r, key).rename("value").to_frame().assign(group=str(r.config_value(group_by)))
              for r in runs if key in r.metrics]
    if not curves:
        raise KeyError(f"no run logs {key!r}: {', '.join(str(r.path) for r in runs)}")
    stats = pd.concat(curves).reset_index().groupby(["group", "step"])["value"].agg(["mean", "std", "count"])
    return stats.rename(columns={"count": "n"}).fillna({"std": 0.0})


def steps_to_reach(run: Run, threshold: float, key: str = "eval/accuracy") -> int | None:
    """The first step whose `key` is at least `threshold`; None when the run never gets there."""
    curve = eval_curve(run, key)
    reached = curve[curve >= threshold]
    return int(reached.index[0]) if len(reached) else None


def expert_load(run: Run, step: int | None = None) -> pd.DataFrame | None:
    """Tokens per expert as a layers x experts table at `step` (default: the last step that logged
    it); None when the run logs no expert load."""
    keys = {c: EXPERT_LOAD_KEY.match(c) for c in run.metrics.columns}
    keys = {c: (int(m[1]), int(m[2])) for c, m in keys.items() if m}
    if not keys:
        return None
    logged = run.metrics[list(keys)].dropna(how="all")
    row = logged.iloc[-1] if step is None else logged.loc[step]
    table = pd.Series({keys[c]: row[c] for c in keys}).unstack()
    table.index.name, table.columns.name = "layer", "expert"
    return table
