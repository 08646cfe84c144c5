"""Mine a finished default run, then train on a mix that keeps what its policy solved sometimes.

    python experiments/mined-curriculum/run.py runs/default/RUN [--seeds 0 1 2] [--steps 600]
    python experiments/mined-curriculum/run.py --summary-only   # the tables again from results/summary.json

1. Mine: `python -m rl.mine RUN --remeasure RUN` keeps the problems the run's policy solved only
   sometimes during RL (0 < pass rate < 1), re-measured on its final checkpoint (16 samples each).
2. Split them by prompt hash: one half is a training source (`task.files.mined`), the other a
   private eval set (`eval.private.mined`), which training refuses by hash (rl/contamination.py).
3. Three arms of experiments/default (1200 warm-start steps on the generator, then 600 RL steps
   with hint_distill), the same steps, prompts and attempts per step (equal generated tokens), each
   seed in --seeds, launched and followed through the experiment API (rl/runs.py):
      plain    the default stream alone
      mined    task.mix {all: 0.7, mined: 0.3}: 30% of the RL problems from the mined training half
      random   the same mix with a file of as many random training-stream problems: the control
               (the same mix and file plumbing, problems not chosen for the policy)
4. results/summary.json and results/summary.md: per arm, mean, sample std (n) and range over seeds
   (rl/stats.py) of the held-out accuracy (final and peak), the private mined set's accuracy, and
   tokens generated; per arm against plain, the paired per-seed difference (the arms of a seed share
   its warm-start) with its 95% interval. summary.json keeps each run's own numbers ("rows"), from
   which --summary-only rebuilds the rest without any run.

Runs go to runs/mined-curriculum/<arm>-s<seed>; a run that already finished is reused
(rl.runs.run_all), so the script picks up where it stopped.
"""
from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent
ROOT = HERE.parents[1]
sys.path.insert(0, str(ROOT))

from rl import runs  # noqa: E402
from rl.stats import fmt, fmt_interval, paired_difference, spread  # noqa: E402

ARMS = ("plain", "mined", "random")
WARMSTART_STEPS = 1200        # experiments/default's: the RL phase starts here
MIX = "{all: 0.7, mined: 0.3}"


def mine(source: Path, out: Path) -> list[dict]:
    if not out.is_file():
        subprocess.run([sys.executable, "-m", "rl.mine", str(source), "--out", str(out), "--remeasure", str(source),
                        "--samples", "16"], cwd=ROOT, check=True)
    return [json.loads(line) for line in out.open()]


def split(mined: list[dict], folder: Path) -> tuple[Path, Path]:
    """Training half and private half, by prompt hash (a fixed split whatever the order)."""
    train, private = folder / "mined-train.jsonl", folder / "mined-private.jsonl"
    halves = ([r for r in mined if int(r["hash"], 16) % 2 == 0], [r for r in mined if int(r["hash"], 16) % 2 == 1])
    for path, records in zip((train, private), halves):
        path.write_text("".join(json.dumps(r) + "\n" for r in records))
    return train, private


def random_file(source: Path, n: int, path: Path) -> Path:
    """n problems of the task's training stream from another seed: the control's file."""
    from rl.configure import load_config
    from rl.tasks import TaskSource

    cfg = load_config(source)
    problems = TaskSource(cfg.task, seed=10_000).next_batch(n)
    path.write_text("".join(json.dumps({"prompt": p.prompt, "answer": p.answer, "entry": p.entry}, default=str) + "\n"
                            for p in problems))
    return path


def arm_overrides(arm: str, train: Path, control: Path) -> list[str]:
    if arm == "plain":
        return []
    return [f"task.files.mined={train if arm == 'mined' else control}", f"task.mix={MIX}"]


def mining_stats(source: Path, mined: list[dict], n_train: int, n_private: int) -> dict:
    """What the mining saw and kept (from the source's problems.jsonl and the mined file)."""
    seen = [json.loads(line)["hash"] for line in (source / "problems.jsonl").open()]
    steps = [json.loads(line) for line in (source / "metrics.jsonl").open()]
    refused = statistics.mean(m.get("data/refused_eval_overlap", 0) for m in steps if m["step"] > 0)
    return {"source": str(source), "source_refused_per_step": refused,
            "appearances": len(seen), "distinct": len(set(seen)), "kept": len(mined),
            "train": n_train, "private": n_private,
            "mean_pass_rate_remeasured": statistics.mean(r["pass_rate"] for r in mined),
            "mean_pass_rate_logged": statistics.mean(r.get("logged_pass_rate", r["pass_rate"]) for r in mined)}


PAIRED = (("final", "held-out end"), ("peak", "held-out peak (RL)"), ("private_final", "private mined end"))


def stats(values):
    """rl/stats.py's spread (mean, sample std, n; no std for one value) and the range; None for none."""
    values = [v for v in values if v is not None]
    if not values:
        return None
    return {**spread(values), "min": min(values), "max": max(values)}


def seed_of(row: dict) -> str:
    return Path(row["run"]).name.rsplit("-s", 1)[-1]


def summarize(rows: dict[str, list[dict]], mining: dict) -> tuple[dict, str]:
    summary = {"mined": mining, "rows": rows, "arms": {}, "vs_plain": {}}
    for arm, per_seed in rows.items():
        summary["arms"][arm] = {key: stats([r[key] for r in per_seed]) for key in per_seed[0] if key != "run"}
        summary["arms"][arm]["runs"] = [r["run"] for r in per_seed]
    by_seed = lambda arm, key: {seed_of(r): r[key] for r in rows[arm]}   # noqa: E731
    for arm in ARMS[1:]:
        summary["vs_plain"][arm] = {key: paired_difference(by_seed(arm, key), by_seed("plain", key)) for key, _ in PAIRED}
    lines = [f"Mined from {mining['source']}: {mining['distinct']} distinct problems in {mining['appearances']} RL "
             f"appearances; kept {mining['kept']} with 0 < pass rate < 1 over 16 re-measured samples (mean "
             f"{mining['mean_pass_rate_remeasured']:.3f}; {mining['mean_pass_rate_logged']:.3f} as logged in RL): "
             f"{mining['train']} to train on, {mining['private']} private.",
             "Training problems refused per step because their hash is in an eval set: "
             + ", ".join(f"{arm} {stats([r['refused_per_step'] for r in rows[arm]])['mean']:.1f}" for arm in rows)
             + f" (the source run, held-out set only: {mining['source_refused_per_step']:.1f}).", "",
             "| arm | seeds | held-out, RL start | held-out end | held-out peak (RL) | private mined, RL start | "
             "private mined end | generated tokens |",
             "|---|---|---|---|---|---|---|---|"]

    def cell(s):
        """mean ± sample std (range); n is the seeds column ("(n=1)" alone for one seed)."""
        if s is None:
            return "—"
        return fmt(s, show_n=False) + ("" if s["n"] == 1 else f" ({s['min']:.3f}..{s['max']:.3f})")

    for arm, s in summary["arms"].items():
        gen = s["generated"]
        lines.append(f"| {arm} | {s['start']['n']} | {cell(s['start'])} | {cell(s['final'])} | {cell(s['peak'])} | "
                     f"{cell(s['private_start'])} | {cell(s['private_final'])} | {gen['mean'] / 1e6:.3f}M |")
    lines += ["", "Per seed (the arms of a seed share their warm-start exactly): held-out end, and the private mined set's end,",
              "", "| seed | RL start | plain | mined | random | mined − plain | random − plain | private: plain / mined / random |",
              "|---|---|---|---|---|---|---|---|"]
    for k in range(len(rows["plain"])):
        p, m, r = (rows[arm][k] for arm in ARMS)
        lines.append(f"| {Path(p['run']).name.split('-s')[-1]} | {p['start']:.3f} | {p['final']:.3f} | {m['final']:.3f} | "
                     f"{r['final']:.3f} | {m['final'] - p['final']:+.3f} | {r['final'] - p['final']:+.3f} | "
                     f"{p['private_final']:.3f} / {m['private_final']:.3f} / {r['private_final']:.3f} |")
    lines += ["", "Paired difference vs plain, per seed, 95% interval (the arm minus plain on each seed; they share the "
              "seed's warm-start): mean [Student-t 95% interval] (n seeds).", "",
              "| arm − plain | " + " | ".join(head for _, head in PAIRED) + " |", "|---|" + "---|" * len(PAIRED)]
    for arm, diffs in summary["vs_plain"].items():
        lines.append(f"| {arm} | " + " | ".join(fmt_interval(diffs[key]) for key, _ in PAIRED) + " |")
    return summary, "\n".join(lines) + "\n"


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("source", type=Path, nargs="?", help="a finished run of experiments/default")
    parser.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2])
    parser.add_argument("--steps", type=int, default=600)
    parser.add_argument("--parallel", type=int, default=2, help="runs at once (one torch thread each)")
    parser.add_argument("--summary-only", action="store_true",
                        help="rebuild summary.json's aggregates and summary.md from its per-run rows; run nothing")
    args = parser.parse_args(argv)
    if args.summary_only:
        saved = json.loads((HERE / "results" / "summary.json").read_text())
        if "rows" not in saved:
            print("results/summary.json has no per-run rows (written before run.py kept them): rerun the arms",
                  file=sys.stderr)
            return 2
        return write(*summarize(saved["rows"], saved["mined"]))
    if args.source is None:
        parser.error("SOURCE is required (a finished run of experiments/default), unless --summary-only")
    source = args.source.resolve()
    if runs.status(source)["state"] != "finished":
        print(f"{source}: not a finished run (python -m rl.runs status {source})", file=sys.stderr)
        return 2
    work = ROOT / "runs" / "mined-curriculum" / "data"
    work.mkdir(parents=True, exist_ok=True)
    mined = mine(source, work / "mined.jsonl")
    train, private = split(mined, work)
    n_train = sum(1 for _ in train.open())
    control = random_file(source, n_train, work / "random.jsonl")
    common = [f"eval.private.mined={private}", "eval.suites=[hinted,private,behaviour]", f"trainer.steps={args.steps}",
              "trainer.threads=1"]
    jobs = [(HERE, [*common, *arm_overrides(arm, train, control), f"seed={seed}", f"run_name={arm}-s{seed}"])
            for seed in args.seeds for arm in ARMS]
    done = dict(zip([(arm, seed) for seed in args.seeds for arm in ARMS], runs.run_all(jobs, parallel=args.parallel)))
    rows = {}
    for arm in ARMS:
        per_seed = []
        for seed in args.seeds:
            run_dir = done[(arm, seed)]
            acc = runs.compare([run_dir], "eval/accuracy")["runs"][0]
            private_acc = runs.compare([run_dir], "eval/private/mined/accuracy")["runs"][0]
            metrics = [json.loads(line) for line in (run_dir / "metrics.jsonl").open()]
            rl_evals = [m for m in metrics if "eval/accuracy" in m and m["step"] >= WARMSTART_STEPS]
            generated = max(m.get("budget/generated_tokens_total", 0) for m in metrics)
            refused = statistics.mean(m.get("data/refused_eval_overlap", 0) for m in metrics if m["step"] > 0)
            per_seed.append({"run": str(run_dir), "start": rl_evals[0]["eval/accuracy"], "final": acc["final"],
                             "peak": max(m["eval/accuracy"] for m in rl_evals),
                             "private_start": rl_evals[0]["eval/private/mined/accuracy"],
                             "private_final": private_acc["final"], "generated": generated,
                             "refused_per_step": refused})
        rows[arm] = per_seed
    return write(*summarize(rows, mining_stats(source, mined, n_train, sum(1 for _ in private.open()))))


def write(summary: dict, table: str) -> int:
    (HERE / "results").mkdir(exist_ok=True)
    (HERE / "results" / "summary.json").write_text(json.dumps(summary, indent=1))
    (HERE / "results" / "summary.md").write_text(table)
    print(table)
    return 0


if __name__ == "__main__":
    sys.exit(main())
