"""Held-out evaluation: greedy answers without hints, then the same problems with the hint.

`eval/accuracy` is the number that matters. `eval/accuracy_hinted` counts a problem as solved if
either the plain answer or the retry with the teacher's hint is right: the gap between the two
is how much better the hint-conditioned distribution is than the student's own.

`eval/accuracy_with_hint` is the self-teacher's accuracy: the teacher weights of the run's method
(`method.teacher_weights`: the student itself when live, else its EMA or frozen copy) answer every
problem greedily with the hint in context where the student's answer got one (a correct answer gets
no hint, nor does one whose hint the leak guard dropped; those are answered plainly).
`eval/teacher_gap` = accuracy_with_hint - accuracy: how far the distillation target is ahead.

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
             tok: ByteTokenizer, max_new_tokens: int, teacher_policy: Policy | None = None) -> dict[str, float]:
    if not problems:
        return {"n": 0, "solved": 0, "fixed": 0, "hinted": 0, "with_hint": 0}
    greedy = Sampling(max_new_tokens=max_new_tokens, eos_id=tok.eos_id, pad_id=tok.pad_id, greedy=True)
    plain = [tok.render_prompt(p.prompt) for p in problems]
    out = policy.generate(plain, greedy)
    attempts = [tok.decode(row.tolist()) for row in out.completion_ids_NC]
    verdicts = [tasks.verify(p, a) for p, a in zip(problems, attempts)]
    correct = [v.reward >= 1.0 for v in verdicts]
    hinted = hint_failed_attempts(teacher, LeakGuard(), tok, problems, attempts, verdicts)
    teacher_policy = policy if teacher_policy is None else teacher_policy

    def solves(rows: list[int], prompts: list[list[int]], by: Policy) -> dict[int, bool]:
        if not rows:
            return {}
        ids = by.generate(prompts, greedy).completion_ids_NC
        return {r: tasks.verify(problems[r], tok.decode(row.tolist())).reward >= 1.0 for r, row in zip(rows, ids)}

    retry = solves(hinted.rows, hinted.prompt_ids, policy)
    if teacher_policy is policy:
        with_hint = {i: retry.get(i, correct[i]) for i in range(len(problems))}
    else:
        # The teacher's own answers: with the hint where there is one, plain elsewhere.
        prompt_of = dict(zip(hinted.rows, hinted.prompt_ids))
        rows = list(range(len(problems)))
        with_hint = solves(rows, [prompt_of.get(i, plain[i]) for i in rows], teacher_policy)
    return {"n": len(problems), "solved": sum(correct), "fixed": sum(retry.values()), "hinted": len(hinted.rows),
            "with_hint": sum(with_hint.values())}


def eval_metrics(counts: dict[str, float]) -> dict[str, float]:
    n, solved = counts["n"], counts["solved"]
    return {"eval/accuracy": solved / n, "eval/accuracy_hinted": (solved + counts["fixed"]) / n,
            "eval/hint_rate": counts["hinted"] / max(1, n - solved),
            "eval/accuracy_with_hint": counts["with_hint"] / n,
            "eval/teacher_gap": (counts["with_hint"] - solved) / n}
