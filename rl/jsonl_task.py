"""Bring-your-own problems: a JSON-lines file as a task (`task.source: jsonl`, `task.path: FILE`).

One problem per line:

    {"prompt": "What is 3/4 + 1/4?", "answer": "1", "solution": "3/4 + 1/4 = 4/4 = 1",
     "hints": ["Add the numerators."], "bucket": "easy"}

`prompt` and `answer` are required; `solution` (a reference derivation), `hints` (human-written
hints, a list of strings) and `bucket` (a difficulty bucket name; "all" when absent) are optional.
Attempts are checked with math-verify (`task.match: math`: 0.5 and 1/2 agree, and a LaTeX answer
is parsed) or by exact text (`task.match: exact`, surrounding whitespace ignored).

A file is read whole at start-up and checked line by line: a line that is not JSON, lacks a
required field or has a field of the wrong type is an error naming the file and the line, before
any compute is spent.

`JsonlDataset` answers the two calls `rl.tasks.TaskSource` makes of a reasoning-gym dataset
(`dataset[i]` and `score_answer`), so held-out splitting, buckets, mixes and resuming work the same
for both sources.
"""
from __future__ import annotations

import json
import random
import threading
from pathlib import Path

REQUIRED = {"prompt": str, "answer": str}
OPTIONAL = {"solution": str, "hints": list, "bucket": str}


class JsonlError(ValueError):
    """A problem file that cannot be used; the message names the file and the line."""


def load_problems(path: str | Path) -> list[dict]:
    """Every problem of the file, checked; blank lines are skipped."""
    path = Path(path)
    try:
        lines = path.read_text(encoding="utf-8").splitlines()
    except OSError as err:
        raise JsonlError(f"task.path={str(path)!r}: cannot read it ({err.strerror or err})") from None
    except UnicodeDecodeError as err:
        raise JsonlError(f"task.path={str(path)!r}: not UTF-8 text ({err.reason})") from None
    problems = []
    for number, line in enumerate(lines, start=1):
        if not line.strip():
            continue
        where = f"{path}:{number}"
        try:
            record = json.loads(line)
        except json.JSONDecodeError as err:
            raise JsonlError(f"{where}: not a JSON object ({err.msg} at column {err.colno})") from None
        if not isinstance(record, dict):
            raise JsonlError(f"{where}: not a JSON object (got {type(record).__name__})")
        for key in REQUIRED:
            if key not in record:
                raise JsonlError(f"{where}: missing {key!r} (each line needs 'prompt' and 'answer')")
        for key, kind in {**REQUIRED, **OPTIONAL}.items():
            if key in record and not isinstance(record[key], kind):
                raise JsonlError(f"{where}: {key!r} must be a {kind.__name__}, got {type(record[key]).__name__}")
        if not record["prompt"].strip():
            raise JsonlError(f"{where}: 'prompt' is empty")
        if not all(isinstance(h, str) for h in record.get("hints", [])):
            raise JsonlError(f"{where}: 'hints' must be a list of strings")
        problems.append({**record, "line": number})
    if not problems:
        raise JsonlError(f"task.path={str(path)!r}: no problems in it")
    return problems


def split_held_out(problems: list[dict], eval_size: int, eval_seed: int) -> tuple[list[dict], list[dict]]:
    """(training problems, held-out problems) of one bucket: `eval_size` drawn by `eval_seed`, and
    every problem sharing a prompt with a held-out one kept out of training too."""
    if len(problems) <= eval_size:
        raise JsonlError(f"task.eval_size={eval_size}, but a bucket has only {len(problems)} problems: "
                         "lower task.eval_size or add problems (some must be left to train on)")
    order = list(range(len(problems)))
    random.Random(eval_seed).shuffle(order)
    held_out = [problems[i] for i in sorted(order[:eval_size])]
    prompts = {p["prompt"] for p in held_out}
    train = [p for p in problems if p["prompt"] not in prompts]
    if not train:
        raise JsonlError("every training problem repeats a held-out prompt: nothing is left to train on")
    return train, held_out


def bucket_of(problem: dict) -> str:
    return problem.get("bucket", "all")


class JsonlDataset:
    """One bucket's problems as reasoning-gym-style entries, in a fixed order per seed (`dataset[i]`
    wraps around, so the training stream cycles through the file, reshuffled each pass). TaskSource
    indexes every bucket by the stream position, as it does reasoning-gym's generators, so with
    several buckets a pass over one bucket's file may repeat or skip a problem; the passes cover it."""

    def __init__(self, problems: list[dict], seed: int, match: str):
        self.problems, self.seed, self.match = problems, seed, match
        self._epoch, self._order = -1, []

    def __len__(self) -> int:
        return len(self.problems)

    def __getitem__(self, index: int) -> dict:
        epoch, offset = divmod(index, len(self.problems))
        if epoch != self._epoch:      # a pure function of (seed, epoch): resuming needs only the index
            self._epoch, self._order = epoch, list(range(len(self.problems)))
            random.Random(f"{self.seed}:{epoch}").shuffle(self._order)
        return self.entry(self.problems[self._order[offset]])

    @staticmethod
    def entry(problem: dict) -> dict:
        return {"question": problem["prompt"], "answer": problem["answer"],
                "metadata": {"source_dataset": "jsonl", "line": problem["line"],
                             "solution": problem.get("solution"), "hints": problem.get("hints", [])}}

    def score_answer(self, answer: str | None, entry: dict) -> float:
        return score_text(answer, entry["answer"], self.match)


class FileDataset(JsonlDataset):
    """A problem file beside the task (`task.files`: a training source; `eval.private`: an eval
    set), e.g. problems `python -m rl.mine` took from runs. A record that carries the task entry it
    was made from (`entry`, written by rl.mine from a reasoning-gym run) is scored by the task's own
    verifier (`task_scorer`), so a mined problem is judged as it was when mined; any other record by
    math-verify or exact text, as `task.source: jsonl`. The prompt is the record's, as written."""

    def __init__(self, problems: list[dict], seed: int, match: str, task_scorer=None):
        super().__init__(problems, seed, match)
        self.task_scorer = task_scorer

    @staticmethod
    def entry(problem: dict) -> dict:
        entry = JsonlDataset.entry(problem)
        if isinstance(problem.get("entry"), dict):
            entry["metadata"]["task_entry"] = problem["entry"]
        return entry

    def score_answer(self, answer: str | None, entry: dict) -> float:
        task_entry = entry["metadata"].get("task_entry")
        if task_entry is not None and self.task_scorer is not None:
            return float(self.task_scorer(answer, task_entry))
        return score_text(answer, entry["answer"], self.match)


def score_text(answer: str | None, reference: str, match: str) -> float:
    """1.0 when `answer` matches `reference`: by math-verify (`match="math"`) or exact text."""
    if not answer or not answer.strip():
        return 0.0
    if match == "exact":
        return float(answer.strip() == reference.strip())
    from math_verify import parse, verify   # imported on first use: sympy is slow to load

    # math-verify's timeouts use signal.alarm, which only the main thread may set (as teacher/leak.py).
    timeout = 5 if threading.current_thread() is threading.main_thread() else None
    gold = parse(reference, parsing_timeout=timeout)
    if not gold:   # math-verify found no expression in the reference: fall back to exact text
        return float(answer.strip() == reference.strip())
    return float(verify(gold, parse(answer, parsing_timeout=timeout), timeout_seconds=timeout))
