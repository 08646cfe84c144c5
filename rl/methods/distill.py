"""What the distilling methods share: the distillation keys, what the teacher and the training
forward must return for each estimator, and the distillation term itself.

A distilling method attaches teacher scores to some rows (`batch.targets[name]`, rl/batch.py);
`distill_term` turns them and the student's training scores into the loss term on those rows:

    full      the whole vocabulary: reverse KL(s‖t), forward KL(t‖s) or JSD (rl/losses.py)
    top_k     the teacher's `distill_top_k` most likely tokens plus one tail bucket (SDPO)
    sampled   the sampled token only, reverse KL as a per-token advantage (on-policy distillation)

`distill_span: first_divergence` keeps each row's tokens up to the teacher's first disagreement
(rl/losses.py::span_to_first_divergence says why); `all` keeps every completion token.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar

import torch

from rl.batch import RowTargets
from rl.config import MethodConfig
from rl.losses import distill_kl_loss, sampled_distill_loss, span_to_first_divergence, topk_distill_loss
from rl.methods.grpo import GRPO
from rl.teacher_weights import MODES as TEACHER_WEIGHTS


@dataclass
class DistillConfig(MethodConfig):
    pg_coef: float = 1.0                     # weight of the GRPO term beside the distillation
    distill_coef: float = 1.0                # weight of the distillation term
    distill_kl: str = "reverse"              # "reverse" KL(s||t), "forward" KL(t||s), "jsd" (full and top_k)
    distill_estimator: str = "full"          # "full" vocabulary, "top_k" + tail bucket, "sampled" token (reverse KL)
    distill_top_k: int = 20                  # top_k: teacher tokens kept per position
    distill_span: str = "first_divergence"   # "all" target tokens, or up to the teacher's first disagreement

    CHOICES: ClassVar[dict[str, tuple]] = {**MethodConfig.CHOICES, "distill_kl": ("reverse", "forward", "jsd"),
                                           "distill_estimator": ("full", "top_k", "sampled"),
                                           "distill_span": ("all", "first_divergence")}

    def check(self) -> list[str]:
        problems = super().check()
        if self.distill_estimator == "sampled" and self.distill_kl != "reverse":
            problems.append(f"method.distill_kl={self.distill_kl!r} needs the full or top_k estimator; "
                            "distill_estimator=sampled estimates the reverse KL only")
        if self.distill_top_k < 1:
            problems.append(f"method.distill_top_k={self.distill_top_k} must be >= 1")
        for key in ("pg_coef", "distill_coef"):
            if getattr(self, key) < 0:
                problems.append(f"method.{key}={getattr(self, key)} must be >= 0")
        return problems


@dataclass
class SelfTeacherConfig(DistillConfig):
    """A distilling method whose teacher is the student's own network in another context."""
    teacher_weights: str = "live"            # "live" student, "ema" of it, "frozen" at the start of RL
    ema_rate: float = 0.05                   # ema: the teacher's step toward the student per optimizer step

    CHOICES: ClassVar[dict[str, tuple]] = {**DistillConfig.CHOICES, "teacher_weights": TEACHER_WEIGHTS}

    def check(self) -> list[str]:
        problems = super().check()
        if not 0 < self.ema_rate <= 1:
            problems.append(f"method.ema_rate={self.ema_rate} must be in (0, 1]")
        return problems


def teacher_need(cfg: DistillConfig) -> str:
    """What teacher scoring returns for this estimator (student.policy.NEEDS)."""
    if cfg.distill_estimator == "full":
        return "full"
    if cfg.distill_estimator == "top_k":
        return "topk"                        # includes the argmax
    return "argmax" if cfg.distill_span == "first_divergence" else "logprobs"


def train_need(cfg: DistillConfig, target: RowTargets | None) -> str:
    """What the training forward returns: the whole distribution when a full or top-k term is due."""
    if target is not None and target.rows and cfg.distill_estimator in ("full", "top_k"):
        return "full"
    return "logprobs"


def score_teacher(policy, cfg: DistillConfig, prompt_ids, completion_NC, temperature: float):
    """Teacher scores of `completion_NC` after `prompt_ids` (no gradient)."""
    with torch.no_grad():
        return policy.score(prompt_ids, completion_NC, temperature=temperature, need=teacher_need(cfg),
                            k=cfg.distill_top_k if cfg.distill_estimator == "top_k" else 0)


def distill_term(cfg: DistillConfig, micro, scores, target: RowTargets | None, norm: float, prefix: str):
    """(coef x the distillation loss on the target's rows, metrics), or (None, {}) without rows.
    Metrics: loss/distill (its share of the objective), <prefix>/kl_per_token,
    <prefix>/distill_tokens (per distilled row)."""
    if target is None or not target.rows:
        return None, {}
    h, teacher = target.rows, target.scores
    mask_HC = micro.mask_NC[h]
    if target.mask_HC is not None:
        mask_HC = mask_HC & target.mask_HC
    if cfg.distill_span == "first_divergence":
        mask_HC = span_to_first_divergence(teacher.argmax_NC, micro.completion_ids_NC[h], mask_HC)
    if cfg.distill_estimator == "full":
        loss, more = distill_kl_loss(scores.logp_NCV[h], teacher.logp_NCV, mask_HC, norm, cfg.distill_kl)
    elif cfg.distill_estimator == "top_k":
        loss, more = topk_distill_loss(scores.logp_NCV[h], teacher.topk_logp_NCK, teacher.topk_ids_NCK, mask_HC,
                                       norm, cfg.distill_kl)
    else:
        loss, more = sampled_distill_loss(scores.logprobs_NC[h], teacher.logprobs_NC, mask_HC, norm)
    loss = cfg.distill_coef * loss
    metrics = {"loss/distill": loss.item(), f"{prefix}/kl_per_token": more["hint/kl_per_token"],
               f"{prefix}/distill_tokens": mask_HC.sum().item() / len(h)}
    return loss, metrics


class Distilling(GRPO):
    """A distilling method's training side: `pg_coef` x the GRPO term + the distillation term on
    the rows of `batch.targets[target]` (metrics under `prefix/`). Subclasses write `extend`."""
    target: ClassVar[str]
    prefix: ClassVar[str]

    def teacher_weights(self):
        if isinstance(self.cfg, SelfTeacherConfig):
            return self.cfg.teacher_weights, self.cfg.ema_rate
        return super().teacher_weights()

    def train_need(self, micro):
        return train_need(self.cfg, micro.targets.get(self.target))

    def loss(self, micro, scores, norm):
        pg, metrics = self.policy_gradient(micro, scores, norm)
        loss = self.cfg.pg_coef * pg           # kept in the graph at 0, so a row-less micro-batch still backwards
        metrics["loss/pg"] = loss.item()
        distill, more = distill_term(self.cfg, micro, scores, micro.targets.get(self.target), norm, self.prefix)
        metrics.update(more)
        return (loss if distill is None else loss + distill), metrics
