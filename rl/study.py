"""A paper-reproduction study: every arm x seed an experiment folder declares, then its results table.

    python -m rl.study EXPERIMENT_DIR [--seeds 0,1,2] [--arms a,b] [--jobs 2] [--fresh]
    (scripts/reproduce.sh EXPERIMENT_DIR ... runs this)
    python -m rl.study overview      (the top-level README's table across the study folders)

The folder holds `config.yaml` (the experiment) and `study.yaml` (the arms):

    seeds: [0, 1, 2]
    target: {bucket: hard, arm: grpo}     # "reach the reference arm's mean final accuracy on that bucket"
    prepare: [teacher]                    # optional: experiment folders (relative) trained first, once,
                                          # e.g. a teacher model the arms load
    arms:                                 # name -> overrides applied to the RL phase; "{output_dir}" in
                                          # an override is the study's output folder
      grpo: [method.name=grpo]
      guide: [method.name=corrected_replay]
      grpo_lr3e-4: {overrides: [method.name=grpo, trainer.lr=3.0e-4], seeds: [0]}   # e.g. an lr sweep

Per seed, warm-start runs once (`trainer.steps=0`, which checkpoints at its end) and the teacher gap
of the warm-started student is measured (rl/teacher_gap.py); every arm then resumes a copy of that
run with its overrides and the experiment's RL steps, so the arms share their starting point
exactly. Folders whose configs warm-start alike share the warm-start too
(`runs/study/_warmstart/<config hash>-s<seed>`), and an arm identical to another folder's finished
arm (same warm-start, steps and overrides, e.g. `grpo`) is copied from it. Runs go to `runs/study/<experiment>/<arm>-s<seed>`,
`--jobs` at a time (cores / jobs torch threads each); a finished run is reused, an unfinished one is
started again (`--fresh` starts all again). Then, from the runs' metrics.jsonl (every arm of
study.yaml, on study.yaml's seeds that have a finished run):

    results/summary.json   per arm: per seed and mean +- std over seeds, per bucket: accuracy at the
                           end of warm-start, final and peak (RL) held-out accuracy; generated, scored
                           and trained tokens of the RL phase; steps and generated tokens to reach
                           the target; the teacher gap per seed
    results.png            held-out accuracy against generated tokens, per bucket, mean and spread
    README.md              the table, between `<!-- reproduce:begin -->` and `<!-- reproduce:end -->`
                           (rerunning replaces it)
"""
from __future__ import annotations

import argparse
import hashlib
import json
import os
import re
import shutil
import statistics
import subprocess
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path

import yaml
from tqdm import tqdm

from rl.config import ConfigError, load_config, to_yaml

BEGIN, END = "<!-- reproduce:begin -->", "<!-- reproduce:end -->"
WARM = "_warmstart"       # runs/study/_warmstart/<config hash>-s<seed>: shared by every folder that warm-starts alike
RUN_KEY = "study_key.json"  # in an arm's run folder: what made it (warm-start, RL steps, threads, overrides)
SHARED = ("seed", "task.", "student.", "warmstart.", "output_dir", "run_name", "resume")   # not per arm


@dataclass
class Arm:
    name: str
    overrides: list[str]
    seeds: list[int]


@dataclass
class Study:
    folder: Path
    seeds: list[int]
    arms: list[Arm]
    target_bucket: str
    target_arm: str
    prepare: list[Path]


def load_study(folder: str | Path, seeds: list[int] | None = None, only: list[str] | None = None) -> Study:
    folder = Path(folder)
    path = folder / "study.yaml"
    if not path.is_file():
        raise ConfigError(f"{path}: no such file (a study folder declares its arms in study.yaml)")
    spec = yaml.safe_load(path.read_text()) or {}
    unknown = set(spec) - {"seeds", "target", "arms", "prepare"}
    if unknown:
        raise ConfigError(f"{path}: unknown keys {sorted(unknown)} (study.yaml has seeds, target, prepare, arms)")
    prepare = [folder / p for p in spec.get("prepare") or []]
    for p in prepare:
        load_config(p)                   # a folder that does not load stops the study before any run
    all_seeds = seeds or [int(s) for s in spec.get("seeds", [0, 1, 2])]
    arms = []
    for name, arm in (spec.get("arms") or {}).items():
        overrides, arm_seeds = (arm, all_seeds) if isinstance(arm, list) else (arm.get("overrides", []), arm.get("seeds"))
        bad = [o for o in overrides if "=" not in o or o.split("=", 1)[0].startswith(SHARED)]
        if bad:
            raise ConfigError(f"{path}: arm {name!r}: overrides {bad} are not key=value or change what the arms "
                              "share (seed, task, student, warm-start, run folder)")
        arms.append(Arm(name, list(overrides), [s for s in (arm_seeds or all_seeds) if s in all_seeds]))
    if not arms:
        raise ConfigError(f"{path}: no arms")
    target = spec.get("target") or {}
    cfg = load_config(folder)            # the experiment must load, and each arm's overrides with it
    buckets = list(cfg.task.buckets) or ["all"]
    for arm in arms:
        if not any("{output_dir}" in o for o in arm.overrides):   # else checked when it runs, after prepare
            load_config(folder, arm.overrides)
    # Default target: the first arm, on the last bucket (list buckets easiest first).
    study = Study(folder, all_seeds, arms, str(target.get("bucket", buckets[-1])), str(target.get("arm", arms[0].name)),
                  prepare)
    if study.target_arm not in {a.name for a in arms}:
        raise ConfigError(f"{path}: target.arm {study.target_arm!r} is not an arm ({[a.name for a in arms]})")
    if only:
        missing = set(only) - {a.name for a in arms}
        if missing:
            raise ConfigError(f"--arms: {sorted(missing)} are not arms of {path}")
        study.arms = [a for a in arms if a.name in only]
    if study.target_bucket not in buckets:
        raise ConfigError(f"{path}: target.bucket {study.target_bucket!r} is not a bucket ({buckets})")
    return study


# ---------------------------------------------------------------------------------------- running
def metrics_of(run_dir: Path) -> list[dict]:
    path = run_dir / "metrics.jsonl"
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()] if path.is_file() else []


def finished(run_dir: Path, steps: int) -> bool:
    rows = metrics_of(run_dir)
    return bool(rows) and rows[-1]["step"] >= steps


def warmstart_key(folder: Path, seed: int) -> str:
    """Folders whose experiments warm-start alike (same resolved config but for what arms change)
    share one warm-start per seed: a short hash of that config."""
    cfg = load_config(folder, [f"seed={seed}"])
    cfg.experiment, cfg.run_name, cfg.output_dir, cfg.trainer.steps, cfg.trainer.threads = "", "", "", 0, 0
    cfg.method = type(cfg.method)()      # arms choose the method
    return hashlib.sha1(to_yaml(cfg).encode()).hexdigest()[:10]


def run_all(study: Study, output_dir: Path, jobs: int, fresh: bool) -> None:
    cfg = load_config(study.folder)
    experiment, warm, total = cfg.experiment, cfg.warmstart.steps, cfg.warmstart.steps + cfg.trainer.steps
    base = output_dir / experiment
    threads = max(1, (os.cpu_count() or 1) // jobs)
    log_dir = base / "logs"
    log_dir.mkdir(parents=True, exist_ok=True)

    def train(run: str, args: list[str], experiment_name: str) -> None:
        with (log_dir / f"{run}.log").open("w") as log:
            code = subprocess.call([sys.executable, "-m", "rl.train", str(study.folder), f"output_dir={output_dir}",
                                    f"experiment={experiment_name}", f"trainer.threads={threads}", f"run_name={run}",
                                    *args], stdout=log, stderr=subprocess.STDOUT)
        if code:
            raise RuntimeError(f"run {run} failed (exit {code}); its output: {log_dir / f'{run}.log'}")

    warm_dirs = {seed: output_dir / WARM / f"{warmstart_key(study.folder, seed)}-s{seed}" for seed in study.seeds}

    def warmstart(seed: int) -> None:
        run = warm_dirs[seed]
        if fresh or not finished(run, warm):
            shutil.rmtree(run, ignore_errors=True)
            train(run.name, [f"seed={seed}", "trainer.steps=0"], WARM)
        gap = run / "teacher_gap.json"
        if fresh or not gap.is_file():
            with (log_dir / f"warmstart-s{seed}-gap.log").open("w") as log:
                code = subprocess.call([sys.executable, "-m", "rl.teacher_gap", str(run), "--seed", str(seed),
                                        "--attempts", str(cfg.rollout.attempts_per_prompt), "--out", str(gap)],
                                       stdout=log, stderr=subprocess.STDOUT)
            if code:
                raise RuntimeError(f"teacher gap of {run} failed; its output: {log_dir / f'warmstart-s{seed}-gap.log'}")
        base.mkdir(parents=True, exist_ok=True)
        shutil.copy(gap, base / f"teacher_gap-s{seed}.json")

    def prepare(folder: Path) -> None:
        """Train a folder the arms need (e.g. their teacher) with its own config, once."""
        own = load_config(folder)
        run = output_dir / own.experiment / own.run_name
        if not own.run_name:
            raise ConfigError(f"{folder}/config.yaml: a prepared experiment needs a fixed run_name")
        if fresh or not finished(run, own.warmstart.steps + own.trainer.steps):
            shutil.rmtree(run, ignore_errors=True)
            with (log_dir / f"prepare-{own.experiment}.log").open("w") as log:
                code = subprocess.call([sys.executable, "-m", "rl.train", str(folder), f"output_dir={output_dir}",
                                        f"trainer.threads={threads}"], stdout=log, stderr=subprocess.STDOUT)
            if code:
                raise RuntimeError(f"preparing {folder} failed (exit {code}); its output: {log.name}")

    def arm_run(arm: Arm, seed: int) -> None:
        run = base / f"{arm.name}-s{seed}"
        if not fresh and finished(run, total):
            return
        shutil.rmtree(run, ignore_errors=True)
        overrides = [o.replace("{output_dir}", str(output_dir)) for o in arm.overrides]
        # The same warm-start, RL steps and overrides make the same run (fresh runs are bit-identical):
        # another folder's finished one (e.g. every folder's `grpo`) is copied, not run again.
        key = json.dumps([warm_dirs[seed].name, cfg.trainer.steps, threads, sorted(overrides)])
        twin = next((p.parent for p in output_dir.glob(f"*/*-s{seed}/{RUN_KEY}")
                     if p.read_text() == key and finished(p.parent, total)), None)
        if twin is not None and not fresh:
            shutil.copytree(twin, run)
            return
        shutil.copytree(warm_dirs[seed], run, ignore=shutil.ignore_patterns("teacher_gap.json"))
        train(run.name, ["resume=true", f"trainer.steps={cfg.trainer.steps}", *overrides], experiment)
        (run / RUN_KEY).write_text(key)

    tasks = [(arm, seed) for seed in study.seeds for arm in study.arms if seed in arm.seeds]
    with ThreadPoolExecutor(jobs) as pool, tqdm(total=len(study.prepare) + len(study.seeds) + len(tasks), unit="run",
                                                 desc=f"reproduce {experiment}") as bar:
        def done(future):
            bar.update(1)

        prepared = [pool.submit(prepare, folder) for folder in study.prepare]
        for future in prepared:
            future.add_done_callback(done)
        warm_futures = {}
        for seed in study.seeds:
            warm_futures[seed] = pool.submit(warmstart, seed)
            warm_futures[seed].add_done_callback(done)
        futures = []
        for arm, seed in tasks:
            # Each arm waits for its seed's warm-start (submitted earlier, so never a deadlock).
            futures.append(pool.submit(lambda a=arm, s=seed: ([f.result() for f in prepared], warm_futures[s].result(),
                                                            arm_run(a, s))))
            futures[-1].add_done_callback(done)
        errors = [f.exception() for f in [*prepared, *warm_futures.values(), *futures] if f.exception()]
    if errors:
        raise RuntimeError("; ".join(str(e) for e in errors))


# ---------------------------------------------------------------------------------------- summary
def accuracy_key(bucket: str, buckets: list[str]) -> str:
    return "eval/accuracy" if buckets == ["all"] else f"eval/accuracy/{bucket}"


def run_summary(run_dir: Path, warm: int, buckets: list[str]) -> dict:
    rows = metrics_of(run_dir)
    at = {r["step"]: r for r in rows}
    start = {k: at[warm].get(f"budget/{k}_tokens_total", 0.0) for k in ("generated", "scored", "trained")}
    evals = [r for r in rows if "eval/accuracy" in r and r["step"] >= warm]
    curve = {"step": [r["step"] for r in evals],
             "generated": [r.get("budget/generated_tokens_total", 0.0) - start["generated"] for r in evals],
             **{b: [r[accuracy_key(b, buckets)] for r in evals] for b in buckets}}
    last = rows[-1]
    return {"curve": curve,
            "warmstart_end": {b: curve[b][0] for b in buckets},
            "final": {b: curve[b][-1] for b in buckets},
            "peak": {b: max(curve[b][1:] or curve[b]) for b in buckets},
            "tokens": {k: last.get(f"budget/{k}_tokens_total", 0.0) - start[k] for k in start},
            "rl_seconds": sum(r.get("time/step_s", 0.0) for r in rows if r["step"] > warm)}


def reach(curve: dict, bucket: str, target: float) -> tuple[float | None, float | None]:
    """(RL steps, generated tokens) at the first evaluation at or above target; None if never."""
    for i, acc in enumerate(curve[bucket]):
        if i > 0 and acc >= target - 1e-9:
            return curve["step"][i] - curve["step"][0], curve["generated"][i]
    return None, None


def spread(values: list[float]) -> dict:
    values = [v for v in values if v is not None]
    if not values:
        return {"mean": None, "std": None, "n": 0}
    return {"mean": statistics.fmean(values), "std": statistics.stdev(values) if len(values) > 1 else 0.0,
            "n": len(values)}


def summarize(study: Study, output_dir: Path) -> dict:
    cfg = load_config(study.folder)
    base, warm = output_dir / cfg.experiment, cfg.warmstart.steps
    buckets = list(cfg.task.buckets) or ["all"]
    runs = {arm.name: {s: run_summary(base / f"{arm.name}-s{s}", warm, buckets) for s in arm.seeds
                       if finished(base / f"{arm.name}-s{s}", warm + cfg.trainer.steps)} for arm in study.arms}
    reference = runs.get(study.target_arm) or {}
    ref_tokens = spread([r["tokens"]["generated"] for r in reference.values()])["mean"]
    targets = {}
    for b in buckets:
        final = spread([r["final"][b] for r in reference.values()])["mean"]
        start = spread([r["warmstart_end"][b] for r in reference.values()])["mean"]
        # A reference that ends no better than it started sets no target: "reaching" it means nothing.
        targets[b] = {"accuracy": final, "reference_warmstart_end": start,
                      "meaningful": final is not None and start is not None and final > start}
    gaps = {s: json.loads((base / f"teacher_gap-s{s}.json").read_text()) for s in study.seeds
            if (base / f"teacher_gap-s{s}.json").is_file()}
    arms = {}
    for name, per_seed in runs.items():
        if not per_seed:
            continue
        entry = {"seeds": sorted(per_seed)}
        for field in ("warmstart_end", "final", "peak"):
            entry[field] = {b: spread([r[field][b] for r in per_seed.values()]) for b in buckets}
        entry["tokens"] = {k: spread([r["tokens"][k] for r in per_seed.values()]) for k in ("generated", "scored", "trained")}
        entry["rl_seconds"] = spread([r["rl_seconds"] for r in per_seed.values()])
        entry["to_target"] = {}
        for b, t in targets.items():
            if not t["meaningful"]:
                continue
            reached = [reach(r["curve"], b, t["accuracy"]) for r in per_seed.values()]
            entry["to_target"][b] = {"steps": spread([v[0] for v in reached]),
                                     "generated": spread([v[1] for v in reached]),
                                     "reached": sum(v[0] is not None for v in reached),
                                     # over the seeds that reach it; "reached" says how many did
                                     "fraction_of_reference_tokens": spread(
                                         [v[1] / ref_tokens for v in reached if v[1] is not None and ref_tokens])}
        entry["curves"] = {s: r["curve"] for s, r in per_seed.items()}
        arms[name] = entry
    prepared = {}
    for folder in study.prepare:          # e.g. a teacher: its final held-out accuracy per bucket
        own = load_config(folder)
        rows = [r for r in metrics_of(output_dir / own.experiment / own.run_name) if "eval/accuracy" in r]
        if rows:
            prepared[own.experiment] = {"step": rows[-1]["step"],
                                        **{b: rows[-1][accuracy_key(b, buckets)] for b in buckets}}
    return {"experiment": cfg.experiment, "buckets": buckets, "warmstart_steps": warm, "rl_steps": cfg.trainer.steps,
            "prepared": prepared,
            "target": {"bucket": study.target_bucket, "arm": study.target_arm, **targets[study.target_bucket],
                       "per_bucket": targets, "reference_generated_tokens": ref_tokens},
            "teacher_gap": gaps, "arms": arms,
            "made": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime())}


def _pm(s: dict, scale: float = 1.0, digits: int = 3) -> str:
    if s["mean"] is None:
        return "—"
    return f"{s['mean'] * scale:.{digits}f} ± {s['std'] * scale:.{digits}f}"


def results_markdown(summary: dict) -> str:
    buckets, target = summary["buckets"], summary["target"]
    tb = target["bucket"]
    lines = [f"Made by `scripts/reproduce.sh` on {summary['made']}; data: `results/summary.json`, figure: "
             "`results.png`. Held-out accuracy (greedy, per bucket), mean ± std over seeds; tokens are the RL "
             "phase's (M = millions).", ""]
    lines += ["| arm | seeds | " + " | ".join(f"final {b}" for b in buckets) + f" | peak {tb} | generated | scored | "
              f"to reach {target['accuracy'] or 0:.3f} on {tb}: steps | generated | × {target['arm']}'s tokens | s/step |",
              "|---|---|" + "---|" * len(buckets) + "---|---|---|---|---|---|---|"]
    for name, a in summary["arms"].items():
        t = a["to_target"].get(tb, {})
        n = len(a["seeds"])
        lines.append(
            f"| `{name}` | {n} | " + " | ".join(_pm(a["final"][b]) for b in buckets) + f" | {_pm(a['peak'][tb])} | "
            f"{_pm(a['tokens']['generated'], 1e-6, 2)}M | {_pm(a['tokens']['scored'], 1e-6, 2)}M | "
            + (f"{_pm(t['steps'], 1, 0)} ({t['reached']}/{n}) | {_pm(t['generated'], 1e-6, 2)}M | "
               f"{_pm(t['fraction_of_reference_tokens'], 1, 2)} |" if t else "— | — | — |")
            + f" {_pm(a['rl_seconds'], 1 / max(1, summary['rl_steps']), 2)} |")
    if target["accuracy"] is not None and not target["meaningful"]:
        lines += ["", f"No target: `{target['arm']}` ends at {target['accuracy']:.3f} on `{tb}`, no better than where "
                  f"warm-start left it ({target['reference_warmstart_end']:.3f}), so reaching its final accuracy means "
                  "nothing and the to-reach columns are empty."]
    others = [b for b, t in target["per_bucket"].items() if b != tb and t["meaningful"]]
    if others:
        lines += ["", f"Every bucket where `{target['arm']}` improved on warm-start: generated tokens to reach its mean "
                  f"final accuracy there, as a multiple of its own generated tokens (seeds that reached it / seeds).", "",
                  "| arm | " + " | ".join(f"{b} (≥ {target['per_bucket'][b]['accuracy']:.3f})" for b in others) + " |",
                  "|---|" + "---|" * len(others)]
        for name, a in summary["arms"].items():
            cells = []
            for b in others:
                t = a["to_target"][b]
                cells.append(f"{_pm(t['fraction_of_reference_tokens'], 1, 2)} ({t['reached']}/{len(a['seeds'])})")
            lines.append(f"| `{name}` | " + " | ".join(cells) + " |")
    if summary.get("prepared"):
        lines += ["", "Prepared runs (`prepare` in study.yaml), final held-out accuracy per bucket: " + "; ".join(
            f"`{name}` " + ", ".join(f"{b} {acc:.3f}" for b, acc in r.items() if b != "step")
            for name, r in summary["prepared"].items()) + "."]
    if summary["teacher_gap"]:
        lines += ["", "Teacher gap of the warm-started student (`rl/teacher_gap.py`, before RL), mean over seeds: "
                  "plain accuracy and pass@G of sampled attempts, the share of problems whose attempts all fail, and per "
                  "hint kind the accuracy gained when each failed attempt is retried once with that hint (in brackets: "
                  "the share of all-fail problems a hinted retry solves).", ""]
        gaps = list(summary["teacher_gap"].values())
        kinds = [k for k in next(iter(gaps[0].values())) if k != "plain"]
        lines += ["| bucket | plain | pass@G | all-fail | " + " | ".join(kinds) + " |",
                  "|---|---|---|---|" + "---|" * len(kinds)]
        for b in gaps[0]:
            mean = lambda kind, key: statistics.fmean(g[b][kind][key] for g in gaps)
            lines.append(f"| {b} | {mean('plain', 'accuracy'):.3f} | {mean('plain', 'pass@G'):.3f} | "
                         f"{mean('plain', 'all_fail'):.3f} | " + " | ".join(
                             f"{mean(k, 'gap'):+.3f} ({mean(k, 'rescued_all_fail'):.2f})" for k in kinds) + " |")
    return "\n".join(lines)


def write_readme(folder: Path, table: str) -> None:
    readme = folder / "README.md"
    text = readme.read_text() if readme.is_file() else f"# {folder.name}\n"
    block = f"{BEGIN}\n{table}\n{END}"
    if BEGIN in text and END in text:
        head, rest = text.split(BEGIN, 1)
        text = head + block + rest.split(END, 1)[1]
    else:
        text = text.rstrip("\n") + f"\n\n## Results\n\n{block}\n"
    readme.write_text(text)


def plot(summary: dict, path: Path) -> None:
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    import numpy as np

    buckets = summary["buckets"]
    fig, axes = plt.subplots(1, len(buckets), figsize=(4.5 * len(buckets), 3.6), squeeze=False)
    for ax, b in zip(axes[0], buckets):
        for name, a in summary["arms"].items():
            curves = list(a["curves"].values())
            width = min(len(c["step"]) for c in curves)
            x = np.mean([c["generated"][:width] for c in curves], axis=0) / 1e6
            y = np.array([c[b][:width] for c in curves])
            ax.plot(x, y.mean(0), label=f"{name} ({len(curves)})")
            if len(curves) > 1:
                ax.fill_between(x, y.mean(0) - y.std(0, ddof=1), y.mean(0) + y.std(0, ddof=1), alpha=0.15)
        ax.set_title(f"{summary['experiment']}: {b}")
        ax.set_xlabel("generated tokens, RL phase (M)")
        ax.set_ylabel("held-out accuracy")
    axes[0][-1].legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


OVERVIEW_BEGIN, OVERVIEW_END = "<!-- studies:begin -->", "<!-- studies:end -->"


def overview(folders: list[Path]) -> str:
    """One line per study folder for the top-level README: the reference arm and each other arm's
    final accuracy on the target bucket (mean ± std over seeds), and the folder's verdict (the bold
    start of its README's line "**Verdict: ...** why")."""
    lines = ["| study | target bucket | arms: final accuracy (mean ± std over seeds) | verdict |", "|---|---|---|---|"]
    for folder in folders:
        path = folder / "results" / "summary.json"
        if not path.is_file():
            continue
        summary = json.loads(path.read_text())
        bucket = summary["target"]["bucket"]
        arms = "; ".join(f"`{name}` {_pm(a['final'][bucket])} (n={len(a['seeds'])})" for name, a in summary["arms"].items())
        readme = (folder / "README.md").read_text() if (folder / "README.md").is_file() else ""
        # The bold verdict may wrap over several lines of the README.
        found = re.search(r"^\*\*Verdict:?\s*(.*?)\*\*", readme, re.MULTILINE | re.DOTALL)
        verdict = " ".join(found.group(1).split()).strip(" .") if found else ""
        lines.append(f"| [{folder.name}](experiments/{folder.name}/) | {bucket} | {arms} | {verdict} |")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m rl.study", description=__doc__.splitlines()[0])
    parser.add_argument("experiment", help="folder with config.yaml and study.yaml")
    parser.add_argument("--seeds", default=None, help="comma-separated, e.g. 0,1,2 (default: study.yaml's)")
    parser.add_argument("--arms", default=None, help="comma-separated subset of the arms (default: all)")
    parser.add_argument("--jobs", type=int, default=2, help="runs at a time (default 2: one per core here)")
    parser.add_argument("--output_dir", default="runs/study")
    parser.add_argument("--fresh", action="store_true", help="rerun finished runs too")
    parser.add_argument("--summary-only", action="store_true", help="only rebuild the table and figure")
    args = parser.parse_args(argv)
    if args.experiment == "overview":
        # python -m rl.study overview: the top-level README's table across every study folder
        root = Path(__file__).resolve().parents[1]
        folders = sorted(p.parent for p in (root / "experiments").glob("*/study.yaml"))
        readme = root / "README.md"
        text = readme.read_text()
        if OVERVIEW_BEGIN not in text:
            print(f"{readme} has no {OVERVIEW_BEGIN} ... {OVERVIEW_END} block", file=sys.stderr)
            return 2
        head, rest = text.split(OVERVIEW_BEGIN, 1)
        readme.write_text(f"{head}{OVERVIEW_BEGIN}\n{overview(folders)}\n{OVERVIEW_END}{rest.split(OVERVIEW_END, 1)[1]}")
        print(overview(folders))
        return 0
    try:
        study = load_study(args.experiment, [int(s) for s in args.seeds.split(",")] if args.seeds else None,
                           args.arms.split(",") if args.arms else None)
    except ConfigError as err:
        print(f"config error: {err}", file=sys.stderr)
        return 2
    output_dir = Path(args.output_dir).resolve()
    if not args.summary_only:
        run_all(study, output_dir, args.jobs, args.fresh)
    # The table covers every arm of study.yaml, on every seed that has a finished run.
    summary = summarize(load_study(args.experiment), output_dir)
    results = study.folder / "results"
    results.mkdir(exist_ok=True)
    (results / "summary.json").write_text(json.dumps(summary, indent=1) + "\n")
    table = results_markdown(summary)
    write_readme(study.folder, table)
    if summary["arms"]:
        plot(summary, study.folder / "results.png")
    print(table)
    return 0


if __name__ == "__main__":
    sys.exit(main())
