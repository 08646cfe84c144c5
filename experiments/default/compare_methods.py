"""Every method on the default experiment from one shared warm-start, one seed: the table in README.md.

    .venv/bin/python experiments/default/compare_methods.py --seed 0          (from the repository root)

Warm-start does not depend on the method, so it runs once (`trainer.steps=0`, checkpoint at its
end); each method then resumes a copy of that run folder with `method.name=...` and the RL
steps (resume is bit-identical, tests/test_train_e2e.py, so this is the run a fresh
`scripts/train.sh experiments/default method.name=...` makes, minus the repeated warm-start).
Methods run one after another (two cores: timing needs the machine to itself).

Writes experiments/default/results/methods-seed<S>.json: per method the held-out accuracy curve,
accuracy at the end of warm-start, at the end and its peak, the RL phase's wall time, and its
generated, scored and trained tokens (budget/*_tokens_total at the end minus at warm-start's end).
teacher_distill needs experiments/teacher's export (runs/teacher/final/export).
"""
from __future__ import annotations

import argparse
import json
import shutil
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
VARIANTS = {
    "grpo": ["method.name=grpo"],
    "hint_distill": ["method.name=hint_distill"],
    "hint_distill/ema": ["method.name=hint_distill", "method.teacher_weights=ema"],
    "hint_distill/frozen": ["method.name=hint_distill", "method.teacher_weights=frozen"],
    "corrected_replay": ["method.name=corrected_replay"],
    "self_distill": ["method.name=self_distill"],
    "self_distill/span_all": ["method.name=self_distill", "method.distill_span=all"],     # SDPO's own span
    "teacher_distill": ["method.name=teacher_distill", f"method.teacher_path={ROOT / 'runs/teacher/final/export'}"],
}


def train(args: list[str]) -> float:
    start = time.perf_counter()
    subprocess.run([sys.executable, "-m", "rl.train", "experiments/default", *args], cwd=ROOT, check=True)
    return time.perf_counter() - start


def metrics(run_dir: Path) -> list[dict]:
    return [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]


def summary(run_dir: Path, warm_steps: int) -> dict:
    rows = metrics(run_dir)
    curve = {m["step"]: (m["eval/accuracy"], m.get("eval/accuracy_with_hint")) for m in rows if "eval/accuracy" in m}
    at = {m["step"]: m for m in rows}
    last = max(at)
    budget = {kind: at[last][f"budget/{kind}_tokens_total"] - at[warm_steps][f"budget/{kind}_tokens_total"]
              for kind in ("generated", "scored", "trained")}
    rl = [acc for step, (acc, _) in curve.items() if step > warm_steps]
    return {"curve": curve, "warmstart_end": curve[warm_steps][0], "end": curve[last][0], "peak_rl": max(rl),
            "with_hint_end": curve[last][1], "rl_tokens": budget}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--methods", nargs="*", default=list(VARIANTS))
    parser.add_argument("--output_dir", default="runs/compare")
    args = parser.parse_args()
    seed, out = args.seed, ROOT / args.output_dir / "default"
    warm = f"warmstart-s{seed}"
    path = ROOT / "experiments/default/results" / f"methods-seed{seed}.json"
    # --methods re-runs some methods: the others' results are kept
    results: dict = json.loads(path.read_text()) if path.is_file() else {"seed": seed, "methods": {}}
    if not (out / warm / "checkpoints").is_dir():
        results["warmstart_wall_s"] = train([f"seed={seed}", f"output_dir={args.output_dir}", f"run_name={warm}",
                                             "trainer.steps=0", "method.name=grpo"])
    warm_steps = max(m["step"] for m in metrics(out / warm))
    for name in args.methods:
        run = f"{name.replace('/', '-')}-s{seed}"
        shutil.rmtree(out / run, ignore_errors=True)
        shutil.copytree(out / warm, out / run)
        wall = train([f"output_dir={args.output_dir}", f"run_name={run}", "resume=true", "trainer.steps=600",
                      *VARIANTS[name]])
        results["methods"][name] = {**summary(out / run, warm_steps), "rl_wall_s": wall, "overrides": VARIANTS[name]}
        path.write_text(json.dumps(results, indent=1) + "\n")
    print(table(results))
    return 0


def table(results: dict) -> str:
    lines = ["| method | warm-start end | end | peak (RL) | teacher with hint, end | RL wall | generated | scored | trained |",
             "|---|---|---|---|---|---|---|---|---|"]
    for name in [n for n in VARIANTS if n in results["methods"]]:
        r = results["methods"][name]
        t = r["rl_tokens"]
        lines.append(f"| `{name}` | {r['warmstart_end']:.3f} | **{r['end']:.3f}** | {r['peak_rl']:.3f} | "
                     f"{r['with_hint_end']:.3f} | {r['rl_wall_s'] / 60:.1f} min | {t['generated'] / 1e6:.2f}M | "
                     f"{t['scored'] / 1e6:.2f}M | {t['trained'] / 1e6:.2f}M |")
    return "\n".join(lines)


if __name__ == "__main__":
    sys.exit(main())
