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

from rl.feedback import request_for
from rl.tasks import Problem, Verdict
from student.tokenizer import ByteTokenizer
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


def demonstrations(problems: list[Problem], teacher: Teacher, guard: LeakGuard, tok: ByteTokenizer,
                   rng: random.Random, hint_fraction: float) -> tuple[list[list[int]], list[list[int]]]:
    """(prompt ids, answer ids) per problem; a `hint_fraction` share carries a hint if one is safe."""
    chosen = [p for p in problems if rng.random() < hint_fraction]
    attempts = [corrupt(p.answer, rng) for p in chosen]
    requests = [request_for(p, a, Verdict(0.0, "incorrect")) for p, a in zip(chosen, attempts)]
    hint_of = {id(p): guard.filter(h.text if h else None, p.answer)
               for p, h in zip(chosen, teacher.write_hints(requests))}
    prompts = [tok.render_prompt(p.prompt, hint_of.get(id(p))) for p in problems]
    answers = [tok.render_answer(p.answer) for p in problems]
    return prompts, answers


def right_pad(rows: list[list[int]], pad_id: int, device=None) -> tuple[torch.Tensor, torch.Tensor]:
    """(ids_NC, mask_NC) for completions given as lists, e.g. demonstration answers."""
    width = max(len(r) for r in rows)
    ids = torch.full((len(rows), width), pad_id, dtype=torch.long)
    for i, r in enumerate(rows):
        ids[i, :len(r)] = torch.tensor(r, dtype=torch.long)
    mask = torch.arange(width)[None, :] < torch.tensor([len(r) for r in rows])[:, None]
    return ids.to(device), mask.to(device)
