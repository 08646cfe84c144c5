"""Sampled generation with a KV cache, and scoring of fixed completions under any prompt.

Shapes: N sequences, P prompt length (left-padded), C completion length, V vocabulary.
Prompts are left-padded so that every row's next token sits in the last column; position ids
come from the attention mask, so padding never shifts a row's positions. Scoring uses the same
layout, which keeps rollout log-probs and training log-probs comparable token for token.
"""
from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F


@dataclass
class Rollout:
    prompt_ids: list[list[int]]
    completion_ids_NC: torch.Tensor   # long, padded with pad_id after <eos>
    mask_NC: torch.Tensor             # bool, True on generated tokens up to and including <eos>
    logprobs_NC: torch.Tensor         # log-prob of each sampled token under the sampling policy


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


@torch.no_grad()
def generate(model, prompt_ids: list[list[int]], *, max_new_tokens: int, eos_id: int, pad_id: int,
             temperature: float = 1.0, greedy: bool = False) -> Rollout:
    """Sample (or greedily decode) completions; stops when every row has produced <eos>."""
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
        logp_NV = F.log_softmax(logits_NV.float() / (1.0 if greedy else temperature), dim=-1)
        tok_N = logp_NV.argmax(-1) if greedy else torch.multinomial(logp_NV.exp(), 1).squeeze(-1)
        tok_N = torch.where(done, torch.full_like(tok_N, pad_id), tok_N)
        tokens.append(tok_N)
        logps.append(logp_NV.gather(-1, tok_N[:, None]).squeeze(-1))
        done = done | (tok_N == eos_id)
        if bool(done.all()) or t == max_new_tokens - 1:
            break
        attn = torch.cat([attn, torch.ones((n, 1), dtype=attn.dtype)], dim=1)
        pos = pos + 1
        out = model(input_ids=tok_N[:, None], attention_mask=attn, position_ids=pos,
                    cache=past, use_cache=True, output_router_logits=False)
        past, logits_NV = out.cache, out.logits[:, -1]
    completion_NC = torch.stack(tokens, dim=1)
    mask_NC = completion_NC != pad_id
    logprobs_NC = torch.stack(logps, dim=1).masked_fill(~mask_NC, 0.0)
    return Rollout(prompt_ids, completion_NC, mask_NC, logprobs_NC)


def score(model, prompt_ids: list[list[int]], completion_NC: torch.Tensor, *, pad_id: int,
          temperature: float = 1.0, full: bool = False, router_logits: bool = False):
    """Log-probs of the given completion tokens after the given prompts, in one forward.

    Returns (logprobs_NC, logp_NCV or None, aux_loss or None). Gradients flow unless the caller
    wraps it in no_grad (the hinted teacher scoring does).
    """
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


def _token_logprobs(logits_NCV: torch.Tensor, completion_NC: torch.Tensor, temperature: float):
    """(log-prob of each completion token, full log-softmax) from the logits that predict them."""
    logp_NCV = F.log_softmax(logits_NCV.float() / temperature, dim=-1)
    return logp_NCV.gather(-1, completion_NC[..., None]).squeeze(-1), logp_NCV


@torch.no_grad()
def score_shared_prompts(model, prompt_ids: list[list[int]], completion_NC: torch.Tensor, *, pad_id: int,
                         temperature: float = 1.0):
    """`score(..., full=True)` without gradient, each distinct prompt forwarded once.

    Rows often share a prompt: the hinted attempts of one group mostly get the same hint (the
    rule teacher's "starts with 1" fits every attempt that goes wrong at the first digit). The
    U distinct prompts run once with a KV cache, the cache is gathered out to the N rows, and the
    completions run on top: U instead of N prompt forwards, for one extra forward call. Equal to
    `score` up to float rounding (other batch shapes). Returns (logprobs_NC, logp_NCV).
    Not for training under router replay: that forces one route tensor per forward call.
    """
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
