"""GRPO plus on-policy distillation toward the hint-conditioned policy (targeted textual feedback).

Stages it adds: a teacher writes a hint for every failed attempt (rl/feedback.py, leak-guarded);
the student's own sampled tokens are scored, without gradient, with the hint in the target
message's context. Those scores are the teacher distribution. Loss: the GRPO term plus
`distill_coef` x a divergence from the student (hint-free context) to that teacher on the hinted
rows' tokens, up to the teacher's first disagreement (`distill_span`). The teacher scores ask only
for what the estimator needs: the whole distribution for `full`, the sampled token's log-prob
(and the argmax for the first-divergence span) for `sampled`.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar

import torch

from rl.batch import RowTargets
from rl.feedback import hint_failed_attempts
from rl.losses import distill_kl_loss, sampled_distill_loss, span_to_first_divergence
from rl.config import MethodConfig
from rl.methods.grpo import GRPO


@dataclass
class HintDistillConfig(MethodConfig):
    distill_coef: float = 1.0                # weight of the distillation term
    distill_kl: str = "reverse"              # "reverse" KL(s||t), "forward" KL(t||s), "jsd" (estimator full)
    distill_estimator: str = "full"          # "full" vocabulary, or "sampled" token only (reverse KL)
    distill_span: str = "first_divergence"   # "all" target tokens, or up to the teacher's first disagreement

    CHOICES: ClassVar[dict[str, tuple]] = {**MethodConfig.CHOICES, "distill_kl": ("reverse", "forward", "jsd"),
                                           "distill_estimator": ("full", "sampled"),
                                           "distill_span": ("all", "first_divergence")}


class HintDistill(GRPO):
    name = "hint_distill"
    summary = ("grpo + on-policy divergence toward the same policy conditioned on a teacher's hint, "
               "on the failed attempt's target message")
    Config = HintDistillConfig

    def teacher_need(self) -> str:
        if self.cfg.distill_estimator == "full":
            return "full"
        return "argmax" if self.cfg.distill_span == "first_divergence" else "logprobs"

    def extend(self, batch, ctx):
        hinted = hint_failed_attempts(ctx.teacher, ctx.guard, ctx.tok, batch.problems, batch.attempts, batch.verdicts)
        batch.hinted = hinted
        ctx.lap("teacher")
        if hinted.rows:
            with torch.no_grad():
                scores = ctx.policy.score(hinted.prompt_ids, batch.completion_ids_NC[hinted.rows],
                                          temperature=ctx.cfg.rollout.temperature, need=self.teacher_need())
            batch.targets["hinted"] = RowTargets(list(hinted.rows), scores)
        ctx.lap("hinted_scoring")
        return {}

    def train_need(self, micro):
        hinted = micro.targets.get("hinted")
        return "full" if self.cfg.distill_estimator == "full" and hinted is not None and hinted.rows else "logprobs"

    def loss(self, micro, scores, norm):
        loss, metrics = self.policy_gradient(micro, scores, norm)
        target = micro.targets.get("hinted")
        if target is None or not target.rows:
            return loss, metrics
        m, h, teacher = self.cfg, target.rows, target.scores
        mask_HC = micro.mask_NC[h]
        if m.distill_span == "first_divergence":
            mask_HC = span_to_first_divergence(teacher.argmax_NC, micro.completion_ids_NC[h], mask_HC)
        if m.distill_estimator == "full":
            distill, more = distill_kl_loss(scores.logp_NCV[h], teacher.logp_NCV, mask_HC, norm, m.distill_kl)
        else:
            distill, more = sampled_distill_loss(scores.logprobs_NC[h], teacher.logprobs_NC, mask_HC, norm)
        metrics.update(more)
        metrics["hint/distill_tokens"] = mask_HC.sum().item() / len(h)
        return loss + m.distill_coef * distill, metrics
