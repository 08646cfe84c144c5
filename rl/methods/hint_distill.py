"""GRPO plus on-policy distillation toward the hint-conditioned policy (targeted textual feedback).

Stages it adds: a teacher writes a hint for every failed attempt (rl/hints.py, leak-guarded);
the student's own sampled tokens are scored, without gradient, with the hint in the target
message's context, by the self-teacher's weights (`teacher_weights`: the live student, an EMA of
it, or its weights when RL began; rl/teacher_weights.py). Those scores are the teacher
distribution. Loss: `pg_coef` (1) x the GRPO term plus `distill_coef` x a divergence from the student (hint-free
context) to that teacher on the hinted rows' tokens, up to the teacher's first disagreement
(`distill_span`). The teacher scores ask only for what the estimator needs (rl/methods/distill.py).

In a multi-message episode (rl/episodes.py) the teacher picks the target message, and
`hint_scope` says where the hint goes and what the divergence covers:

    message     the hint right before the target message, every earlier message as sampled; the
                divergence on the target message's tokens only (Composer's targeted feedback)
    trajectory  the hint before the episode's first message; the divergence on every message the
                policy wrote (the untargeted comparison)

For a one-message task the two are the same.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar

from rl.batch import RowTargets, cut_spans
from rl.hints import hint_failed_attempts
from rl.methods.distill import Distilling, SelfTeacherConfig, score_teacher


@dataclass
class HintDistillConfig(SelfTeacherConfig):
    hint_scope: str = "message"              # "message": hint before, and KL on, the target message; "trajectory"

    CHOICES: ClassVar[dict[str, tuple]] = {**SelfTeacherConfig.CHOICES, "hint_scope": ("message", "trajectory")}


class HintDistill(Distilling):
    name = "hint_distill"
    summary = ("grpo + on-policy divergence toward the policy conditioned on a teacher's hint, "
               "on the failed attempt's target message")
    Config = HintDistillConfig
    target, prefix = "hinted", "hint"

    def extend(self, batch, ctx):
        episodes = batch.episodes()
        hinted = hint_failed_attempts(ctx.teacher, ctx.guard, ctx.tok, batch.problems, batch.attempts, batch.verdicts,
                                      episodes=episodes)
        batch.hinted = hinted
        ctx.lap("teacher")
        if hinted.rows:
            contexts, starts, ends = self._spans(batch, hinted, ctx.tok)
            completion_HW = cut_spans(batch.completion_ids_NC, hinted.rows, starts, ends, ctx.tok.pad_id)
            scores = score_teacher(ctx.teacher_policy, self.cfg, contexts, completion_HW, ctx.cfg.rollout.temperature)
            batch.targets[self.target] = RowTargets.on_spans(list(hinted.rows), scores, starts, ends,
                                                             batch.completion_ids_NC.size(1))
        ctx.lap("hinted_scoring")
        return {}

    def _spans(self, batch, hinted, tok) -> tuple[list[list[int]], list[int], list[int]]:
        """Per hinted row: the teacher's context, and the completion positions [start, end) it scores
        and the divergence covers. A target that is the episode's last message is scored to the
        row's end (for a one-message task: exactly the whole completion, as always)."""
        width = batch.completion_ids_NC.size(1)
        if batch.transcripts is None:
            return hinted.prompt_ids, [0] * len(hinted.rows), [width] * len(hinted.rows)
        if self.cfg.hint_scope == "trajectory":
            contexts = [tok.insert_hint(batch.prompt_ids[r], h) for r, h in zip(hinted.rows, hinted.hints)]
            return contexts, [0] * len(hinted.rows), [width] * len(hinted.rows)
        ends = []
        for r, target in zip(hinted.rows, hinted.targets):
            transcript = batch.transcripts[r]
            last = target == transcript.assistant_indices[-1]
            ends.append(width if last else transcript.span_of(target)[1])
        return hinted.prompt_ids, hinted.starts, ends
