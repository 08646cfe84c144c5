"""Compute accounting, so that methods are compared at equal cost rather than equal steps.

Three counts per step, summed over ranks, and their running totals since the run began (saved in
checkpoints, so a resumed run continues them):

    budget/generated_tokens   tokens sampled: rollouts and every regeneration (e.g. under a hint)
    budget/scored_tokens      tokens through a no-gradient forward that is not sampling: the
                              hinted or teacher scores of the distilling methods (prompt + completion)
    budget/trained_tokens     tokens through the training forward (prompt + completion)

and `budget/<name>_total`. Evaluation is not counted: it is the same for every method.

Generation and scoring are counted where they happen, by wrapping the policy a step uses
(`Metered`), so a method cannot forget to count a forward it adds.
"""
from __future__ import annotations

import torch

from rl import distributed as dist

KINDS = ("generated", "scored", "trained")


class Budget:
    def __init__(self):
        self.step = dict.fromkeys(KINDS, 0)
        self.total = dict.fromkeys(KINDS, 0)

    def add(self, kind: str, tokens: int) -> None:
        self.step[kind] += int(tokens)

    def add_sequences(self, kind: str, prompts: list[list[int]], mask_NC: torch.Tensor) -> None:
        """Real tokens of (prompt, completion) rows: every prompt token and the completion tokens in mask_NC."""
        self.add(kind, sum(map(len, prompts)) + int(mask_NC.sum()))

    def close_step(self) -> dict[str, float]:
        """This step's counts over every rank, added to the totals (the same on every rank)."""
        summed = dist.sum_over_ranks({k: float(v) for k, v in self.step.items()})
        out = {}
        for kind in KINDS:
            self.total[kind] += int(summed[kind])
            out[f"budget/{kind}_tokens"] = summed[kind]
            out[f"budget/{kind}_tokens_total"] = float(self.total[kind])
        self.step = dict.fromkeys(KINDS, 0)
        return out

    def state(self) -> dict[str, int]:
        return dict(self.total)

    def load(self, state: dict[str, int] | None) -> None:
        self.total = {k: int((state or {}).get(k, 0)) for k in KINDS}


class Metered:
    """A policy whose generations and scores are added to a Budget (generated / scored tokens)."""

    def __init__(self, policy, budget: Budget, pad_id: int):
        self.policy, self.budget, self.pad_id = policy, budget, pad_id

    def __getattr__(self, name):        # device, num_routed_layers, take_replay_mismatch, ...
        return getattr(self.policy, name)

    def generate(self, prompts, sampling, turns=None):
        roll = self.policy.generate(prompts, sampling, turns)
        self.budget.add("generated", int(roll.mask_NC.sum()))
        return roll

    def score(self, prompts, completion_NC, **kwargs):
        self.budget.add_sequences("scored", prompts, completion_NC != self.pad_id)
        return self.policy.score(prompts, completion_NC, **kwargs)
