"""`hinted`: the held-out problems answered plainly, then each failed one retried with the
teacher's hint, and answered by the run's self-teacher with the hint in context: accuracy, hinted
accuracy, hint rate and the teacher gap, overall and per bucket (rl/evals/greedy.py says what each is).
The trainer's default periodic evaluation."""
from __future__ import annotations

from rl.evals.base import EvalContext
from rl.evals.heldout import HeldOut
from rl.evals.greedy import eval_metrics, evaluate


class Hinted(HeldOut):
    """`heldout`'s sets, with the hinted retries and the self-teacher on top."""
    name = "hinted"
    summary = "accuracy, accuracy with one hinted retry, and the self-teacher's gap, per bucket"
    subsumed_by = None

    def counts(self, ctx: EvalContext, problems):
        return evaluate(ctx.policy, problems, ctx.tasks, ctx.teacher, ctx.tok, ctx.max_new_tokens,
                        teacher_policy=ctx.teacher_policy, env=ctx.env, max_turns=ctx.max_turns)

    def report(self, per_set):
        total = {k: sum(c[k] for c in per_set.values()) for k in next(iter(per_set.values()))}
        metrics = eval_metrics(total)
        if len(per_set) > 1:
            for bucket, counts in per_set.items():
                metrics.update({f"{k}/{bucket}": v for k, v in eval_metrics(counts).items()})
        return metrics
