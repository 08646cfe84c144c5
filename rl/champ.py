"""CHAMP (Concept and Hint-Annotated Math Problems, the offline `champ-dataset` package) as a
problem file for `task.source: jsonl`: 270 competition problems with answers, reference solutions
and human-written hints, the category as the bucket. The tested example of bring-your-own data.

    python -m rl.champ problems.jsonl        # then task.source=jsonl task.path=problems.jsonl

Some answers are prose ("C(10, 5), or equivalently 252"); math-verify reads the expression in
them where there is one, so those problems are harder to verify, not wrong.
"""
from __future__ import annotations

import argparse
import json
from pathlib import Path


def champ_problems(version: str = "v0") -> list[dict]:
    """Every CHAMP problem as a jsonl record (rl/jsonl_task.py): prompt, answer, solution, hints,
    bucket. The hints are the problem's own (`H_` entries of its concept-and-hint list); its
    concepts (`C_`) are general facts, not hints for this problem, and are left out."""
    import champ_dataset

    data = champ_dataset.load(version)
    records = []
    for problem in data.problems.values():
        records.append({
            "prompt": problem.text,
            "answer": problem.answer,
            "solution": " ".join(step.text for step in problem.solution.steps),
            "hints": [data.hints[key].text for key in problem.ch_list if key in data.hints],
            "bucket": problem.category,
        })
    return records


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m rl.champ", description=__doc__.splitlines()[0])
    parser.add_argument("out", type=Path, help="the JSON-lines file to write")
    parser.add_argument("--version", default="v0", help="the champ-dataset file version")
    args = parser.parse_args(argv)
    records = champ_problems(args.version)
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text("".join(json.dumps(r, ensure_ascii=False) + "\n" for r in records), encoding="utf-8")
    print(f"wrote {len(records)} problems to {args.out}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
