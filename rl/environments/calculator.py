"""The calculator environment: multi-term arithmetic with a `calc(a, op, b)` tool.

Problems are reasoning-gym `chain_sum` expressions (e.g. `15 - 43 - 75`, `task.render: expression`;
`num_terms` and `num_digits` are the difficulty knobs). The policy may call

    calc{"a": 15, "op": "-", "b": 43}      ->  tool: -28

as often as it likes (up to `rollout.max_turns` messages) and ends the episode with a message that
is not a tool call: its final answer. Reward 1 when that answer is the expression's value.

The per-step verifier follows the canonical derivation, left to right: message k should be
`calc{"a":<value so far>,"op":<k-th operator>,"b":<next term>}` and, after the last term, the
value itself. The first assistant message that departs from it is the episode's `first_wrong`,
and the canonical message is `expected`, so a rule teacher can target the message that went wrong
(an episode that reaches the right answer by another order of calls is correct; only its steps
are not checked). A call that cannot run (unknown tool, arguments that are not a JSON object with
integer `a`, `b` and `op` in + - *) is answered with a tool error and the episode goes on; it is
counted as malformed.

Problems of `task.name: hidden_tool_rule` (rl/hidden_tool_rule.py) may carry a tool key: every call
then takes `"key":"<key>"` as well, and the tool refuses a call with another key or none
("error: refused", which says nothing of the right one); the canonical calls carry it, and the
reward asks for it: a right value with a call that lacked the key, or without any call, scores 0.
"""
from __future__ import annotations

import json
import re

from rl.environments.base import Response, assistant_messages
from rl.hidden_tool_rule import key_hint
from rl.tasks import Problem, TaskSource, Verdict
from student.tokenizer import assistant_text

TOOL = "calc"
LIMIT = 10 ** 9                 # operands the tool takes: a product stays a short reply
OPS = {"+": lambda a, b: a + b, "-": lambda a, b: a - b, "*": lambda a, b: a * b}
TERM = re.compile(r"\s*([+\-*])?\s*(-?\d+)")


def terms(expression: str) -> tuple[int, list[tuple[str, int]]]:
    """(first term, [(operator, term), ...]) of a chain like `15 - 43 + 7` (a hidden tool rule's
    trailing " ?" aside)."""
    parts = [(op, int(n)) for op, n in TERM.findall(expression.strip().rstrip("=").removesuffix("?"))]
    if not parts or parts[0][0] or any(not op for op, _ in parts[1:]):
        raise ValueError(f"calculator: {expression!r} is not a chain of integers and + - * operators")
    return parts[0][1], parts[1:]


def call_text(a: int, op: str, b: int, key: str | None = None) -> str:
    """The canonical tool-call message: compact JSON, the form the demonstrations use."""
    args = {"a": a, "op": op, "b": b} if key is None else {"a": a, "op": op, "b": b, "key": key}
    return TOOL + json.dumps(args, separators=(",", ":"))


def tool_key(problem: Problem) -> str | None:
    """The key the problem's tool takes (rl/hidden_tool_rule.py), or None."""
    return problem.entry.get("metadata", {}).get("tool_key")


def canonical(expression: str, key: str | None = None) -> list[str]:
    """The assistant messages of the canonical derivation: one call per operator, then the value."""
    value, rest = terms(expression)
    steps = []
    for op, b in rest:
        steps.append(call_text(value, op, b, key))
        value = OPS[op](value, b)
    return steps + [str(value)]


def parse_call(message: dict) -> tuple[int, str, int, str | None] | str:
    """(a, op, b, key or None) of an assistant tool call, or the error the tool answers with."""
    call = message["tool_calls"][0]["function"]
    if call["name"] != TOOL:
        return f"error: unknown tool; the tool is {TOOL}"
    try:
        args = json.loads(call["arguments"])
    except ValueError:
        return "error: arguments are not JSON"
    if not isinstance(args, dict) or set(args) - {"key"} != {"a", "op", "b"} or args["op"] not in OPS \
            or not all(isinstance(args[k], int) and not isinstance(args[k], bool) for k in ("a", "b")) \
            or not isinstance(args.get("key", ""), str):
        return 'error: need {"a": int, "op": "+"|"-"|"*", "b": int}'
    if max(abs(args["a"]), abs(args["b"])) >= LIMIT:
        return f"error: numbers must be below {LIMIT:.0e}"
    return args["a"], args["op"], args["b"], args.get("key")


class CalculatorEnvironment:
    max_reply_tokens = 56          # the longest tool message (an error, or a 19-digit product) and <assistant>
    reads_task = (("chain_sum", "expression"), ("hidden_tool_rule", "expression"))

    def __init__(self, tasks: TaskSource):
        self.tasks = tasks

    def start(self, problem: Problem) -> list[dict]:
        return [{"role": "user", "content": problem.prompt}]

    def respond(self, problem: Problem, messages: list[dict]) -> Response | None:
        last = messages[-1]
        if not last.get("tool_calls"):
            return None                               # a final answer ends the episode
        parsed = parse_call(last)
        call_id = last["tool_calls"][0]["id"]
        if isinstance(parsed, str):
            return Response([{"role": "tool", "tool_call_id": call_id, "content": parsed}], malformed=True)
        a, op, b, key = parsed
        if tool_key(problem) is not None and key != tool_key(problem):
            return Response([{"role": "tool", "tool_call_id": call_id, "content": "error: refused"}])
        return Response([{"role": "tool", "tool_call_id": call_id, "content": str(OPS[op](a, b))}])

    def verify(self, problem: Problem, messages: list[dict]) -> Verdict:
        steps = canonical(problem.prompt, tool_key(problem))
        said = assistant_messages(messages)
        last = messages[said[-1]] if said else None
        final = None if last is None or last.get("tool_calls") else assistant_text(last).strip()
        reward = float(final is not None and final == steps[-1] and self._keys_kept(problem, messages, said))
        first_wrong, expected = None, ""
        if not reward:
            for k, index in enumerate(said):
                want = steps[min(k, len(steps) - 1)]
                if not self._same(messages[index], want):
                    first_wrong, expected = index, want
                    break
        if reward:
            feedback = "correct"
        elif final is None:
            feedback = "incorrect: the episode ended without a final answer"
        elif final == steps[-1]:       # a tool key's rule broken on the way to the right value
            feedback = "incorrect: the value is right, but not every call was made with the tool's key"
        else:
            feedback = f"incorrect: the final answer {final!r} is wrong"
        if first_wrong is not None and not reward:
            feedback += f"; the first wrong step is message [{first_wrong + 1}]"
        stated = problem.entry.get("metadata", {}).get("stated")
        if stated and not reward:       # the hidden tool rule's words, where its `hint` allows them
            feedback += f"; {key_hint(stated)}"
        return Verdict(reward, feedback, first_wrong, expected)

    @staticmethod
    def _keys_kept(problem: Problem, messages: list[dict], said: list[int]) -> bool:
        """Under a tool key the rule is part of the answer: at least one call, every call with the key
        (else a student could answer a one-digit sum without the tool and never meet the rule)."""
        key = tool_key(problem)
        if key is None:
            return True
        calls = [parse_call(messages[i]) for i in said if messages[i].get("tool_calls")]
        return bool(calls) and all(not isinstance(c, str) and c[3] == key for c in calls)

    @staticmethod
    def _same(message: dict, want: str) -> bool:
        """A message says what the canonical step says (a call by its values, an answer by its text)."""
        if message.get("tool_calls"):
            parsed = parse_call(message)
            return not isinstance(parsed, str) and call_text(*parsed) == want
        return assistant_text(message).strip() == want

    def demonstration(self, problem: Problem) -> list[dict]:
        messages = self.start(problem)
        value, rest = terms(problem.prompt)
        for k, (op, b) in enumerate(rest):
            call_id = f"call_{k}"
            messages.append({"role": "assistant", "content": "", "tool_calls": [
                {"id": call_id, "type": "function",
                 "function": {"name": TOOL, "arguments": call_text(value, op, b, tool_key(problem))[len(TOOL):]}}]})
            value = OPS[op](value, b)
            messages.append({"role": "tool", "tool_call_id": call_id, "content": str(value)})
        return messages + [{"role": "assistant", "content": str(value)}]

