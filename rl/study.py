"""A paper-reproduction study: every arm x seed an experiment folder declares, then its results table.

    python -m rl.study EXPERIMENT_DIR [--seeds 0,1,2] [--arms a,b] [--jobs 2] [--fresh]
    (scripts/reproduce.sh EXPERIMENT_DIR ... runs this)
    python -m rl.study overview      (the top-level README's table across the study folders)

The folder holds `config.yaml` (the experiment) and `study.yaml` (the arms):

    seeds: [0, 1, 2]
    target: {bucket: hard, arm: grpo}     # "reach the reference arm's mean final accuracy on that bucket"
    prepare: [teacher]                    # optional: experiment folders (relative) trained first, once,
                                          # e.g. a teacher model the arms load
    gate: {bucket: hidden, kind: rule, min_over_none: 0.3}   # optional: a seed's arms run only when its
                                          # warm-start's hinted retry beats the plain one by this (teacher gap;
                                          # `problems: N` measures it on the first N held-out problems of
                                          # each bucket instead of all: multi-message episodes are slow)
    arms:                                 # name -> overrides applied to the RL phase; "{output_dir}" in
                                          # an override is the study's output folder
      grpo: [method.name=grpo]
      guide: [method.name=corrected_replay]
      grpo_lr3e-4: {overrides: [method.name=grpo, trainer.lr=3.0e-4], seeds: [0]}   # e.g. an lr sweep
      grpo_mixed: [method.name=grpo, "task.mix={hard: 1, easy: 1}"]   # the one task key an arm may set:
                                          # RL's bucket draw (the warm-start is shared)
      oracle: {kind: oracle}              # an arm kind (KINDS): supervised on the RL problems' reference
                                          # answers (rl/methods/oracle.py), + the arm's own overrides

Per seed, warm-start runs once (`trainer.steps=0`, which checkpoints at its end) and the teacher gap
of the warm-started student is measured (rl/teacher_gap.py); every arm then resumes a copy of that
run with its overrides and the experiment's RL phase (`trainer.steps` and `trainer.eval_at`, passed
as the folder says: a resumed run otherwise keeps its warm-start's config), so the arms share their
starting point exactly. Folders whose configs warm-start alike (equal but for the RL phase and the
method) share the warm-start too
(`runs/study/_warmstart/<config hash>-s<seed>`), and an arm identical to another folder's finished
arm (same warm-start, steps and overrides, e.g. `grpo`) is copied from it. Runs go to `runs/study/<experiment>/<arm>-s<seed>`,
`--jobs` at a time (cores / jobs torch threads each); a finished run is reused, an unfinished one is
started again (`--fresh` starts all again). Then, from the runs' metrics.jsonl (every arm of
study.yaml, on study.yaml's seeds that have a finished run):

    results/summary.json   per arm: per seed and mean, sample std and n over seeds (rl/stats.py), per
                           bucket: accuracy at the end of warm-start, final and peak (RL) held-out
                           accuracy, and the final and peak `eval/reference_logprob` and final
                           `eval/pass@k` when the runs log them; generated, scored and trained tokens
                           of the RL phase; steps and generated tokens to reach the target; its
                           `kind` ("" or a KINDS key) and `config_hash`; `vs_baseline` (every arm but
                           the target arm): per field and bucket, the paired per-seed
                           difference from the target arm with its 95% interval. Also the teacher gap
                           per seed, the `commit` (and `dirty`) the summary was made at, and the
                           `eval_sets` the runs were measured on (each set's digest, rl/contamination.py)
    results.png            held-out accuracy against generated tokens, per bucket, mean and spread
    README.md              the tables (rl/study_tables.py), between `<!-- reproduce:begin -->` and
                           `<!-- reproduce:end -->` (rerunning replaces them)
"""
from __future__ import annotations

import argparse
import hashlib
import json
import os
import shutil
import subprocess
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path

import yaml
from tqdm import tqdm

from rl.config import ConfigError, to_yaml
from rl.configure import load_config
from rl.contamination import set_digest
from rl.runlog import read_log
from rl.stats import paired_difference, spread
from rl.study_tables import BEGIN, END, OVERVIEW_BEGIN, OVERVIEW_END, overview, plot, results_markdown, write_readme

WARM = "_warmstart"       # runs/study/_warmstart/<config hash>-s<seed>: shared by every folder that warm-starts alike
RUN_KEY = "study_key.json"  # in an arm's run folder: what made it (warm-start, RL steps, threads, overrides)
SHARED = ("seed", "task.", "student.", "warmstart.", "output_dir", "run_name", "resume")   # not per arm
# ...except the RL phase's bucket draw: an arm resumes the shared warm-start, so its own `task.mix`
# changes only which problems RL sees (e.g. base problems mixed in against forgetting).
PER_ARM_TASK = ("task.mix",)
# Arm kinds (`name: {kind: K}` in study.yaml): the overrides a kind stands for, before the arm's own.
KINDS = {"oracle": ["method.name=oracle"]}     # supervised on the references (rl/methods/oracle.py)
ARM_KEYS = {"overrides", "seeds", "kind"}


@dataclass
class Arm:
    name: str
    overrides: list[str]
    seeds: list[int]
    kind: str = ""                   # "" for an arm given by its overrides alone, else a key of KINDS


@dataclass
class Study:
    folder: Path
    seeds: list[int]
    arms: list[Arm]
    target_bucket: str
    target_arm: str
    prepare: list[Path]
    gate: dict | None = None       # {bucket, kind, min_over_none[, problems]}: a seed's arms run only past it


def load_study(folder: str | Path, seeds: list[int] | None = None, only: list[str] | None = None) -> Study:
    folder = Path(folder)
    path = folder / "study.yaml"
    if not path.is_file():
        raise ConfigError(f"{path}: no such file (a study folder declares its arms in study.yaml)")
    spec = yaml.safe_load(path.read_text()) or {}
    unknown = set(spec) - {"seeds", "target", "arms", "prepare", "gate"}
    if unknown:
        raise ConfigError(f"{path}: unknown keys {sorted(unknown)} (study.yaml has seeds, target, prepare, gate, arms)")
    prepare = [folder / p for p in spec.get("prepare") or []]
    for p in prepare:
        load_config(p)                   # a folder that does not load stops the study before any run
    all_seeds = seeds or [int(s) for s in spec.get("seeds", [0, 1, 2])]
    arms = [_arm(path, name, arm, all_seeds) for name, arm in (spec.get("arms") or {}).items()]
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
    study.gate = _gate(path, spec.get("gate"), buckets)
    return study


def _gate(path: Path, gate, buckets: list[str]) -> dict | None:
    """study.yaml's `gate: {bucket, kind, min_over_none}`: the warm-started student's hinted retry
    (teacher-gap kind, rl/teacher_gap.py) must beat the plain retry by min_over_none on bucket."""
    if gate is None:
        return None
    from rl.teacher_gap import KINDS as GAP_KINDS

    if not isinstance(gate, dict) or not {"bucket", "kind", "min_over_none"} <= set(gate) \
            or set(gate) - {"bucket", "kind", "min_over_none", "problems"}:
        raise ConfigError(f"{path}: gate is {{bucket, kind, min_over_none[, problems]}}, got {gate!r}")
    problems = gate.get("problems")
    if problems is not None and (not isinstance(problems, int) or isinstance(problems, bool) or problems < 1):
        raise ConfigError(f"{path}: gate.problems={problems!r} must be a positive number of held-out problems")
    if gate["bucket"] not in buckets:
        raise ConfigError(f"{path}: gate.bucket {gate['bucket']!r} is not a bucket ({buckets})")
    if gate["kind"] not in GAP_KINDS or gate["kind"] == "none":
        raise ConfigError(f"{path}: gate.kind {gate['kind']!r}: one of {[k for k in GAP_KINDS if k != 'none']}")
    return {"bucket": str(gate["bucket"]), "kind": str(gate["kind"]), "min_over_none": float(gate["min_over_none"]),
            **({"problems": problems} if problems is not None else {})}


def gate_margin(gate: dict, gap: dict) -> float | None:
    """What the gate reads in a warm-start's teacher gap: its kind's retry over the plain retry."""
    return gap[gate["bucket"]][gate["kind"]].get("over_none", {}).get("mean")


def check_gate(gate: dict | None, gap: dict, where: str) -> None:
    """Raises GateError when a warm-start's teacher gap (teacher_gap.json) falls short of the gate."""
    if gate is None:
        return
    over = gate_margin(gate, gap)
    if over is None or over < gate["min_over_none"]:
        # A hinted retry can add at most what the plain retry leaves unsolved: where that is below the
        # gate (a rule a blind guess often hits), the gate is what is wrong, not the warm-start.
        ceiling = 1.0 - gap[gate["bucket"]].get("none", {}).get("accuracy", 0.0)
        why = (f"no retry can beat the plain one (accuracy {1 - ceiling:.3f}) by more than {ceiling:.3f} here: "
               "lower gate.min_over_none" if ceiling < gate["min_over_none"] else
               "the warm-started student does not read the hint well enough for this study to answer its "
               "question; fix the warm-start first")
        raise GateError(f"{where}: the {gate['kind']} retry beats the plain retry on {gate['bucket']} by {over} "
                        f"< gate.min_over_none={gate['min_over_none']:g}: {why}")


class GateError(RuntimeError):
    pass


def _arm(path: Path, name: str, arm, all_seeds: list[int]) -> Arm:
    """One arm of study.yaml: a list of overrides, or {overrides, seeds, kind}."""
    if isinstance(arm, list):
        arm = {"overrides": arm}
    if not isinstance(arm, dict) or set(arm) - ARM_KEYS:
        raise ConfigError(f"{path}: arm {name!r} is a list of overrides or a mapping with {sorted(ARM_KEYS)}")
    kind, own = str(arm.get("kind") or ""), list(arm.get("overrides") or [])
    if kind and kind not in KINDS:
        raise ConfigError(f"{path}: arm {name!r}: kind {kind!r} is unknown; choose one of {sorted(KINDS)}")
    if kind and any(o.startswith("method.name=") for o in own):
        raise ConfigError(f"{path}: arm {name!r}: a {kind} arm's method is its kind's; drop method.name")
    def per_arm(key: str) -> bool:
        return any(key == k or key.startswith(k + ".") for k in PER_ARM_TASK)

    bad = [o for o in own if "=" not in o
           or (o.split("=", 1)[0].startswith(SHARED) and not per_arm(o.split("=", 1)[0].strip()))]
    if bad:
        raise ConfigError(f"{path}: arm {name!r}: overrides {bad} are not key=value or change what the arms "
                          "share (seed, task but task.mix, student, warm-start, run folder)")
    seeds = [s for s in (arm.get("seeds") or all_seeds) if s in all_seeds]
    return Arm(name, [*KINDS.get(kind, []), *own], seeds, kind)


# ---------------------------------------------------------------------------------------- running
def metrics_of(run_dir: Path) -> list[dict]:
    return read_log(run_dir / "metrics.jsonl")


def finished(run_dir: Path, steps: int) -> bool:
    rows = metrics_of(run_dir)
    return bool(rows) and rows[-1]["step"] >= steps


def warmstart_key(folder: Path, seed: int) -> str:
    """Folders whose experiments warm-start alike (same resolved config but for what arms change)
    share one warm-start per seed: a short hash of that config."""
    cfg = load_config(folder, [f"seed={seed}"])
    cfg.experiment, cfg.run_name, cfg.output_dir, cfg.trainer.steps, cfg.trainer.threads = "", "", "", 0, 0
    cfg.trainer.eval_at = []             # RL steps: the warm-start never reaches them
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
                subset = [f"task.eval_size={study.gate['problems']}"] if study.gate and "problems" in study.gate else []
                code = subprocess.call([sys.executable, "-m", "rl.teacher_gap", str(run), *subset, "--seed", str(seed),
                                        "--attempts", str(cfg.rollout.attempts_per_prompt), "--out", str(gap)],
                                       stdout=log, stderr=subprocess.STDOUT)
            if code:
                raise RuntimeError(f"teacher gap of {run} failed; its output: {log_dir / f'warmstart-s{seed}-gap.log'}")
        base.mkdir(parents=True, exist_ok=True)
        shutil.copy(gap, base / f"teacher_gap-s{seed}.json")
        check_gate(study.gate, json.loads(gap.read_text()), f"seed {seed} ({run})")

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
        # A resumed run keeps its warm-start's config: what the warm-start key leaves out (the RL
        # phase's length and extra evaluations) is passed as the folder says.
        rl_phase = [f"trainer.steps={cfg.trainer.steps}", f"trainer.eval_at={list(cfg.trainer.eval_at)}"]
        # The same warm-start, RL phase and overrides make the same run (fresh runs are bit-identical):
        # another folder's finished one (e.g. every folder's `grpo`) is copied, not run again.
        key = json.dumps([warm_dirs[seed].name, cfg.trainer.steps, threads, sorted(overrides)]
                         + ([list(cfg.trainer.eval_at)] if cfg.trainer.eval_at else []))
        twin = next((p.parent for p in output_dir.glob(f"*/*-s{seed}/{RUN_KEY}")
                     if p.read_text() == key and finished(p.parent, total)), None)
        if twin is not None and not fresh:
            shutil.copytree(twin, run)
            return
        shutil.copytree(warm_dirs[seed], run, ignore=shutil.ignore_patterns("teacher_gap.json"))
        train(run.name, ["resume=true", *rl_phase, *overrides], experiment)
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
    # A seed stopped by the gate is a result (the summary reports it), not a failed study, unless it
    # leaves no seed to compare on. Anything else is an error.
    others = [e for e in errors if not isinstance(e, GateError)]
    stopped = {s for s, f in warm_futures.items() if isinstance(f.exception(), GateError)}
    if others or (stopped and stopped == set(study.seeds)):
        raise RuntimeError("; ".join(dict.fromkeys(str(e) for e in errors)))   # a seed's arms share its warm-start's
    for seed in sorted(stopped):
        print(f"warning: {warm_futures[seed].exception()}; its arms did not run", file=sys.stderr)


# ---------------------------------------------------------------------------------------- summary
# Evaluations read besides accuracy when the runs log them (the `reference_logprob` eval suite):
# summary field -> metric; with one bucket the metric is unsuffixed, else "<metric>/<bucket>".
EXTRA = {"reference_logprob": "eval/reference_logprob", "pass@k": "eval/pass@k"}
# vs_baseline fields: accuracy at the first RL evaluation, final and peak, and reference_logprob's when logged.
PAIRED = ("first", "final", "peak", "reference_logprob_final", "reference_logprob_peak")


def eval_key(metric: str, bucket: str, buckets: list[str]) -> str:
    return metric if len(buckets) == 1 else f"{metric}/{bucket}"


def accuracy_key(bucket: str, buckets: list[str]) -> str:
    return eval_key("eval/accuracy", bucket, buckets)


def run_summary(run_dir: Path, warm: int, buckets: list[str]) -> dict:
    rows = metrics_of(run_dir)
    at = {r["step"]: r for r in rows}
    start = {k: at[warm].get(f"budget/{k}_tokens_total", 0.0) for k in ("generated", "scored", "trained")}
    evals = [r for r in rows if "eval/accuracy" in r and r["step"] >= warm]
    curve = {"step": [r["step"] for r in evals],
             "generated": [r.get("budget/generated_tokens_total", 0.0) - start["generated"] for r in evals],
             **{b: [r[accuracy_key(b, buckets)] for r in evals] for b in buckets}}
    last = rows[-1]
    out = {"curve": curve,
           "warmstart_end": {b: curve[b][0] for b in buckets},
           # at the first evaluation of RL: at equal (and small) compute, before a slow arm catches up
           "first": {b: curve[b][min(1, len(curve[b]) - 1)] for b in buckets},
           "final": {b: curve[b][-1] for b in buckets},
           "peak": {b: max(curve[b][1:] or curve[b]) for b in buckets},
           "tokens": {k: last.get(f"budget/{k}_tokens_total", 0.0) - start[k] for k in start},
           "rl_seconds": sum(r.get("time/step_s", 0.0) for r in rows if r["step"] > warm)}
    for field, metric in EXTRA.items():
        logged = [r for r in evals if eval_key(metric, buckets[0], buckets) in r]
        if logged:                        # final and peak (after warm-start, as accuracy's) per bucket
            series = {b: [r[eval_key(metric, b, buckets)] for r in logged] for b in buckets}
            out[field] = {"final": {b: v[-1] for b, v in series.items()},
                          "peak": {b: max(v[1:] or v) for b, v in series.items()}}
    return out


def reach(curve: dict, bucket: str, target: float) -> tuple[float | None, float | None]:
    """(RL steps, generated tokens) at the first evaluation at or above target; None if never."""
    for i, acc in enumerate(curve[bucket]):
        if i > 0 and acc >= target - 1e-9:
            return curve["step"][i] - curve["step"][0], curve["generated"][i]
    return None, None


def paired_values(per_seed: dict, field: str, bucket: str) -> dict:
    """seed -> the run's value of a PAIRED field on `bucket` (reference_logprob_* only where logged)."""
    if field in ("first", "final", "peak"):
        return {s: r[field][bucket] for s, r in per_seed.items()}
    metric, which = field.rsplit("_", 1)
    return {s: r[metric][which][bucket] for s, r in per_seed.items() if metric in r}


def versus(per_seed: dict, baseline: dict, buckets: list[str]) -> dict:
    """field -> bucket -> the paired per-seed difference arm - baseline (rl/stats.py), on the seeds
    both ran: the arms of a seed share its warm-start, so the seed's luck cancels."""
    out = {}
    for field in PAIRED:
        diffs = {b: paired_difference(paired_values(per_seed, field, b), paired_values(baseline, field, b))
                 for b in buckets}
        if any(d["n"] for d in diffs.values()):
            out[field] = diffs
    return out


def arm_entry(per_seed: dict, buckets: list[str], targets: dict, ref_tokens: float | None) -> dict:
    """An arm's spreads over its seeds (rl/stats.py: mean, sample std, n) and its curves."""
    entry = {"seeds": sorted(per_seed)}
    for field in ("warmstart_end", "final", "peak"):
        entry[field] = {b: spread([r[field][b] for r in per_seed.values()]) for b in buckets}
    for field in EXTRA:
        logged = [r[field] for r in per_seed.values() if field in r]
        if logged:
            entry[field] = {which: {b: spread([r[which][b] for r in logged]) for b in buckets}
                            for which in ("final", "peak")}
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
    return entry


# ---------------------------------------------------------------------------------------- provenance
def commit_of(root: Path) -> dict:
    """{"commit": HEAD's sha, "dirty": uncommitted changes (untracked files count)} of the checkout
    holding `root`; both None outside a git checkout (or without git)."""
    def git(*args):
        return subprocess.run(["git", "-C", str(root), *args], capture_output=True, text=True, timeout=60)

    try:
        head, status = git("rev-parse", "HEAD"), git("status", "--porcelain")
    except (OSError, subprocess.SubprocessError):
        return {"commit": None, "dirty": None}
    if head.returncode or status.returncode:
        return {"commit": None, "dirty": None}
    return {"commit": head.stdout.strip(), "dirty": bool(status.stdout.strip())}


def config_hash(folder: Path, arm: Arm, seed: int, output_dir: Path) -> str | None:
    """A short sha of the arm's resolved config (its overrides on the experiment, at `seed`: the
    study's first, so that arms differ by their overrides only), with what only names or places a run
    cleared (as `warmstart_key` does): equal hashes, the same arm. None when the config does not load
    (e.g. a prepared teacher not trained yet); "{output_dir}" in an override is the study's."""
    overrides = [o.replace("{output_dir}", str(output_dir)) for o in arm.overrides]
    try:
        cfg = load_config(folder, [*overrides, f"seed={seed}"])
    except ConfigError:
        return None
    cfg.run_name, cfg.output_dir, cfg.trainer.threads = "", "", 0
    return hashlib.sha1(to_yaml(cfg).encode()).hexdigest()[:10]


def eval_sets(run_dirs: list[Path]) -> dict:
    """Set name -> {"digest", "n"}: the eval sets the runs report (their eval_sets.json), each named by
    rl.contamination's set digest; a set whose runs disagree gets digest None and "by_run"."""
    seen: dict[str, dict[str, str]] = {}
    sizes: dict[str, int] = {}
    for run in run_dirs:
        path = run / "eval_sets.json"
        if path.is_file():
            for name, hashes in json.loads(path.read_text()).items():
                seen.setdefault(name, {})[run.name] = set_digest(hashes)
                sizes[name] = len(hashes)
    out = {}
    for name, by_run in seen.items():
        digests = set(by_run.values())
        out[name] = ({"digest": digests.pop(), "n": sizes[name]} if len(digests) == 1
                     else {"digest": None, "by_run": by_run})
    return out


def summarize(study: Study, output_dir: Path) -> dict:
    cfg = load_config(study.folder)
    base, warm = output_dir / cfg.experiment, cfg.warmstart.steps
    buckets = list(cfg.task.buckets) or ["all"]
    done = {arm.name: [s for s in arm.seeds if finished(base / f"{arm.name}-s{s}", warm + cfg.trainer.steps)]
            for arm in study.arms}
    runs = {name: {s: run_summary(base / f"{name}-s{s}", warm, buckets) for s in seeds} for name, seeds in done.items()}
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
    gate = None
    if study.gate:
        # Every seed's gate reading is reported; the teacher-gap table averages the seeds it let through.
        margins = {s: gate_margin(study.gate, g) for s, g in gaps.items()}
        gate = {**study.gate, "seeds": {s: {"over_none": m, "passed": m is not None and m >= study.gate["min_over_none"]}
                                        for s, m in margins.items()}}
        gaps = {s: g for s, g in gaps.items() if gate["seeds"][s]["passed"]}
    arms = {}
    for arm in study.arms:
        per_seed = runs[arm.name]
        if not per_seed:
            continue
        arms[arm.name] = {"kind": arm.kind, "config_hash": config_hash(study.folder, arm, study.seeds[0], output_dir),
                          **arm_entry(per_seed, buckets, targets, ref_tokens)}
        if arm.name != study.target_arm and reference:
            arms[arm.name]["vs_baseline"] = versus(per_seed, reference, buckets)
    prepared = {}
    for folder in study.prepare:          # e.g. a teacher: its final held-out accuracy per bucket
        own = load_config(folder)
        rows = [r for r in metrics_of(output_dir / own.experiment / own.run_name) if "eval/accuracy" in r]
        if rows:
            prepared[own.experiment] = {"step": rows[-1]["step"],
                                        **{b: rows[-1][accuracy_key(b, buckets)] for b in buckets}}
    return {"experiment": cfg.experiment, **commit_of(Path(__file__).resolve().parents[1]),
            "eval_sets": eval_sets([base / f"{name}-s{s}" for name, seeds in done.items() for s in seeds]),
            "buckets": buckets, "warmstart_steps": warm, "rl_steps": cfg.trainer.steps, "prepared": prepared,
            "target": {"bucket": study.target_bucket, "arm": study.target_arm, **targets[study.target_bucket],
                       "per_bucket": targets, "reference_generated_tokens": ref_tokens},
            "gate": gate, "teacher_gap": gaps, "arms": arms,
            "made": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime())}


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
