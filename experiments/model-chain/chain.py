"""Models training models: train a larger student, export it, distil the default student from it,
and evaluate both on the same suites, every stage through the experiment API (rl/runs.py).

    python experiments/model-chain/chain.py [--seeds 0 1 2] [--parallel 2]

Stage 1  large/   a 2.86M-parameter student (experiments/teacher's shape), warm-start then grpo,
                  exported at its end (trainer.export_to) -> runs/model-chain-large/large-s0/export
Stage 2  small/   the default 1.02M student from scratch, per seed:
                    distill-s<seed>  method teacher_distill, method.teacher_path = stage 1's export
                    grpo-s<seed>     method grpo: the same steps and rollouts without the teacher (baseline)
Stage 3  rl.eval  every final model (stage 1's export and each stage 2 run) on the same suites
                  (hinted: held-out accuracy, hinted accuracy and the teacher gap; behaviour)
         -> results/summary.json, results/summary.md (mean ± std and range over seeds, tokens)

A stage's run that already finished is reused (its status says so), so the chain resumes where it
stopped; a run that failed stops the chain with its last error line.
"""
from __future__ import annotations

import argparse
import json
import statistics
import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent
ROOT = HERE.parents[1]
sys.path.insert(0, str(ROOT))

from rl import runs  # noqa: E402

SUITES = ["hinted", "behaviour"]
KEYS = ("eval/accuracy", "eval/accuracy_hinted", "eval/teacher_gap", "eval/behaviour/format_ok",
        "eval/behaviour/eos_rate", "eval/behaviour/answer_tokens")


def evaluate(model: Path) -> dict:
    from rl.eval import evaluate_model

    report = evaluate_model(model, SUITES)
    return {k: v for s in report["suites"].values() for k, v in s["metrics"].items()}


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
    args = parser.parse_args(argv)

    # Stage 1: the larger student, exported.
    [large] = runs.run_all([(HERE / "large", ["run_name=large-s0", "seed=0"])], parallel=1)
    export = large / "export"
    print(f"stage 1 done: {large} -> {export}", flush=True)

    # Stage 2: the default student distilled from it, and the grpo baseline, per seed.
    jobs = []
    for seed in args.seeds:
        common = [f"seed={seed}", "trainer.threads=1"]
        jobs.append((HERE / "small", [*common, f"method.teacher_path={export}", f"run_name=distill-s{seed}"]))
        jobs.append((HERE / "small", [*common, "method.name=grpo", f"run_name=grpo-s{seed}"]))
    small = runs.run_all(jobs, parallel=args.parallel)
    print("stage 2 done: " + ", ".join(d.name for d in small), flush=True)

    # Stage 3: every final model on the same suites.
    models = {"large": export, **{d.name: d for d in small}}
    results = {name: {"metrics": evaluate(path), "tokens": tokens(large if name == "large" else path),
                      "model": str(path)} for name, path in models.items()}
    summary = {"suites": SUITES, "models": results, "arms": {}}
    for arm in ("large", "distill", "grpo"):
        names = [n for n in results if n == arm or n.startswith(f"{arm}-s")]
        summary["arms"][arm] = {"runs": names, **{key: _stats([results[n]["metrics"].get(key) for n in names])
                                                  for key in KEYS}}
        summary["arms"][arm]["generated"] = _stats([results[n]["tokens"].get("generated") for n in names])
        summary["arms"][arm]["scored"] = _stats([results[n]["tokens"].get("scored") for n in names])
    (HERE / "results").mkdir(exist_ok=True)
    (HERE / "results" / "summary.json").write_text(json.dumps(summary, indent=1))
    table = _table(summary)
    (HERE / "results" / "summary.md").write_text(table)
    print(table)
    return 0


def _stats(values):
    values = [v for v in values if v is not None]
    if not values:
        return None
    return {"mean": statistics.mean(values), "std": statistics.pstdev(values), "min": min(values),
            "max": max(values), "n": len(values)}


def _table(summary: dict) -> str:
    def cell(s, scale=1.0, digits=3):
        if s is None:
            return "—"
        if s["n"] == 1:
            return f"{s['mean'] / scale:.{digits}f}"
        return f"{s['mean'] / scale:.{digits}f} ± {s['std'] / scale:.{digits}f} ({s['min'] / scale:.{digits}f}..{s['max'] / scale:.{digits}f})"

    lines = ["| model | runs | accuracy | hinted accuracy | format ok | eos rate | answer tokens | generated | scored |",
             "|---|---|---|---|---|---|---|---|---|"]
    for arm, s in summary["arms"].items():
        lines.append(f"| {arm} | {len(s['runs'])} | {cell(s['eval/accuracy'])} | {cell(s['eval/accuracy_hinted'])} | "
                     f"{cell(s['eval/behaviour/format_ok'])} | {cell(s['eval/behaviour/eos_rate'])} | "
                     f"{cell(s['eval/behaviour/answer_tokens'], digits=2)} | {cell(s['generated'], 1e6, 2)}M | "
                     f"{cell(s['scored'], 1e6, 2)}M |")
    return "\n".join(lines) + "\n"


if __name__ == "__main__":
    sys.exit(main())
