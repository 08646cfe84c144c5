"""The default experiment with each rollout engine, same seed: learning curve, step time and the
engines' agreement with the training forward.

    scripts/train.sh experiments/default rollout.engine=local run_name=engine-local
    scripts/train.sh experiments/default rollout.engine=vllm  run_name=engine-vllm
    .venv/bin/python experiments/default/compare_engines.py runs/default/engine-local runs/default/engine-vllm

Writes results/engines-seed0.json and prints the README's table (markdown).
"""
from __future__ import annotations

import argparse
import json
import statistics
from pathlib import Path

from omegaconf import OmegaConf

HERE = Path(__file__).resolve().parent
STEP_TIMES = ("time/step_s", "time/rollout_s", "time/hinted_scoring_s", "time/forward_s", "time/backward_s",
              "time/weight_sync_s")


def summarise(run_dir: Path) -> dict:
    rows = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    config = OmegaConf.load(run_dir / "config.yaml")
    warm = config.warmstart.steps
    rl = [r for r in rows if r["step"] > warm and "time/rollout_s" in r]
    evals = {r["step"]: r["eval/accuracy"] for r in rows if "eval/accuracy" in r}
    median = lambda key: statistics.median(r[key] for r in rl if key in r) if any(key in r for r in rl) else None
    syncs = [r["time/weight_sync_s"] for r in rl if r.get("time/weight_sync_s", 0) > 0]
    return {
        "run": str(run_dir), "engine": config.rollout.engine,
        "warmstart_steps": warm, "eval_accuracy": evals, "final": evals[max(evals)], "peak_rl": max(v for s, v in evals.items() if s >= warm),
        "median_step_times": {k: median(k) for k in STEP_TIMES},
        "weight_sync_s": {"median": statistics.median(syncs), "max": max(syncs)} if syncs else None,
        "logprob_mismatch": {"mean_of_means": statistics.fmean(r["rollout/logprob_mismatch_mean"] for r in rl),
                             "max": max(r["rollout/logprob_mismatch_max"] for r in rl)},
        "ratio_std_max": max(r["rollout/ratio_std"] for r in rl),
        "router_replay_mismatch_max": max(r.get("router/replay_mismatch", 0.0) for r in rl),
    }


def markdown(results: list[dict]) -> str:
    steps = sorted(set.intersection(*(set(r["eval_accuracy"]) for r in results)))
    steps = [s for s in steps if s >= results[0]["warmstart_steps"]]
    out = ["| engine | " + " | ".join(str(s) for s in steps) + " | RL step (median) | rollout | hinted scoring | "
           "weight sync | mismatch max |",
           "|---|" + "---|" * (len(steps) + 5)]
    for r in results:
        t = r["median_step_times"]
        ms = lambda k: f"{1000 * t[k]:.0f} ms" if t.get(k) is not None else "—"
        sync = f"{1000 * r['weight_sync_s']['median']:.0f} ms" if r["weight_sync_s"] else "—"
        out.append(f"| `{r['engine']}` | " + " | ".join(f"{r['eval_accuracy'][s]:.3f}" for s in steps)
                   + f" | {ms('time/step_s')} | {ms('time/rollout_s')} | {ms('time/hinted_scoring_s')} | {sync} | "
                   f"{r['logprob_mismatch']['max']:.1e} |")
    return "\n".join(out)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("runs", nargs="+", type=Path)
    parser.add_argument("--out", type=Path, default=HERE / "results" / "engines-seed0.json")
    args = parser.parse_args()
    results = [summarise(run) for run in args.runs]
    args.out.write_text(json.dumps(results, indent=1) + "\n")
    print(markdown(results))


if __name__ == "__main__":
    main()
