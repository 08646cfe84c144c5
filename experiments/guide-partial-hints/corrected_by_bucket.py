"""How often the corrected trajectories succeed, per difficulty bucket, from the study's runs.

The trainer logs a sample of each step's rows to rollouts.jsonl (`source` = "corrected" for a
regeneration under a hint); the bucket is read off the prompt, since the hard bucket's operands
have three digits and the easy bucket's at most two. Usage, after scripts/reproduce.sh:

    .venv/bin/python experiments/guide-partial-hints/corrected_by_bucket.py [runs/study/guide-partial-hints]
"""
import re
import sys
from pathlib import Path

from rl.analysis import corrected_successes


def bucket(prompt: str) -> str:
    return "hard" if any(len(n) >= 3 for n in re.findall(r"\d+", prompt)) else "easy"


def main(study_dir: Path) -> None:
    print("| run | easy: corrected successes / sampled | hard: corrected successes / sampled |")
    print("|---|---|---|")
    for run in sorted(p for p in study_dir.glob("guide*-s*") if (p / "rollouts.jsonl").is_file()):
        counts = corrected_successes(run, bucket)
        cells = [f"{s} / {n} = {s / n:.3f}" if n else "—" for s, n in (counts.get(b, (0, 0)) for b in ("easy", "hard"))]
        print(f"| `{run.name}` | {cells[0]} | {cells[1]} |")


if __name__ == "__main__":
    main(Path(sys.argv[1] if len(sys.argv) > 1 else "runs/study/guide-partial-hints"))
