"""Supervised warm-start on task demonstrations, some with a teacher hint in context.

A model trained from scratch has never seen a hint; a pretrained one would know how to read one.
Demonstrations stand in for that: for a share of them we invent a plausible wrong attempt, ask
the teacher for its hint, and train on (prompt + hint -> correct answer), so the student learns
what the teacher's hints mean before RL starts relying on them.
"""
from __future__ import annotations

import random
import string

import torch

from rl.environments import Environment
from rl.hints import request_for
from rl.tasks import Problem, Verdict
from student.tokenizer import Tokenizer, assistant_text
from teacher import LeakGuard, Teacher


def corrupt(answer: str, rng: random.Random) -> str:
    """A near-miss of `answer`, shaped like a student's mistakes: one wrong character mostly."""
    if not answer:
        return rng.choice(string.digits)
    roll = rng.random()
    if roll < 0.1 and len(answer) > 1:
        return answer[:-1]
    if roll < 0.2:
        return answer + rng.choice(string.digits)
    i = rng.randrange(len(answer))
    pool = string.digits if answer[i].isdigit() else string.digits + "-"
    choice = rng.choice([c for c in pool if c != answer[i]])
    return answer[:i] + choice + answer[i + 1:]


def demonstrations(problems: list[Problem], teacher: Teacher, guard: LeakGuard, tok: Tokenizer,
                   rng: random.Random, hint_fraction: float, env: Environment,
                   by_bucket: dict[str, float] | None = None
                   ) -> tuple[list[list[int]], list[list[int]], list[list[bool]]]:
    """(prompt ids, completion ids, completion mask) per problem; a `hint_fraction` share (the
    problem's bucket's in `by_bucket`, where it has one) carries a hint if one is safe. The demonstration is `env`'s correct episode (`answer`: the answer alone);
    in a multi-message one, the hint is about one of its assistant messages (an invented near-miss
    of it) and sits right before that message. The mask marks the assistant messages' tokens:
    what the environment says, and the hint, are context, never targets."""
    episodes = [env.demonstration(p) for p in problems]
    by_bucket = by_bucket or {}
    chosen = [i for i in range(len(problems)) if rng.random() < by_bucket.get(problems[i].bucket, hint_fraction)]
    targets = {}
    for i in chosen:
        said = [k for k, m in enumerate(episodes[i]) if m["role"] == "assistant"]
        # rng.choice draws even from one option: a one-message task keeps the random stream it always had
        targets[i] = said[0] if len(said) == 1 else rng.choice(said)
        # A task that knows which message its hint is about (rl/hidden_tool_rule.py: the first call,
        # the one a hidden key breaks; later calls may copy the key from it) puts it there.
        before = problems[i].entry.get("metadata", {}).get("hint_before")
        if before is not None:
            targets[i] = said[before]
    requests = []
    for i in chosen:
        messages, k = episodes[i], targets[i]
        expected = assistant_text(messages[k])
        wrong = messages[:k] + [{"role": "assistant", "content": corrupt(expected, rng)}]
        requests.append(request_for(problems[i], wrong[-1]["content"], Verdict(0.0, "incorrect", k, expected), wrong))
    hint_of = {i: guard.filter(h.text if h else None, problems[i].answer)
               for i, h in zip(chosen, teacher.write_hints(requests))}
    out = ([], [], [])
    for i, messages in enumerate(episodes):
        if hint_of.get(i):
            messages = messages[:targets[i]] + [{"role": "hint", "content": hint_of[i]}] + messages[targets[i]:]
        for part, rows in zip(split_demonstration(tok, messages), out):
            rows.append(part)
    return out


def split_demonstration(tok: Tokenizer, messages: list[dict]) -> tuple[list[int], list[int], list[bool]]:
    """(prompt ids through the first assistant opening, the rest, True on assistant messages' own
    tokens): rendered piece by piece as an episode is sampled (the prompt, then each answer and the
    environment's reply after it), so a demonstration has the ids a rollout of it would have."""
    prompt, hint, pending = None, None, []
    completion, mask = [], []
    for m in messages:
        if m["role"] == "hint":
            hint = m["content"]
        elif m["role"] != "assistant":
            pending.append(m)
        else:
            if prompt is None:
                if len(pending) != 1 or pending[0]["role"] != "user":
                    raise ValueError(f"a demonstration opens with one user message, not {[p['role'] for p in pending]}")
                prompt = tok.render_prompt(pending[0]["content"], hint)
            else:
                reply = tok.render_reply(pending, hint)
                completion += reply
                mask += [False] * len(reply)
            answer = tok.render_answer(assistant_text(m))     # the message and its end of turn are targets
            completion += answer
            mask += [True] * len(answer)
            hint, pending = None, []
    if prompt is None:
        raise ValueError("a demonstration has no assistant message")
    return prompt, completion, mask


def right_pad(rows: list[list[int]], pad_id: int, device=None,
              masks: list[list[bool]] | None = None) -> tuple[torch.Tensor, torch.Tensor]:
    """(ids_NC, mask_NC) for completions given as lists, e.g. demonstrations; `masks` (per row, as
    long as it) mark the tokens to train, default every token of the row."""
    width = max(len(r) for r in rows)
    ids = torch.full((len(rows), width), pad_id, dtype=torch.long)
    mask = torch.zeros((len(rows), width), dtype=torch.bool)
    for i, r in enumerate(rows):
        ids[i, :len(r)] = torch.tensor(r, dtype=torch.long)
        mask[i, :len(r)] = torch.tensor(masks[i], dtype=torch.bool) if masks is not None else True
    return ids.to(device), mask.to(device)
