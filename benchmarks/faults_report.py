"""benchmarks/results/faults.md from the fault suite's trial records (scripts/faults.sh).

Each record is one trial of tests/faults/ (tests/faults/conftest.py's `record`): its suite (fault
family), outcome, and details. The report counts them per family, and for kills the steps each
cost (those logged after the newest complete checkpoint, redone on resume).
"""
from __future__ import annotations

import argparse
import json
import platform
import re
import subprocess
import time
from collections import Counter, defaultdict
from pathlib import Path

FAMILIES = {
    "kill": "kill -9 of the trainer, then resume=true",
    "disk": "a disk filling up during a checkpoint",
    "output_folder": "read-only or deleted run folder",
    "corrupt_checkpoint": "corrupted checkpoint files",
    "pickle": "a malicious pickle planted in a checkpoint",
    "teacher_endpoint": "teacher endpoint faults",
    "config": "bad config values, types, keys and files",
}


def _commit() -> str:
    try:
        return subprocess.run(["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True,
                              check=True).stdout.strip()
    except (OSError, subprocess.CalledProcessError):
        return "unknown"


def _short(text: str, width: int = 230) -> str:
    """A message for the table: pytest's temporary folders shortened, pipes escaped."""
    text = re.sub(r"/tmp/pytest-of-[^/]+/pytest-\d+/[^/\s]+", "<tmp>", str(text))
    return text.replace("|", "/")[:width]


def report(records: list[dict], pytest_tail: str, seconds: int) -> str:
    by_suite = defaultdict(list)
    for r in records:
        by_suite[r["suite"]].append(r)
    lines = [f"# Fault-injection suite ({time.strftime('%Y-%m-%d')}, commit {_commit()})", "",
             f"`scripts/faults.sh` on {platform.node() or 'this machine'} ({platform.machine()}, "
             f"{__import__('os').cpu_count()} CPUs): {pytest_tail or 'pytest summary missing'}, {seconds} s.", "",
             "| fault family | trials | outcomes |", "|---|---|---|"]
    for suite, title in FAMILIES.items():
        rows = by_suite.get(suite, [])
        outcomes = ", ".join(f"{n} {o}" for o, n in Counter(r["outcome"] for r in rows).most_common())
        lines.append(f"| {title} | {len(rows)} | {outcomes or 'not run'} |")
    kills = by_suite.get("kill", [])
    if kills:
        inside = [k for k in kills if k["where"].startswith("checkpoint.")]
        two = [k for k in kills if k.get("ranks") == 2]
        lost = [k["steps_lost"] for k in kills]
        lines += ["", "## kill -9", "",
                  f"- {sum(k['outcome'] == 'survived' for k in kills)}/{len(kills)} kills survived: after each, every "
                  "`step_*` folder verified against its manifest, and the resumed run's metrics.jsonl and "
                  "rollouts.jsonl equal an uninterrupted run's.",
                  f"- {len(inside)} inside checkpoint writes, "
                  f"{sum(k['where'] == 'runlog.before_replace' for k in kills)} during a resume's log truncation, "
                  f"{len(kills) - len(inside) - sum(k['where'] == 'runlog.before_replace' for k in kills)} at "
                  f"seeded times; {len(two)} on one rank of a two-rank ZeRO-3 run.",
                  f"- Steps lost (logged after the newest complete checkpoint, redone on resume): {sum(lost)} in "
                  f"all, at most {max(lost)} per kill (checkpoint_every=2).", "",
                  "| where | ranks | last step logged | resumed from | steps lost |", "|---|---|---|---|---|"]
        lines += [f"| {k['where']} | {k.get('ranks', 1)} | {k['logged_step']} | {k['resumes_at']} | {k['steps_lost']} |"
                  for k in kills]
    files = by_suite.get("corrupt_checkpoint", []) + by_suite.get("pickle", [])
    if files:
        lines += ["", "## Damaged and planted checkpoint files", "",
                  "| fault | outcome | what the run said |", "|---|---|---|"]
        lines += [f"| {r['fault']} | {r['outcome']} | "
                  + (_short(r["said"]) if r.get("said") else f"resumed from {r['fell_back_to']}, ended equal to the "
                     "undamaged run" if r.get("fell_back_to") else "skipped as unusable; the pickle never ran") + " |"
                  for r in files]
    other = by_suite.get("disk", []) + by_suite.get("output_folder", [])
    if other:
        lines += ["", "## Disk and run folder", ""]
        lines += [f"- {r['fault']}: {r['outcome']} — `{_short(r.get('stopped_with') or r.get('message', ''), 400)}`"
                  for r in other]
    endpoint = by_suite.get("teacher_endpoint", [])
    if endpoint:
        faults = Counter(r.get("fault", "?") for r in endpoint)
        lines += ["", "## Teacher endpoint", "",
                  f"{len(endpoint)} trials on a real misbehaving HTTP server; every failed request counted under "
                  "its own name (hint/teacher_errors/<fault>), the run finishing: " +
                  ", ".join(f"{f} ×{n}" for f, n in sorted(faults.items())) + "."]
    config = [r for r in by_suite.get("config", []) if r.get("via") != "cli"]
    cli = [r for r in by_suite.get("config", []) if r.get("via") == "cli"]
    if config or cli:
        categories = Counter(r.get("category", "?") for r in config)
        lines += ["", "## Config fuzzing", "",
                  f"- {len(config)} seeded bad inputs through the real loader ("
                  + ", ".join(f"{c} {n}" for c, n in categories.most_common()) + "): "
                  f"{sum(r['outcome'] == 'rejected' for r in config)} rejected with one line naming the key "
                  f"({len({r.get('key') for r in config})} distinct keys named).",
                  f"- {len(cli)} of them through `python -m rl.train`: {sum(r['outcome'] == 'rejected' for r in cli)} "
                  "exited 2 with exactly that line on stderr, no traceback, nothing under output_dir."]
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.faults_report", description=__doc__.splitlines()[0])
    parser.add_argument("records", help="the JSON-lines file the suite's trials wrote (HINTRL_FAULTS_RECORD)")
    parser.add_argument("--pytest-log", default=None, help="pytest's output, for its summary line")
    parser.add_argument("--seconds", type=int, default=0)
    parser.add_argument("--out", default="benchmarks/results/faults.md")
    args = parser.parse_args(argv)
    path = Path(args.records)
    records = [json.loads(line) for line in path.read_text().splitlines() if line.strip()] if path.exists() else []
    tail = ""
    if args.pytest_log and Path(args.pytest_log).exists():
        found = re.findall(r"^=*\s*(\d+ (?:passed|failed).*?) in [\d.]+s", Path(args.pytest_log).read_text(), re.M)
        tail = found[-1].strip(" =") if found else ""
    Path(args.out).write_text(report(records, tail, args.seconds))
    print(f"wrote {args.out} ({len(records)} trials)")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
