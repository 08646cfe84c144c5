"""The policy on transformers' own forward: every registered MoE family, any ZeRO stage.

Generation decodes with the model's KV cache; routes are recorded and replayed through router
hooks (student/router_replay.py). Scoring with gradient calls `forward` (the DeepSpeed engine in
training, so ZeRO sees the forward); without gradient it runs the decoder and projects to the
vocabulary in chunks (student.policy.Distribution), through transformers' public
`get_decoder()` / `get_output_embeddings()`.
"""
from __future__ import annotations

from contextlib import nullcontext

import torch

from student.lean import positions
from student.policy import Decoding, Distribution, ReplayCounting, Rollout, Routes, Sampling, Scores, Turns, left_pad
from student.router_replay import RouterReplay


class HFPolicy(ReplayCounting):
    def __init__(self, model: torch.nn.Module, *, pad_id: int, banned_ids: tuple[int, ...] = (), forward=None):
        self.model, self.pad_id = model, pad_id
        self.forward = forward if forward is not None else model
        self.dist = Distribution(banned_ids)
        self.replay = self.routers = RouterReplay(model)     # hooks; also the mismatch counter
        self.num_routed_layers = self.routers.num_layers

    @property
    def device(self) -> torch.device:
        return self.model.get_input_embeddings().weight.device

    @torch.no_grad()
    def generate(self, prompts: list[list[int]], sampling: Sampling, turns: Turns | None = None) -> Rollout:
        model, dev = self.model, self.device
        ids_NP, mask_NP = left_pad(prompts, self.pad_id, dev)
        n, p = ids_NP.shape
        decoding = Decoding(n, sampling, turns, dev)
        with self.routers.record() as recording:
            # output_router_logits=False: the load-balancing loss breaks on left-padded cached decoding.
            out = model(input_ids=ids_NP, attention_mask=mask_NP, position_ids=positions(mask_NP),
                        use_cache=True, output_router_logits=False)
            past, attn, pos = out.cache, mask_NP, positions(mask_NP)[:, -1:]
            logits_NV = out.logits[:, -1]
            for t in range(decoding.steps):
                tok_N = decoding.choose(*self.dist.sample(logits_NV, decoding.done_N, sampling))
                if decoding.over(t):
                    break
                attn = torch.cat([attn, torch.ones((n, 1), dtype=attn.dtype, device=dev)], dim=1)
                pos = pos + 1
                out = model(input_ids=tok_N[:, None], attention_mask=attn, position_ids=pos,
                            cache=past, use_cache=True, output_router_logits=False)
                past, logits_NV = out.cache, out.logits[:, -1]
        per_row = recording.routes(batch_size=n)          # (N, P + fed tokens, K) per layer
        routes = Routes(torch.arange(n, device=dev), [r[:, :p] for r in per_row], [r[:, p:] for r in per_row])
        return decoding.rollout(prompts, routes)

    def score(self, prompts, completion_NC, *, temperature=1.0, need="logprobs", k=0, routes=None,
              router_aux=False) -> Scores:
        ids_NP, mask_NP = left_pad(prompts, self.pad_id, self.device)
        c = completion_NC.shape[1]
        # Logits at position t predict token t+1: the last prompt position predicts completion[0], and
        # the last completion token predicts nothing scored, so it is not fed (as in generate, whose
        # recorded routes then cover exactly these positions).
        inputs_NS = completion_NC[:, :-1]
        ids = torch.cat([ids_NP, inputs_NS], dim=1)
        mask = torch.cat([mask_NP, torch.ones_like(inputs_NS)], dim=1)
        kwargs = dict(input_ids=ids, attention_mask=mask, position_ids=positions(mask), use_cache=False)
        replaying = routes is not None
        if replaying:
            # These rows' prompts are left-padded to their own longest: keep the routes' last columns.
            width = ids.size(1)
            forced = [r[:, r.size(1) - width:] for r in routes.per_row()]
        with self.routers.replay(forced) if replaying else nullcontext():
            if torch.is_grad_enabled() or router_aux:
                out = self.forward(**kwargs, logits_to_keep=c, output_router_logits=router_aux)
                logits = out.logits[:, -c:]
                scores = self.dist.scores(logits, lambda x: x, logits.size(-1), completion_NC, temperature, need, k)
                scores.aux_loss = getattr(out, "aux_loss", None) if router_aux else None
                return scores
            hidden = self.model.get_decoder()(**kwargs).last_hidden_state[:, -c:]
            head = self.model.get_output_embeddings()
            return self.dist.scores(hidden, head, head.weight.size(0), completion_NC, temperature, need, k)
