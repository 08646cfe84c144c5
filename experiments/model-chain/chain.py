"""Models training models: train a larger student, export it, distil the default student from it,
and evaluate both on the same suites, every stage through the experiment API (rl/runs.py).

    python experiments/model-chain/chain.py [--seeds 0 1 2] [--parallel 2]
    python experiments/model-chain/chain.py --summary-only   # the tables again from results/summary.json

Stage 1  large/   a 2.86M-parameter student (experiments/teacher's shape), warm-start then grpo,
                  exported at its end (trainer.export_to) -> runs/model-chain-large/large-s0/export
Stage 2  small/   the default 1.02M student from scratch, per seed:
                    distill-s<seed>  method teacher_distill, method.teacher_path = stage 1's export
                    grpo-s<seed>     method grpo: the same steps and rollouts without the teacher (baseline)
                    untrained-distill-s<seed>  teacher_distill from an untrained model of stage 1's
                                     shape: the control, which should not work
Stage 3  rl.eval  every final model (stage 1's export and each stage 2 run) on the same suites
                  (hinted: held-out accuracy, hinted accuracy and the teacher gap; behaviour)
         -> results/summary.json, results/summary.md: per arm mean ± sample std (n) and range over
            seeds (rl/stats.py), tokens; per arm against grpo, the paired per-seed difference (a seed's
            runs share its warm-start) with its 95% interval. summary.json keeps every model's own
            numbers ("models"), from which --summary-only rebuilds the rest without any run.

A stage's run that already finished is reused (its status says so), so the chain resumes where it
stopped; a run that failed stops the chain with its last error line.
"""
from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent


def _relative(path: Path) -> str:
    """A run folder as the summary records it: relative to the repository, no machine's paths."""
    path = Path(path).resolve()
    return str(path.relative_to(ROOT)) if path.is_relative_to(ROOT) else path.name
ROOT = HERE.parents[1]
sys.path.insert(0, str(ROOT))

from rl import runs  # noqa: E402
from rl.configure import load_config  # noqa: E402
from rl.stats import fmt, fmt_interval, paired_difference, spread  # noqa: E402

SUITES = ["hinted", "behaviour"]
KEYS = ("eval/accuracy", "eval/accuracy_hinted", "eval/teacher_gap", "eval/behaviour/format_ok",
        "eval/behaviour/eos_rate", "eval/behaviour/answer_tokens")


def evaluate(model: Path) -> dict:
    from rl.eval import evaluate_model

    report = evaluate_model(model, SUITES)
    return {k: v for s in report["suites"].values() for k, v in s["metrics"].items()}


def curve(run_dir: Path, warmstart_steps: int) -> dict:
    """Held-out accuracy at the warm-start's end, the RL phase's peak, and the end (metrics.jsonl)."""
    evals = [json.loads(line) for line in (run_dir / "metrics.jsonl").open()]
    evals = [(r["step"], r["eval/accuracy"]) for r in evals if "eval/accuracy" in r and r["step"] >= warmstart_steps]
    return {"warmstart_end": evals[0][1], "peak": max(a for _, a in evals), "end": evals[-1][1],
            "lift": evals[-1][1] - evals[0][1]}


def tokens(run_dir: Path) -> dict:
    totals = {}
    for line in (run_dir / "metrics.jsonl").open():
        row = json.loads(line)
        for kind in ("generated", "scored", "trained"):
            if f"budget/{kind}_tokens_total" in row:
                totals[kind] = row[f"budget/{kind}_tokens_total"]
    return totals


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2])
    parser.add_argument("--parallel", type=int, default=2, help="stage-2 runs at once (one torch thread each)")
    parser.add_argument("--summary-only", action="store_true",
                        help="rebuild summary.json's aggregates and summary.md from its per-model numbers; run nothing")
    args = parser.parse_args(argv)
    if args.summary_only:
        return write(json.loads((HERE / "results" / "summary.json").read_text())["models"])

    # Stage 1: the larger student, exported; and the control's teacher: the same shape untrained
    # (one RL step at a negligible learning rate, so that there is a checkpoint to export).
    large, untrained = runs.run_all([(HERE / "large", ["run_name=large-s0", "seed=0"]),
                                     (HERE / "large", ["run_name=untrained-s0", "seed=0", "warmstart.steps=0",
                                                       "trainer.steps=1", "trainer.lr=1e-12", "trainer.eval_every=1"])],
                                    parallel=1)
    export = large / "export"
    print(f"stage 1 done: {large} -> {export}", flush=True)

    # Stage 2: the default student distilled from it, and the grpo baseline, per seed.
    jobs = []
    for seed in args.seeds:
        common = [f"seed={seed}", "trainer.threads=1"]
        jobs.append((HERE / "small", [*common, f"method.teacher_path={export}", f"run_name=distill-s{seed}"]))
        jobs.append((HERE / "small", [*common, "method.name=grpo", f"run_name=grpo-s{seed}"]))
        jobs.append((HERE / "small", [*common, f"method.teacher_path={untrained / 'export'}",
                                      f"run_name=untrained-distill-s{seed}"]))
    small = runs.run_all(jobs, parallel=args.parallel)
    print("stage 2 done: " + ", ".join(d.name for d in small), flush=True)

    # Stage 3: every final model on the same suites.
    models = {"large": export, **{d.name: d for d in small}}
    results = {name: {"metrics": evaluate(path), "tokens": tokens(large if name == "large" else path),
                      "model": _relative(path)} for name, path in models.items()}
    for name, path in models.items():      # the trainer's own evaluations along the run
        run_dir = large if name == "large" else path
        results[name]["curve"] = curve(run_dir, load_config(run_dir).warmstart.steps)
    return write(results)


ARMS = ("large", "distill", "grpo", "untrained-distill")
PAIRED = (("eval/accuracy", "accuracy"), ("eval/accuracy_hinted", "hinted accuracy"), ("peak", "RL peak"))


def value(model: dict, key: str):
    """A model's number by key: a suite metric, or a field of its training curve."""
    return model["curve"][key] if key in model["curve"] else model["metrics"].get(key)


def summarize(results: dict) -> dict:
    """Per arm, spreads over its seeds; per arm but grpo and large, the paired difference from grpo
    per seed (the runs of a seed share its warm-start exactly)."""
    summary = {"suites": SUITES, "models": results, "arms": {}, "vs_grpo": {}}
    for arm in ARMS:
        names = [n for n in results if n == arm or n.startswith(f"{arm}-s")]
        summary["arms"][arm] = {"runs": names, **{key: _stats([results[n]["metrics"].get(key) for n in names])
                                                  for key in KEYS}}
        summary["arms"][arm]["generated"] = _stats([results[n]["tokens"].get("generated") for n in names])
        summary["arms"][arm]["scored"] = _stats([results[n]["tokens"].get("scored") for n in names])
        for key in ("warmstart_end", "peak", "lift"):
            summary["arms"][arm][key] = _stats([results[n]["curve"][key] for n in names])
    by_seed = lambda arm, key: {n.rsplit("-s", 1)[1]: value(r, key) for n, r in results.items()  # noqa: E731
                                if n.startswith(f"{arm}-s")}
    for arm in ("distill", "untrained-distill"):
        summary["vs_grpo"][arm] = {key: paired_difference(by_seed(arm, key), by_seed("grpo", key)) for key, _ in PAIRED}
    return summary


def write(results: dict) -> int:
    summary = summarize(results)
    (HERE / "results").mkdir(exist_ok=True)
    (HERE / "results" / "summary.json").write_text(json.dumps(summary, indent=1))
    table = _table(summary)
    (HERE / "results" / "summary.md").write_text(table)
    print(table)
    return 0


def _stats(values):
    """rl/stats.py's spread (mean, sample std, n; no std for one value) and the range; None for none."""
    values = [v for v in values if v is not None]
    if not values:
        return None
    return {**spread(values), "min": min(values), "max": max(values)}


def _table(summary: dict) -> str:
    def cell(s, scale=1.0, digits=3):
        """mean ± sample std (range); n is the runs column ("(n=1)" alone for one run)."""
        if s is None:
            return "—"
        if s["n"] == 1:
            return fmt(s, 1 / scale, digits, show_n=False)
        return f"{fmt(s, 1 / scale, digits, show_n=False)} ({s['min'] / scale:.{digits}f}..{s['max'] / scale:.{digits}f})"

    lines = ["| model | runs | accuracy | hinted accuracy | format ok | eos rate | answer tokens | generated | scored |",
             "|---|---|---|---|---|---|---|---|---|"]
    for arm, s in summary["arms"].items():
        lines.append(f"| {arm} | {len(s['runs'])} | {cell(s['eval/accuracy'])} | {cell(s['eval/accuracy_hinted'])} | "
                     f"{cell(s['eval/behaviour/format_ok'])} | {cell(s['eval/behaviour/eos_rate'])} | "
                     f"{cell(s['eval/behaviour/answer_tokens'], digits=2)} | {cell(s['generated'], 1e6, 2)}M | "
                     f"{cell(s['scored'], 1e6, 2)}M |")
    lines += ["", "Held-out accuracy along each run (the trainer's evaluations; a seed's two runs share their warm-start):", "",
              "| run | warm-start end | RL peak | end | lift over warm-start |", "|---|---|---|---|---|"]
    for name, r in summary["models"].items():
        c = r["curve"]
        lines.append(f"| {name} | {c['warmstart_end']:.3f} | {c['peak']:.3f} | {c['end']:.3f} | {c['lift']:+.3f} |")
    lines += ["", "Paired difference vs grpo, per seed, 95% interval (the arm's run minus grpo's on each seed; they "
              "share the seed's warm-start): mean [Student-t 95% interval] (n seeds), then the per-seed differences.",
              "", "| arm − grpo | " + " | ".join(head for _, head in PAIRED) + " |", "|---|" + "---|" * len(PAIRED)]
    for arm, diffs in summary["vs_grpo"].items():
        lines.append(f"| {arm} | " + " | ".join(
            fmt_interval(diffs[key]) + " (" + ", ".join(f"s{k} {d:+.3f}" for k, d in diffs[key]["per_seed"].items()) + ")"
            for key, _ in PAIRED) + " |")
    lines += ["", "| arm | runs | lift over warm-start (mean ± std, range) | RL peak |", "|---|---|---|---|"]
    for arm, s in summary["arms"].items():
        lines.append(f"| {arm} | {len(s['runs'])} | {cell(s['lift'])} | {cell(s['peak'])} |")
    return "\n".join(lines) + "\n"


if __name__ == "__main__":
    sys.exit(main())
