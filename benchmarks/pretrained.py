"""A pretrained MoE student's RL step: `python -m benchmarks.pretrained` (or `scripts/bench.sh pretrained`).

The student of experiments/smol-moe (SmolLM2-135M-Instruct upcycled to a Mixtral-family MoE, 4
experts top-2, 373M parameters, its own tokenizer and chat template), fp32 on the CPU, its hidden-rule
task in words, 4 prompts x 4 attempts, at most 16 new tokens, no warm-start. Contenders, each a
training run of its own process (`--steps` RL steps, default 6): `grpo`, `hint_distill` (frozen
teacher), `corrected_replay` (its corrections joining their groups, as in smol-moe's study), and
`grpo` on transformers' forward instead of the lean one (`student.lean_forward=false`). Reported
per contender: the median over steps 2.. of each stage of the step (generation, teacher,
regeneration, hinted scoring, training forward, backward, optimizer) and of the whole step,
tokens per step (generated / scored / trained, rl/budget.py), and the process's peak RSS. Writes
benchmarks/results/pretrained-cpu.{json,md}; with other --steps or --contenders, into the work
folder instead.
"""
from __future__ import annotations

import argparse
import json
import os
import platform
import resource
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
RESULTS = ROOT / "benchmarks" / "results"
EXPERIMENT = ROOT / "experiments" / "smol-moe"
CONTENDERS = {
    "grpo": ["method.name=grpo"],
    "hint_distill": ["method.name=hint_distill", "method.teacher_weights=frozen"],
    "corrected_replay": ["method.name=corrected_replay", "method.place=join"],   # as smol-moe's arm
    "grpo_transformers_forward": ["method.name=grpo", "student.lean_forward=false"],
}
STEPS = 6
STAGES = {"generation": "time/rollout_s", "teacher": "time/teacher_s", "regeneration": "time/regenerate_s",
          "hinted scoring": "time/hinted_scoring_s", "forward + loss": "time/forward_s",
          "backward": "time/backward_s", "optimizer": "time/optimizer_s", "step": "time/step_s"}
TOKENS = ("generated", "scored", "trained")


def run(name: str, steps: int, work: Path) -> dict:
    """One contender's training run in a child process; its medians and peak RSS."""
    overrides = [*CONTENDERS[name], "warmstart.steps=0", f"trainer.steps={steps}", "trainer.eval_every=1000000",
                 "trainer.checkpoint_every=1000000", "task.eval_size=2", "eval.suites=[heldout]",
                 "trainer.threads=2", f"output_dir={work}", f"run_name={name}"]
    env = dict(os.environ, PYTHONPATH=str(ROOT), OMP_NUM_THREADS="2")
    before = resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss
    start = time.monotonic()
    proc = subprocess.run([sys.executable, "-m", "rl.train", str(EXPERIMENT), *overrides], cwd=ROOT, env=env,
                          capture_output=True, text=True)
    if proc.returncode:
        raise SystemExit(f"{name} failed:\n{proc.stderr[-3000:]}")
    peak = resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss
    run_dir = work / "smol-moe" / name
    rows = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    shutil.rmtree(run_dir / "checkpoints", ignore_errors=True)     # the run's end checkpoint: ~4.5 GB with Adam's state
    measured = [r for r in rows if r.get("step", 0) >= 2 and "time/step_s" in r]
    median = lambda key: statistics.median(r.get(key, 0.0) for r in measured)        # noqa: E731
    return {"steps_measured": len(measured), "wall_s": round(time.monotonic() - start, 1),
            "stages_s": {stage: round(median(key), 3) for stage, key in STAGES.items()},
            "tokens": {kind: median(f"budget/{kind}_tokens") for kind in TOKENS},
            # ru_maxrss of the children so far: a later child raises it only past the earlier peak
            "peak_rss_mib": round(peak / 1024, 1) if peak > before else None}


def markdown(result: dict) -> str:
    lines = ["# A pretrained MoE student's RL step (cpu)", "",
             f"Workload: {result['workload']}. {result['machine']}.", "",
             "| contender | s/step | " + " | ".join(s for s in STAGES if s != "step")
             + " | generated | scored | trained | peak RSS MiB |",
             "|---|---|" + "---|" * (len(STAGES) - 1) + "---|---|---|---|"]
    for name, r in result["contenders"].items():
        stages = r["stages_s"]
        rss = "-" if r["peak_rss_mib"] is None else f"{r['peak_rss_mib']:.0f}"
        lines.append(f"| {name} | {stages['step']:.2f} | " + " | ".join(f"{stages[s]:.2f}" for s in STAGES if s != "step")
                     + " | " + " | ".join(f"{r['tokens'][k]:.0f}" for k in TOKENS) + f" | {rss} |")
    lines += ["", "Medians over the measured steps (2 onwards; step 1 carries the optimizer's state allocation). "
              "Peak RSS is the process's (a contender that peaks below an earlier one shows '-': ru_maxrss of "
              "children only grows). grpo_transformers_forward: grpo with student.lean_forward=false."]
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.pretrained", description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=STEPS)
    parser.add_argument("--contenders", default=",".join(CONTENDERS))
    args = parser.parse_args(argv)
    names = [n for n in args.contenders.split(",") if n]
    unknown = sorted(set(names) - set(CONTENDERS))
    if unknown:
        parser.error(f"unknown contenders {unknown}; choose from {list(CONTENDERS)}")
    import torch
    import transformers

    work = Path(tempfile.mkdtemp(prefix="hintrl-bench-pretrained-"))
    result = {"workload": f"experiments/smol-moe's student and task, 4 prompts x 4 attempts, <= 16 new tokens, "
                          f"{args.steps} RL steps per contender, no warm-start, fp32, 2 threads",
              "machine": f"{os.cpu_count()} CPUs ({platform.processor() or platform.machine()}), torch "
                         f"{torch.__version__}, transformers {transformers.__version__}, load average (1 min) "
                         f"{os.getloadavg()[0]:.2f} at start",
              "contenders": {}}
    for name in names:
        print(f"[bench] {name} ...", file=sys.stderr, flush=True)
        result["contenders"][name] = run(name, args.steps, work)
    result["machine"] += f", {os.getloadavg()[0]:.2f} at end"
    full = args.steps == STEPS and names == list(CONTENDERS)
    out = RESULTS if full else work
    (out / "pretrained-cpu.json").write_text(json.dumps(result, indent=1) + "\n")
    (out / "pretrained-cpu.md").write_text(markdown(result))
    print(markdown(result))
    print(f"written to {out}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
