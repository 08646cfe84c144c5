"""Tasks from reasoning-gym, scored by their own verifiers, with feedback text for the teacher.

Training problems stream from `seed`; held-out problems come from `task.eval_seed`. Seeds alone
do not make the sets disjoint (many generators draw from small spaces: two-term arithmetic has
~20k distinct problems), so the training stream also skips any problem whose prompt is in the
held-out set. `TaskSource.assert_disjoint` re-checks that after the fact.
"""
from __future__ import annotations

from dataclasses import dataclass

import reasoning_gym

from rl.config import TaskConfig


@dataclass
class Problem:
    index: int          # position in its source stream (train cursor or eval index)
    prompt: str
    answer: str         # the reference answer (for the verifier and the teacher's eyes)
    entry: dict         # the reasoning-gym entry, as its verifier expects it


@dataclass
class Verdict:
    reward: float       # in [0, 1]: 0/1 with task.reward=binary, the verifier's score with partial
    feedback: str       # what the verifier says about the attempt (never the answer itself)


def render_prompt(entry: dict, render: str) -> str:
    if render == "question":
        return entry["question"]
    expression = entry.get("metadata", {}).get("expression")
    if expression is None:
        raise ValueError("task.render=expression needs tasks whose metadata has an 'expression'; "
                         f"{entry['metadata'].get('source_dataset')} has none: use task.render=question")
    return expression


class TaskSource:
    def __init__(self, cfg: TaskConfig, seed: int):
        self.cfg = cfg
        self.train = reasoning_gym.create_dataset(cfg.name, seed=seed, size=cfg.train_size, **cfg.config)
        eval_data = reasoning_gym.create_dataset(cfg.name, seed=cfg.eval_seed, size=cfg.eval_size, **cfg.config)
        self.eval_problems = [self._problem(i, eval_data[i]) for i in range(cfg.eval_size)]
        self._eval_prompts = {p.prompt for p in self.eval_problems}
        self.cursor = 0          # next training index; saved in checkpoints
        self.skipped = 0         # training problems skipped because they are held out

    def _problem(self, index: int, entry: dict) -> Problem:
        return Problem(index, render_prompt(entry, self.cfg.render), str(entry["answer"]), entry)

    def next_batch(self, n: int) -> list[Problem]:
        batch: list[Problem] = []
        while len(batch) < n:
            index = self.cursor % self.cfg.train_size
            self.cursor += 1
            problem = self._problem(index, self.train[index])
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
        score = float(self.train.score_answer(attempt, problem.entry))
        if score >= 1.0:
            feedback = "correct"
        elif not attempt.strip():
            feedback = "no answer was given"
        else:
            feedback = f"incorrect: {attempt.strip()!r} does not match the expected answer"
        reward = score if self.cfg.reward == "partial" else float(score >= 1.0)
        return Verdict(reward, feedback)
