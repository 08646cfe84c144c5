"""Which policy runs a student module: the lean forward where the family allows it, else
transformers' own (student/policy.py is the contract both implement; this module is apart from it
so that the implementations import the contract and nothing imports back)."""
from __future__ import annotations

import torch

from student.hf_policy import HFPolicy
from student.lean import unsupported
from student.lean_policy import LeanPolicy
from student.policy import Policy


def build_policy(model: torch.nn.Module, *, pad_id: int, banned_ids: tuple[int, ...] = (), lean: bool = True,
                 forward=None, runner=None, warn=None) -> Policy:
    """The lean policy where `lean` and the family allow it, else transformers' forward.

    pad_id: the id prompts are left-padded with. banned_ids: never sampled, never scored.
    forward: a callable that runs the module's forward (e.g. a DeepSpeed engine; default: the
    module). runner(fn): runs a whole lean computation as the training forward (e.g. inside the
    engine's forward). warn(text) is told why the lean forward was not used."""
    if lean:
        reason = unsupported(model)
        if reason is None:
            return LeanPolicy(model, pad_id=pad_id, banned_ids=banned_ids, runner=runner)
        if warn is not None:
            warn(f"student.lean_forward: {reason}; using the transformers forward")
    return HFPolicy(model, pad_id=pad_id, banned_ids=banned_ids, forward=forward)
