"""Teacher feedback on failed attempts: hint requests, leak guard, hinted contexts, teacher scores.

The hint goes into the local context of the target message (right before the assistant turn,
see `student.tokenizer`). The policy conditioned on it is the teacher distribution: scoring the
student's own sampled tokens under the hinted context, without gradient, gives the targets of
the on-policy distillation KL.
"""
from __future__ import annotations

from dataclasses import dataclass

import torch

from rl.rollout import score
from rl.tasks import Problem, Verdict
from student.tokenizer import ByteTokenizer
from teacher import HintRequest, LeakGuard, Teacher


@dataclass
class HintedRows:
    rows: list[int]                 # indices of the attempts that got a hint
    hints: list[str]                # one per row
    prompt_ids: list[list[int]]     # each row's prompt with its hint inserted
    requested: int                  # attempts a hint was asked for (the failed ones)


def request_for(problem: Problem, attempt: str, verdict: Verdict) -> HintRequest:
    messages = [{"role": "user", "content": problem.prompt},
                {"role": "assistant", "content": attempt}]
    return HintRequest(messages, verdict.feedback, problem.answer)


def hint_failed_attempts(teacher: Teacher, guard: LeakGuard, tok: ByteTokenizer,
                         problems: list[Problem], attempts: list[str],
                         verdicts: list[Verdict]) -> HintedRows:
    """Ask the teacher about every attempt that did not earn full reward; keep safe hints."""
    failed = [i for i, v in enumerate(verdicts) if v.reward < 1.0]
    hints = teacher.write_hints([request_for(problems[i], attempts[i], verdicts[i]) for i in failed])
    rows, texts, prompts = [], [], []
    for i, hint in zip(failed, hints):
        text = guard.filter(hint.text if hint else None, problems[i].answer)
        if text is None:
            continue
        rows.append(i)
        texts.append(text)
        prompts.append(tok.render_prompt(problems[i].prompt, text))
    return HintedRows(rows, texts, prompts, requested=len(failed))


@torch.no_grad()
def teacher_logprobs(model, hinted: HintedRows, completion_NC: torch.Tensor, *, pad_id: int,
                     temperature: float):
    """Scores of the student's own tokens under the hinted context: (logprobs_HC, logp_HCV).

    The full distribution is always returned: the distillation span needs the teacher's argmax.
    """
    logprobs, logp_full, _ = score(model, hinted.prompt_ids, completion_NC[hinted.rows],
                                   pad_id=pad_id, temperature=temperature, full=True)
    return logprobs, logp_full
