"""A lean forward pass for the student, run on the transformers module's own parameters.

Why: at RL shapes (a few dozen rows, tens of tokens, a few million parameters) the step is made
of small ops, and the transformers forward adds per-call work the arithmetic does not need: a
growing `DynamicCache` re-concatenated every decode step, CPU flash attention whose blocking
costs more than these tiny attentions, mask building, output dataclasses. This file is the same
decoder written out as tensor ops on the same parameters, with three things the module API does
not offer:

* a preallocated KV cache for decoding (`StaticKV`),
* prompt sharing: rows that share a prompt (the G attempts of a group) forward it once, and its
  keys/values are gathered to the rows, in generation (`Collect` then `StaticKV`) and in scoring
  (`Packed`: shared prefixes and every row's rest in one pass, no padding) alike; the gradient of
  the shared prompt sums over its rows,
* routes as arguments: each forward may record the experts it picked and may be told which
  experts to use (router replay, student/router_replay.py), with no hooks.

Nothing is copied: weights stay where DeepSpeed and the checkpoints put them (ZeRO 0-2, or the
rollout copy under ZeRO-3). `unsupported(model)` says when a model needs the transformers forward
instead (another family, sliding windows, attention biases); the tests hold this forward equal to
transformers' to float rounding, logits and gradients.

Shapes: N rows, S tokens fed in this call, T keys (cached + new), D hidden, H query heads,
Hkv key/value heads, d head width, E experts, K routed slots, L routed layers, V vocabulary.
"""
from __future__ import annotations

from contextlib import contextmanager

import torch
import torch.nn.functional as F

from kernels import ops
from student.experts import expert_mlp
from student.model import STUDENT_FAMILIES

# CPU attention over at least this many keys runs through SDPA's fused kernel rather than two
# matmuls and a softmax: measured at 64 rows, 4 heads of 32, 2 threads, SDPA is 1.5x faster at 48
# keys and 3x at 144 (a self-teacher's feedback context), slower below ~32 (a rollout's rows).
SDPA_MIN_KEYS = 48


def unsupported(model: torch.nn.Module) -> str | None:
    """Why `model` cannot run on LeanForward, or None when it can."""
    c = getattr(model, "config", None)
    kind = getattr(c, "model_type", None)
    if kind not in STUDENT_FAMILIES or not STUDENT_FAMILIES[kind].lean_forward:
        lean = [name for name in STUDENT_FAMILIES if STUDENT_FAMILIES[name].lean_forward]
        return f"model_type {kind!r} has no lean forward (the families with one: {lean})"
    if getattr(c, "sliding_window", None) is not None and getattr(c, "use_sliding_window", True):
        return "sliding-window attention"
    if getattr(c, "attention_bias", False):
        return "attention projections with bias"
    if getattr(c, "router_jitter_noise", 0.0):
        return "router jitter noise"
    if getattr(c, "_attn_implementation", "sdpa") == "flash_attention_2":
        return "attn_implementation=flash_attention_2 (the lean forward computes attention itself)"
    layers = model.model.layers
    if any(getattr(getattr(l.mlp, "experts", None), "has_bias", False) for l in layers):
        return "expert biases"
    return None


# ---------------------------------------------------------------------- key/value stores
class KV:
    """Where a forward keeps keys/values and how a layer attends over them: `attend` takes the
    layer's projected heads and returns its attention output; by default through `extend(layer, k,
    v)`, which returns every key/value the new tokens attend to (past + new). `advance(s)` is
    called once per forward after the last layer."""

    def extend(self, layer: int, k: torch.Tensor, v: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        raise NotImplementedError

    def attend(self, lean: "LeanForward", layer: int, qkv_NSJd: torch.Tensor, qk_norm_w: torch.Tensor | None,
               cos: torch.Tensor, sin: torch.Tensor, bias_N1ST: torch.Tensor) -> torch.Tensor:
        """Attention output (N, S, H, d) of the projected heads qkv_NSJd (H query, Hkv key, Hkv
        value heads; queries and keys still to normalise and rotate) over extend()'s keys/values."""
        q, k, v = lean._heads(qkv_NSJd, qk_norm_w, cos, sin)
        k_all, v_all = self.extend(layer, k.transpose(1, 2), v.transpose(1, 2))
        return lean._attention(q.transpose(1, 2), k_all, v_all, bias_N1ST).transpose(1, 2)

    def advance(self, s: int) -> None:
        pass


class Collect(KV):
    """No past; keeps this forward's keys/values, e.g. a prompt's, to seed a StaticKV."""

    def __init__(self):
        self.k: list[torch.Tensor] = []
        self.v: list[torch.Tensor] = []

    def extend(self, layer, k, v):
        self.k.append(k)
        self.v.append(v)
        return k, v


class NoPast(KV):
    """No past and nothing kept: one forward over whole sequences."""

    def extend(self, layer, k, v):
        return k, v


class Packed(KV):
    """Rows as one sequence of their real tokens, with shared prefixes forwarded once: U heads (a
    prompt prefix shared by one or more rows) and N continuations (the rest of a row: its own
    prompt tail, then its fed completion tokens). The caller feeds the single row (1, T), heads'
    tokens then continuations', so every per-token op (norms, projections, experts) runs once over
    exactly these tokens; only attention regroups them into padded rows: a head attends causally
    within itself (head_bias, (U, 1, P, P)), a continuation to its head's keys and then causally to
    its own (cont_bias, (N, 1, C, P + C)). The gradient of a head sums over its rows.
    Differentiable.

    head_UP / cont_NC: the packed index of each head / continuation token, left-padded (a pad
    points at token 0, hidden by the bias; head_mask_UP / cont_mask_NC say which are real);
    head_of_N: each row's head. Built by student/lean_policy.py::pack_rows.

    Why one pass: forwarding the prefixes first and the continuations on their keys after doubles
    the op count, and at RL shapes (8 prompts of ~9 tokens) that second, short pass cost a sixth of
    the training forward + backward. Why no padding: the self-teacher's contexts (a problem, then
    each row's own feedback) differ in length by tens of tokens."""

    def __init__(self, head_UP, head_mask_UP, head_bias, cont_NC, cont_mask_NC, head_of_N, cont_bias):
        self.head, self.cont = _Segment(head_UP, head_mask_UP), _Segment(cont_NC, cont_mask_NC)
        self.keys = _Segment(torch.cat([head_UP[head_of_N], cont_NC], dim=1), None)   # a continuation's keys
        self.head_bias, self.cont_bias = head_bias, cont_bias

    def attend(self, lean, layer, qkv_NSJd, qk_norm_w, cos, sin, bias_N1ST):
        q_THd, k_TKd, v_TKd = (t[0] for t in lean._heads(qkv_NSJd, qk_norm_w, cos, sin))
        h, c = self.head, self.cont
        out = [h.tokens(lean._attention(h.rows(q_THd), h.rows(k_TKd), h.rows(v_TKd), self.head_bias))]
        if c.width:
            out.append(c.tokens(lean._attention(c.rows(q_THd), self.keys.rows(k_TKd), self.keys.rows(v_TKd),
                                                self.cont_bias)))
        return torch.cat(out)[None]      # back in packed order: heads' real tokens, then continuations'


class _Segment:
    """Padded rows (R, L) of packed token indices (`mask_RL`: the real ones, in packed order):
    gathers (T, heads, d) into (R, heads, L, d), and attention outputs back to packed order. Rows
    without padding that sit contiguously in the packed sequence (a group's completions) are views."""

    def __init__(self, index_RL: torch.Tensor, mask_RL: torch.Tensor | None):
        self.count, self.width = index_RL.shape
        self.flat = index_RL.flatten()
        dense = mask_RL is None or bool(mask_RL.all())
        self.real = None if dense else mask_RL.flatten().nonzero().squeeze(1)
        self.start = None                # dense and contiguous: rows are a view of tokens start..
        if dense and self.flat.numel():
            first = int(self.flat[0])
            if torch.equal(self.flat, torch.arange(first, first + self.flat.numel(), device=self.flat.device)):
                self.start = first

    def rows(self, t_THd: torch.Tensor) -> torch.Tensor:
        if self.start is not None:
            t = t_THd[self.start:self.start + self.flat.numel()]
        else:
            t = t_THd.index_select(0, self.flat)
        return t.view(self.count, self.width, *t_THd.shape[1:]).transpose(1, 2)

    def tokens(self, out_RHLd: torch.Tensor) -> torch.Tensor:
        out = out_RHLd.transpose(1, 2).reshape(self.count * self.width, out_RHLd.size(1), out_RHLd.size(3))
        return out if self.real is None else out.index_select(0, self.real)


class StaticKV(KV):
    """Preallocated (N, Hkv, capacity, d) buffers per layer, filled left to right, one token per row
    and forward (decoding, no grad). A layer attends in one fused op (kernels.ops.decode_attention:
    q/k norm, rotary, cache write, attention), a few calls instead of ~120, whose dispatch cost
    dominated decoding at RL shapes."""

    def __init__(self, prefix: Collect, row_N: torch.Tensor, capacity: int):
        k0 = prefix.k[0]
        n, hkv, p, d = len(row_N), k0.size(1), k0.size(2), k0.size(3)
        self.k = [k0.new_empty(n, hkv, capacity, d) for _ in prefix.k]
        self.v = [k0.new_empty(n, hkv, capacity, d) for _ in prefix.v]
        for buf, src in zip(self.k + self.v, prefix.k + prefix.v):
            buf[:, :, :p].copy_(src[row_N])
        self.length = p

    def attend(self, lean, layer, qkv_NSJd, qk_norm_w, cos, sin, bias_N1ST):
        n, s, _, d = qkv_NSJd.shape
        if s != 1:
            raise ValueError(f"StaticKV decodes one token per row and forward, got {s}")
        o = ops.decode_attention(qkv_NSJd.view(n, -1, d), qk_norm_w, cos.view(n, d), sin.view(n, d), self.k[layer],
                                 self.v[layer], self.length, bias_N1ST.reshape(n, -1), lean.scale, lean.eps)
        return o.view(n, 1, -1, d)

    def advance(self, s):
        self.length += s


# ---------------------------------------------------------------------- routes
class RouteLog:
    """Per routed layer, the (rows, K) expert ids and (rows, E) router logits of every forward."""

    def __init__(self, num_layers: int, logits: bool = False):
        self.ids: list[list[torch.Tensor]] = [[] for _ in range(num_layers)]
        self.logits: list[list[torch.Tensor]] | None = [[] for _ in range(num_layers)] if logits else None


# ---------------------------------------------------------------------- the forward
class LeanForward:
    """The decoder of `model` as tensor ops. `runner(fn)`, when given, runs a whole scoring
    computation (e.g. inside a DeepSpeed engine's forward, so its backward hooks see the output)."""

    def __init__(self, model: torch.nn.Module, runner=None):
        self.runner = runner
        reason = unsupported(model)
        if reason is not None:
            raise ValueError(f"{type(model).__name__}: no lean forward ({reason})")
        self.model = model
        c = model.config
        self.qk_norm = STUDENT_FAMILIES[c.model_type].qk_norm
        self.num_heads, self.num_kv_heads = c.num_attention_heads, c.num_key_value_heads
        self.head_dim = getattr(c, "head_dim", None) or c.hidden_size // c.num_attention_heads
        self.scale = self.head_dim ** -0.5
        self.eps = c.rms_norm_eps
        self.top_k = c.num_experts_per_tok
        self.renorm = bool(getattr(c, "norm_topk_prob", True))
        self.routed = [i for i, l in enumerate(model.model.layers) if hasattr(l.mlp, "experts")]
        self.num_layers = len(self.routed)    # routed layers, as RouterReplay counts them
        self._frozen: dict[int, tuple] | None = None

    def _qkv_weights(self, a) -> tuple[torch.Tensor, torch.Tensor | None]:
        """The stacked q/k/v projection and per-head q/k norm weights of attention module `a`:
        built per call while weights may change (a cat, so gradients come out of it), once per
        `frozen()` scope otherwise (a cat per layer per decode step is measurable at RL shapes)."""
        if self._frozen is not None and id(a) in self._frozen:
            return self._frozen[id(a)]
        w_qkv = torch.cat([a.q_proj.weight, a.k_proj.weight, a.v_proj.weight])
        w_norm = None
        if self.qk_norm:
            w_norm = torch.cat([a.q_norm.weight.expand(self.num_heads, -1),
                                a.k_norm.weight.expand(self.num_kv_heads, -1)])
        if self._frozen is not None:
            self._frozen[id(a)] = (w_qkv, w_norm)
        return w_qkv, w_norm

    @contextmanager
    def frozen(self):
        """A scope in which the weights do not change (one rollout): derived weights are built once."""
        self._frozen = {}
        try:
            yield self
        finally:
            self._frozen = None

    def run(self, fn):
        """fn() through the runner (a training forward's whole computation), or plainly."""
        return fn() if self.runner is None else self.runner(fn)

    # -- pieces ------------------------------------------------------------------------------
    def _rms(self, x: torch.Tensor, weight: torch.Tensor) -> torch.Tensor:
        h = x.float()
        h = h * torch.rsqrt(h.pow(2).mean(-1, keepdim=True) + self.eps)
        return weight * h.to(x.dtype)

    def _rope(self, pos_NS: torch.Tensor, dtype: torch.dtype) -> tuple[torch.Tensor, torch.Tensor]:
        rotary = self.model.model.rotary_emb
        freqs = pos_NS[..., None].float() * rotary.inv_freq.float()
        emb = torch.cat((freqs, freqs), dim=-1)
        scaling = rotary.attention_scaling
        return (emb.cos() * scaling).to(dtype)[:, :, None], (emb.sin() * scaling).to(dtype)[:, :, None]

    @staticmethod
    def _rotate(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
        half = x.size(-1) // 2
        return x * cos + torch.cat((-x[..., half:], x[..., :half]), dim=-1) * sin

    def _heads(self, qkv_NSJd, qk_norm_w, cos, sin):
        """(q, k, v), token-major, from the projected heads: queries and keys normalised (Qwen3)
        and rotated together (per-head ops, so each element sees the same arithmetic as apart)."""
        h_, hkv = self.num_heads, self.num_kv_heads
        qk, v = qkv_NSJd[:, :, :h_ + hkv], qkv_NSJd[:, :, h_ + hkv:]
        if self.qk_norm:
            qk = self._rms(qk, qk_norm_w)
        qk = self._rotate(qk, cos, sin)
        return qk[:, :, :h_], qk[:, :, h_:], v

    def _attention(self, q_NHSd, k_NKTd, v_NKTd, bias_N1ST):
        if q_NHSd.is_cuda or k_NKTd.size(2) >= SDPA_MIN_KEYS:
            return self._attention_sdpa(q_NHSd, k_NKTd, v_NKTd, bias_N1ST)
        # Query heads grouped by the key/value head they share (transformers' repeat_kv order), so
        # GQA is two batched matmuls without materialising repeated keys.
        n, h, s, d = q_NHSd.shape
        hkv, t = k_NKTd.size(1), k_NKTd.size(2)
        g = h // hkv
        att = torch.matmul(q_NHSd.reshape(n, hkv, g * s, d), k_NKTd.transpose(-1, -2)) * self.scale
        att = att.view(n, hkv, g, s, t) + bias_N1ST[:, :, None]
        att = torch.softmax(att.float(), dim=-1).to(q_NHSd.dtype)
        return torch.matmul(att.view(n, hkv, g * s, t), v_NKTd).view(n, h, s, d)

    def _attention_sdpa(self, q_NHSd, k_NKTd, v_NKTd, bias_N1ST):
        """The same attention through torch SDPA, which picks a fused kernel on a GPU (with an
        additive mask, the memory-efficient one: every row's padding and prefix layout is a mask).
        On the CPU the two matmuls above are faster for short rows (a rollout's prompt and
        completion), SDPA's fused kernel for long ones (SDPA_MIN_KEYS)."""
        return F.scaled_dot_product_attention(q_NHSd, k_NKTd, v_NKTd, attn_mask=bias_N1ST.to(q_NHSd.dtype),
                                              scale=self.scale, enable_gqa=True)

    def _route(self, li: int, mlp, h_TD: torch.Tensor, forced: list[torch.Tensor] | None,
               log: RouteLog | None, replay) -> torch.Tensor:
        logits_TE = F.linear(h_TD, mlp.gate.weight)
        if forced is None:
            w_TK, ids_TK = ops.topk_gating(logits_TE, self.top_k, self.renorm)
        else:
            # A row of -1 ids is free (as in RouterReplay): the router's own choice, not counted.
            own_TK = ops.topk_gating(logits_TE.detach(), self.top_k, self.renorm)[1]
            forced_TK = forced[li].to(own_TK.device)
            free_T = forced_TK[:, 0] < 0
            forced_TK = torch.where(free_T[:, None], own_TK, forced_TK)
            w_TK, ids_TK = ops.topk_gating(logits_TE, self.top_k, self.renorm, forced_TK)
            if replay is not None:          # how often the router would have chosen otherwise
                replay.count(li, ids_TK, own_TK, forced_N=~free_T)
        if log is not None:
            log.ids[li].append(ids_TK.detach())
            if log.logits is not None:
                log.logits[li].append(logits_TE)
        ex = mlp.experts
        _counts, offsets_E1 = ops.expert_counts(ids_TK, ex.num_experts)
        xs_PD, pos_TK = ops.permute(h_TD, ids_TK, offsets_E1)
        ys_PD = expert_mlp(ex, xs_PD, offsets_E1)
        return ops.unpermute_combine(ys_PD.to(h_TD.dtype), pos_TK, w_TK)

    # -- forward -----------------------------------------------------------------------------
    def __call__(self, ids_NS: torch.Tensor, pos_NS: torch.Tensor, bias_N1ST: torch.Tensor, kv: KV, *,
                 logits_from: int | torch.Tensor | None = None, forced: list[torch.Tensor] | None = None,
                 log: RouteLog | None = None, replay=None, head: bool = True) -> torch.Tensor | None:
        """Logits (N, S - logits_from, V) of positions logits_from.. (an index tensor: of those
        positions; None: no logits); with head=False the final-normed hidden states there instead
        (the caller projects them, e.g. in chunks).

        bias_N1ST: additive attention bias (0 or -inf) over the T keys the layer attends to (unused
        by `Packed`, which holds its own); every query must see at least one key. forced[l]:
        (N*S, K) expert ids for routed layer l, a row of -1 leaving that token to the router; `replay`
        (a MismatchCounter) then counts how often the forced ids differ from the router's own choice.
        """
        m = self.model.model
        n, s = ids_NS.shape
        x = m.embed_tokens(ids_NS)
        cos, sin = self._rope(pos_NS, x.dtype)
        h_, hkv, d = self.num_heads, self.num_kv_heads, self.head_dim
        li = 0
        for i, layer in enumerate(m.layers):
            a = layer.self_attn
            h = self._rms(x, layer.input_layernorm.weight)
            w_qkv, w_qk_norm = self._qkv_weights(a)       # queries, keys and values in one GEMM
            qkv = F.linear(h, w_qkv).view(n, s, h_ + 2 * hkv, d)
            o = kv.attend(self, i, qkv, w_qk_norm, cos, sin, bias_N1ST)
            x = x + F.linear(o.reshape(n, s, h_ * d), a.o_proj.weight)
            h = self._rms(x, layer.post_attention_layernorm.weight).view(n * s, -1)
            mlp = layer.mlp
            if hasattr(mlp, "experts"):
                out = self._route(li, mlp, h, forced, log, replay)
                li += 1
            else:                                      # a dense layer (Qwen3-MoE mlp_only_layers)
                out = mlp.down_proj(mlp.act_fn(mlp.gate_proj(h)) * mlp.up_proj(h))
            x = x + out.view(n, s, -1)
        kv.advance(s)
        if logits_from is None:
            return None
        x = x[:, logits_from:] if isinstance(logits_from, int) else x[:, logits_from]
        x = self._rms(x, m.norm.weight)
        return F.linear(x, self.model.lm_head.weight) if head else x

    def head(self, x: torch.Tensor) -> torch.Tensor:
        """The vocabulary projection of final-normed hidden states."""
        return F.linear(x, self.model.lm_head.weight)


# ---------------------------------------------------------------------- masks
def prompt_bias(mask_NP: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    """Causal bias over a left-padded prompt; a padding query sees itself (its output is unused)."""
    p, dev = mask_NP.size(1), mask_NP.device
    causal = torch.ones(p, p, dtype=torch.bool, device=dev).tril()
    see = (causal[None] & mask_NP.bool()[:, None, :]) | torch.eye(p, dtype=torch.bool, device=dev)[None]
    return torch.zeros(see.shape, dtype=dtype, device=dev).masked_fill_(~see, float("-inf"))[:, None]


def continuation_bias(head_mask_NP: torch.Tensor, cont_mask_NC: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    """Bias for left-padded continuations after left-padded heads: the head's real keys, then the
    continuation's own real keys causally; a padding query sees itself (its output is unused)."""
    (n, p), c, dev = head_mask_NP.shape, cont_mask_NC.size(1), head_mask_NP.device
    causal = torch.ones(c, c, dtype=torch.bool, device=dev).tril()
    own = (causal[None] & cont_mask_NC.bool()[:, None, :]) | torch.eye(c, dtype=torch.bool, device=dev)[None]
    see = torch.cat([head_mask_NP.bool()[:, None, :].expand(n, c, p), own], dim=2)
    return torch.zeros(see.shape, dtype=dtype, device=dev).masked_fill_(~see, float("-inf"))[:, None]


def positions(mask: torch.Tensor) -> torch.Tensor:
    """Position ids of a left-padded batch (padding never shifts a row's positions)."""
    return (mask.cumsum(-1) - 1).clamp(min=0)


def load_balancing_loss(logits: list[list[torch.Tensor]], weights_T: torch.Tensor, num_experts: int,
                        top_k: int) -> torch.Tensor:
    """transformers' `load_balancing_loss_func` (Switch Transformer aux loss) with a weight per
    routed token instead of a 0/1 mask, so a prompt forwarded once for G rows counts G times.

    logits[l]: layer l's (rows, E) router logits of each forward, concatenated in order; weights_T
    matches that concatenation. E * sum_e (share of slots to e) * (mean router prob of e).
    """
    w = weights_T.float()
    slots_E = torch.zeros(num_experts, dtype=torch.float32, device=w.device)
    prob_E = torch.zeros(num_experts, dtype=torch.float32, device=w.device)
    for chunks in logits:
        probs_TE = torch.softmax(torch.cat(chunks).float(), dim=-1)
        _, top_TK = torch.topk(probs_TE, top_k, dim=-1)
        slots_E = slots_E.scatter_add(0, top_TK.reshape(-1), w.repeat_interleave(top_k))
        prob_E = prob_E + (probs_TE * w[:, None]).sum(0)
    total = w.sum() * len(logits)
    return (slots_E / total * prob_E / total).sum() * num_experts
