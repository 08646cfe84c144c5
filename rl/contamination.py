"""Prompt hashes for contamination checks.

Every eval set a run reports (each bucket's held-out set, each private set in `eval.private`)
is a set of prompt hashes; the training stream refuses any problem whose hash is in one of them,
whether it comes from a reasoning-gym seed or a JSONL file in `task.files` (rl/tasks.py). The hash
is taken over the prompt with its whitespace collapsed, so "12 + 35" and "12  +  35\n" are one
problem. 16 hex digits (64 bits): a chance collision between a million training problems and a few
thousand eval prompts is ~1e-10.
"""
from __future__ import annotations

import hashlib


def prompt_hash(prompt: str) -> str:
    return hashlib.sha256(" ".join(prompt.split()).encode("utf-8")).hexdigest()[:16]


def set_digest(hashes) -> str:
    """One hash naming a whole eval set (its sorted prompt hashes), for reports that compare sets."""
    return hashlib.sha256("\n".join(sorted(hashes)).encode()).hexdigest()[:16]
