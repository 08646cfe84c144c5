"""The batch record of one RL step: every row the update trains on, and what each method attached.

A row is one (prompt, completion) pair with its sampling log-probs, reward, advantage, a weight on
its policy-gradient term and where it came from (`source`: "rollout", or a method's own rows).
`group_N` says which prompt group a row belongs to, so advantages can be taken over groups that a
method has grown. Teacher targets are attached per row subset (`RowTargets`), and `select` cuts
the whole record down to the rows of one gradient-accumulation micro-batch.

Shapes: N rows, C completion tokens, B prompt groups.
"""
from __future__ import annotations

from dataclasses import dataclass, field, fields, replace
from typing import Any

import torch

from student.policy import Routes, Scores


@dataclass
class RowTargets:
    """Teacher scores for some rows of the batch: rows[h] is the batch row of scores[h], in the
    row's completion positions. `mask_HC`, when set, limits the tokens they cover (e.g. the target
    message of an episode)."""
    rows: list[int]
    scores: Scores
    mask_HC: torch.Tensor | None = None

    def select(self, index: list[int]) -> "RowTargets":
        """The targets of the batch rows `index`, renumbered to their positions in it."""
        where = {row: i for i, row in enumerate(index)}
        keep = [h for h, row in enumerate(self.rows) if row in where]
        pick = torch.tensor(keep, dtype=torch.long)
        scores = Scores(**{f.name: None if getattr(self.scores, f.name) is None or f.name == "aux_loss"
                           else getattr(self.scores, f.name)[pick.to(getattr(self.scores, f.name).device)]
                           for f in fields(Scores)})
        mask = None if self.mask_HC is None else self.mask_HC[pick.to(self.mask_HC.device)]
        return RowTargets([where[self.rows[h]] for h in keep], scores, mask)


def shift_scores(scores: Scores, starts: list[int], width: int) -> Scores:
    """Scores of completion slices that began at `starts` (per row), moved to the rows' own
    positions in a completion `width` wide; positions outside a slice hold zeros."""
    if not any(starts) and scores.logprobs_NC.size(1) == width:
        return scores

    def moved(x):
        if x is None or x.dim() < 2:
            return x
        out = x.new_zeros((x.size(0), width, *x.shape[2:]))
        for h, s in enumerate(starts):
            n = min(x.size(1), width - s)
            out[h, s:s + n] = x[h, :n]
        return out

    return Scores(**{f.name: moved(getattr(scores, f.name)) if f.name != "aux_loss" else None
                     for f in fields(Scores)})


@dataclass
class Batch:
    problems: list                       # rl.tasks.Problem per row
    prompt_ids: list[list[int]]          # the context each row is trained in (never a hint)
    completion_ids_NC: torch.Tensor
    mask_NC: torch.Tensor                # real completion tokens
    old_logprobs_NC: torch.Tensor        # under the distribution that sampled them
    routes: Routes                       # experts picked when they were sampled
    attempts: list[str]
    verdicts: list                       # rl.tasks.Verdict per row
    rewards_N: torch.Tensor
    group_N: torch.Tensor                # long: the prompt group of each row
    source: list[str]                    # "rollout", or the name of the method stage that added the row
    advantages_N: torch.Tensor | None = None
    weight_N: torch.Tensor | None = None            # per-row weight on the policy-gradient term
    targets: dict[str, RowTargets] = field(default_factory=dict)
    hinted: Any = None                   # rl.feedback.HintedRows of the step, if a teacher was asked
    transcripts: list | None = None      # rl.episodes.Transcript per row: its messages and their token spans
    correction_gamma: float | None = None  # corrected_replay's Guide γ, fixed once per step (not per micro-batch)

    def __post_init__(self):
        if self.weight_N is None:
            self.weight_N = torch.ones(len(self.prompt_ids), device=self.completion_ids_NC.device)

    @property
    def n(self) -> int:
        return len(self.prompt_ids)

    def episodes(self) -> list[tuple[Any, list[int]]] | None:
        """Each row's (transcript, completion ids), what targeting reads (rl/feedback.py)."""
        if self.transcripts is None:
            return None
        return list(zip(self.transcripts, self.completion_ids_NC.tolist()))

    def select(self, index: list[int]) -> "Batch":
        """The rows `index` (in that order) as a batch of their own, targets renumbered."""
        idx = torch.tensor(index, dtype=torch.long, device=self.completion_ids_NC.device)

        def rows(x):
            if x is None:
                return None
            return x[idx] if isinstance(x, torch.Tensor) else [x[i] for i in index]

        return replace(self, problems=rows(self.problems), prompt_ids=rows(self.prompt_ids),
                       completion_ids_NC=rows(self.completion_ids_NC), mask_NC=rows(self.mask_NC),
                       old_logprobs_NC=rows(self.old_logprobs_NC), routes=self.routes.select(index),
                       attempts=rows(self.attempts), verdicts=rows(self.verdicts), rewards_N=rows(self.rewards_N),
                       group_N=rows(self.group_N), source=rows(self.source),
                       advantages_N=rows(self.advantages_N), weight_N=rows(self.weight_N),
                       targets={k: t.select(index) for k, t in self.targets.items()},
                       transcripts=rows(self.transcripts))

    def add_rows(self, more: "Batch", pad_id: int) -> None:
        """Append `more`'s rows to this batch, in place; its advantages are then unset (the caller
        takes them over the grown groups). `more.routes` must index this batch's distinct prompts
        (`routes.prompt`); completions are right-padded to the wider of the two, the added
        positions masked out and free of routes. Targets keep their rows (they come first)."""
        width = max(self.completion_ids_NC.size(1), more.completion_ids_NC.size(1))

        def both(a, b, fill):
            return torch.cat([widen(a, width, fill), widen(b, width, fill)])

        routes = self.routes.widen(width - 1).add_rows(more.routes.prompt_of_row_N,
                                                       more.routes.widen(width - 1).completion)
        cat = lambda a, b: None if a is None else (torch.cat([a, b]) if isinstance(a, torch.Tensor) else a + b)
        grown = replace(self, problems=self.problems + more.problems, prompt_ids=self.prompt_ids + more.prompt_ids,
                       completion_ids_NC=both(self.completion_ids_NC, more.completion_ids_NC, pad_id),
                       mask_NC=both(self.mask_NC, more.mask_NC, False),
                       old_logprobs_NC=both(self.old_logprobs_NC, more.old_logprobs_NC, 0.0), routes=routes,
                       attempts=self.attempts + more.attempts, verdicts=self.verdicts + more.verdicts,
                       rewards_N=cat(self.rewards_N, more.rewards_N), group_N=cat(self.group_N, more.group_N),
                       source=self.source + more.source, advantages_N=None,
                       weight_N=cat(self.weight_N, more.weight_N),
                       transcripts=None if self.transcripts is None else self.transcripts + more.transcripts)
        for f in fields(self):
            setattr(self, f.name, getattr(grown, f.name))


def widen(x_NC: torch.Tensor, width: int, fill) -> torch.Tensor:
    """x_NC with columns of `fill` added on the right up to `width`."""
    extra = width - x_NC.size(1)
    return x_NC if extra <= 0 else torch.cat([x_NC, x_NC.new_full((x_NC.size(0), extra), fill)], dim=1)


def micro_batches(n_rows: int, parts: int) -> list[list[int]]:
    """Consecutive row ranges of (near) equal size, one per gradient-accumulation micro-batch."""
    bounds = [round(i * n_rows / parts) for i in range(parts + 1)]
    return [list(range(bounds[i], bounds[i + 1])) for i in range(parts)]
