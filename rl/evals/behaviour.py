"""`behaviour`: what a researcher checks by eye at this scale, counted over the held-out problems.

    eval/behaviour/format_ok    answers in the reference's format: a bare number where the reference
                                is a number, else one non-empty line
    eval/behaviour/empty        answers with no text
    eval/behaviour/answer_tokens  mean tokens in the final answer
    eval/behaviour/eos_rate     episodes whose messages all ended with <eos> (not cut at max_new_tokens)
    eval/behaviour/hint_echo    hinted retries whose answer repeats the hint's words (a word of three
                                or more letters from the hint that is not in the problem or its
                                answer, or the hint's whole text): the student copying its context
                                instead of answering

Greedy, like the other suites; the retries use the run's teacher, as `hinted` does.
"""
from __future__ import annotations

import re

from rl.evals.base import EvalContext, Suite
from rl.evals.greedy import evaluate

NUMBER = re.compile(r"[-+]?\d+(?:\.\d+)?(?:/\d+)?")
WORD = re.compile(r"[A-Za-z]{3,}")
KEYS = ("n", "format_ok", "empty", "answer_tokens", "eos", "hinted", "echo")


def in_format(answer: str, reference: str) -> bool:
    answer, reference = answer.strip(), reference.strip()
    if NUMBER.fullmatch(reference):
        return NUMBER.fullmatch(answer) is not None
    return bool(answer) and "\n" not in answer


def echoes(answer: str, hint: str, prompt: str, reference: str) -> bool:
    text = answer.lower()
    if len(hint.strip()) >= 4 and hint.strip().lower() in text:
        return True
    own = {w.lower() for w in WORD.findall(prompt + " " + reference)}
    foreign = {w.lower() for w in WORD.findall(hint)} - own
    return bool(foreign & {w.lower() for w in WORD.findall(answer)})


class Behaviour(Suite):
    name = "behaviour"
    summary = "answer format, answer length, <eos> rate, hint text echoed into answers"

    def sets(self, tasks):
        return {"heldout": tasks.eval_problems}

    def counts(self, ctx: EvalContext, problems):
        record: dict = {}
        evaluate(ctx.policy, problems, ctx.tasks, ctx.teacher, ctx.tok, ctx.max_new_tokens,
                 env=ctx.env, max_turns=ctx.max_turns, record=record)
        if not problems:
            return dict.fromkeys(KEYS, 0.0)
        attempts, plain, hints = record["attempts"], record["episodes"], record["hints"]
        hint_of = dict(zip(hints.rows, hints.hints))
        echo = sum(echoes(text, hint_of[r], problems[r].prompt, problems[r].answer)
                   for r, text in record["retries"].items())
        return {"n": len(problems),
                "format_ok": sum(in_format(a, p.answer) for a, p in zip(attempts, problems)),
                "empty": sum(not a.strip() for a in attempts),
                "answer_tokens": sum(len(ctx.tok.encode(a)) for a in attempts),
                "eos": sum(not t for t in plain.truncated),
                "hinted": len(record["retries"]), "echo": echo}

    def report(self, per_set):
        c = per_set["heldout"]
        n = max(1, c["n"])
        return {"eval/behaviour/format_ok": c["format_ok"] / n, "eval/behaviour/empty": c["empty"] / n,
                "eval/behaviour/answer_tokens": c["answer_tokens"] / n, "eval/behaviour/eos_rate": c["eos"] / n,
                "eval/behaviour/hint_echo": c["echo"] / max(1, c["hinted"])}
