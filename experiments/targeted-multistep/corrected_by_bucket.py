"""How often the corrected episodes succeed, per difficulty bucket, from the study's `corrected` runs.

The trainer logs a sample of each step's rows to rollouts.jsonl (`source` = "corrected" for an
episode regenerated from the hint's target message); the bucket is read off the prompt (three
terms = easy, four or five = hard). Usage, after scripts/reproduce.sh:

    .venv/bin/python experiments/targeted-multistep/corrected_by_bucket.py [runs/study/targeted-multistep]
"""
import json
import re
import sys
from pathlib import Path

from rl.analysis import corrected_successes


def bucket(prompt: str) -> str:
    return "easy" if len(re.findall(r"\d+", prompt)) == 3 else "hard"


def main(study_dir: Path) -> None:
    print("| run | easy: corrected successes / sampled | hard: corrected successes / sampled | hard: target message (mean index) |")
    print("|---|---|---|---|")
    for run in sorted(p for p in study_dir.glob("corrected-s*") if (p / "rollouts.jsonl").is_file()):
        counts = corrected_successes(run, bucket)
        cells = [f"{s} / {n} = {s / n:.3f}" if n else "—" for s, n in (counts.get(b, (0, 0)) for b in ("easy", "hard"))]
        rows = [json.loads(line) for line in (run / "rollouts.jsonl").open()]
        hard_targets = [r["hint_target"] for r in rows if r.get("hint_target") is not None and bucket(r["prompt"]) == "hard"]
        mean_target = f"{sum(hard_targets) / len(hard_targets):.2f} ({len(hard_targets)})" if hard_targets else "—"
        print(f"| {run.name} | {cells[0]} | {cells[1]} | {mean_target} |")


if __name__ == "__main__":
    main(Path(sys.argv[1] if len(sys.argv) > 1 else "runs/study/targeted-multistep"))
