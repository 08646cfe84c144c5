"""Corrected replay: learn from what the student does with the hint, without the hint.

Guide-GRPO (Nath et al. 2025, arXiv 2506.13923): for failed attempts that got a teacher hint
(`when: all_fail`, Guide's setting, only in groups where every attempt failed; `failed`: every
failed attempt), the student regenerates the target message with the hint in its context
(`corrections_per_attempt` samples each), the verifier scores the regenerations, and they are
trained as rows whose context is the problem *without* the hint, in their prompt's group. Where
they go (`place`):

    replace  (default) each correction takes the place of the attempt it corrects, successful or
             not: the batch keeps its size, as in Guide, which re-rolls an all-fail group under the
             hint and trains the hinted group instead (guide_rl `_roll_with_prompt_variant`,
             `mixin: false`)
    mixin    only successful corrections take their attempt's place; a failed one gives it back to
             the original attempt (guide_rl's `scale_reasoning.mixin: true`)
    join     extra rows: the group grows, the failed attempts stay and are trained too (more trained
             tokens a step than Guide; `corrections_per_attempt` > 1 needs it)

An attempt whose correction took its place stays in the step's statistics and logs and is left out
of the update (`Batch.trained_N`). Advantages are taken over the trained rows of each group, so a
corrected success in an all-fail group is the group's only positive signal. The rollout rows keep
GRPO's PPO-clip term; the corrected rows' term weighs each token by `method.weight`
(rl/losses.py::corrected_trajectory_loss, each with its paper's equation):

    guide  (default) r/(r+γ), r = π_θ(y_t|x) / π_old(y_t|x,h), γ = the batch's 90th-percentile r; no clip
    luffy  π_θ/(π_θ+`shape_gamma`), the behaviour probability taken as 1 (LUFFY, Critique-GRPO)
    is     min(r, `is_clip`), detached: truncated IS (its gradient vanishes on the tokens the hint
           supplies, so it learns little there: tests/test_learning.py measures it beside the others)
    sft    1 on successful corrections: STaR's rationalization

Routes: a corrected row's prompt is the rollout's own hint-free prompt, whose recorded routes are
replayed as usual; its completion was routed under the hinted prompt, which the training forward
does not see, so those tokens are left to the router (free routes). `check_routes` measures how
often the hint-free router picks other experts for them than the hinted generation did
(`corrected/route_mismatch`), with one no-gradient forward over the corrected rows that is a
measurement, not part of the method, and is not counted in the step's budget.

Metrics: corrected/success_rate (share of regenerations the verifier accepts), corrected/rows,
corrected/replaced (attempts a correction took the place of: `place` replace or mixin),
corrected/weight_pos_mean (mean gradient weight on tokens with A > 0), corrected/seq_weight/<bucket>
(mean over successful corrections of the product of their tokens' weights: how much of a supervised
example one success is worth), corrected/is_ratio_mean (≈ 1 by identity: not evidence of anything),
corrected/guide_gamma, corrected/is_clipped_frac, corrected/route_mismatch.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar

import torch

from rl.batch import Batch
from rl.episodes import Episodes
from rl.config import MethodConfig
from rl.hints import hint_failed_attempts
from rl.losses import CORRECTION_WEIGHTS, corrected_trajectory_loss, group_advantages, guide_gamma, policy_gradient_loss
from rl.methods.grpo import GRPO
from student.policy import Routes, distinct_prompts, join_rows


@dataclass
class CorrectedReplayConfig(MethodConfig):
    when: str = "all_fail"                   # which failed attempts get a correction: all_fail (Guide) or failed
    corrections_per_attempt: int = 1         # regenerations under each hint
    weight: str = "guide"                    # corrected tokens' weight: guide, luffy, is, sft (rl/losses.py)
    guide_quantile: float = 0.9              # guide: γ = this quantile of the batch's ratios
    shape_gamma: float = 0.1                 # luffy: γ of π/(π+γ)
    is_clip: float = 2.0                     # is: truncation of the per-token importance weight
    check_routes: bool = False               # measure corrected/route_mismatch (a diagnostic: one more forward a step)
    place: str = "replace"                   # replace or mixin (Guide: the batch keeps its size), or join (extra rows)

    CHOICES: ClassVar[dict[str, tuple]] = {**MethodConfig.CHOICES, "when": ("all_fail", "failed"),
                                           "weight": CORRECTION_WEIGHTS, "place": ("join", "replace", "mixin")}

    def check(self) -> list[str]:
        problems = super().check()
        if self.corrections_per_attempt < 1:
            problems.append(f"method.corrections_per_attempt={self.corrections_per_attempt} must be >= 1")
        if self.place != "join" and self.corrections_per_attempt != 1:
            problems.append(f"method.place={self.place} puts one correction in its attempt's place: "
                            f"method.corrections_per_attempt={self.corrections_per_attempt} must be 1, "
                            "or set method.place=join to add every correction as a row of its own")
        if self.is_clip <= 0:
            problems.append(f"method.is_clip={self.is_clip} must be > 0")
        if not 0 < self.guide_quantile <= 1:
            problems.append(f"method.guide_quantile={self.guide_quantile} must be in (0, 1]")
        if self.shape_gamma <= 0:
            problems.append(f"method.shape_gamma={self.shape_gamma} must be > 0")
        return problems


def candidates(batch: Batch, when: str) -> list[int]:
    """Failed rollout rows eligible for a correction."""
    failed = [i for i, v in enumerate(batch.verdicts) if v.reward < 1.0 and batch.source[i] == "rollout"]
    if when == "failed":
        return failed
    solved_groups = {int(batch.group_N[i]) for i, v in enumerate(batch.verdicts) if v.reward >= 1.0}
    return [i for i in failed if int(batch.group_N[i]) not in solved_groups]


def trained_group_advantages(batch: Batch, std_norm: bool) -> torch.Tensor:
    """Group-relative advantages over each group's trained rows; 0 on the rows left out."""
    rows = batch.trained_N.nonzero().flatten()
    adv_N = torch.zeros(batch.n, device=batch.rewards_N.device)
    adv_N[rows] = group_advantages(batch.rewards_N[rows], batch.group_N[rows], std_norm)
    return adv_N


class CorrectedReplay(GRPO):
    name = "corrected_replay"
    summary = ("Guide-GRPO: failed attempts regenerated under the teacher's hint join their group hint-free, "
               "policy gradient with per-token weights (method.weight: guide r/(r+gamma), luffy, is, sft)")
    Config = CorrectedReplayConfig

    def extend(self, batch, ctx):
        m = self.cfg
        hinted = hint_failed_attempts(ctx.teacher, ctx.guard, ctx.tok, batch.problems, batch.attempts, batch.verdicts,
                                      only=candidates(batch, m.when), episodes=batch.episodes())
        batch.hinted = hinted
        ctx.lap("teacher")
        metrics = {"corrected/rows": 0.0}
        if not hinted.rows:
            return metrics
        k = m.corrections_per_attempt
        picks = [h for h in range(len(hinted.rows)) for _ in range(k)]
        source = [hinted.rows[h] for h in picks]
        starts = [hinted.starts[h] for h in picks]
        problems = [batch.problems[r] for r in source]
        # The episode continues from the target message with the environment, the hint before it.
        histories = None
        if batch.transcripts is not None:
            histories = [batch.transcripts[r].messages[:hinted.targets[h]] for r, h in zip(source, picks)]
        episodes = Episodes(ctx.env, ctx.tok, problems, ctx.cfg.rollout.max_turns, ctx.cfg.rollout.max_new_tokens,
                            histories=histories, prompts=[hinted.prompt_ids[h] for h in picks])
        roll = ctx.policy.generate(episodes.prompts, ctx.sampling, episodes)
        verdicts = episodes.verdicts()
        regenerated = episodes.transcripts(roll.mask_NC)
        attempts = [t.final_text() for t in regenerated]
        ctx.lap("regenerate")

        # A corrected row: the hint-free prompt, the episode as sampled before the target (not
        # trained again here: masked, its recorded routes replayed), then the regeneration (free routes).
        corrected = batch.continued(source, starts, roll, ctx.tok.pad_id, attempts=attempts, verdicts=verdicts,
                                    transcripts=regenerated, source=["corrected"] * len(source))
        if m.check_routes:
            fed = corrected.completion_ids_NC.size(1) - 1
            hinted_routes = [join_rows([c.new_full((s, c.size(-1)), -1) for s in starts], g, -1, fed)
                             for c, g in zip(batch.routes.completion, roll.routes.completion)]
            metrics["corrected/route_mismatch"] = self._route_mismatch(ctx, corrected, hinted_routes)
        if m.place != "join":
            takes_place = [True] * len(source) if m.place == "replace" else [v.reward >= 1.0 for v in verdicts]
            corrected.trained_N = torch.tensor(takes_place, device=batch.trained_N.device)
            batch.trained_N[[r for r, t in zip(source, takes_place) if t]] = False
            metrics["corrected/replaced"] = float(sum(takes_place))
        trained = corrected.trained()
        if m.weight == "guide" and trained.n:
            # γ once for the step, from the hint-free policy before the update (as the training
            # forward will see it: one epoch), so gradient accumulation does not change it. A
            # scoring pass of the method's own (counted), with the router free.
            with torch.no_grad():
                free = ctx.policy.score(trained.prompt_ids, trained.completion_ids_NC,
                                        temperature=ctx.cfg.rollout.temperature)
            batch.correction_gamma = guide_gamma(free.logprobs_NC, trained.old_logprobs_NC, trained.mask_NC,
                                                 m.guide_quantile)
            ctx.lap("correction_scoring")
        batch.add_rows(corrected, ctx.tok.pad_id)
        batch.advantages_N = trained_group_advantages(batch, m.adv_std_norm)
        metrics.update({"corrected/rows": float(len(source)),
                        "corrected/success_rate": sum(v.reward >= 1.0 for v in verdicts) / len(verdicts)})
        if batch.transcripts is not None and ctx.cfg.rollout.max_turns > 1:
            metrics["corrected/from_message_mean"] = sum(len(h) for h in histories) / len(histories)
        return metrics

    @staticmethod
    def _route_mismatch(ctx, corrected: Batch, hinted_completion_routes: list[torch.Tensor]) -> float:
        """Share of the corrected completions' routing slots where the hint-free router picks an
        expert the hinted generation did not: their hinted routes replayed, the prompts (and the
        episode before the target) left free."""
        distinct, of_row = distinct_prompts(corrected.prompt_ids, hinted_completion_routes[0].device)
        width, k = max(len(p) for p in distinct), hinted_completion_routes[0].size(-1)
        free = [c.new_full((len(distinct), width, k), -1) for c in hinted_completion_routes]
        ctx.diagnostic.take_replay_mismatch()
        with torch.no_grad():
            ctx.diagnostic.score(corrected.prompt_ids, corrected.completion_ids_NC,
                                 routes=Routes(of_row, free, hinted_completion_routes))
        return ctx.diagnostic.take_replay_mismatch()

    def loss(self, micro, scores, norm):
        rollout = torch.tensor([s != "corrected" for s in micro.source], device=micro.mask_NC.device)
        loss, metrics = policy_gradient_loss(scores.logprobs_NC, micro.old_logprobs_NC, micro.advantages_N,
                                             micro.mask_NC & rollout[:, None], norm, self.cfg.clip_eps, micro.weight_N)
        if not bool(rollout.all()):
            m = self.cfg
            corrected = micro.mask_NC & ~rollout[:, None]
            extra, more, seq_weight_N = corrected_trajectory_loss(
                scores.logprobs_NC, micro.old_logprobs_NC, micro.advantages_N, corrected, norm, m.weight,
                is_clip=m.is_clip, shape_gamma=m.shape_gamma, guide_quantile=m.guide_quantile, gamma=micro.correction_gamma)
            loss = loss + extra
            metrics.update(more)
            # Per bucket, what one successful correction is worth next to a supervised example (1).
            by_bucket: dict[str, list[float]] = {}
            for i, (source, verdict) in enumerate(zip(micro.source, micro.verdicts)):
                if source == "corrected" and verdict.reward >= 1.0:
                    by_bucket.setdefault(micro.problems[i].bucket, []).append(seq_weight_N[i].item())
            metrics.update({f"corrected/seq_weight/{b}": sum(v) / len(v) for b, v in by_bucket.items()})
        return loss, metrics
