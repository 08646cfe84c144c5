"""Mine training runs for the problems the student solves only sometimes, as a problem file.

    python -m rl.mine RUN_DIR [RUN_DIR ...] --out mined.jsonl
        [--include-unsolved] [--min-attempts N] [--since-step S] [--examples N]
        [--remeasure RUN_OR_CHECKPOINT_OR_EXPORT [--samples K] [--seed S] [--batch-size ROWS]
         [--experiment DIR] [--set KEY=VALUE ...]]

Input: each run folder's per-problem log `problems.jsonl`, one object per (RL step, problem) of
rank 0's batch, every attempt of it:

    {"step": 12, "prompt": "12 + 35", "answer": "47", "bucket": "all", "hash": "…",
     "entry": {the task entry, as reasoning-gym gives it}, "rewards": [1.0, 0.0, …],
     "attempts": ["47", "46", …], "feedback": ["correct", …], "hints": [null, "…", …]}

A run written before that log existed has only `rollouts.jsonl` (a sample of each step's attempts:
the first `trainer.log_rollouts`); it is read instead, said on stderr, its rows without `source`
or with source "rollout" counting as attempts. It logs no task entry and no bucket.

Each problem (keyed by `rl.contamination.prompt_hash` of its prompt) is aggregated over all its
appearances in all the runs: attempts, solved attempts (reward >= 1), pass rate, the distinct
hints it was given, example attempts with the verifier's feedback, the steps it was drawn at.
Kept: problems with 0 < pass rate < 1, solved only sometimes (`--include-unsolved`: pass rate 0
too), drawn at step >= `--since-step` with at least `--min-attempts` attempts there.

`--remeasure PATH` (a run folder, a checkpoint folder or an export folder: rl/load_policy.py)
samples every candidate problem K more times (`--samples`, default 16) with that policy, at its
run config's rollout.temperature, max_new_tokens and max_turns, in the run's environment, scored by
the task's own verifier (rl.tasks.TaskSource.verify, the problem's entry in hand), in batches of
about `--batch-size` rows. The written pass rates are then these, k/K (the logged ones stay as
`logged_*`), and the filter applies to them. Sampling is seeded (`--seed`): the same arguments give
the same file.

Output: JSON lines in the task format (rl/jsonl_task.py), so `task.source=jsonl task.path=FILE`
or `task.files.NAME=FILE` trains on it, sorted by pass rate then prompt:

    {"prompt": str, "answer": str, "bucket": str (the run's; absent from a rollouts.jsonl run),
     "hints": [distinct hints the run's teacher gave, first seen first],
     "hash": str, "pass_rate": float, "n_attempts": int, "n_solved": int,
     "attempts": [{"text", "reward", "feedback", "hint", "count"}, …]   distinct, failed ones first
                                                                      (at most --examples, default 8)
     "entry": {the task entry: the task's own verifier scores the problem with it; absent when
               the run logged none; for a problem the run drew from a problem file (task.files),
               the task entry that file carried},
     "mined_from": [run folders], "steps": [steps it was drawn at],
     with --remeasure also:
     "logged_pass_rate", "logged_n_attempts", "logged_n_solved",
     "remeasured": {"policy": what was loaded, "samples", "temperature", "max_new_tokens", "seed"},
     "remeasured_attempts": [{"text", "reward", "feedback", "count"}, …]}

A summary (problems seen, kept, per bucket, a pass-rate histogram) goes to stdout. A run folder
without either log is one error line and exit status 2, as is a policy that cannot be loaded.
"""
from __future__ import annotations

import argparse
import json
import os
import sys
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path

from rl.contamination import prompt_hash
from rl.runlog import LogError, log_lines

PROBLEMS_LOG = "problems.jsonl"
ROLLOUTS_LOG = "rollouts.jsonl"
UNKNOWN = "(unknown)"         # the bucket of a problem from a rollouts.jsonl run


class MineError(ValueError):
    """An input that cannot be mined; the message is one line naming the file."""


@dataclass
class Appearance:
    """One problem at one step of one run, with its attempts."""
    run: str
    step: int
    prompt: str
    answer: str
    bucket: str | None
    entry: dict | None
    rewards: list[float]
    attempts: list[str]
    feedback: list[str]
    hints: list[str | None]


@dataclass
class Seen:
    """One problem over all its appearances."""
    hash: str
    prompt: str
    answer: str
    bucket: str | None
    entry: dict | None
    rewards: list[float] = field(default_factory=list)
    attempts: list[tuple[str, float, str, str | None]] = field(default_factory=list)  # (text, reward, feedback, hint)
    hints: list[str] = field(default_factory=list)
    steps: set[int] = field(default_factory=set)
    runs: list[str] = field(default_factory=list)

    @property
    def n_attempts(self) -> int:
        return len(self.rewards)

    @property
    def n_solved(self) -> int:
        return sum(r >= 1.0 for r in self.rewards)

    @property
    def pass_rate(self) -> float:
        return self.n_solved / self.n_attempts if self.rewards else 0.0


# ---------------------------------------------------------------------- reading the logs
def _json_lines(path: Path):
    """(line number, object) of each line (rl/runlog.py: a cut-short last line is skipped, any
    other line that is not a JSON object is an error)."""
    try:
        yield from log_lines(path)
    except LogError as err:
        raise MineError(str(err)) from None


def _need(record: dict, key: str, kind, where: str):
    value = record.get(key)
    if not isinstance(value, kind) or isinstance(value, bool):
        what = " or ".join(k.__name__ for k in (kind if isinstance(kind, tuple) else (kind,)))
        raise MineError(f"{where}: {key!r} is missing or not a {what}")
    return value


def _padded(values, n: int, fill) -> list:
    values = list(values) if isinstance(values, list) else []
    return (values + [fill] * n)[:n]


def read_problems_log(run: Path, since_step: int) -> list[Appearance]:
    path, out = run / PROBLEMS_LOG, []
    for number, rec in _json_lines(path):
        where = f"{path}:{number}"
        step = _need(rec, "step", int, where)
        if step < since_step:
            continue
        rewards = _need(rec, "rewards", list, where)
        if not all(isinstance(r, (int, float)) and not isinstance(r, bool) for r in rewards):
            raise MineError(f"{where}: 'rewards' must be a list of numbers")
        rewards = [float(r) for r in rewards]
        n = len(rewards)
        entry = rec.get("entry")
        if isinstance(entry, dict) and isinstance(entry.get("metadata"), dict) and \
                isinstance(entry["metadata"].get("task_entry"), dict):
            entry = entry["metadata"]["task_entry"]     # drawn from a problem file: the task entry it carries
        out.append(Appearance(str(run), step, _need(rec, "prompt", str, where), str(_need(rec, "answer", (str, int, float), where)),
                              rec.get("bucket") if isinstance(rec.get("bucket"), str) else None,
                              entry if isinstance(entry, dict) else None, rewards,
                              [str(a) for a in _padded(rec.get("attempts"), n, "")],
                              [str(f) for f in _padded(rec.get("feedback"), n, "")],
                              [h if isinstance(h, str) else None for h in _padded(rec.get("hints"), n, None)]))
    return out


def read_rollouts_log(run: Path, since_step: int) -> list[Appearance]:
    """rollouts.jsonl's attempt rows, grouped by (step, prompt)."""
    path, groups = run / ROLLOUTS_LOG, {}
    for number, rec in _json_lines(path):
        where = f"{path}:{number}"
        if rec.get("source", "rollout") != "rollout":
            continue                                   # a row a method added (e.g. a corrected attempt)
        step = _need(rec, "step", int, where)
        if step < since_step:
            continue
        prompt = _need(rec, "prompt", str, where)
        key = (step, prompt)
        if key not in groups:
            groups[key] = Appearance(str(run), step, prompt, str(_need(rec, "answer", (str, int, float), where)),
                                     None, None, [], [], [], [])
        a = groups[key]
        a.rewards.append(float(_need(rec, "reward", (int, float), where)))
        a.attempts.append(str(rec.get("attempt", "")))
        a.feedback.append(str(rec.get("feedback", "")))
        a.hints.append(rec["hint"] if isinstance(rec.get("hint"), str) else None)
    return list(groups.values())


def read_run(run: Path, since_step: int = 0) -> tuple[list[Appearance], str]:
    """The run's appearances and which log they came from."""
    if (run / PROBLEMS_LOG).is_file():
        return read_problems_log(run, since_step), PROBLEMS_LOG
    if (run / ROLLOUTS_LOG).is_file():
        print(f"[mine] {run}: no {PROBLEMS_LOG} (a run from before it was written); reading {ROLLOUTS_LOG}, "
              "which holds only a sample of each step's attempts (trainer.log_rollouts), no task entry "
              "and no bucket", file=sys.stderr)
        return read_rollouts_log(run, since_step), ROLLOUTS_LOG
    what = "no such folder" if not run.is_dir() else f"neither {PROBLEMS_LOG} nor {ROLLOUTS_LOG} in it (not a run folder?)"
    raise MineError(f"{run}: {what}")


def aggregate(appearances: list[Appearance]) -> dict[str, Seen]:
    """Per prompt hash, in order of first appearance."""
    seen: dict[str, Seen] = {}
    conflicts = 0
    for a in appearances:
        key = prompt_hash(a.prompt)
        s = seen.get(key)
        if s is None:
            s = seen[key] = Seen(key, a.prompt, a.answer, a.bucket, a.entry)
        elif a.answer != s.answer:
            conflicts += 1                # the same prompt with another answer (another task's run)
            continue
        s.bucket = s.bucket or a.bucket
        s.entry = s.entry if s.entry is not None else a.entry
        s.rewards += a.rewards
        s.attempts += list(zip(a.attempts, a.rewards, a.feedback, a.hints))
        for hint in a.hints:
            if hint and hint not in s.hints:
                s.hints.append(hint)
        s.steps.add(a.step)
        if a.run not in s.runs:
            s.runs.append(a.run)
    if conflicts:
        print(f"[mine] {conflicts} appearance(s) of a prompt with another answer than its first were left out",
              file=sys.stderr)
    return seen


def examples(attempts, cap: int) -> list[dict]:
    """Distinct attempts (by text and hint), failed ones first, each with how often it came up;
    at most two solved ones, and `cap` in all."""
    counts, first = Counter(), {}
    for text, reward, feedback, *hint in attempts:
        key = (text, hint[0] if hint else None)
        counts[key] += 1
        first.setdefault(key, (text, reward, feedback, *hint))
    failed = [k for k in first if first[k][1] < 1.0]
    solved = [k for k in first if first[k][1] >= 1.0]
    n_solved = min(len(solved), 2, cap)
    chosen = failed[:cap - n_solved] + solved[:n_solved]
    out = []
    for key in chosen:
        text, reward, feedback, *hint = first[key]
        ex = {"text": text, "reward": reward, "feedback": feedback}
        if hint:
            ex["hint"] = hint[0]
        ex["count"] = counts[key]
        out.append(ex)
    return out


def kept(rate: float, include_unsolved: bool) -> bool:
    return 0.0 < rate < 1.0 or (include_unsolved and rate == 0.0)


def record_of(s: Seen, cap: int) -> dict:
    rec = {"prompt": s.prompt, "answer": s.answer}
    if s.bucket is not None:
        rec["bucket"] = s.bucket
    rec.update(hints=list(s.hints), hash=s.hash, pass_rate=s.pass_rate, n_attempts=s.n_attempts,
               n_solved=s.n_solved, attempts=examples(s.attempts, cap))
    if s.entry is not None:
        rec["entry"] = s.entry
    rec.update(mined_from=list(s.runs), steps=sorted(s.steps))
    return rec


# ---------------------------------------------------------------------- re-measuring
def remeasure(records: list[dict], loaded, samples: int, seed: int = 0, batch_rows: int = 256,
              cap: int = 8, progress: bool = True) -> None:
    """Sample each record's problem `samples` times with `loaded` (rl.load_policy.Loaded) in its
    run's environment and verifier; the records' pass rates become these (the logged ones move to
    logged_*). Seeded once, batches in the records' order: the same inputs give the same rates."""
    import torch
    from tqdm import tqdm

    from rl.assembly import run_parts
    from rl.episodes import Episodes
    from rl.tasks import Problem

    if not records:
        return
    cfg, tok = loaded.cfg, loaded.tok
    parts = run_parts(cfg, tok)
    tasks, env, sampling, ro = parts.tasks, parts.env, parts.sampling, cfg.rollout
    # A problem of a bucket is scored by that bucket's verifier. One drawn from a problem file
    # (task.files) carries its task entry, which the task's verifier scores as the file source
    # itself does (rl/jsonl_task.py::FileDataset); so does any problem of a bucket this config lacks.
    sources = set(getattr(tasks, "sources", tasks.buckets))
    strangers = sorted({r.get("bucket", UNKNOWN) for r in records} - sources)
    if strangers:
        print(f"[mine] buckets {strangers} are not the re-measuring config's ({sorted(sources)}); "
              f"their problems are scored by {tasks.buckets[0]!r}'s verifier", file=sys.stderr)

    def problem(index: int, rec: dict) -> Problem:
        bucket = rec.get("bucket")
        entry = rec.get("entry") or {"question": rec["prompt"], "answer": rec["answer"], "metadata": {}}
        return Problem(index, rec["prompt"], rec["answer"], entry,
                       bucket if bucket in tasks.buckets else tasks.buckets[0])

    per_batch = max(1, batch_rows // samples)
    torch.manual_seed(seed)
    with torch.no_grad(), tqdm(total=len(records), unit="problem", desc="remeasure", file=sys.stderr,
                               dynamic_ncols=True, disable=not progress) as bar:
        for start in range(0, len(records), per_batch):
            chunk = records[start:start + per_batch]
            group = [problem(start + i, rec) for i, rec in enumerate(chunk) for _ in range(samples)]
            episodes = Episodes(env, tok, group, ro.max_turns, ro.max_new_tokens)
            out = loaded.policy.generate(episodes.prompts, sampling, episodes)
            texts = [t.final_text() for t in episodes.transcripts(out.mask_NC)]
            verdicts = episodes.verdicts()
            for i, rec in enumerate(chunk):
                rows = range(i * samples, (i + 1) * samples)
                solved = sum(verdicts[r].reward >= 1.0 for r in rows)
                rec["logged_pass_rate"], rec["logged_n_attempts"], rec["logged_n_solved"] = (
                    rec["pass_rate"], rec["n_attempts"], rec["n_solved"])
                rec.update(pass_rate=solved / samples, n_attempts=samples, n_solved=solved)
                rec["remeasured"] = {"policy": loaded.description, "samples": samples,
                                     "temperature": ro.temperature, "max_new_tokens": ro.max_new_tokens,
                                     "seed": seed}
                rec["remeasured_attempts"] = examples(
                    [(texts[r], verdicts[r].reward, verdicts[r].feedback) for r in rows], cap)
            bar.update(len(chunk))


# ---------------------------------------------------------------------- the summary
def _decile(i: int) -> str:
    return "(0, 0.1)" if i == 0 else "[%.1f, %.1f)" % (i / 10, (i + 1) / 10)


BINS = ["0", *(_decile(i) for i in range(10)), "1"]     # the summary's pass-rate histogram


def rate_bin(rate: float) -> str:
    if rate <= 0.0:
        return "0"
    if rate >= 1.0:
        return "1"
    return _decile(min(int(rate * 10), 9))


def summary(sources: list[tuple[str, str]], candidates: list[dict], out: list[dict], include_unsolved: bool,
            seen_total: int, min_attempts: int, path: Path) -> str:
    lines = [f"mined {len(sources)} run folder(s): " + ", ".join(f"{run} ({log})" for run, log in sources)]
    measured = " (re-measured)" if candidates and "remeasured" in candidates[0] else ""
    which = ("0 <= pass rate < 1" if include_unsolved else "0 < pass rate < 1") + measured
    logged = sum(r.get("logged_n_attempts", r["n_attempts"]) for r in candidates)
    lines.append(f"problems seen: {seen_total}; with >= {min_attempts} logged attempts: {len(candidates)} "
                 f"({logged} attempts); kept: {len(out)} ({which})")
    if candidates and "remeasured" in candidates[0]:
        m = candidates[0]["remeasured"]
        lines.append(f"re-measured with {m['policy']}: {m['samples']} samples at temperature {m['temperature']}, "
                     f"max_new_tokens {m['max_new_tokens']}, seed {m['seed']}")
    buckets = Counter(r.get("bucket", UNKNOWN) for r in candidates)
    kept_buckets = Counter(r.get("bucket", UNKNOWN) for r in out)
    lines.append("by bucket (kept / candidates): " + ", ".join(f"{b} {kept_buckets[b]}/{n}" for b, n in sorted(buckets.items())))
    hist, hist_kept = Counter(rate_bin(r["pass_rate"]) for r in candidates), Counter(rate_bin(r["pass_rate"]) for r in out)
    width = max([1, *hist.values()])
    lines.append(f"pass rate{measured}   candidates  kept")
    for b in BINS:
        bar = "#" * round(30 * hist[b] / width)
        lines.append(f"  {b:<12} {hist[b]:>9}  {hist_kept[b]:>5}  {bar}")
    lines.append(f"wrote {len(out)} problems to {path}")
    return "\n".join(lines)


# ---------------------------------------------------------------------- the command
def mine(runs: list[str | Path], min_attempts: int = 1, since_step: int = 0, cap: int = 8) -> tuple[list[dict], list[tuple[str, str]], int]:
    """(candidate records sorted by pass rate then prompt, (run, log) per run, problems seen).
    Candidates are the problems with >= min_attempts attempts since `since_step`, before the pass-rate
    filter (`select`)."""
    appearances, sources = [], []
    for run in dict.fromkeys(str(Path(r)) for r in runs):
        found, log = read_run(Path(run), since_step)
        appearances += found
        sources.append((run, log))
    seen = aggregate(appearances)
    candidates = [record_of(s, cap) for s in seen.values() if s.n_attempts >= max(1, min_attempts)]
    return sort_records(candidates), sources, len(seen)


def sort_records(records: list[dict]) -> list[dict]:
    return sorted(records, key=lambda r: (r["pass_rate"], r["prompt"], r["hash"]))


def select(records: list[dict], include_unsolved: bool) -> list[dict]:
    return sort_records([r for r in records if kept(r["pass_rate"], include_unsolved)])


def write_jsonl(records: list[dict], path: Path) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.tmp-{os.getpid()}")
    tmp.write_text("".join(json.dumps(r, ensure_ascii=False) + "\n" for r in records), encoding="utf-8")
    os.replace(tmp, path)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m rl.mine", description=__doc__.splitlines()[0],
                                     formatter_class=argparse.RawDescriptionHelpFormatter,
                                     epilog="Input and output formats: see the module docstring (rl/mine.py).")
    parser.add_argument("runs", nargs="+", metavar="RUN_DIR", help="run folders to mine")
    parser.add_argument("--out", required=True, type=Path, help="the JSON-lines file to write")
    parser.add_argument("--include-unsolved", action="store_true", help="keep problems never solved too")
    parser.add_argument("--min-attempts", type=int, default=1, metavar="N",
                        help="only problems with at least N logged attempts (default 1)")
    parser.add_argument("--since-step", type=int, default=0, metavar="S", help="only appearances at step >= S")
    parser.add_argument("--examples", type=int, default=8, metavar="N", help="example attempts kept per problem")
    group = parser.add_argument_group("re-measuring")
    group.add_argument("--remeasure", metavar="PATH", help="a run, checkpoint or export folder (rl/load_policy.py)")
    group.add_argument("--samples", type=int, default=16, metavar="K", help="samples per problem (default 16)")
    group.add_argument("--seed", type=int, default=0)
    group.add_argument("--batch-size", type=int, default=256, metavar="ROWS", help="rows per generation batch")
    group.add_argument("--experiment", help="the experiment folder of an export without its config")
    group.add_argument("--set", action="append", default=[], metavar="KEY=VALUE", dest="overrides",
                       help="config override for the re-measuring policy (repeatable)")
    group.add_argument("--threads", type=int, default=0, help="torch threads (0: torch's default)")
    args = parser.parse_args(argv)
    for name in ("samples", "batch_size", "min_attempts", "examples"):
        if getattr(args, name) < (0 if name == "examples" else 1):
            parser.error(f"--{name.replace('_', '-')} must be at least {0 if name == 'examples' else 1}")
    try:
        candidates, sources, seen_total = mine(args.runs, args.min_attempts, args.since_step, args.examples)
    except MineError as err:
        print(f"mine error: {err}", file=sys.stderr)
        return 2
    if args.remeasure:
        from rl.checkpoint import CheckpointError
        from rl.load_policy import load_policy
        from student.safe_load import UnsafeCheckpointError

        if args.threads:
            import torch
            torch.set_num_threads(args.threads)
        try:
            loaded = load_policy(args.remeasure, args.experiment, args.overrides)
        except (ValueError, FileNotFoundError, CheckpointError, UnsafeCheckpointError) as err:
            print(f"mine error: --remeasure: {err}", file=sys.stderr)
            return 2
        print(f"[mine] re-measuring {len(candidates)} problems, {args.samples} samples each, with "
              f"{loaded.description}", file=sys.stderr)
        remeasure(candidates, loaded, args.samples, args.seed, args.batch_size, args.examples)
        candidates = sort_records(candidates)
    out = select(candidates, args.include_unsolved)
    write_jsonl(out, args.out)
    print(summary(sources, candidates, out, args.include_unsolved, seen_total, args.min_attempts, args.out))
    if not out:
        print(f"[mine] nothing was kept: {args.out} is empty", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
