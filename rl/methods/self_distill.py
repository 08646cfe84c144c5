"""SDPO (Hübotter et al. 2026, arXiv 2601.20802; lasgroup/SDPO): self-distillation from the same
network given what the failed attempt lacked, here a successful sibling's answer and/or the
verifier's feedback.

For every failed attempt, the teacher context is the problem with, in the target message's local
context (the hint slot, student/tokenizer.py), `context`:

    solution               "a correct answer: <a successful sibling's attempt>" (rows whose group
                           has a success; SDPO's implicit feedback from scalar rewards)
    feedback               "feedback on your answer: <the verifier's words>"
    solution_and_feedback  both, whichever exist

The student's own tokens are scored under that context by the self-teacher's weights
(`teacher_weights`, an EMA of the student by default as in SDPO, rate 0.05), and the failed rows
are distilled toward it (`distill_estimator`: top_k with a tail bucket by default, SDPO's choice,
or full or sampled; `distill_kl` JSD by default, or reverse KL). Loss:
`pg_coef` x GRPO + `distill_coef` x distillation; SDPO's default is distillation alone (pg_coef 0).

Differences from SDPO, on purpose: the top-k support is the teacher's (rl/losses.py says why); a
successful row is not distilled (SDPO may reprompt it with another success); with one update per
batch the importance ratio of the training forward to the rollout is 1, so SDPO's IS clip has
nothing to clip; and the distillation stops at the teacher's first disagreement
(`distill_span: first_divergence`) where SDPO distils every token. With every token (`all`) the
default experiment collapsed (seed 0, experiments/default/README.md): after the first wrong digit
the teacher that has seen the answer puts little mass on <eos>, the student learnt to stop ending
its answers ("100000"), successes vanished, and with them every teacher context, so nothing could
pull it back (accuracy 0.35 -> 0.0 in 400 steps).

`shuffle_context` is the control: each failed row is distilled toward the policy shown the context
built for another problem (teacher/shuffled.py), which should not help.

The context may state the answer: this teacher is the privileged one by construction (the student
never trains in that context, only toward its predictions), so the leak guard does not apply.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar

from rl.batch import RowTargets
from rl.methods.distill import Distilling, SelfTeacherConfig, score_teacher
from teacher.shuffled import from_other_problem


@dataclass
class SelfDistillConfig(SelfTeacherConfig):
    context: str = "solution"                # what the teacher sees: solution, feedback or solution_and_feedback
    pg_coef: float = 0.0                     # SDPO: distillation alone
    distill_kl: str = "jsd"
    distill_estimator: str = "top_k"
    distill_span: str = "first_divergence"   # SDPO distils every token: here that collapsed (module docstring)
    teacher_weights: str = "ema"
    shuffle_context: bool = False            # control: each failed row gets the context of another problem's row

    CHOICES: ClassVar[dict[str, tuple]] = {**SelfTeacherConfig.CHOICES,
                                           "context": ("solution", "feedback", "solution_and_feedback")}


def teacher_context(row: int, attempts: list[str], verdicts: list, group: list[int], context: str) -> str | None:
    """The text the teacher sees for failed row `row`, or None when there is nothing to show."""
    parts = []
    if context in ("solution", "solution_and_feedback"):
        success = next((i for i in group if i != row and verdicts[i].reward >= 1.0), None)
        if success is not None:
            parts.append(f"a correct answer: {attempts[success].strip()}")
    if context in ("feedback", "solution_and_feedback") and verdicts[row].feedback:
        parts.append(f"feedback on your answer: {verdicts[row].feedback}")
    return "; ".join(parts) or None


class SelfDistill(Distilling):
    name = "self_distill"
    summary = ("SDPO: distil failed attempts toward the policy shown a successful sibling and/or the verifier's "
               "feedback (EMA teacher, top-k + tail, JSD)")
    Config = SelfDistillConfig
    target, prefix = "self", "self"

    def extend(self, batch, ctx):
        groups: dict[int, list[int]] = {}
        for i, g in enumerate(batch.group_N.tolist()):
            groups.setdefault(g, []).append(i)
        failed = [i for i, v in enumerate(batch.verdicts) if v.reward < 1.0]
        texts = [teacher_context(i, batch.attempts, batch.verdicts, groups[int(batch.group_N[i])], self.cfg.context)
                 for i in failed]
        if self.cfg.shuffle_context:
            texts = from_other_problem([batch.problems[i].prompt for i in failed], texts)
        rows, prompts = [], []
        for i, text in zip(failed, texts):
            if text is not None:
                rows.append(i)
                prompts.append(ctx.tok.render_prompt(batch.problems[i].prompt, text))
        if rows:
            scores = score_teacher(ctx.teacher_policy, self.cfg, prompts, batch.completion_ids_NC[rows],
                                   ctx.cfg.rollout.temperature)
            batch.targets[self.target] = RowTargets(rows, scores)
        ctx.lap("teacher_scoring")
        return {"self/context_rate": len(rows) / max(1, len(failed)), "self/distilled_rows": float(len(rows))}
