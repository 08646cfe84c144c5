"""The policy on the lean forward (student/lean.py): qwen3_moe and mixtral.

Generation prefills each distinct prompt once and decodes on a preallocated KV cache. Scoring
packs every row into one pass of real tokens, no padding (`pack_rows`): each shared prefix once
(a group's G attempts share their prompt; a self-teacher's contexts share the problem and the
feedback's opening), then every row's own rest, so per-token ops run once per distinct token.
Routes are arguments and results, not hooks.

Work without gradient runs under torch.inference_mode rather than no_grad (no autograd
bookkeeping per op, which matters at RL shapes: thousands of small ops per rollout), and its
results are cloned out, because inference tensors cannot enter a graph that saves them.
"""
from __future__ import annotations

import dataclasses

import torch

from student.lean import (Collect, LeanForward, NoPast, Packed, RouteLog, StaticKV, continuation_bias,
                          load_balancing_loss, positions, prompt_bias)
from student.policy import (Decoding, Distribution, ReplayCounting, Rollout, Routes, Sampling, Scores, Turns,
                            distinct_prompts, left_pad)
from student.router_replay import MismatchCounter


# Rows whose prompts are all distinct are packed (shared prefixes once, no padding) when that
# leaves at most this share of the whole rows' padded tokens. A self-teacher's feedback contexts
# pack to ~0.65 and score 1.5x faster (no gradient, 1 thread); distinct short prompts sharing a
# token or two pack to ~0.8 and gain ~5%, not worth moving the rounding of the whole-row pass that
# the toy learning runs of tests/test_learning.py were measured on (a toy run amplifies rounding).
PACK_AT_MOST = 0.75


def _usable_outside(x):
    """x with its tensors cloned out of inference mode."""
    if isinstance(x, torch.Tensor):
        return x.clone()
    if isinstance(x, (list, tuple)):
        return type(x)(_usable_outside(v) for v in x)
    if dataclasses.is_dataclass(x):
        return dataclasses.replace(x, **{f.name: _usable_outside(getattr(x, f.name)) for f in dataclasses.fields(x)})
    return x


class LeanPolicy(ReplayCounting):
    def __init__(self, model: torch.nn.Module, *, pad_id: int, banned_ids: tuple[int, ...] = (), runner=None):
        self.model, self.pad_id = model, pad_id
        self.lean = LeanForward(model, runner=runner)
        self.dist = Distribution(banned_ids)
        self.num_routed_layers = self.lean.num_layers
        self.replay = MismatchCounter(self.lean.num_layers, self.lean.top_k)

    @property
    def device(self) -> torch.device:
        return self.model.model.embed_tokens.weight.device

    @property
    def dtype(self) -> torch.dtype:
        return self.model.model.embed_tokens.weight.dtype

    # ------------------------------------------------------------------ generation
    @torch.no_grad()
    def generate(self, prompts: list[list[int]], sampling: Sampling, turns: Turns | None = None) -> Rollout:
        with torch.inference_mode(), self.lean.frozen():
            roll = self._generate(prompts, sampling, turns)
        return _usable_outside(roll)

    def _generate(self, prompt_ids, sampling: Sampling, turns: Turns | None) -> Rollout:
        lean, dev, dtype = self.lean, self.device, self.dtype
        distinct, of_row = distinct_prompts(prompt_ids, dev)
        ids_UP, mask_UP = left_pad(distinct, self.pad_id, dev)
        u, p = ids_UP.shape
        n = len(prompt_ids)
        decoding = Decoding(n, sampling, turns, dev)
        new = decoding.steps
        log, prefix = RouteLog(lean.num_layers), Collect()
        logits_NV = lean(ids_UP, positions(mask_UP), prompt_bias(mask_UP, dtype), prefix,
                         logits_from=p - 1, log=log)[of_row, -1]
        kv = StaticKV(prefix, of_row, p + new - 1)
        mask_NP = mask_UP[of_row]
        pos_N1 = positions(mask_NP)[:, -1:]
        # One bias row per sequence over every key it may ever see: its real prompt tokens, then all
        # later ones (tokens after the end are padding whose outputs nobody reads).
        seen = torch.cat([mask_NP.bool(), torch.ones(n, new, dtype=torch.bool, device=dev)], dim=1)
        bias_N11T = torch.zeros(seen.shape, dtype=dtype, device=dev).masked_fill_(~seen, float("-inf"))[:, None, None]
        for t in range(new):
            tok_N = decoding.choose(*self.dist.sample(logits_NV, decoding.done_N, sampling))
            if decoding.over(t):
                break
            pos_N1 = pos_N1 + 1
            logits_NV = lean(tok_N[:, None], pos_N1, bias_N11T[..., :kv.length + 1], kv, logits_from=0,
                             log=log)[:, -1]
        k = lean.top_k
        routes = Routes(of_row, [c[0].view(u, p, k) for c in log.ids],
                        [torch.stack(c[1:], dim=1) if len(c) > 1 else c[0].new_empty(n, 0, k) for c in log.ids])
        return decoding.rollout(prompt_ids, routes)

    # ------------------------------------------------------------------ scoring
    def score(self, prompts, completion_NC, *, temperature=1.0, need="logprobs", k=0, routes=None,
              router_aux=False) -> Scores:
        if torch.is_grad_enabled():
            return self._score(prompts, completion_NC, temperature, need, k, routes, router_aux)
        with torch.inference_mode():
            scores = self._score(prompts, completion_NC, temperature, need, k, routes, router_aux)
        return _usable_outside(scores)

    def _score(self, prompt_ids, completion_NC, temperature, need, k, routes, router_aux) -> Scores:
        lean, dev = self.lean, self.device
        distinct, of_row = distinct_prompts(prompt_ids, dev)
        ids_UP, mask_UP = left_pad(distinct, self.pad_id, dev)
        u, p = ids_UP.shape
        inputs_NS = completion_NC[:, :-1]               # the last token predicts nothing scored
        n, s = inputs_NS.shape
        forced = None
        if routes is not None:
            if len(routes.prompt[0]) != u or routes.completion[0].shape[:2] != inputs_NS.shape:
                raise ValueError(f"routes for {len(routes.prompt[0])} prompts x "
                                 f"{tuple(routes.completion[0].shape[:2])} tokens do not fit {u} prompts x "
                                 f"{tuple(inputs_NS.shape)}")
            # A row subset's prompts are left-padded to their own longest: keep the last p route columns.
            forced = [(r[:, -p:], c) for r, c in zip(routes.prompt, routes.completion)]
        replay = self.replay if forced is not None else None
        pack = pack_rows(distinct, of_row, s, self.dtype)
        if u <= n // 2 or pack.source_T.numel() <= PACK_AT_MOST * n * (p + s):
            # shared prompts or prefixes: each forwarded once, with every row's rest, in one pass
            ids_NS, pos_NS, bias, kv = (torch.cat([ids_UP.flatten(), inputs_NS.flatten()])[pack.source_T][None],
                                        pack.pos_T[None], None, pack.kv)
            scored, weights_T = pack.scored_NS.flatten(), pack.weights_T
            if forced is not None:
                forced = [torch.cat([r.reshape(-1, r.size(-1)), c.reshape(-1, c.size(-1))])[pack.source_T]
                          for r, c in forced]
        else:             # distinct prompts sharing little: one forward over whole rows
            mask = torch.cat([mask_UP[of_row], torch.ones_like(inputs_NS)], dim=1)
            ids_NS, pos_NS, bias, kv = (torch.cat([ids_UP[of_row], inputs_NS], dim=1), positions(mask),
                                        prompt_bias(mask, self.dtype), NoPast())
            scored, weights_T = p - 1, mask.flatten()
            if forced is not None:
                forced = [torch.cat([r[of_row], c], dim=1).reshape(-1, r.size(-1)) for r, c in forced]

        def compute():
            log = RouteLog(lean.num_layers, logits=True) if router_aux else None
            hidden = lean(ids_NS, pos_NS, bias, kv, logits_from=scored, forced=forced, log=log, replay=replay,
                          head=False)
            scores = self.dist.scores(hidden.view(n, s + 1, -1), lean.head, self.model.lm_head.weight.size(0),
                                      completion_NC, temperature, need, k)
            if router_aux:
                cfg = self.model.config
                num_experts = getattr(cfg, "num_experts", None) or cfg.num_local_experts
                scores.aux_loss = load_balancing_loss(log.logits, weights_T, num_experts, lean.top_k)
            return tuple(getattr(scores, f.name) for f in dataclasses.fields(scores))

        return Scores(*lean.run(compute))


# ---------------------------------------------------------------------- packing rows for scoring
@dataclasses.dataclass
class Packing:
    """N rows (prompt, then S fed completion tokens) as one packed sequence of T real tokens."""
    source_T: torch.Tensor    # each token's index into cat(distinct prompts left-padded (U, p), fed tokens (N, S))
    pos_T: torch.Tensor       # its position in its row
    weights_T: torch.Tensor   # the rows it serves (a shared head's token counts once per row: aux loss)
    scored_NS: torch.Tensor   # (N, S + 1) packed index of each row's last prompt token, then its fed tokens
    kv: Packed


def pack_rows(distinct: list[list[int]], of_row: torch.Tensor, s: int, dtype: torch.dtype) -> Packing:
    """The `Packed` layout of rows whose prompts are `distinct[of_row[i]]`, each followed by s fed
    completion tokens: the heads `shared_heads` picks (each forwarded once), then every row's
    continuation (the rest of its prompt, then its fed tokens), no padding."""
    dev, n = of_row.device, len(of_row)
    len_U = torch.tensor([len(x) for x in distinct], device=dev)
    p = int(len_U.max())                                    # the width distinct prompts are left-padded to
    heads = shared_heads(distinct, torch.bincount(of_row, minlength=len(distinct)).tolist())
    head_of_U = torch.empty(len(distinct), dtype=torch.long, device=dev)
    for c, (members, _) in enumerate(heads):
        head_of_U[members] = c
    first_H = torch.tensor([members[0] for members, _ in heads], device=dev)
    len_H = torch.tensor([length for _, length in heads], device=dev)
    # heads, left-padded to P: j is the token's index in its head (negative on padding)
    big_p = int(len_H.max())
    j_HP = torch.arange(big_p, device=dev) - (big_p - len_H)[:, None]
    mask_HP = j_HP >= 0
    source_HP = (first_H * p + p - len_U[first_H])[:, None] + j_HP
    head_HP = torch.where(mask_HP, (len_H.cumsum(0) - len_H)[:, None] + j_HP, 0)
    # continuations, left-padded to C: the prompt's tail after its head, then the fed tokens
    head_N = head_of_U[of_row]
    start_N, tail_N = len_H[head_N], len_U[of_row] - len_H[head_N]
    len_N = tail_N + s
    c = int(len_N.max())
    j_NC = torch.arange(c, device=dev) - (c - len_N)[:, None]
    mask_NC = j_NC >= 0
    from_tail = (of_row * p + p - len_U[of_row] + start_N)[:, None] + j_NC
    from_fed = len(distinct) * p + (torch.arange(n, device=dev) * s)[:, None] + j_NC - tail_N[:, None]
    source_NC = torch.where(j_NC < tail_N[:, None], from_tail, from_fed)
    cont_NC = torch.where(mask_NC, (int(len_H.sum()) + len_N.cumsum(0) - len_N)[:, None] + j_NC, 0)
    last_N = head_HP[head_N, -1]                            # a row's last prompt token: its head's,
    if c > s:                                               # or its tail's where it has one
        last_N = torch.where(tail_N > 0, cont_NC[:, c - s - 1], last_N)
    rows_H = torch.zeros(len(heads), device=dev).index_add_(0, head_of_U[of_row], torch.ones(n, device=dev))
    kv = Packed(head_HP, mask_HP, prompt_bias(mask_HP, dtype), cont_NC, mask_NC, head_N,
                continuation_bias(mask_HP[head_N], mask_NC, dtype))
    weights_T = torch.cat([rows_H[:, None].expand(mask_HP.shape)[mask_HP], torch.ones(int(len_N.sum()), device=dev)])
    return Packing(source_T=torch.cat([source_HP[mask_HP], source_NC[mask_NC]]),
                   pos_T=torch.cat([j_HP[mask_HP], (start_N[:, None] + j_NC)[mask_NC]]), weights_T=weights_T,
                   scored_NS=torch.cat([last_N[:, None], cont_NC[:, c - s:]], dim=1), kv=kv)


def shared_heads(prompts: list[list[int]], rows_U: list[int]) -> list[tuple[list[int], int]]:
    """Which distinct prompts share a head (a common prefix forwarded once): [(members, head
    length)]; a prompt that shares nothing is its own head.

    Sorted, prompts with a common prefix sit together. A run of them sharing its common prefix of
    μ tokens costs μ + Σ rows·(len − μ) tokens (the head once, then each row's own tail), against
    Σ len apart (each prompt once for all its rows, as a group's attempts are); a run shares when
    that saves more than splitting it at its weakest link, recursively. So a GRPO group's prompt is
    forwarded once, and a self-teacher's contexts (the problem, then each row's own feedback)
    share the problem and what follows up to the first token where they differ."""
    order = sorted(range(len(prompts)), key=prompts.__getitem__)
    lcp = [_common_prefix(prompts[a], prompts[b]) for a, b in zip(order, order[1:])]

    # prefix sums over the sorted prompts of len - rows x len, and of rows
    own, rows = [0], [0]
    for u in order:
        own.append(own[-1] + len(prompts[u]) * (1 - rows_U[u]))
        rows.append(rows[-1] + rows_U[u])

    def saving(lo, hi, mu):           # tokens saved by members order[lo..hi] sharing mu tokens
        return own[hi + 1] - own[lo] + mu * (rows[hi + 1] - rows[lo]) - mu

    best: dict[tuple[int, int], tuple[int, list]] = {}
    todo = [(0, len(order) - 1, False)]
    while todo:                       # post-order over the runs, split at their weakest link
        lo, hi, ready = todo.pop()
        if lo == hi:
            best[lo, hi] = (0, [([order[lo]], len(prompts[order[lo]]))])
            continue
        weakest = min(range(lo, hi), key=lcp.__getitem__)
        if not ready:
            todo += [(lo, hi, True), (lo, weakest, False), (weakest + 1, hi, False)]
            continue
        (left, lh), (right, rh) = best.pop((lo, weakest)), best.pop((weakest + 1, hi))
        together = saving(lo, hi, lcp[weakest]) if lcp[weakest] else 0
        best[lo, hi] = ((left + right, lh + rh) if left + right >= together
                        else (together, [(order[lo:hi + 1], lcp[weakest])]))
    return best[0, len(order) - 1][1]


def _common_prefix(a: list[int], b: list[int]) -> int:
    n = 0
    for x, y in zip(a, b):
        if x != y:
            break
        n += 1
    return n
