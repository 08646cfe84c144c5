"""Evaluate any trained student on named suites: `scripts/eval.sh MODEL --suite NAME [--suite ...]`.

    python -m rl.eval runs/default/RUN --suite hinted --suite behaviour
    python -m rl.eval runs/default/RUN/checkpoints/step_0001800 --suite heldout
    python -m rl.eval runs/teacher/final/export --suite private eval.private.hard=mined.jsonl --json

MODEL is a run folder (its newest complete checkpoint), one checkpoint folder, or an export folder
(rl/load_policy.py). The task, the teacher and the rollout shape are the run's own config (an
export carries it in hintrl_config.yaml; `--experiment DIR` for one that does not); `key=value`
overrides go on top, e.g. a private set, `task.eval_size`, or another teacher. Without `--suite`
the config's `eval.suites` run. Suites: rl/evals/ (`--list`).

Prints a table; `--json` prints the JSON instead, `--out FILE` writes it:

    {"model": ..., "loaded": "...", "suites": {NAME: {"metrics": {key: value},
       "sets": {SET: {"n": problems, "digest": hash of the set, "hashes": [prompt hashes]}}}}}

The hashes are each prompt's `rl.contamination.prompt_hash`: what a training run refuses, so a
report says exactly which prompts it was measured on.
"""
from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from rl.config import ConfigError


def evaluate_model(model: str | Path, suites: list[str] | None = None, experiment: str | Path | None = None,
                   overrides: list[str] = ()) -> dict:
    """The report (see the module docstring) of `model` on `suites` (default: its config's)."""
    import torch

    from rl.assembly import run_parts
    from rl.contamination import prompt_hash, set_digest
    from rl.evals import EvalContext, run_suites, suites_to_run
    from rl.load_policy import load_policy

    overrides = list(overrides) + ([f"eval.suites=[{','.join(suites)}]"] if suites else [])
    loaded = load_policy(model, experiment, overrides)
    cfg = loaded.cfg
    torch.manual_seed(cfg.seed)
    parts = run_parts(cfg, loaded.tok)
    ctx = EvalContext(policy=loaded.policy, tasks=parts.tasks, teacher=parts.teacher, tok=parts.tok,
                      env=parts.env, max_new_tokens=cfg.rollout.max_new_tokens,
                      max_turns=cfg.rollout.max_turns, temperature=cfg.rollout.temperature, pass_k=cfg.eval.pass_k,
                      seed=cfg.seed)
    report = {"model": str(model), "loaded": loaded.description, "suites": {}}
    for name, result in run_suites(cfg.eval.suites, ctx).items():
        sets = {s: {prompt_hash(p.prompt) for p in problems} for s, problems in result["sets"].items()}
        report["suites"][name] = {"metrics": result["metrics"], "sets": {
            s: {"n": int(result["counts"][s]["n"]), "digest": set_digest(hashes), "hashes": sorted(hashes)}
            for s, hashes in sets.items()}}
    report["skipped"] = [n for n in cfg.eval.suites if n not in suites_to_run(cfg.eval.suites)]
    return report


def table(report: dict) -> str:
    lines = [f"{report['loaded']}", f"{'suite':<10} {'metric':<40} {'value':>8}"]
    for name, result in report["suites"].items():
        sizes = ", ".join(f"{s}: {v['n']}" for s, v in result["sets"].items())
        lines.append(f"{name:<10} ({sizes})")
        lines += [f"{'':<10} {key:<40} {value:>8.3f}" for key, value in result["metrics"].items()]
    for name in report.get("skipped", []):
        lines.append(f"{name:<10} (its metrics are in another listed suite's)")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    from rl.evals import SUITES

    parser = argparse.ArgumentParser(prog="python -m rl.eval", description=__doc__.splitlines()[0],
                                     epilog="suites: " + "; ".join(f"{n}: {c.summary}" for n, c in SUITES.items()))
    parser.add_argument("model", nargs="?", help="a run folder, a checkpoint folder or an export folder")
    parser.add_argument("overrides", nargs="*", help="config overrides, e.g. eval.private.hard=mined.jsonl")
    parser.add_argument("--suite", action="append", default=None, help="a suite to run (repeat; default: eval.suites)")
    parser.add_argument("--experiment", default=None, help="the experiment folder, for an export without hintrl_config.yaml")
    parser.add_argument("--json", action="store_true", help="print the JSON report instead of the table")
    parser.add_argument("--out", default=None, help="also write the JSON report to this file")
    parser.add_argument("--list", action="store_true", help="list the suites and exit")
    args = parser.parse_args(argv)
    if args.list:
        print("\n".join(f"{n:<10} {c.summary}" for n, c in SUITES.items()))
        return 0
    if not args.model:
        parser.error("MODEL is required (a run folder, a checkpoint folder or an export folder)")
    unknown = [s for s in args.suite or () if s not in SUITES]
    if unknown:
        print(f"eval error: unknown suite(s) {unknown}; choose from {sorted(SUITES)}", file=sys.stderr)
        return 2
    from rl.load_policy import PolicyLoadError

    try:
        report = evaluate_model(args.model, args.suite, args.experiment, args.overrides)
    except (ConfigError, PolicyLoadError) as err:
        print(f"eval error: {err}", file=sys.stderr)
        return 2
    if args.out:
        Path(args.out).parent.mkdir(parents=True, exist_ok=True)
        Path(args.out).write_text(json.dumps(report, indent=1))
    print(json.dumps(report, indent=1) if args.json else table(report))
    return 0


if __name__ == "__main__":
    sys.exit(main())
