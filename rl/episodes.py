"""Episodes: a batch of multi-message conversations generated together through the policy.

`Episodes` is the `student.policy.Turns` of a rollout: after each row's assistant message it asks
the environment (rl/environments/) for its reply and hands the policy the reply's tokens to feed
into that row's KV cache. Rows finish at different turns. Caps, each a counted truncation (never an
error): a message that reaches `rollout.max_new_tokens` without <eos>, and an episode that reaches
`rollout.max_turns` assistant messages while the environment still answers.

A finished batch is a list of `Transcript`s: each row's messages and where its assistant messages
sit in the completion (`spans`), which is what targeting needs: the hint goes right before the
target message (`hinted_context`) and the loss covers that message's tokens.
"""
from __future__ import annotations

from dataclasses import dataclass

import torch

from rl.environments import Environment
from rl.environments.base import assistant_messages
from rl.tasks import Problem, Verdict
from student.tokenizer import Tokenizer, assistant_message, assistant_text


@dataclass
class Transcript:
    prompt_ids: list[int]             # the first user message, rendered up to the first <assistant>
    messages: list[dict]              # the whole episode, OpenAI-shaped
    spans: list[tuple[int, int]]      # each assistant message's [start, end) in the completion, <eos> included

    @property
    def assistant_indices(self) -> list[int]:
        return assistant_messages(self.messages)

    def span_of(self, message_index: int) -> tuple[int, int]:
        """[start, end) of the assistant message `message_index` in the completion."""
        return self.spans[self.assistant_indices.index(message_index)]

    def final_text(self) -> str:
        """The last assistant message as the student wrote it (the attempt a one-turn task verifies)."""
        said = self.assistant_indices
        return assistant_text(self.messages[said[-1]]) if said else ""

    def continued(self, start: int, more: "Transcript") -> "Transcript":
        """This episode up to completion position `start` (a message's start), then `more`: an
        episode that went on from there (its messages whole, its spans counted from `start`)."""
        return Transcript(self.prompt_ids, more.messages, [sp for sp in self.spans if sp[1] <= start]
                          + [(a + start, b + start) for a, b in more.spans])


def hinted_context(tok: Tokenizer, transcript: Transcript, completion: list[int], message_index: int,
                   hint: str) -> tuple[list[int], int]:
    """(context ids, start): everything before the assistant message `message_index` as sampled, with
    the hint in its local context (`tok.insert_hint`), and where that message starts in the
    completion. For a one-message episode this is `tok.render_prompt(prompt, hint)` and 0."""
    start = transcript.span_of(message_index)[0]
    return tok.insert_hint(transcript.prompt_ids + completion[:start], hint), start


def message_spans(mask_row: list[bool]) -> list[tuple[int, int]]:
    """The runs of sampled tokens in a completion's mask: one per assistant message."""
    spans, start = [], None
    for t, m in enumerate(mask_row + [False]):
        if m and start is None:
            start = t
        elif not m and start is not None:
            spans.append((start, t))
            start = None
    return spans


class Episodes:
    """The Turns of one generation call (student/policy.py): rows' conversations with `env`."""

    def __init__(self, env: Environment, tok: Tokenizer, problems: list[Problem], max_turns: int,
                 max_new_tokens: int, histories: list[list[dict]] | None = None,
                 prompts: list[list[int]] | None = None):
        """histories and prompts: continue each row from these messages and these context ids (the
        episode as sampled up to an assistant message, e.g. with a hint before a corrected target)
        instead of the problem's start; `max_turns` still counts every assistant message."""
        self.env, self.tok, self.problems = env, tok, problems
        self.messages = [list(h) for h in histories] if histories else [env.start(p) for p in problems]
        self.prompts = prompts or [tok.render_messages(m, add_generation_prompt=True) for m in self.messages]
        self.max_turns = max_turns
        left = max(1, max_turns - min((self.turns_taken(i) for i in range(len(problems))), default=0))
        self.max_tokens = left * max_new_tokens + (left - 1) * env.max_reply_tokens
        self.truncated = [False] * len(problems)
        self.malformed = 0                       # tool calls the environment could not run

    def turns_taken(self, row: int) -> int:
        return len(assistant_messages(self.messages[row]))

    # ---------------------------------------------------------------- student.policy.Turns
    def after_message(self, row: int, message: list[int], ended: bool) -> list[int] | None:
        text = self.tok.decode(message)
        self.messages[row].append(assistant_message(text, call_id=f"call_{self.turns_taken(row)}"))
        if not ended:
            self.truncated[row] = True           # the message reached rollout.max_new_tokens
            return None
        response = self.env.respond(self.problems[row], self.messages[row])
        if response is None:
            return None
        if self.turns_taken(row) >= self.max_turns:
            self.truncated[row] = True           # the environment still answers at rollout.max_turns
            return None
        self.malformed += response.malformed
        self.messages[row] += response.messages
        reply = self.tok.render_reply(response.messages)
        if len(reply) > self.env.max_reply_tokens:
            raise ValueError(f"{type(self.env).__name__} replied with {len(reply)} tokens, more than its "
                             f"max_reply_tokens={self.env.max_reply_tokens}: {response.messages}")
        return reply

    # ---------------------------------------------------------------- after generation
    def transcripts(self, mask_NC: torch.Tensor) -> list[Transcript]:
        """Each row's transcript, its assistant messages found as the runs of sampled tokens."""
        return [Transcript(self.prompts[i], self.messages[i], message_spans(mask))
                for i, mask in enumerate(mask_NC.tolist())]

    def verdicts(self) -> list[Verdict]:
        return [self.env.verify(p, m) for p, m in zip(self.problems, self.messages)]

    def stats(self) -> dict[str, float]:
        n = max(1, len(self.problems))
        return {"episode/turns_mean": sum(self.turns_taken(i) for i in range(len(self.problems))) / n,
                "episode/truncated": sum(self.truncated) / n,
                "episode/malformed_tool_calls": float(self.malformed)}
