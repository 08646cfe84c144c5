"""Sampled generation with a KV cache, and scoring of fixed completions under any prompt.

Shapes: N sequences, P prompt length (left-padded), C completion length, V vocabulary.
Prompts are left-padded so that every row's next token sits in the last column; position ids
come from the attention mask, so padding never shifts a row's positions. Scoring uses the same
layout, which keeps rollout log-probs and training log-probs comparable token for token.
"""
from __future__ import annotations

import dataclasses
from dataclasses import dataclass

import torch
import torch.nn.functional as F

from student.lean import (Collect, LeanForward, NoPast, RouteLog, SharedPrefix, StaticKV, continuation_bias,
                          load_balancing_loss, prompt_bias)


@dataclass
class Routes:
    """The experts each routed layer picked at rollout, as the lean forward computed them: each
    distinct prompt once, then every row's fed completion tokens (all but the last)."""
    prompt_of_row_N: torch.Tensor     # long (N,): row -> distinct prompt, in order of first appearance
    prompt: list[torch.Tensor]        # per layer (U, P, K), left-padded like the prompts
    completion: list[torch.Tensor]    # per layer (N, C-1, K)

    def per_row(self) -> list[torch.Tensor]:
        """Per layer (N, P + C-1, K): the layout of RouterReplay recordings (one row per sequence)."""
        return [torch.cat([p[self.prompt_of_row_N], c], dim=1) for p, c in zip(self.prompt, self.completion)]

    def select(self, rows: slice) -> "Routes":
        """The routes of rows[rows], distinct prompts renumbered in order of first appearance."""
        of_row = self.prompt_of_row_N[rows]
        kept = list(dict.fromkeys(of_row.tolist()))
        renumber = torch.full((len(self.prompt[0]) if self.prompt else 0,), -1, dtype=torch.long)
        renumber[kept] = torch.arange(len(kept))
        return Routes(renumber[of_row], [p[kept] for p in self.prompt], [c[rows] for c in self.completion])


@dataclass
class Rollout:
    prompt_ids: list[list[int]]
    completion_ids_NC: torch.Tensor   # long, padded with pad_id after <eos>
    mask_NC: torch.Tensor             # bool, True on generated tokens up to and including <eos>
    logprobs_NC: torch.Tensor         # log-prob of each sampled token under the sampling policy
    routes: Routes | None = None      # recorded by the lean forward (the transformers path: hooks)


def left_pad(rows: list[list[int]], pad_id: int) -> tuple[torch.Tensor, torch.Tensor]:
    width = max(len(r) for r in rows)
    ids = torch.full((len(rows), width), pad_id, dtype=torch.long)
    mask = torch.zeros((len(rows), width), dtype=torch.long)
    for i, r in enumerate(rows):
        ids[i, width - len(r):] = torch.tensor(r, dtype=torch.long)
        mask[i, width - len(r):] = 1
    return ids, mask


def _positions(mask: torch.Tensor) -> torch.Tensor:
    return (mask.cumsum(-1) - 1).clamp(min=0)


def _distinct(prompt_ids: list[list[int]]) -> tuple[list[list[int]], torch.Tensor]:
    """(distinct prompts in order of first appearance, row -> index into them)."""
    index: dict[tuple[int, ...], int] = {}
    of_row = torch.tensor([index.setdefault(tuple(p), len(index)) for p in prompt_ids], dtype=torch.long)
    return [list(p) for p in index], of_row


def _sample(logits_NV, done_N, temperature, greedy, pad_id):
    logp_NV = F.log_softmax(logits_NV.float() / (1.0 if greedy else temperature), dim=-1)
    tok_N = logp_NV.argmax(-1) if greedy else _inverse_cdf(logp_NV.exp())
    tok_N = torch.where(done_N, torch.full_like(tok_N, pad_id), tok_N)
    return tok_N, logp_NV.gather(-1, tok_N[:, None]).squeeze(-1)


def _usable_outside(x):
    """x with its tensors cloned out of inference mode.

    The lean forward's no-gradient work (generation, hinted scoring) runs under
    torch.inference_mode rather than no_grad: no autograd bookkeeping per op, which at RL shapes
    (thousands of small ops per rollout) took the 2-thread rollout of the RL benchmark from 0.125
    to 0.107 s. Inference tensors cannot enter a graph that saves them for backward, so results
    leave as ordinary tensors."""
    if isinstance(x, torch.Tensor):
        return x.clone()
    if isinstance(x, (list, tuple)):
        return type(x)(_usable_outside(v) for v in x)
    if dataclasses.is_dataclass(x):
        return dataclasses.replace(x, **{f.name: _usable_outside(getattr(x, f.name)) for f in dataclasses.fields(x)})
    return x


def _inverse_cdf(probs_NV: torch.Tensor) -> torch.Tensor:
    """One token per row drawn from probs_NV: the first token whose cumulative probability passes a
    uniform draw (scaled by the row's total, so rounding in the cumsum cannot step past the end).
    One uniform per row; torch.multinomial draws an exponential per vocabulary entry, >10x slower
    at RL shapes. A zero-probability token never passes: its cumsum equals its predecessor's."""
    cdf_NV = probs_NV.cumsum(-1)
    u_N1 = torch.rand(probs_NV.size(0), 1, device=probs_NV.device) * cdf_NV[:, -1:]
    return torch.searchsorted(cdf_NV, u_N1, right=True).clamp_(max=probs_NV.size(-1) - 1).squeeze(-1)


@torch.no_grad()
def generate(model, prompt_ids: list[list[int]], *, max_new_tokens: int, eos_id: int, pad_id: int,
             temperature: float = 1.0, greedy: bool = False, lean: LeanForward | None = None) -> Rollout:
    """Sample (or greedily decode) completions; stops when every row has produced <eos>.

    With `lean` (a LeanForward over `model`): each distinct prompt is prefilled once, decoding
    runs on a preallocated KV cache, and the routes are returned in `Rollout.routes`."""
    if lean is not None:
        with torch.inference_mode(), lean.frozen():
            roll = _lean_generate(lean, prompt_ids, max_new_tokens, eos_id, pad_id, temperature, greedy)
        return _usable_outside(roll)
    ids_NP, mask_NP = left_pad(prompt_ids, pad_id)
    n = ids_NP.shape[0]
    # output_router_logits=False: the load-balancing loss breaks on left-padded cached decoding.
    out = model(input_ids=ids_NP, attention_mask=mask_NP, position_ids=_positions(mask_NP),
                use_cache=True, output_router_logits=False)
    past, attn, pos = out.cache, mask_NP, _positions(mask_NP)[:, -1:]
    logits_NV = out.logits[:, -1]
    tokens, logps = [], []
    done = torch.zeros(n, dtype=torch.bool)
    for t in range(max_new_tokens):
        tok_N, logp_N = _sample(logits_NV, done, temperature, greedy, pad_id)
        tokens.append(tok_N)
        logps.append(logp_N)
        done = done | (tok_N == eos_id)
        if bool(done.all()) or t == max_new_tokens - 1:
            break
        attn = torch.cat([attn, torch.ones((n, 1), dtype=attn.dtype)], dim=1)
        pos = pos + 1
        out = model(input_ids=tok_N[:, None], attention_mask=attn, position_ids=pos,
                    cache=past, use_cache=True, output_router_logits=False)
        past, logits_NV = out.cache, out.logits[:, -1]
    return _finish(prompt_ids, tokens, logps, pad_id)


def _finish(prompt_ids, tokens, logps, pad_id, routes=None) -> Rollout:
    completion_NC = torch.stack(tokens, dim=1)
    mask_NC = completion_NC != pad_id
    logprobs_NC = torch.stack(logps, dim=1).masked_fill(~mask_NC, 0.0)
    return Rollout(prompt_ids, completion_NC, mask_NC, logprobs_NC, routes)


def _lean_generate(lean: LeanForward, prompt_ids, max_new_tokens, eos_id, pad_id, temperature, greedy) -> Rollout:
    distinct, of_row = _distinct(prompt_ids)
    ids_UP, mask_UP = left_pad(distinct, pad_id)
    dtype = lean.model.model.embed_tokens.weight.dtype
    u, p = ids_UP.shape
    n = len(prompt_ids)
    log, prefix = RouteLog(lean.num_layers), Collect()
    logits_NV = lean(ids_UP, _positions(mask_UP), prompt_bias(mask_UP, dtype), prefix,
                     logits_from=p - 1, log=log)[of_row, -1]
    kv = StaticKV(prefix, of_row, p + max_new_tokens - 1)
    mask_NP = mask_UP[of_row]
    pos_N1 = _positions(mask_NP)[:, -1:]
    # One bias row per sequence over every key it may ever see: its real prompt tokens, then all
    # generated ones (tokens after <eos> are padding whose outputs nobody reads).
    seen = torch.cat([mask_NP.bool(), torch.ones(n, max_new_tokens, dtype=torch.bool)], dim=1)
    bias_N11T = torch.zeros(seen.shape, dtype=dtype).masked_fill_(~seen, float("-inf"))[:, None, None]
    tokens, logps = [], []
    done = torch.zeros(n, dtype=torch.bool)
    for t in range(max_new_tokens):
        tok_N, logp_N = _sample(logits_NV, done, temperature, greedy, pad_id)
        tokens.append(tok_N)
        logps.append(logp_N)
        done = done | (tok_N == eos_id)
        if bool(done.all()) or t == max_new_tokens - 1:
            break
        pos_N1 = pos_N1 + 1
        logits_NV = lean(tok_N[:, None], pos_N1, bias_N11T[..., :kv.length + 1], kv, logits_from=0, log=log)[:, -1]
    k = lean.top_k
    routes = Routes(of_row, [c[0].view(u, p, k) for c in log.ids],
                    [torch.stack(c[1:], dim=1) if len(c) > 1 else c[0].new_empty(n, 0, k) for c in log.ids])
    return _finish(prompt_ids, tokens, logps, pad_id, routes)


def score(model, prompt_ids: list[list[int]], completion_NC: torch.Tensor, *, pad_id: int,
          temperature: float = 1.0, full: bool = False, router_logits: bool = False,
          lean: LeanForward | None = None, routes: Routes | None = None, replay=None):
    """Log-probs of the given completion tokens after the given prompts, in one forward.

    Returns (logprobs_NC, logp_NCV or None, aux_loss or None). Gradients flow unless the caller
    wraps it in no_grad (the hinted teacher scoring does). With `lean`, rows that share a prompt
    forward it once (its gradient sums over them), and `routes` (of these rows) force the experts,
    `replay` (a RouterReplay) counting the slots where the router would have chosen otherwise.
    """
    if lean is not None:
        return _lean_score(lean, prompt_ids, completion_NC, pad_id=pad_id, temperature=temperature, full=full,
                           router_logits=router_logits, routes=routes, replay=replay)
    ids_NP, mask_NP = left_pad(prompt_ids, pad_id)
    c = completion_NC.shape[1]
    # Logits at position t predict token t+1: the last prompt position predicts completion[0], and
    # the last completion token predicts nothing we score, so it is not fed (as in generate, whose
    # recorded routes then cover exactly these positions). Causal attention keeps the rest equal.
    inputs_NS = completion_NC[:, :-1]
    ids = torch.cat([ids_NP, inputs_NS], dim=1)
    mask = torch.cat([mask_NP, torch.ones_like(inputs_NS)], dim=1)
    kwargs = dict(output_router_logits=True) if router_logits else {}
    out = model(input_ids=ids, attention_mask=mask, position_ids=_positions(mask), use_cache=False,
                logits_to_keep=c, **kwargs)
    logprobs_NC, logp_NCV = _token_logprobs(out.logits[:, -c:], completion_NC, temperature)
    aux = getattr(out, "aux_loss", None) if router_logits else None
    return logprobs_NC, (logp_NCV if full else None), aux


def _lean_score(lean: LeanForward, prompt_ids, completion_NC, *, pad_id, temperature, full, router_logits,
                routes, replay):
    distinct, of_row = _distinct(prompt_ids)
    ids_UP, mask_UP = left_pad(distinct, pad_id)
    (u, p), (n, c) = ids_UP.shape, completion_NC.shape
    dtype = lean.model.model.embed_tokens.weight.dtype
    inputs_NS = completion_NC[:, :-1]               # the last token predicts nothing scored
    forced_prompt = forced_rest = None
    if routes is not None:
        if len(routes.prompt[0]) != u or routes.completion[0].shape[:2] != inputs_NS.shape:
            raise ValueError(f"routes for {len(routes.prompt[0])} prompts x {tuple(routes.completion[0].shape[:2])} "
                             f"tokens do not fit {u} prompts x {tuple(inputs_NS.shape)}")
        # A row slice's prompts are left-padded to their own longest: keep the last p route columns.
        forced_prompt = [r[:, -p:].reshape(-1, r.size(-1)) for r in routes.prompt]
        forced_rest = [r.reshape(-1, r.size(-1)) for r in routes.completion]

    def compute():
        log = RouteLog(lean.num_layers, logits=router_logits) if router_logits else None
        logits_NCV, weights_T = _lean_logits(lean, ids_UP, mask_UP, of_row, inputs_NS, dtype, forced_prompt,
                                             forced_rest, log, replay)
        if not router_logits:
            return logits_NCV, None
        c = lean.model.config
        num_experts = getattr(c, "num_experts", None) or c.num_local_experts
        return logits_NCV, load_balancing_loss(log.logits, weights_T, num_experts, lean.top_k)

    logits_NCV, aux = lean.run(compute)
    logprobs_NC, logp_NCV = _token_logprobs(logits_NCV, completion_NC, temperature)
    return logprobs_NC, (logp_NCV if full else None), aux


def _lean_logits(lean, ids_UP, mask_UP, of_row, inputs_NS, dtype, forced_prompt, forced_rest, log, replay):
    """Logits predicting every completion token, and each routed token's weight in the aux loss."""
    (u, p), (n, c) = ids_UP.shape, (inputs_NS.size(0), inputs_NS.size(1) + 1)
    if u <= n // 2:       # shared prompts: each forwarded once, in one pass with every row's continuation
        mask_NP, s = mask_UP[of_row], c - 1
        ids_1S = torch.cat([ids_UP.flatten(), inputs_NS.flatten()])[None]
        pos_1S = torch.cat([_positions(mask_UP).flatten(),
                            (mask_NP.sum(1, keepdim=True) + torch.arange(s)).flatten()])[None]
        packed = SharedPrefix(u, p, of_row, prompt_bias(mask_UP, dtype), continuation_bias(mask_NP, s, dtype))
        scored = torch.cat([torch.arange(u) * p + p - 1, u * p + torch.arange(n * s)])  # each prompt's last, all fed
        forced = None if forced_prompt is None else [torch.cat(f) for f in zip(forced_prompt, forced_rest)]
        logits_V = lean(ids_1S, pos_1S, None, packed, logits_from=scored, forced=forced, log=log, replay=replay)[0]
        logits_NCV = torch.cat([logits_V[:u][of_row, None], logits_V[u:].view(n, s, logits_V.size(-1))], dim=1)
        weights_T = torch.cat([(mask_UP * torch.bincount(of_row, minlength=u)[:, None]).flatten(),
                               torch.ones(inputs_NS.numel())])
    else:                 # distinct prompts: one forward over whole rows
        ids_NP, mask_NP = ids_UP[of_row], mask_UP[of_row]
        mask = torch.cat([mask_NP, torch.ones_like(inputs_NS)], dim=1)
        forced = None
        if forced_prompt is not None:
            forced = [torch.cat([fp.view(u, p, -1)[of_row], fr.view(n, c - 1, -1)], dim=1).reshape(-1, fp.size(-1))
                      for fp, fr in zip(forced_prompt, forced_rest)]
        logits_NCV = lean(torch.cat([ids_NP, inputs_NS], dim=1), _positions(mask), prompt_bias(mask, dtype),
                          NoPast(), logits_from=p - 1, forced=forced, log=log, replay=replay)
        weights_T = mask.flatten()
    return logits_NCV, weights_T


def _token_logprobs(logits_NCV: torch.Tensor, completion_NC: torch.Tensor, temperature: float):
    """(log-prob of each completion token, full log-softmax) from the logits that predict them."""
    logp_NCV = F.log_softmax(logits_NCV.float() / temperature, dim=-1)
    return logp_NCV.gather(-1, completion_NC[..., None]).squeeze(-1), logp_NCV


@torch.no_grad()
def score_shared_prompts(model, prompt_ids: list[list[int]], completion_NC: torch.Tensor, *, pad_id: int,
                         temperature: float = 1.0, lean: LeanForward | None = None):
    """`score(..., full=True)` without gradient, each distinct prompt forwarded once.

    Rows often share a prompt: the hinted attempts of one group mostly get the same hint (the
    rule teacher's "starts with 1" fits every attempt that goes wrong at the first digit). The
    U distinct prompts run once with a KV cache, the cache is gathered out to the N rows, and the
    completions run on top: U instead of N prompt forwards, for one extra forward call. Equal to
    `score` up to float rounding (other batch shapes). Returns (logprobs_NC, logp_NCV).
    Not for training under router replay: that forces one route tensor per forward call (the
    lean path, `score(..., lean=...)`, shares prompts in training too).
    """
    if lean is not None:
        with torch.inference_mode():
            logprobs_NC, logp_NCV, _ = _lean_score(lean, prompt_ids, completion_NC, pad_id=pad_id,
                                                   temperature=temperature, full=True, router_logits=False,
                                                   routes=None, replay=None)
        return _usable_outside((logprobs_NC, logp_NCV))
    distinct: dict[tuple[int, ...], int] = {}
    row_U = torch.tensor([distinct.setdefault(tuple(p), len(distinct)) for p in prompt_ids])
    if len(distinct) > len(prompt_ids) // 2:    # saving under half the prompt forwards: one call
        logprobs_NC, logp_NCV, _ = score(model, prompt_ids, completion_NC, pad_id=pad_id,
                                         temperature=temperature, full=True)
        return logprobs_NC, logp_NCV
    ids_UP, mask_UP = left_pad([list(p) for p in distinct], pad_id)
    out = model(input_ids=ids_UP, attention_mask=mask_UP, position_ids=_positions(mask_UP), use_cache=True,
                logits_to_keep=1, output_router_logits=False)
    logits_NCV = out.logits[:, -1:][row_U]               # the last prompt position predicts completion[0]
    c = completion_NC.shape[1]
    if c > 1:
        cache = out.cache
        cache.batch_select_indices(row_U)
        inputs_NS = completion_NC[:, :-1]                # the last token predicts nothing scored
        mask_NP = mask_UP[row_U]
        mask = torch.cat([mask_NP, torch.ones_like(inputs_NS)], dim=1)
        out = model(input_ids=inputs_NS, attention_mask=mask, position_ids=_positions(mask)[:, mask_NP.shape[1]:],
                    cache=cache, use_cache=True, logits_to_keep=c - 1, output_router_logits=False)
        logits_NCV = torch.cat([logits_NCV, out.logits[:, -(c - 1):]], dim=1)
    return _token_logprobs(logits_NCV, completion_NC, temperature)


def right_pad(rows: list[list[int]], pad_id: int) -> tuple[torch.Tensor, torch.Tensor]:
    """(ids_NC, mask_NC) for completions given as lists, e.g. demonstration answers."""
    width = max(len(r) for r in rows)
    ids = torch.full((len(rows), width), pad_id, dtype=torch.long)
    for i, r in enumerate(rows):
        ids[i, :len(r)] = torch.tensor(r, dtype=torch.long)
    mask = torch.arange(width)[None, :] < torch.tensor([len(r) for r in rows])[:, None]
    return ids, mask
