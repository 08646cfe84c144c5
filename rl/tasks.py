"""Tasks from reasoning-gym, scored by their own verifiers, with feedback text for the teacher;
or your own problems from a JSON-lines file (`task.source: jsonl`, rl/jsonl_task.py).

Training problems stream from `seed`; held-out problems come from `task.eval_seed`. Seeds alone
do not make the sets disjoint (many generators draw from small spaces: two-term arithmetic has
~20k distinct problems), so the training stream also skips any problem whose prompt is in the
held-out set. `TaskSource.assert_disjoint` re-checks that after the fact.

Difficulty buckets (`task.buckets`: name -> generator settings over `task.config`) make difficulty a
knob: each bucket has its own generator and its own held-out set (`task.eval_size` problems each,
reported per bucket), and a training phase draws from them by weight (`task.mix` for RL,
`warmstart.mix` for warm-start, e.g. the easy buckets only). Which bucket stream position c comes
from is a pure function of (seed, c), so the one-integer cursor still resumes a run exactly. A
held-out prompt of any bucket is skipped by every bucket's stream. Without buckets there is one,
named "all", streaming from the run's seed.
"""
from __future__ import annotations

import random
from dataclasses import dataclass

import reasoning_gym

import rl.hidden_rule  # noqa: F401  (registers task.name: hidden_rule with reasoning-gym)
import rl.hidden_tool_rule  # noqa: F401  (registers task.name: hidden_tool_rule)
from rl.config import EvalConfig, TaskConfig
from rl.contamination import prompt_hash

ALL = "all"             # the one bucket of a task without `task.buckets`


@dataclass
class Problem:
    index: int          # position in its source stream (train cursor or eval index)
    prompt: str
    answer: str         # the reference answer (for the verifier and the teacher's eyes)
    entry: dict         # the reasoning-gym entry, as its verifier expects it
    bucket: str = ALL   # the difficulty bucket it was drawn from


@dataclass
class Verdict:
    reward: float       # in [0, 1]: 0/1 with task.reward=binary, the verifier's score with partial
    feedback: str       # what the verifier says about the attempt (never the answer itself)
    first_wrong: int | None = None   # episodes: index of the first message that went wrong (None: none found)
    expected: str = ""               # what that message should have been (for a rule teacher's eyes only)


def render_prompt(entry: dict, render: str) -> str:
    if render == "question":
        return entry["question"]
    expression = entry.get("metadata", {}).get("expression")
    if expression is None:
        raise ValueError("task.render=expression needs tasks whose metadata has an 'expression'; "
                         f"{entry['metadata'].get('source_dataset')} has none: use task.render=question")
    return expression


def bucket_settings(cfg: TaskConfig) -> dict[str, dict]:
    """Each bucket's generator settings: `task.config` with the bucket's own on top."""
    return {name: {**cfg.config, **own} for name, own in (cfg.buckets or {ALL: {}}).items()}


class TaskSource:
    def __init__(self, cfg: TaskConfig, seed: int, eval_cfg: EvalConfig | None = None):
        self.cfg, self.seed = cfg, seed
        self.train, self.eval_by_bucket = {}, {}
        if cfg.source == "jsonl":
            self._load_jsonl()
        else:
            # Bucket k streams from seed + k and holds out eval_seed + k: bucket 0 keeps the plain seeds.
            for k, (name, settings) in enumerate(bucket_settings(cfg).items()):
                self.train[name] = reasoning_gym.create_dataset(cfg.name, seed=seed + k, size=cfg.train_size, **settings)
                held_out = reasoning_gym.create_dataset(cfg.name, seed=cfg.eval_seed + k, size=cfg.eval_size, **settings)
                self.eval_by_bucket[name] = [self._problem(i, held_out[i], name) for i in range(cfg.eval_size)]
        self.buckets = list(self.train)
        self.eval_problems = [p for problems in self.eval_by_bucket.values() for p in problems]
        self._scorers = dict(self.train)     # bucket -> what scores its problems (train sources and eval sets)
        self.private = {name: self._load_file(name, path, seed) for name, path in
                        (eval_cfg.private if eval_cfg is not None else {}).items()}
        # Every eval set the run reports, as prompt hashes: nothing in them is trained on.
        self.eval_sets = {f"heldout/{b}": {prompt_hash(p.prompt) for p in problems}
                          for b, problems in self.eval_by_bucket.items()}
        self.eval_sets.update({f"private/{name}": {prompt_hash(p.prompt) for p in problems}
                               for name, problems in self.private.items()})
        self._blocked = set().union(*self.eval_sets.values())
        self.refused_at_load: dict[str, int] = {}
        for k, (name, path) in enumerate(cfg.files.items()):
            self._add_training_file(name, path, seed + len(self.buckets) + k)
        self.sources = list(self.train)      # buckets, then files: what a mix may name
        self.cursor = 0          # next training position; saved in checkpoints
        self.skipped = 0         # training problems drawn from a generator and refused: their hash is in an eval set

    def _load_jsonl(self) -> None:
        """`task.source: jsonl`: each bucket of the file split into held-out and training problems
        (rl/jsonl_task.py), the training stream in a per-seed order that cycles."""
        from rl.jsonl_task import JsonlDataset, bucket_of, load_problems, split_held_out

        problems = load_problems(self.cfg.path)
        for k, name in enumerate(sorted({bucket_of(p) for p in problems})):
            train, held_out = split_held_out([p for p in problems if bucket_of(p) == name],
                                             self.cfg.eval_size, self.cfg.eval_seed + k)
            self.train[name] = JsonlDataset(train, self.seed + k, self.cfg.match)
            self.eval_by_bucket[name] = [self._problem(i, JsonlDataset.entry(p), name) for i, p in enumerate(held_out)]

    def _file_dataset(self, records: list[dict], seed: int):
        from rl.jsonl_task import FileDataset

        # Records mined from a reasoning-gym run carry their entry: the task's verifier scores them.
        base = next(iter(self.train.values()), None) if self.cfg.source != "jsonl" else None
        return FileDataset(records, seed, self.cfg.match, base.score_answer if base is not None else None)

    def _load_file(self, name: str, path: str, seed: int) -> list[Problem]:
        """A private eval set: every problem of the file, scored like a training file's."""
        from rl.jsonl_task import load_problems

        records = load_problems(path)
        bucket = f"private/{name}"
        self._scorers[bucket] = dataset = self._file_dataset(records, seed)
        return [Problem(i, r["prompt"], r["answer"], dataset.entry(r), bucket) for i, r in enumerate(records)]

    def _add_training_file(self, name: str, path: str, seed: int) -> None:
        from rl.jsonl_task import JsonlError, load_problems

        records = load_problems(path)
        kept = [r for r in records if prompt_hash(r["prompt"]) not in self._blocked]
        self.refused_at_load[name] = len(records) - len(kept)
        if not kept:
            raise JsonlError(f"task.files.{name}={path!r}: all {len(records)} problems are in an eval set this run "
                             "reports; nothing is left to train on")
        self.train[name] = self._scorers[name] = self._file_dataset(kept, seed)

    def _problem(self, index: int, entry: dict, bucket: str) -> Problem:
        if bucket in self.cfg.files:         # a file's prompt is its record's, as written
            return Problem(index, entry["question"], str(entry["answer"]), entry, bucket)
        return Problem(index, render_prompt(entry, self.cfg.render), str(entry["answer"]), entry, bucket)

    def bucket_at(self, position: int, mix: dict[str, float]) -> str:
        """The source (bucket or file) stream position `position` draws from under `mix` (name ->
        weight; empty = the buckets alike, files only when named): a function of (seed, position)
        only, so resuming needs only the cursor."""
        names = [b for b in self.sources if mix.get(b, 0.0) > 0] if mix else self.buckets
        if len(names) == 1:
            return names[0]
        weights = [mix[b] for b in names] if mix else None
        return random.Random(f"{self.seed}:{position}").choices(names, weights)[0]

    def next_batch(self, n: int, mix: dict[str, float] | None = None) -> list[Problem]:
        """The next n training problems, drawn from the sources by `mix` (default `task.mix`)."""
        mix = self.cfg.mix if mix is None else mix
        batch: list[Problem] = []
        while len(batch) < n:
            bucket = self.bucket_at(self.cursor, mix)
            index = self.cursor % self.cfg.train_size
            self.cursor += 1
            problem = self._problem(index, self.train[bucket][index], bucket)
            if prompt_hash(problem.prompt) in self._blocked:
                self.skipped += 1
                continue
            batch.append(problem)
        return batch

    def assert_disjoint(self, problems: list[Problem]) -> None:
        leaked = [p.prompt for p in problems if prompt_hash(p.prompt) in self._blocked]
        assert not leaked, f"held-out or private eval problems reached training: {leaked[:3]}"

    def verify(self, problem: Problem, attempt: str) -> Verdict:
        """The verifier's verdict. `task.reward=binary` (default) pays 1 only for a fully correct
        answer: reasoning-gym's scores give partial credit (0.75 for -280 against -28, for any
        attempt that contains the answer), which would reward wrong answers in the policy gradient
        while the hint methods treat them as failed. `partial` keeps the verifier's score."""
        score = float(self._scorers[problem.bucket].score_answer(attempt, problem.entry))
        if score >= 1.0:
            feedback = "correct"
        elif not attempt.strip():
            feedback = "no answer was given"
        elif hasattr(self._scorers[problem.bucket], "feedback"):     # a task with its own words (rl/hidden_rule.py)
            feedback = self._scorers[problem.bucket].feedback(attempt, problem.entry)
        else:
            feedback = f"incorrect: {attempt.strip()!r} does not match the expected answer"
        reward = score if self.cfg.reward == "partial" else float(score >= 1.0)
        return Verdict(reward, feedback)
