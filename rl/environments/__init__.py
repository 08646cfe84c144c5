"""Environments: what answers the policy between its messages, and how an episode is scored.

    env.start(problem)             -> the opening messages (the user's problem)
    env.respond(problem, messages) -> Response (tool results / user feedback) or None: episode over
    env.verify(problem, messages)  -> Verdict (reward, feedback, the first wrong message)
    env.demonstration(problem)     -> a correct episode (warm-start)

`answer` (the default) is the one-message task: the user's problem, one assistant answer,
the task's verifier. `calculator` gives the policy a `calc` tool over multi-term arithmetic;
`chain` asks for one partial result per message and checks each.
Messages are OpenAI chat-completions dicts (student/tokenizer.py renders them).
"""
from rl.environments.base import ENVIRONMENTS, Environment, Response, build_environment

__all__ = ["ENVIRONMENTS", "Environment", "Response", "build_environment"]
