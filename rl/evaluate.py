"""Held-out evaluation: greedy answers without hints, then one hinted retry for each miss.

`eval/accuracy` is the number that matters. `eval/accuracy_hinted` counts a problem as solved if
either the plain answer or the retry with the teacher's hint is right: the gap between the two
is how much better the hint-conditioned (teacher) distribution is than the student's own.

`evaluate` returns counts, so that ranks holding shards of the held-out set can sum them;
`eval_metrics` turns (summed) counts into the logged rates.
"""
from __future__ import annotations

import torch

from rl.feedback import hint_failed_attempts
from rl.tasks import Problem, TaskSource
from student.policy import Policy, Sampling
from student.tokenizer import ByteTokenizer
from teacher import LeakGuard, Teacher


@torch.no_grad()
def evaluate(policy: Policy, problems: list[Problem], tasks: TaskSource, teacher: Teacher,
             tok: ByteTokenizer, max_new_tokens: int) -> dict[str, float]:
    if not problems:
        return {"n": 0, "solved": 0, "fixed": 0, "hinted": 0}
    greedy = Sampling(max_new_tokens=max_new_tokens, eos_id=tok.eos_id, pad_id=tok.pad_id, greedy=True)
    out = policy.generate([tok.render_prompt(p.prompt) for p in problems], greedy)
    attempts = [tok.decode(row.tolist()) for row in out.completion_ids_NC]
    verdicts = [tasks.verify(p, a) for p, a in zip(problems, attempts)]
    solved = sum(v.reward >= 1.0 for v in verdicts)
    hinted = hint_failed_attempts(teacher, LeakGuard(), tok, problems, attempts, verdicts)
    fixed = 0
    if hinted.rows:
        retry = policy.generate(hinted.prompt_ids, greedy)
        for row, ids in zip(hinted.rows, retry.completion_ids_NC):
            fixed += tasks.verify(problems[row], tok.decode(ids.tolist())).reward >= 1.0
    return {"n": len(problems), "solved": solved, "fixed": fixed, "hinted": len(hinted.rows)}


def eval_metrics(counts: dict[str, float]) -> dict[str, float]:
    n, solved = counts["n"], counts["solved"]
    return {"eval/accuracy": solved / n, "eval/accuracy_hinted": (solved + counts["fixed"]) / n,
            "eval/hint_rate": counts["hinted"] / max(1, n - solved)}
