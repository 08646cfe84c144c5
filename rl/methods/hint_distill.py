"""GRPO plus on-policy distillation toward the hint-conditioned policy (targeted textual feedback).

Stages it adds: a teacher writes a hint for every failed attempt (rl/feedback.py, leak-guarded);
the student's own sampled tokens are scored, without gradient, with the hint in the target
message's context, by the self-teacher's weights (`teacher_weights`: the live student, an EMA of
it, or its weights when RL began; rl/teacher_weights.py). Those scores are the teacher
distribution. Loss: `pg_coef` (1) x the GRPO term plus `distill_coef` x a divergence from the student (hint-free
context) to that teacher on the hinted rows' tokens, up to the teacher's first disagreement
(`distill_span`). The teacher scores ask only for what the estimator needs (rl/methods/distill.py).
"""
from __future__ import annotations

from dataclasses import dataclass

from rl.batch import RowTargets
from rl.feedback import hint_failed_attempts
from rl.methods.distill import Distilling, SelfTeacherConfig, score_teacher


@dataclass
class HintDistillConfig(SelfTeacherConfig):
    pass


class HintDistill(Distilling):
    name = "hint_distill"
    summary = ("grpo + on-policy divergence toward the policy conditioned on a teacher's hint, "
               "on the failed attempt's target message")
    Config = HintDistillConfig
    target, prefix = "hinted", "hint"

    def extend(self, batch, ctx):
        hinted = hint_failed_attempts(ctx.teacher, ctx.guard, ctx.tok, batch.problems, batch.attempts, batch.verdicts)
        batch.hinted = hinted
        ctx.lap("teacher")
        if hinted.rows:
            scores = score_teacher(ctx.teacher_policy, self.cfg, hinted.prompt_ids,
                                   batch.completion_ids_NC[hinted.rows], ctx.cfg.rollout.temperature)
            batch.targets[self.target] = RowTargets(list(hinted.rows), scores)
        ctx.lap("hinted_scoring")
        return {}
