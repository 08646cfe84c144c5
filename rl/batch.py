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

from student.policy import Rollout, Routes, Scores, join_rows


@dataclass
class RowTargets:
    """Teacher scores for some rows of the batch: rows[h] is the batch row of scores[h], in the
    row's completion positions. `mask_HC`, when set, limits the tokens they cover (e.g. the target
    message of an episode)."""
    rows: list[int]
    scores: Scores
    mask_HC: torch.Tensor | None = None

    @classmethod
    def on_spans(cls, rows: list[int], scores: Scores, starts: list[int], ends: list[int], width: int) -> "RowTargets":
        """Targets from scores of completion slices [starts[h], ends[h]) of `rows` (cut_spans),
        moved to the rows' own positions in a completion `width` wide and covering only the slices."""
        positions = torch.arange(width, device=scores.logprobs_NC.device)
        mask_HC = ((positions >= torch.tensor(starts, device=positions.device)[:, None])
                   & (positions < torch.tensor(ends, device=positions.device)[:, None]))
        return cls(rows, shift_scores(scores, starts, width), mask_HC)

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


def cut_spans(completion_NC: torch.Tensor, rows: list[int], starts: list[int], ends: list[int], pad_id: int) -> torch.Tensor:
    """The completion slices [starts[h], ends[h]) of `rows`, right-padded with `pad_id`: (H, W)."""
    slices = [completion_NC[r, s:e] for r, s, e in zip(rows, starts, ends)]
    return torch.nn.utils.rnn.pad_sequence(slices, batch_first=True, padding_value=pad_id)


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


def per_row(fill=None, *, optional: bool = False, derived: bool = False):
    """A field with one entry per row, which `select` and `add_rows` carry generically: `fill`
    right-pads a (N, C) completion field when rows of two widths meet ("pad": the tokenizer's
    <pad>); `derived` fields (advantages) are unset when rows are added, for the caller to
    recompute over the grown groups."""
    meta = {"per_row": True, "fill": fill, "derived": derived}
    return field(default=None, metadata=meta) if optional or derived else field(metadata=meta)


@dataclass
class Batch:
    problems: list = per_row()                          # rl.tasks.Problem per row
    prompt_ids: list[list[int]] = per_row()             # the context each row is trained in (never a hint)
    completion_ids_NC: torch.Tensor = per_row(fill="pad")
    mask_NC: torch.Tensor = per_row(fill=False)         # real completion tokens
    old_logprobs_NC: torch.Tensor = per_row(fill=0.0)   # under the distribution that sampled them
    routes: Routes = per_row()                          # experts picked when they were sampled
    attempts: list[str] = per_row()
    verdicts: list = per_row()                          # rl.tasks.Verdict per row
    rewards_N: torch.Tensor = per_row()
    group_N: torch.Tensor = per_row()                   # long: the prompt group of each row
    source: list[str] = per_row()                       # "rollout", or the name of the method stage that added the row
    advantages_N: torch.Tensor | None = per_row(derived=True)
    weight_N: torch.Tensor | None = per_row(optional=True)   # per-row weight on the policy-gradient term (default 1)
    transcripts: list | None = per_row(optional=True)   # rl.episodes.Transcript per row: its messages and their token spans
    # bool: the row is trained (default all). A method may keep a row for the step's statistics and
    # logs but leave it out of the update, e.g. an attempt a correction took the place of.
    trained_N: torch.Tensor | None = per_row(optional=True)
    # per step
    targets: dict[str, RowTargets] = field(default_factory=dict)   # renumbered by `select`
    hinted: Any = None                   # rl.hints.HintedRows of the step, if a teacher was asked
    correction_gamma: float | None = None  # corrected_replay's Guide γ, fixed once per step (not per micro-batch)

    def __post_init__(self):
        if self.weight_N is None:
            self.weight_N = torch.ones(len(self.prompt_ids), device=self.completion_ids_NC.device)
        if self.trained_N is None:
            self.trained_N = torch.ones(len(self.prompt_ids), dtype=torch.bool, device=self.completion_ids_NC.device)

    @property
    def n(self) -> int:
        return len(self.prompt_ids)

    def episodes(self) -> list[tuple[Any, list[int]]] | None:
        """Each row's (transcript, completion ids), what targeting reads (rl/hints.py)."""
        if self.transcripts is None:
            return None
        return list(zip(self.transcripts, self.completion_ids_NC.tolist()))

    def select(self, index: list[int]) -> "Batch":
        """The rows `index` (in that order) as a batch of their own, targets renumbered."""
        idx = torch.tensor(index, dtype=torch.long, device=self.completion_ids_NC.device)

        def rows(x):
            if x is None:
                return None
            if isinstance(x, Routes):
                return x.select(index)
            return x[idx] if isinstance(x, torch.Tensor) else [x[i] for i in index]

        return replace(self, targets={k: t.select(index) for k, t in self.targets.items()},
                       **{f.name: rows(getattr(self, f.name)) for f in _row_fields()})

    def trained(self) -> "Batch":
        """The rows the update trains on: this batch itself when that is every row."""
        if bool(self.trained_N.all()):
            return self
        return self.select(self.trained_N.nonzero().flatten().tolist())

    def add_rows(self, more: "Batch", pad_id: int) -> None:
        """Append `more`'s rows to this batch, in place; its advantages are then unset (the caller
        takes them over the grown groups). `more.routes` must index this batch's distinct prompts
        (`routes.prompt`); completions are right-padded to the wider of the two, the added
        positions masked out and free of routes. Targets keep their rows (they come first)."""
        width = max(self.completion_ids_NC.size(1), more.completion_ids_NC.size(1))

        def grown(f, a, b):
            if f.metadata["derived"] or a is None:
                return None
            if isinstance(a, Routes):
                return a.widen(width - 1).add_rows(b.prompt_of_row_N, b.widen(width - 1).completion)
            if not isinstance(a, torch.Tensor):
                return a + b
            fill = pad_id if f.metadata["fill"] == "pad" else f.metadata["fill"]
            return torch.cat([a, b]) if fill is None else torch.cat([widen(a, width, fill), widen(b, width, fill)])

        for f in _row_fields():
            setattr(self, f.name, grown(f, getattr(self, f.name), getattr(more, f.name)))

    def continued(self, rows: list[int], starts: list[int], roll: Rollout, pad_id: int, **outcome) -> "Batch":
        """New rows that go on from rows `rows` of this one: each keeps its prompt, problem, group
        and its completion's first `starts[i]` tokens (context now: masked out, their routes
        replayed), then continues with `roll`'s tokens, sampled in another context (their routes
        free). `outcome` gives the new rows' attempts, verdicts, source and transcripts (the
        regenerated episodes, from their start); rewards follow the verdicts."""
        dev = self.completion_ids_NC.device
        index = torch.tensor(rows, dtype=torch.long, device=dev)
        completion_NC = join_rows([self.completion_ids_NC[r, :s] for r, s in zip(rows, starts)],
                                  roll.completion_ids_NC, pad_id)
        more = outcome.pop("transcripts", None)
        transcripts = None if self.transcripts is None else [self.transcripts[r].continued(s, t)
                                                              for r, s, t in zip(rows, starts, more)]
        verdicts = outcome.pop("verdicts")
        return Batch(problems=[self.problems[r] for r in rows], prompt_ids=[self.prompt_ids[r] for r in rows],
                     completion_ids_NC=completion_NC,
                     mask_NC=join_rows([torch.zeros(s, dtype=torch.bool, device=dev) for s in starts], roll.mask_NC,
                                       False),
                     old_logprobs_NC=join_rows([torch.zeros(s, device=dev) for s in starts], roll.logprobs_NC, 0.0),
                     routes=self.routes.continued(rows, starts, [torch.full_like(g, -1) for g in roll.routes.completion],
                                                  completion_NC.size(1) - 1),
                     verdicts=verdicts, rewards_N=torch.tensor([v.reward for v in verdicts], device=dev),
                     group_N=self.group_N[index], transcripts=transcripts, **outcome)


def _row_fields():
    return [f for f in fields(Batch) if f.metadata.get("per_row")]


def widen(x_NC: torch.Tensor, width: int, fill) -> torch.Tensor:
    """x_NC with columns of `fill` added on the right up to `width`."""
    extra = width - x_NC.size(1)
    return x_NC if extra <= 0 else torch.cat([x_NC, x_NC.new_full((x_NC.size(0), extra), fill)], dim=1)


def micro_batches(n_rows: int, parts: int) -> list[list[int]]:
    """Consecutive row ranges of (near) equal size, one per gradient-accumulation micro-batch."""
    bounds = [round(i * n_rows / parts) for i in range(parts + 1)]
    return [list(range(bounds[i], bounds[i + 1])) for i in range(parts)]
