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
named "all", and the stream is the one it always was.
"""
from __future__ import annotations

import random
from dataclasses import dataclass

import reasoning_gym

from rl.config import TaskConfig

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
    def __init__(self, cfg: TaskConfig, seed: int):
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
        self._eval_prompts = {p.prompt for p in self.eval_problems}
        self.cursor = 0          # next training position; saved in checkpoints
        self.skipped = 0         # training problems skipped because they are held out

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

    def _problem(self, index: int, entry: dict, bucket: str) -> Problem:
        return Problem(index, render_prompt(entry, self.cfg.render), str(entry["answer"]), entry, bucket)

    def bucket_at(self, position: int, mix: dict[str, float]) -> str:
        """The bucket stream position `position` draws from under `mix` (name -> weight; empty =
        every bucket alike): a function of (seed, position) only, so resuming needs only the cursor."""
        if len(self.buckets) == 1:
            return self.buckets[0]
        names = [b for b in self.buckets if mix.get(b, 0.0) > 0] if mix else self.buckets
        weights = [mix[b] for b in names] if mix else None
        return random.Random(f"{self.seed}:{position}").choices(names, weights)[0]

    def next_batch(self, n: int, mix: dict[str, float] | None = None) -> list[Problem]:
        """The next n training problems, drawn from the buckets by `mix` (default `task.mix`)."""
        mix = self.cfg.mix if mix is None else mix
        batch: list[Problem] = []
        while len(batch) < n:
            bucket = self.bucket_at(self.cursor, mix)
            index = self.cursor % self.cfg.train_size
            self.cursor += 1
            problem = self._problem(index, self.train[bucket][index], bucket)
            if problem.prompt in self._eval_prompts:
                self.skipped += 1
                continue
            batch.append(problem)
        return batch

    def assert_disjoint(self, problems: list[Problem]) -> None:
        leaked = [p.prompt for p in problems if p.prompt in self._eval_prompts]
        assert not leaked, f"held-out problems reached training: {leaked[:3]}"

    def verify(self, problem: Problem, attempt: str) -> Verdict:
        """The verifier's verdict. `task.reward=binary` (default) pays 1 only for a fully correct
        answer: reasoning-gym's scores give partial credit (0.75 for -280 against -28, for any
        attempt that contains the answer), which would reward wrong answers in the policy gradient
        while the hint methods treat them as failed. `partial` keeps the verifier's score."""
        score = float(self.train[problem.bucket].score_answer(attempt, problem.entry))
        if score >= 1.0:
            feedback = "correct"
        elif not attempt.strip():
            feedback = "no answer was given"
        else:
            feedback = f"incorrect: {attempt.strip()!r} does not match the expected answer"
        reward = score if self.cfg.reward == "partial" else float(score >= 1.0)
        return Verdict(reward, feedback)
