"""Teacher feedback on failed attempts: hint requests, leak guard, hinted contexts.

The hint goes into the local context of the target message (right before the assistant turn,
see `student.tokenizer`). The policy conditioned on it is the teacher distribution of the
distilling methods (rl/methods/hint_distill.py scores the student's own tokens under it).
"""
from __future__ import annotations

from collections import Counter
from dataclasses import dataclass, field

from rl.episodes import Transcript, hinted_context
from rl.tasks import Problem, Verdict
from student.tokenizer import Tokenizer
from teacher import HintRequest, LeakGuard, Teacher
from teacher.base import TEACHER_FAULTS


@dataclass
class HintedRows:
    rows: list[int]                 # indices of the attempts that got a hint
    hints: list[str]                # one per row
    prompt_ids: list[list[int]]     # each row's context up to its target message, the hint right before it
    requested: int                  # attempts a hint was asked for (the failed ones)
    targets: list[int] = field(default_factory=list)   # per row: the target message's index in its episode
    starts: list[int] = field(default_factory=list)    # per row: where the target message starts in the completion
    errors: dict[int, str] = field(default_factory=dict)    # row -> "malformed" | "teacher_error" | "leak"
    replies: dict[int, str] = field(default_factory=dict)   # row -> a model teacher's raw reply
    faults: dict[int, str] = field(default_factory=dict)    # "teacher_error" row -> why (TEACHER_FAULTS)

    def count(self, error: str) -> int:
        return sum(e == error for e in self.errors.values())

    def fault_counts(self) -> dict[str, int]:
        """hint/teacher_errors/<fault> for every fault, zeros included: every step of an endpoint
        teacher logs the same keys (averaging over ranks needs them); they add up to
        hint/teacher_errors."""
        counts = Counter(self.faults.values())
        return {f"hint/teacher_errors/{fault}": counts[fault] for fault in TEACHER_FAULTS}


def request_for(problem: Problem, attempt: str, verdict: Verdict, messages: list[dict] | None = None) -> HintRequest:
    """The teacher's view of a failed attempt: the episode's messages (a one-message task: the
    problem and the attempt), the verifier's feedback and, when it named one, its first wrong message."""
    if messages is None:
        messages = [{"role": "user", "content": problem.prompt}, {"role": "assistant", "content": attempt}]
    # A problem file's human-written hints (task.source=jsonl) travel with the request, and a task's
    # decoys (rl/hidden_rule.py: a wrong rule, for the teacher.decoy control).
    meta = problem.entry.get("metadata", {})
    return HintRequest(messages, verdict.feedback, problem.answer, list(meta.get("hints") or []), verdict.first_wrong,
                       verdict.expected, list(meta.get("decoy_hints") or []))


def hint_failed_attempts(teacher: Teacher, guard: LeakGuard, tok: Tokenizer,
                         problems: list[Problem], attempts: list[str],
                         verdicts: list[Verdict], only: list[int] | None = None,
                         episodes: list[tuple[Transcript, list[int]]] | None = None) -> HintedRows:
    """Ask the teacher about every attempt that did not earn full reward (among the rows `only`,
    if given); keep safe hints.

    episodes: each row's (transcript, completion ids) when the rows are multi-message episodes:
    the teacher then sees every message and picks the target, and the hint goes right before that
    message (`prompt_ids`, `starts`). Without them a row is one answer to its problem.

    A teacher that failed (malformed reply, endpoint down) leaves that attempt without a hint;
    the failure and the raw reply are kept for the run's counts and rollouts.jsonl.
    """
    failed = [i for i in (range(len(verdicts)) if only is None else only) if verdicts[i].reward < 1.0]
    requests = [request_for(problems[i], attempts[i], verdicts[i], episodes[i][0].messages if episodes else None)
                for i in failed]
    hints = teacher.write_hints(requests)
    out = HintedRows([], [], [], requested=len(failed))
    for i, hint in zip(failed, hints):
        if hint is not None and hint.reply:
            out.replies[i] = hint.reply
        if hint is not None and hint.error:
            out.errors[i] = hint.error
            if hint.error == "teacher_error":
                out.faults[i] = hint.fault if hint.fault in TEACHER_FAULTS else "other"
        text = guard.filter(hint.text if hint else None, problems[i].answer, problems[i].prompt)
        if text is None:
            if hint is not None and hint.text:
                out.errors[i] = "leak"          # dropped by the guard (counted in hint/leak_rate)
            continue
        out.rows.append(i)
        out.hints.append(text)
        out.targets.append(hint.target_index)
        if episodes:
            context, start = hinted_context(tok, *episodes[i], hint.target_index, text)
        else:
            context, start = tok.render_prompt(problems[i].prompt, text), 0
        out.prompt_ids.append(context)
        out.starts.append(start)
    return out
