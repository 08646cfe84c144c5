"""The step-by-step chain environment: one partial result per message, checked message by message.

Problems are reasoning-gym `chain_sum` expressions (`task.render: expression`). The policy writes the
running value after each operator, one message each, and the user answers `next` until every
operator is done; the last message is the answer:

    user: 15 - 43 + 7     assistant: -28     user: next     assistant: -21

Reward 1 when the last message is the expression's value. The verifier checks every message
against the partial values of the left-to-right derivation: the first that departs from it is the
episode's `first_wrong`, its partial value `expected`. Every message is a step here, so a wrong
intermediate message is always visible (the calculator environment's tool hides the arithmetic).
"""
from __future__ import annotations

from rl.environments.base import Response, assistant_messages
from rl.environments.calculator import OPS, terms
from rl.tasks import Problem, TaskSource, Verdict
from student.tokenizer import assistant_text

NEXT = "next"


def partial_values(expression: str) -> list[str]:
    """The value after each operator, left to right; the last is the answer."""
    value, rest = terms(expression)
    out = []
    for op, b in rest:
        value = OPS[op](value, b)
        out.append(str(value))
    return out


class ChainEnvironment:
    max_reply_tokens = len(NEXT) + 1          # "next" and the next <assistant>
    reads_task = (("chain_sum", "expression"),)

    def __init__(self, tasks: TaskSource):
        self.tasks = tasks

    def start(self, problem: Problem) -> list[dict]:
        return [{"role": "user", "content": problem.prompt}]

    def respond(self, problem: Problem, messages: list[dict]) -> Response | None:
        if len(assistant_messages(messages)) >= len(partial_values(problem.prompt)):
            return None
        return Response([{"role": "user", "content": NEXT}])

    def verify(self, problem: Problem, messages: list[dict]) -> Verdict:
        steps = partial_values(problem.prompt)
        said = [assistant_text(messages[i]).strip() for i in assistant_messages(messages)]
        reward = float(len(said) == len(steps) and said[-1] == steps[-1])
        first_wrong, expected = None, ""
        if not reward:
            for k, index in enumerate(assistant_messages(messages)):
                if k >= len(steps) or said[k] != steps[k]:
                    first_wrong, expected = index, steps[min(k, len(steps) - 1)]
                    break
        if reward:
            feedback = "correct"
        elif len(said) < len(steps):
            feedback = f"incorrect: the episode ended after {len(said)} of {len(steps)} steps"
        else:
            feedback = f"incorrect: the final answer {said[-1]!r} is wrong"
        if first_wrong is not None:
            feedback += f"; the first wrong step is message [{first_wrong + 1}]"
        return Verdict(reward, feedback, first_wrong, expected)

    def demonstration(self, problem: Problem) -> list[dict]:
        messages = self.start(problem)
        for k, value in enumerate(partial_values(problem.prompt)):
            if k:
                messages.append({"role": "user", "content": NEXT})
            messages.append({"role": "assistant", "content": value})
        return messages

