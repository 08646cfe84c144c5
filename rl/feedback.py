"""Teacher feedback on failed attempts: hint requests, leak guard, hinted contexts.

The hint goes into the local context of the target message (right before the assistant turn,
see `student.tokenizer`). The policy conditioned on it is the teacher distribution of the
distilling methods (rl/methods/hint_distill.py scores the student's own tokens under it).
"""
from __future__ import annotations

from dataclasses import dataclass, field

from rl.tasks import Problem, Verdict
from student.tokenizer import ByteTokenizer
from teacher import HintRequest, LeakGuard, Teacher


@dataclass
class HintedRows:
    rows: list[int]                 # indices of the attempts that got a hint
    hints: list[str]                # one per row
    prompt_ids: list[list[int]]     # each row's prompt with its hint inserted
    requested: int                  # attempts a hint was asked for (the failed ones)
    errors: dict[int, str] = field(default_factory=dict)    # row -> "malformed" | "teacher_error" | "leak"
    replies: dict[int, str] = field(default_factory=dict)   # row -> a model teacher's raw reply

    def count(self, error: str) -> int:
        return sum(e == error for e in self.errors.values())


def request_for(problem: Problem, attempt: str, verdict: Verdict) -> HintRequest:
    messages = [{"role": "user", "content": problem.prompt},
                {"role": "assistant", "content": attempt}]
    # A problem file's human-written hints (task.source=jsonl) travel with the request.
    hints = problem.entry.get("metadata", {}).get("hints") or []
    return HintRequest(messages, verdict.feedback, problem.answer, list(hints))


def hint_failed_attempts(teacher: Teacher, guard: LeakGuard, tok: ByteTokenizer,
                         problems: list[Problem], attempts: list[str],
                         verdicts: list[Verdict], only: list[int] | None = None) -> HintedRows:
    """Ask the teacher about every attempt that did not earn full reward (among the rows `only`,
    if given); keep safe hints.

    A teacher that failed (malformed reply, endpoint down) leaves that attempt without a hint;
    the failure and the raw reply are kept for the run's counts and rollouts.jsonl.
    """
    failed = [i for i in (range(len(verdicts)) if only is None else only) if verdicts[i].reward < 1.0]
    hints = teacher.write_hints([request_for(problems[i], attempts[i], verdicts[i]) for i in failed])
    out = HintedRows([], [], [], requested=len(failed))
    for i, hint in zip(failed, hints):
        if hint is not None and hint.reply:
            out.replies[i] = hint.reply
        if hint is not None and hint.error:
            out.errors[i] = hint.error
        text = guard.filter(hint.text if hint else None, problems[i].answer, problems[i].prompt)
        if text is None:
            if hint is not None and hint.text:
                out.errors[i] = "leak"          # dropped by the guard (counted in hint/leak_rate)
            continue
        out.rows.append(i)
        out.hints.append(text)
        out.prompt_ids.append(tok.render_prompt(problems[i].prompt, text))
    return out
