"""The environment protocol and its registry (see rl/environments/__init__.py).

An environment is a pure function of the episode so far: `respond` and `verify` read the problem
and the messages, nothing else. So an episode can be continued from any of its messages (corrected
replay regenerates from the target message on) and a resumed run replays exactly.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Callable, Protocol

from rl.tasks import Problem, TaskSource, Verdict
from student.registry import Registry


@dataclass
class Response:
    messages: list[dict]               # the environment's messages (role "tool" or "user")
    malformed: bool = False            # the assistant's tool call could not be run (answered with an error)


class Environment(Protocol):
    max_reply_tokens: int              # longest rendered reply between two assistant messages
    reads_task: tuple[tuple[str, str], ...] | None  # the (task.name, task.render) pairs it reads, None = any task

    def start(self, problem: Problem) -> list[dict]: ...

    def respond(self, problem: Problem, messages: list[dict]) -> Response | None: ...

    def verify(self, problem: Problem, messages: list[dict]) -> Verdict: ...

    def demonstration(self, problem: Problem) -> list[dict]: ...


# task.environment -> the class (student/registry.py): a new environment is its file and one line here
ENVIRONMENTS: Registry[Callable[[TaskSource], Environment]] = Registry("task.environment", {
    "answer": "rl.environments.answer:AnswerEnvironment",
    "calculator": "rl.environments.calculator:CalculatorEnvironment",
    "chain": "rl.environments.chain:ChainEnvironment",
})


def build_environment(name: str, tasks: TaskSource) -> Environment:
    return ENVIRONMENTS[name](tasks)


def assistant_messages(messages: list[dict]) -> list[int]:
    """Indices of the assistant messages."""
    return [i for i, m in enumerate(messages) if m["role"] == "assistant"]

