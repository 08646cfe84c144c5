"""Router replay for MoE students: record each layer's routed expert ids during a forward (rollout
time) and force them in a later forward (training time), with the router's probabilities at the
forced ids as the routing weights, so the gradient still reaches the router.

Why: the trainer's forward differs numerically from the rollout's (other kernels, dtype, batch
layout), and a token near a routing tie can pick different experts, which makes the policy ratio of
that token meaningless. Replaying the rollout's routes removes that source of drift; the mismatch
counter says how often it would have happened.

API (one RouterReplay per model; hooks every router module, layer order = module order):

    replay = RouterReplay(model)               # finds the routers, installs forward hooks (idle)
    replay.num_layers, replay.top_k            # routed layers, slots per token

    with replay.record() as rec:               # every router call in the block is recorded
        model.generate(...)                    # or any number of forwards
    routes = rec.routes(batch_size=B)          # list[num_layers] of int64 (B, S_rec, K) tensors
    flat = rec.routes()                        # or list[num_layers] of (N, K), N = tokens seen

    with replay.replay(routes):                # every router call uses the given ids
        loss = model(input_ids).logits...      # weights = router probs at those ids (differentiable)
    replay.stats()                             # {"slots", "mismatched", "mismatch_rate", "per_layer"}
    replay.reset_stats(); replay.remove()      # zero the counters; take the hooks off

Semantics:
  * routes[l] is (N, K) with N the rows the layer's router sees (batch * seq flattened), or
    (B, S_rec, K): then the router must see B*S rows with S >= S_rec, and the missing tail positions
    are free (e.g. the last generated token, which generate never feeds back).
  * A row of -1 ids is free: the router's own choice is used there (padding, prompt positions one
    does not want to force). Rows must be all -1 or all valid.
  * record() keeps ids on the router's device as int64; routes(batch_size=B) assumes every recorded
    forward saw the same B sequences, as in HF generate (prefill B*S0 rows, then B rows per step).
  * The mismatch counter counts, among forced slots, those whose forced expert is not among the
    experts the router would have picked itself for that token (a set comparison, order-free).
    Gradient checkpointing re-runs routers, so counts include recomputation; the rate is unaffected.
  * Supported routers: softmax-then-top-k (Qwen2/3-MoE, Qwen3-Next, Mixtral, Olmoe, ...: weights from
    kernels.ops.topk_gating in forced mode, renormalised iff the router renormalises), top-k-then-
    softmax (GptOss) and sigmoid with score-correction bias (DeepseekV3 family). Others raise at
    construction.
"""
from __future__ import annotations

import contextlib

import torch

from kernels import ops
from student.experts import find_routers, router_kind

# Shape legend: N router rows (tokens) in one call, E experts, K slots per token, B batch, S seq.


class Recording:
    """Routes captured by RouterReplay.record(); chunks[l] holds one (N_i, K) tensor per router call."""

    def __init__(self, num_layers: int):
        self.chunks: list[list[torch.Tensor]] = [[] for _ in range(num_layers)]

    def routes(self, batch_size: int | None = None) -> list[torch.Tensor]:
        if batch_size is None:
            return [torch.cat(c) for c in self.chunks]
        return [torch.cat([x.view(batch_size, -1, x.size(-1)) for x in c], dim=1) for c in self.chunks]


class MismatchCounter:
    """Counts forced routing slots, and those the router would not have picked itself, per layer
    (on the device of the ids: no host sync per layer)."""

    def __init__(self, num_layers: int, top_k: int):
        self.num_layers, self.top_k = num_layers, top_k
        self.reset_stats()

    def count(self, layer: int, forced_NK: torch.Tensor, own_NK: torch.Tensor,
              forced_N: torch.Tensor | None = None) -> None:
        """Add one forward's forced slots (rows forced_N, default all) to the counters."""
        with torch.no_grad():
            if self._slots.device != forced_NK.device:
                self._slots, self._mismatched = self._slots.to(forced_NK.device), self._mismatched.to(forced_NK.device)
            hit_NK = (forced_NK[:, :, None] == own_NK[:, None, :]).any(-1)
            if forced_N is None:
                self._slots[layer] += forced_NK.numel()
                self._mismatched[layer] += (~hit_NK).sum()
            else:
                self._slots[layer] += forced_N.sum() * self.top_k
                self._mismatched[layer] += (~hit_NK & forced_N[:, None]).sum()

    def stats(self) -> dict:
        slots, mism = int(self._slots.sum()), int(self._mismatched.sum())
        return {"slots": slots, "mismatched": mism, "mismatch_rate": mism / slots if slots else 0.0,
                "per_layer": [(int(s), int(m)) for s, m in zip(self._slots.tolist(), self._mismatched.tolist())]}

    def reset_stats(self) -> None:
        self._slots = torch.zeros(self.num_layers, dtype=torch.long)
        self._mismatched = torch.zeros(self.num_layers, dtype=torch.long)


class RouterReplay(MismatchCounter):
    def __init__(self, model: torch.nn.Module):
        routers = find_routers(model)
        if not routers:
            raise ValueError(f"{type(model).__name__} has no top-k router modules to hook")
        self.names = [n for n, _ in routers]
        self.kinds = [router_kind(r) for _, r in routers]
        super().__init__(len(routers), int(routers[0][1].top_k))
        self._mode = "off"
        self._recording: Recording | None = None
        self._routes: list[torch.Tensor] | None = None
        self._handles = [r.register_forward_hook(self._make_hook(i, r)) for i, (_, r) in enumerate(routers)]

    # -- public API ----------------------------------------------------------------------------
    @contextlib.contextmanager
    def record(self):
        self._enter("record")
        self._recording = Recording(self.num_layers)
        try:
            yield self._recording
        finally:
            self._mode = "off"

    @contextlib.contextmanager
    def replay(self, routes: list[torch.Tensor]):
        if len(routes) != self.num_layers:
            raise ValueError(f"got routes for {len(routes)} layers, the model routes in {self.num_layers}")
        self._enter("replay")
        self._routes = routes
        try:
            yield self
        finally:
            self._mode, self._routes = "off", None

    def remove(self) -> None:
        for h in self._handles:
            h.remove()
        self._handles = []

    # -- internals -----------------------------------------------------------------------------
    def _enter(self, mode: str) -> None:
        if self._mode != "off":
            raise RuntimeError(f"RouterReplay is already in {self._mode!r} mode")
        self._mode = mode

    def _forced_rows(self, layer: int, n_rows: int, device: torch.device) -> torch.Tensor:
        r = self._routes[layer].to(device=device, dtype=torch.long)
        if r.dim() == 3 and r.size(0) * r.size(1) != n_rows:
            b, s_rec, k = r.shape
            if n_rows % b or n_rows // b < s_rec:
                raise ValueError(f"layer {layer}: routes {tuple(r.shape)} do not fit {n_rows} router rows")
            r = torch.cat([r, r.new_full((b, n_rows // b - s_rec, k), -1)], dim=1)
        r = r.reshape(-1, r.size(-1))
        if r.shape != (n_rows, self.top_k):
            raise ValueError(f"layer {layer}: routes {tuple(r.shape)} != ({n_rows}, {self.top_k})")
        return r

    def _make_hook(self, layer: int, router: torch.nn.Module):
        kind = self.kinds[layer]

        def hook(module, args, output):
            if self._mode == "off":
                return None
            logits_NE, scores_NK, ids_NK = output
            if self._mode == "record":
                self._recording.chunks[layer].append(ids_NK.detach().to(torch.long))
                return None
            forced_NK = self._forced_rows(layer, logits_NE.size(0), logits_NE.device)
            free_N = forced_NK[:, 0] < 0
            forced_NK = torch.where(free_N[:, None], ids_NK.to(torch.long), forced_NK)
            self.count(layer, forced_NK, ids_NK, forced_N=~free_N)
            weights_NK = _replay_weights(kind, module, logits_NE, forced_NK).to(scores_NK.dtype)
            return logits_NE, weights_NK, forced_NK.to(ids_NK.dtype)

        return hook


def _replay_weights(kind: str, router: torch.nn.Module, logits_NE: torch.Tensor, ids_NK: torch.Tensor) -> torch.Tensor:
    if kind == "softmax_topk":
        renorm = bool(getattr(router, "norm_topk_prob", True))
        return ops.topk_gating(logits_NE, ids_NK.size(1), renorm, ids_NK)[0]
    if kind == "topk_softmax":
        return torch.softmax(logits_NE.gather(1, ids_NK), dim=1)
    scores_NK = logits_NE.sigmoid().gather(1, ids_NK)  # "sigmoid": DeepseekV3 family
    if router.norm_topk_prob:
        scores_NK = scores_NK / (scores_NK.sum(dim=-1, keepdim=True) + 1e-20)
    return scores_NK * router.routed_scaling_factor
