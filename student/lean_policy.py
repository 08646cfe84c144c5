"""The policy on the lean forward (student/lean.py): qwen3_moe and mixtral.

Generation prefills each distinct prompt once and decodes on a preallocated KV cache; scoring
packs the distinct prompts and every row's completion into one pass when prompts are shared (a
group's G attempts), so per-token ops run once. Routes are arguments and results, not hooks.

Work without gradient runs under torch.inference_mode rather than no_grad (no autograd
bookkeeping per op, which matters at RL shapes: thousands of small ops per rollout), and its
results are cloned out, because inference tensors cannot enter a graph that saves them.
"""
from __future__ import annotations

import dataclasses

import torch

from student.lean import (Collect, LeanForward, NoPast, RouteLog, SharedPrefix, StaticKV, continuation_bias,
                          load_balancing_loss, positions, prompt_bias)
from student.policy import (Decoding, Distribution, ReplayCounting, Rollout, Routes, Sampling, Scores, Turns,
                            distinct_prompts, left_pad)
from student.router_replay import MismatchCounter


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
        forced_prompt = forced_rest = None
        if routes is not None:
            if len(routes.prompt[0]) != u or routes.completion[0].shape[:2] != inputs_NS.shape:
                raise ValueError(f"routes for {len(routes.prompt[0])} prompts x "
                                 f"{tuple(routes.completion[0].shape[:2])} tokens do not fit {u} prompts x "
                                 f"{tuple(inputs_NS.shape)}")
            # A row subset's prompts are left-padded to their own longest: keep the last p route columns.
            forced_prompt = [r[:, -p:].reshape(-1, r.size(-1)) for r in routes.prompt]
            forced_rest = [r.reshape(-1, r.size(-1)) for r in routes.completion]

        def compute():
            log = RouteLog(lean.num_layers, logits=True) if router_aux else None
            hidden_NCD, weights_T = self._hidden(ids_UP, mask_UP, of_row, inputs_NS, forced_prompt, forced_rest, log)
            scores = self.dist.scores(hidden_NCD, lean.head, self.model.lm_head.weight.size(0), completion_NC,
                                      temperature, need, k)
            if router_aux:
                cfg = self.model.config
                num_experts = getattr(cfg, "num_experts", None) or cfg.num_local_experts
                scores.aux_loss = load_balancing_loss(log.logits, weights_T, num_experts, lean.top_k)
            return tuple(getattr(scores, f.name) for f in dataclasses.fields(scores))

        return Scores(*lean.run(compute))

    def _hidden(self, ids_UP, mask_UP, of_row, inputs_NS, forced_prompt, forced_rest, log):
        """Final hidden states before every completion token, and each routed token's weight in the
        aux loss (a shared prompt counts once per row)."""
        lean, dev, dtype = self.lean, self.device, self.dtype
        replay = self.replay if forced_prompt is not None else None
        (u, p), (n, s) = ids_UP.shape, inputs_NS.shape
        if u <= n // 2:   # shared prompts: each forwarded once, in one pass with every row's continuation
            mask_NP = mask_UP[of_row]
            ids_1S = torch.cat([ids_UP.flatten(), inputs_NS.flatten()])[None]
            pos_1S = torch.cat([positions(mask_UP).flatten(),
                                (mask_NP.sum(1, keepdim=True) + torch.arange(s, device=dev)).flatten()])[None]
            packed = SharedPrefix(u, p, of_row, prompt_bias(mask_UP, dtype), continuation_bias(mask_NP, s, dtype))
            # each prompt's last position, then every fed completion token
            scored = torch.cat([torch.arange(u, device=dev) * p + p - 1, u * p + torch.arange(n * s, device=dev)])
            forced = None if forced_prompt is None else [torch.cat(f) for f in zip(forced_prompt, forced_rest)]
            h_TD = lean(ids_1S, pos_1S, None, packed, logits_from=scored, forced=forced, log=log, replay=replay,
                        head=False)[0]
            hidden = torch.cat([h_TD[:u][of_row, None], h_TD[u:].view(n, s, h_TD.size(-1))], dim=1)
            weights_T = torch.cat([(mask_UP * torch.bincount(of_row, minlength=u)[:, None]).flatten(),
                                   torch.ones(inputs_NS.numel(), device=dev)])
        else:             # distinct prompts: one forward over whole rows
            ids_NP, mask_NP = ids_UP[of_row], mask_UP[of_row]
            mask = torch.cat([mask_NP, torch.ones_like(inputs_NS)], dim=1)
            forced = None
            if forced_prompt is not None:
                forced = [torch.cat([fp.view(u, p, -1)[of_row], fr.view(n, s, -1)], dim=1).reshape(-1, fp.size(-1))
                          for fp, fr in zip(forced_prompt, forced_rest)]
            hidden = lean(torch.cat([ids_NP, inputs_NS], dim=1), positions(mask), prompt_bias(mask, dtype), NoPast(),
                          logits_from=p - 1, forced=forced, log=log, replay=replay, head=False)
            weights_T = mask.flatten()
        return hidden, weights_T

