"""The policy interface: what the trainer, evaluation, rollouts and teacher scoring ask of a student.

    policy.generate(prompts, sampling)                      -> Rollout (tokens, log-probs, routes)
    policy.score(prompts, completions, routes=, need=, k=)  -> Scores

Two implementations sit behind it: `LeanPolicy` (student/lean_policy.py: the lean forward of
student/lean.py, qwen3_moe and mixtral) and `HFPolicy` (student/hf_policy.py: transformers' own
forward, every registered family). `student.build.build_policy` picks one. Both work wherever the module's
parameters live (CPU here, CUDA on a GPU machine): every tensor they make is made on
`policy.device`.

The distribution a policy defines is the model's softmax at `temperature` with `banned_ids`
(special tokens such as <pad>, <bos>, <hint>) removed: generation samples from it and scoring
returns its log-probs, so the old and new log-probs of a policy-gradient ratio come from the same
distribution, and a sampled <pad> can never punch a hole into a loss mask.

`need` says what scoring returns besides each given token's log-prob, and so how much it costs:

    "logprobs"  log p(token)                                   memory O(rows x tokens)
    "argmax"    + the most likely token at each position        O(rows x tokens)
    "topk"      + the k most likely tokens, their log-probs,    O(rows x tokens x k)
                  and the log of the remaining mass
    "full"      + the whole log-distribution                    O(rows x tokens x vocabulary)

Without gradient the vocabulary projection runs in chunks of positions, so a 151,936-token
vocabulary never materialises as a (rows x tokens x vocabulary) fp32 tensor unless "full" asks
for it. Scoring runs with gradient when autograd is enabled (training) and without under
`torch.no_grad()` (teacher scores, evaluation).

Shapes: N rows, P prompt tokens (left-padded), C completion tokens, V vocabulary, K routed slots
(or top-k entries), U distinct prompts.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Callable, Protocol

import torch
import torch.nn.functional as F

from student.router_replay import MismatchCounter

NEEDS = ("logprobs", "argmax", "topk", "full")


@dataclass(frozen=True)
class Sampling:
    max_new_tokens: int
    eos_id: int
    pad_id: int                       # written after a row's <eos> (never sampled)
    temperature: float = 1.0
    greedy: bool = False


@dataclass
class Routes:
    """The experts each routed layer picked at rollout: each distinct prompt once, then every
    row's fed completion tokens (all but the last, which predicts nothing scored). A token whose
    ids are all -1 is free: replay leaves it to the router and does not count it."""
    prompt_of_row_N: torch.Tensor     # long (N,): row -> distinct prompt
    prompt: list[torch.Tensor]        # per layer (U, P, K), left-padded like the prompts
    completion: list[torch.Tensor]    # per layer (N, C-1, K)

    def per_row(self) -> list[torch.Tensor]:
        """Per layer (N, P + C-1, K): one row per sequence."""
        return [torch.cat([p[self.prompt_of_row_N], c], dim=1) for p, c in zip(self.prompt, self.completion)]

    def select(self, rows) -> "Routes":
        """The routes of some rows (a slice or index list), distinct prompts renumbered in order
        of first appearance."""
        index = torch.as_tensor(range(len(self.prompt_of_row_N))[rows] if isinstance(rows, slice) else rows,
                                dtype=torch.long, device=self.prompt_of_row_N.device)
        of_row = self.prompt_of_row_N[index]
        kept = list(dict.fromkeys(of_row.tolist()))
        renumber = torch.full((len(self.prompt[0]),), -1, dtype=torch.long, device=of_row.device)
        renumber[kept] = torch.arange(len(kept), device=of_row.device)
        return Routes(renumber[of_row], [p[kept] for p in self.prompt], [c[index] for c in self.completion])

    def widen(self, tokens: int) -> "Routes":
        """The same routes over `tokens` fed completion tokens, the added ones free."""
        extra = tokens - self.completion[0].size(1)
        if extra < 0:
            raise ValueError(f"cannot widen routes of {self.completion[0].size(1)} tokens to {tokens}")
        return Routes(self.prompt_of_row_N, self.prompt,
                      [torch.cat([c, c.new_full((c.size(0), extra, c.size(2)), -1)], dim=1) for c in self.completion])

    def add_rows(self, prompt_of_row_N: torch.Tensor, completion: list[torch.Tensor]) -> "Routes":
        """These routes and more rows after them, on the same distinct prompts (equal widths)."""
        return Routes(torch.cat([self.prompt_of_row_N, prompt_of_row_N]), self.prompt,
                      [torch.cat([a, b]) for a, b in zip(self.completion, completion)])

    def continued(self, rows: list[int], starts: list[int], after: list[torch.Tensor], fed: int) -> "Routes":
        """The routes of rows `rows` (on the same distinct prompts) whose completions keep their
        first `starts[i]` tokens and go on with tokens routed as `after` (per layer (R, S, K), -1
        for free), over `fed` fed completion tokens; what no row reaches is free."""
        index = torch.tensor(rows, dtype=torch.long, device=self.prompt_of_row_N.device)
        return Routes(self.prompt_of_row_N[index], self.prompt,
                      [join_rows([c[r, :s] for r, s in zip(rows, starts)], a, -1, fed)
                       for c, a in zip(self.completion, after)])


def join_rows(before: list[torch.Tensor], after: torch.Tensor, fill, width: int | None = None) -> torch.Tensor:
    """Per row i: `before[i]`, then `after[i]`, right-filled with `fill`: (R, width, ...) with
    `width` = the longest join unless given (then `after` is cut to fit). Any trailing dimensions
    (e.g. routed slots) ride along."""
    width = max(len(b) for b in before) + after.size(1) if width is None else width
    out = after.new_full((len(before), width, *after.shape[2:]), fill)
    for i, b in enumerate(before):
        n = min(after.size(1), width - len(b))
        out[i, :len(b)] = b
        out[i, len(b):len(b) + n] = after[i, :n]
    return out


@dataclass
class Rollout:
    prompt_ids: list[list[int]]
    completion_ids_NC: torch.Tensor   # long, pad_id after <eos> (after the episode's end, with turns)
    mask_NC: torch.Tensor             # bool, True on sampled tokens up to and including <eos>; False on
                                      # the replies fed between messages (turns)
    logprobs_NC: torch.Tensor         # log-prob of each sampled token under the sampling distribution
    routes: Routes                    # the experts every routed layer picked


@dataclass
class Scores:
    logprobs_NC: torch.Tensor                    # log p(given token)
    argmax_NC: torch.Tensor | None = None        # need argmax, topk or full
    topk_logp_NCK: torch.Tensor | None = None    # need topk: the k largest log-probs, descending
    topk_ids_NCK: torch.Tensor | None = None
    tail_logp_NC: torch.Tensor | None = None     # need topk: log(1 - their total mass)
    logp_NCV: torch.Tensor | None = None         # need full
    aux_loss: torch.Tensor | None = None         # router load-balancing loss (router_aux=True)


class Turns(Protocol):
    """Multi-message episodes inside one generation: who speaks after each of a row's messages.

    A row's completion is then the whole episode after its prompt: the policy's messages (each up
    to `sampling.max_new_tokens`, ending at <eos>) and, between them, the tokens `after_message`
    returns (an environment's reply rendered in the chat layout, ending with the marker that opens
    the next message), fed into the row's KV cache, not sampled: `Rollout.mask_NC` is False on
    them and their log-probs are 0, so no loss ever trains on them."""
    max_tokens: int           # a row's whole completion, replies included

    def after_message(self, row: int, message: list[int], ended: bool) -> list[int] | None:
        """Tokens to feed after `row`'s latest message, or None: its episode is over. `ended`:
        the message ended with <eos> (False: it reached sampling.max_new_tokens)."""
        ...


class Policy(Protocol):
    device: torch.device
    num_routed_layers: int

    def generate(self, prompts: list[list[int]], sampling: Sampling, turns: Turns | None = None) -> Rollout:
        """One sampled completion per prompt; with `turns`, a multi-message episode per row."""
        ...

    def score(self, prompts: list[list[int]], completion_NC: torch.Tensor, *, temperature: float = 1.0,
              need: str = "logprobs", k: int = 0, routes: Routes | None = None,
              router_aux: bool = False) -> Scores:
        """Scores of completion_NC after the prompts, in one forward. `routes` (of these rows)
        force the experts; how often the router would have chosen otherwise accumulates until
        `take_replay_mismatch()`."""
        ...

    def take_replay_mismatch(self) -> float:
        """Share of forced routing slots since the last call where the router would have picked
        another expert (0 when none were forced)."""
        ...


# ---------------------------------------------------------------------- shared pieces
class ReplayCounting:
    """What both implementations report from: `self.replay`, the counter of forced routing slots
    (a RouterReplay, which is one, for the hook-based policy)."""
    replay: MismatchCounter

    def take_replay_mismatch(self) -> float:
        rate = self.replay.stats()["mismatch_rate"]
        self.replay.reset_stats()
        return rate


class Decoding:
    """The per-step bookkeeping of a decode loop, shared by both policies: which rows are done and,
    with `turns`, which rows are fed an environment's reply instead of sampling.

        for t in range(decoding.steps):
            tok_N = decoding.choose(*dist.sample(logits_NV, decoding.done_N, sampling))
            if decoding.over(t): break
            ...feed tok_N...
        return decoding.rollout(prompt_ids, routes)

    Without turns this is the one-message loop: a row is done at <eos>, and the mask
    marks every token up to it. With turns, rows being fed still draw their sample (one uniform
    each), so the random stream does not depend on which rows are being fed."""

    def __init__(self, n: int, sampling: Sampling, turns: Turns | None, device):
        self.sampling, self.turns = sampling, turns
        self.steps = sampling.max_new_tokens if turns is None else turns.max_tokens
        self.done_N = torch.zeros(n, dtype=torch.bool, device=device)
        self.tokens: list[torch.Tensor] = []
        self.logps: list[torch.Tensor] = []
        self.sampled: list[torch.Tensor] = []       # turns: True where the policy sampled the token
        self._queue = [[] for _ in range(n)]        # turns: reply tokens still to feed
        self._message = [[] for _ in range(n)]      # turns: the message being sampled
        self._done = [False] * n

    def choose(self, tok_N: torch.Tensor, logp_N: torch.Tensor) -> torch.Tensor:
        """Records and returns this step's tokens: the sampled ones, or a reply's next token."""
        if self.turns is None:
            self.done_N = self.done_N | (tok_N == self.sampling.eos_id)
            self.tokens.append(tok_N)
            self.logps.append(logp_N)
            return tok_N
        fed, sampled = tok_N.tolist(), [False] * len(self._done)
        for i, tok in enumerate(fed):
            if self._done[i]:
                fed[i] = self.sampling.pad_id
            elif self._queue[i]:
                fed[i] = self._queue[i].pop(0)
            else:
                sampled[i] = True
                message = self._message[i]
                message.append(tok)
                if tok == self.sampling.eos_id or len(message) >= self.sampling.max_new_tokens:
                    reply = self.turns.after_message(i, list(message), tok == self.sampling.eos_id)
                    message.clear()
                    self._queue[i] = list(reply or ())
                    self._done[i] = not reply
        dev = tok_N.device
        sampled_N = torch.tensor(sampled, dtype=torch.bool, device=dev)
        tok_N = torch.tensor(fed, dtype=tok_N.dtype, device=dev)
        self.done_N = torch.tensor(self._done, dtype=torch.bool, device=dev)
        self.tokens.append(tok_N)
        self.logps.append(logp_N.masked_fill(~sampled_N, 0.0))
        self.sampled.append(sampled_N)
        return tok_N

    def over(self, t: int) -> bool:
        """After step t: nothing left to feed (the last step, or every row done)."""
        return t == self.steps - 1 or bool(self.done_N.all())

    def rollout(self, prompt_ids, routes: Routes) -> Rollout:
        completion_NC = torch.stack(self.tokens, dim=1)
        if self.turns is None:
            mask_NC = completion_NC != self.sampling.pad_id
        else:
            mask_NC = torch.stack(self.sampled, dim=1)
        logprobs_NC = torch.stack(self.logps, dim=1).masked_fill(~mask_NC, 0.0)
        return Rollout(prompt_ids, completion_NC, mask_NC, logprobs_NC, routes)


def left_pad(rows: list[list[int]], pad_id: int, device=None) -> tuple[torch.Tensor, torch.Tensor]:
    """(ids_NP, mask_NP): rows right-aligned, so every row's next token sits in the last column."""
    width = max(len(r) for r in rows)
    ids = torch.full((len(rows), width), pad_id, dtype=torch.long)
    mask = torch.zeros((len(rows), width), dtype=torch.long)
    for i, r in enumerate(rows):
        ids[i, width - len(r):] = torch.tensor(r, dtype=torch.long)
        mask[i, width - len(r):] = 1
    return ids.to(device), mask.to(device)


def distinct_prompts(prompt_ids: list[list[int]], device=None) -> tuple[list[list[int]], torch.Tensor]:
    """(distinct prompts in order of first appearance, row -> index into them)."""
    index: dict[tuple[int, ...], int] = {}
    of_row = torch.tensor([index.setdefault(tuple(p), len(index)) for p in prompt_ids], dtype=torch.long)
    return [list(p) for p in index], of_row.to(device)


def inverse_cdf(probs_NV: torch.Tensor) -> torch.Tensor:
    """One token per row drawn from probs_NV: the first token whose cumulative probability passes a
    uniform draw (scaled by the row's total, so rounding in the cumsum cannot step past the end).
    One uniform per row where torch.multinomial draws an exponential per vocabulary entry. A
    zero-probability token never passes: its cumsum equals its predecessor's."""
    cdf_NV = probs_NV.cumsum(-1)
    u_N1 = torch.rand(probs_NV.size(0), 1, device=probs_NV.device) * cdf_NV[:, -1:]
    return torch.searchsorted(cdf_NV, u_N1, right=True).clamp_(max=probs_NV.size(-1) - 1).squeeze(-1)


class Distribution:
    """The policy's next-token distribution from logits: temperature, banned ids removed."""

    def __init__(self, banned_ids: tuple[int, ...] = ()):
        self.banned_ids = tuple(banned_ids)
        self._banned: dict[tuple, torch.Tensor] = {}

    def log_softmax(self, logits_XV: torch.Tensor, temperature: float) -> torch.Tensor:
        z = logits_XV.float() / temperature
        if self.banned_ids:
            # one index tensor per device, and apart for inference mode (its tensors cannot be
            # saved for a backward outside it)
            key = (z.device, torch.is_inference_mode_enabled())
            if key not in self._banned:
                self._banned[key] = torch.tensor(self.banned_ids, dtype=torch.long, device=z.device)
            z = z.index_fill(-1, self._banned[key], float("-inf"))
        return F.log_softmax(z, dim=-1)

    def sample(self, logits_NV, done_N, sampling: Sampling) -> tuple[torch.Tensor, torch.Tensor]:
        """(token, its log-prob) per row; rows already done get pad_id."""
        logp_NV = self.log_softmax(logits_NV, 1.0 if sampling.greedy else sampling.temperature)
        tok_N = logp_NV.argmax(-1) if sampling.greedy else inverse_cdf(logp_NV.exp())
        tok_N = torch.where(done_N, torch.full_like(tok_N, sampling.pad_id), tok_N)
        return tok_N, logp_NV.gather(-1, tok_N[:, None]).squeeze(-1)

    def scores(self, hidden_NCD: torch.Tensor, head: Callable[[torch.Tensor], torch.Tensor], vocab_size: int,
               tokens_NC: torch.Tensor, temperature: float, need: str, k: int,
               chunk_logits: int = 1 << 24) -> Scores:
        """Scores from the final hidden states through `head` (the vocabulary projection, to
        `vocab_size` logits).

        With gradient: one projection over all positions (backward needs the log-softmax anyway).
        Without: positions in chunks of about `chunk_logits` logits (64 MiB of fp32), keeping
        only what `need` asks for."""
        if need not in NEEDS:
            raise ValueError(f"need={need!r}: choose one of {NEEDS}")
        if need == "topk" and k < 1:
            raise ValueError("need='topk' takes k >= 1")
        n, c = tokens_NC.shape
        h_MD, tok_M = hidden_NCD.reshape(n * c, -1), tokens_NC.reshape(-1)
        if torch.is_grad_enabled() or need == "full":
            parts = [self._chunk_scores(head(h_MD), tok_M, temperature, need, k)]
        else:
            step = max(1, chunk_logits // vocab_size)
            parts = [self._chunk_scores(head(h_MD[i:i + step]), tok_M[i:i + step], temperature, need, k)
                     for i in range(0, n * c, step)]
        fields = {name: torch.cat([p[name] for p in parts]) for name in parts[0]}
        shaped = {name: t.view(n, c, *t.shape[1:]) for name, t in fields.items()}
        return Scores(**shaped)

    def _chunk_scores(self, logits_MV, tok_M, temperature, need, k) -> dict[str, torch.Tensor]:
        logp_MV = self.log_softmax(logits_MV, temperature)
        out = {"logprobs_NC": logp_MV.gather(-1, tok_M[:, None]).squeeze(-1)}
        if need != "logprobs":
            out["argmax_NC"] = logp_MV.argmax(-1)
        if need == "topk":
            top, ids = logp_MV.topk(min(k, logp_MV.size(-1)), dim=-1)
            out.update(topk_logp_NCK=top, topk_ids_NCK=ids,
                       tail_logp_NC=torch.log1p(-top.exp().sum(-1).clamp(max=1.0)))
        if need == "full":
            out["logp_NCV"] = logp_MV
        return out
