"""`heldout`: greedy accuracy on each difficulty bucket's held-out problems, without the teacher.

The cheapest suite; `hinted` reports the same accuracy beside the teacher gap (listing both runs
`hinted` only)."""
from __future__ import annotations

from rl.evals.base import EvalContext, Suite
from rl.evals.greedy import evaluate


class HeldOut(Suite):
    name = "heldout"
    summary = "greedy accuracy per difficulty bucket, no hints"
    subsumed_by = "hinted"

    def sets(self, tasks):
        return tasks.eval_by_bucket

    def counts(self, ctx: EvalContext, problems):
        return evaluate(ctx.policy, problems, ctx.tasks, ctx.teacher, ctx.tok, ctx.max_new_tokens,
                        env=ctx.env, max_turns=ctx.max_turns, plain_only=True)

    def report(self, per_set):
        n, solved = sum(c["n"] for c in per_set.values()), sum(c["solved"] for c in per_set.values())
        metrics = {"eval/accuracy": solved / max(1, n)}
        if len(per_set) > 1:
            metrics.update({f"eval/accuracy/{b}": c["solved"] / max(1, c["n"]) for b, c in per_set.items()})
        return metrics
