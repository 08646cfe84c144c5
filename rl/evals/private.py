"""`private`: greedy accuracy on each private eval set (`eval.private: {name: FILE}`), e.g. the
problems `python -m rl.mine` found a run solving only sometimes, kept apart from training: a set a
model cannot have seen (its hashes are refused by the training stream, rl/contamination.py)."""
from __future__ import annotations

from rl.evals import EvalContext, Suite, register
from rl.evaluate import evaluate


@register
class Private(Suite):
    name = "private"
    summary = "greedy accuracy on each private set of eval.private (e.g. mined problems)"

    def sets(self, tasks):
        return tasks.private

    def counts(self, ctx: EvalContext, problems):
        return evaluate(ctx.policy, problems, ctx.tasks, ctx.teacher, ctx.tok, ctx.max_new_tokens,
                        env=ctx.env, max_turns=ctx.max_turns, plain_only=True)

    def report(self, per_set):
        return {f"eval/private/{name}/accuracy": c["solved"] / max(1, c["n"]) for name, c in per_set.items()}
