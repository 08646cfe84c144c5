"""Held-out evaluation: greedy answers without hints, then the same problems with the hint.

`eval/accuracy` is the number that matters. `eval/accuracy_hinted` counts a problem as solved if
either the plain answer or the retry with the teacher's hint is right: the gap between the two
is how much better the hint-conditioned distribution is than the student's own.

`eval/accuracy_with_hint` is the self-teacher's accuracy: the teacher weights of the run's method
(`method.teacher_weights`: the student itself when live, else its EMA or frozen copy) answer every
problem greedily with the hint in context wherever the teacher writes one: for a separate (EMA or
frozen) teacher that includes the problems the student answered right, since it may not know what
the student has learned; a live one answers those as the student did. A problem without a hint (the
rule teacher declines a right answer; the leak guard drops some) is answered plainly.
`eval/teacher_gap` = accuracy_with_hint - accuracy: how far the distillation target is ahead.

`evaluate` returns counts, so that ranks holding shards of the held-out set can sum them;
`eval_metrics` turns (summed) counts into the logged rates. The suites of rl/evals/ build on it
(`plain_only`: no teacher, no retries; `record`: what a suite reads beyond the counts).
"""
from __future__ import annotations

from dataclasses import replace

import torch

from rl.environments import Environment
from rl.environments.answer import AnswerEnvironment
from rl.episodes import Episodes
from rl.hints import hint_failed_attempts
from rl.tasks import Problem, TaskSource
from student.policy import Policy, Sampling
from student.tokenizer import Tokenizer
from teacher import LeakGuard, Teacher


@torch.no_grad()
def evaluate(policy: Policy, problems: list[Problem], tasks: TaskSource, teacher: Teacher,
             tok: Tokenizer, max_new_tokens: int, teacher_policy: Policy | None = None,
             env: Environment | None = None, max_turns: int = 1, plain_only: bool = False,
             record: dict | None = None) -> dict[str, float]:
    """Counts over `problems`, each an episode with `env` (default: one answer, the task's verifier).
    A hinted retry continues the episode from the hint's target message. `plain_only` stops after
    the plain answers (no teacher). `record`, when given, receives the plain episodes, attempts and
    verdicts, the hints, and each hinted retry's final answer (rows -> text)."""
    if not problems:
        if record is not None:
            record.update(episodes=None, attempts=[], verdicts=[], retries={}, hints=None)
        return ({"n": 0, "solved": 0, "fixed": 0, "hinted": 0, "with_hint": 0} if not plain_only else {"n": 0, "solved": 0})
    env = AnswerEnvironment(tasks) if env is None else env
    greedy = Sampling(max_new_tokens=max_new_tokens, eos_id=tok.eos_id, pad_id=tok.pad_id, greedy=True)

    def episodes(rows: list[int], histories=None, prompts=None) -> Episodes:
        return Episodes(env, tok, [problems[r] for r in rows], max_turns, max_new_tokens, histories, prompts)

    plain = episodes(list(range(len(problems))))
    out = policy.generate(plain.prompts, greedy, plain)
    transcripts = plain.transcripts(out.mask_NC)
    attempts = [t.final_text() for t in transcripts]
    verdicts = plain.verdicts()
    correct = [v.reward >= 1.0 for v in verdicts]
    if record is not None:
        record.update(episodes=plain, attempts=attempts, verdicts=verdicts, retries={}, hints=None)
    if plain_only:
        return {"n": len(problems), "solved": sum(correct)}
    hinted = hint_failed_attempts(teacher, LeakGuard(), tok, problems, attempts, verdicts,
                                  episodes=list(zip(transcripts, out.completion_ids_NC.tolist())))
    teacher_policy = policy if teacher_policy is None else teacher_policy
    context = {r: (transcripts[r].messages[:target], ids)
               for r, target, ids in zip(hinted.rows, hinted.targets, hinted.prompt_ids)}

    def solves(rows: list[int], by: Policy, context: dict = context) -> dict[int, bool]:
        """Greedy episodes of `rows` by `by`: from the hint's target message where a row has a hint,
        from the start elsewhere."""
        if not rows:
            return {}
        starts = [context.get(r, (env.start(problems[r]), plain.prompts[r])) for r in rows]
        retry = episodes(rows, [h for h, _ in starts], [ids for _, ids in starts])
        out = by.generate(retry.prompts, greedy, retry)
        if by is policy and record is not None:
            record["retries"].update({r: t.final_text() for r, t in zip(rows, retry.transcripts(out.mask_NC))})
        return {r: v.reward >= 1.0 for r, v in zip(rows, retry.verdicts())}

    if record is not None:
        record["hints"] = hinted
    retry = solves(hinted.rows, policy)
    if teacher_policy is policy:
        with_hint = {i: retry.get(i, correct[i]) for i in range(len(problems))}
    else:
        # The teacher's own answers, with a hint wherever the teacher writes one, the student's right
        # answers included: a frozen teacher asked plainly where the student has since learned what
        # only the hint says (experiments/hidden-rule) would read 0 there, and the gap -1.
        right = [i for i in range(len(problems)) if correct[i]]
        more = hint_failed_attempts(teacher, LeakGuard(), tok, problems, attempts,
                                    [replace(v, reward=0.0) if correct[i] else v for i, v in enumerate(verdicts)],
                                    only=right, episodes=list(zip(transcripts, out.completion_ids_NC.tolist())))
        teacher_context = {**context, **{r: (transcripts[r].messages[:target], ids)
                                         for r, target, ids in zip(more.rows, more.targets, more.prompt_ids)}}
        with_hint = solves(list(range(len(problems))), teacher_policy, teacher_context)
    return {"n": len(problems), "solved": sum(correct), "fixed": sum(retry.values()), "hinted": len(hinted.rows),
            "with_hint": sum(with_hint.values())}


def eval_metrics(counts: dict[str, float]) -> dict[str, float]:
    n, solved = counts["n"], counts["solved"]
    return {"eval/accuracy": solved / n, "eval/accuracy_hinted": (solved + counts["fixed"]) / n,
            "eval/hint_rate": counts["hinted"] / max(1, n - solved),
            "eval/accuracy_with_hint": counts["with_hint"] / n,
            "eval/teacher_gap": (counts["with_hint"] - solved) / n}
