"""`private`: greedy accuracy on each private eval set (`eval.private: {name: FILE}`), e.g. the
problems `python -m rl.mine` found a run solving only sometimes, kept apart from training: a set a
model cannot have seen (its hashes are refused by the training stream, rl/contamination.py).
Answered as `heldout` answers (its counts), reported per set."""
from __future__ import annotations

from rl.evals.heldout import HeldOut


class Private(HeldOut):
    name = "private"
    summary = "greedy accuracy on each private set of eval.private (e.g. mined problems)"
    subsumed_by = None

    def sets(self, tasks):
        return tasks.private

    def report(self, per_set):
        return {f"eval/private/{name}/accuracy": c["solved"] / max(1, c["n"]) for name, c in per_set.items()}
