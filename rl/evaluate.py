"""Held-out evaluation: greedy answers without hints, then one hinted retry for each miss.

`eval/accuracy` is the number that matters. `eval/accuracy_hinted` counts a problem as solved if
either the plain answer or the retry with the teacher's hint is right: the gap between the two
is how much better the hint-conditioned (teacher) distribution is than the student's own.
"""
from __future__ import annotations

import torch

from rl.feedback import hint_failed_attempts
from rl.rollout import generate
from rl.tasks import TaskSource
from student.tokenizer import ByteTokenizer
from teacher import LeakGuard, Teacher


@torch.no_grad()
def evaluate(model, tasks: TaskSource, teacher: Teacher, tok: ByteTokenizer,
             max_new_tokens: int) -> dict[str, float]:
    problems = tasks.eval_problems
    out = generate(model, [tok.render_prompt(p.prompt) for p in problems], greedy=True,
                   max_new_tokens=max_new_tokens, eos_id=tok.eos_id, pad_id=tok.pad_id)
    attempts = [tok.decode(row.tolist()) for row in out.completion_ids_NC]
    verdicts = [tasks.verify(p, a) for p, a in zip(problems, attempts)]
    solved = sum(v.reward >= 1.0 for v in verdicts)
    hinted = hint_failed_attempts(teacher, LeakGuard(), tok, problems, attempts, verdicts)
    fixed = 0
    if hinted.rows:
        retry = generate(model, hinted.prompt_ids, greedy=True, max_new_tokens=max_new_tokens,
                         eos_id=tok.eos_id, pad_id=tok.pad_id)
        for row, ids in zip(hinted.rows, retry.completion_ids_NC):
            fixed += tasks.verify(problems[row], tok.decode(ids.tolist())).reward >= 1.0
    n = len(problems)
    return {"eval/accuracy": solved / n, "eval/accuracy_hinted": (solved + fixed) / n,
            "eval/hint_rate": len(hinted.rows) / max(1, n - solved)}
