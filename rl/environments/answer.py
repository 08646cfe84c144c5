"""The one-message environment: the user's problem, one assistant answer, the task's verifier.

The one-message tasks as the one-turn case of the protocol: nothing answers the assistant, so the episode
ends after its first message, and the verdict is the task's own (rl/tasks.py).
"""
from __future__ import annotations

from rl.environments.base import Response
from rl.tasks import Problem, TaskSource, Verdict
from student.tokenizer import assistant_text


class AnswerEnvironment:
    max_reply_tokens = 0
    reads_task = None                  # any task: its own verifier scores the answer

    def __init__(self, tasks: TaskSource):
        self.tasks = tasks

    def start(self, problem: Problem) -> list[dict]:
        return [{"role": "user", "content": problem.prompt}]

    def respond(self, problem: Problem, messages: list[dict]) -> Response | None:
        return None

    def verify(self, problem: Problem, messages: list[dict]) -> Verdict:
        last = messages[-1]
        attempt = assistant_text(last) if last["role"] == "assistant" else ""
        verdict = self.tasks.verify(problem, attempt)
        if verdict.reward < 1.0:
            verdict.first_wrong = len(messages) - 1 if last["role"] == "assistant" else None
            verdict.expected = problem.answer
        return verdict

    def demonstration(self, problem: Problem) -> list[dict]:
        return self.start(problem) + [{"role": "assistant", "content": problem.answer}]

