"""The hint requests `scripts/bench.sh teacher` times: real RL steps' failed attempts.

    python -m benchmarks.teacher_requests RUN_DIR [--experiment experiments/default] [--steps 3]

Resumes a copy of RUN_DIR (a run of experiments/default or one built on it, e.g. llm-teacher
after its warm-start) from its last checkpoint and runs `--steps` RL steps with the rule teacher,
recording every hint request the trainer makes (the failed attempts of the step, after the
method's own selection), one JSON line per step. Nothing is written into RUN_DIR. The committed
file `benchmarks/data/teacher-requests-default.jsonl` came from
`runs/llm-teacher/warmstart-s0` (experiments/llm-teacher with `teacher.kind=rule trainer.steps=0
seed=0`: the default experiment's warm-start end, step 1200).
"""
from __future__ import annotations

import argparse
import dataclasses
import json
import shutil
import sys
import tempfile
from pathlib import Path

DATA = Path(__file__).resolve().parent / "data"
DEFAULT_FILE = DATA / "teacher-requests-default.jsonl"


class RecordingTeacher:
    """Passes requests to the run's teacher and keeps them."""

    def __init__(self, inner):
        self.inner, self.requests = inner, []

    def write_hints(self, requests):
        self.requests += [dataclasses.asdict(r) for r in requests]
        return self.inner.write_hints(requests)


def capture(run_dir: Path, experiment: Path, steps: int, threads: int) -> list[dict]:
    from rl.configure import load_config
    from rl.trainer import Trainer

    with tempfile.TemporaryDirectory() as tmp:
        copy = Path(tmp) / run_dir.name
        shutil.copytree(run_dir, copy)
        cfg = load_config(experiment, ["resume=true", "teacher.kind=rule", f"trainer.threads={threads}"])
        trainer = Trainer(cfg, copy)
        if trainer.step < cfg.warmstart.steps:
            raise SystemExit(f"{run_dir}: its last checkpoint is step {trainer.step}, inside warm-start "
                             f"({cfg.warmstart.steps} steps); the requests must come from RL steps")
        recorder = trainer.teacher = RecordingTeacher(trainer.teacher)
        lines = []
        for _ in range(steps):
            recorder.requests = []
            trainer.rl_step()
            trainer.step += 1
            lines.append({"step": trainer.step, "requests": recorder.requests})
        trainer.log.close()
    return lines


def load(path: Path = DEFAULT_FILE) -> list[list]:
    """The recorded steps, each a list of teacher.HintRequest."""
    from teacher import HintRequest

    return [[HintRequest(**r) for r in json.loads(line)["requests"]]
            for line in path.read_text().splitlines() if line.strip()]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.teacher_requests", description=__doc__.splitlines()[0])
    parser.add_argument("run_dir", type=Path)
    parser.add_argument("--experiment", type=Path, default=Path("experiments/default"))
    parser.add_argument("--steps", type=int, default=3)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--out", type=Path, default=DEFAULT_FILE)
    args = parser.parse_args(argv)
    lines = capture(args.run_dir, args.experiment, args.steps, args.threads)
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text("".join(json.dumps(line) + "\n" for line in lines))
    print(f"{args.out}: {len(lines)} steps, {[len(line['requests']) for line in lines]} requests", file=sys.stderr)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
