"""Our MoE experts forward for transformers, registered in its ExpertsInterface as "hintrl".

Importing this module registers it (cheap: no model is built), after which any transformers MoE
family whose experts class carries `@use_experts_implementation` (Qwen3Moe, Qwen2Moe, Mixtral, Olmoe,
DeepseekV3, GptOss, ...) accepts `experts_implementation="hintrl"`, e.g.
`AutoModelForCausalLM.from_config(cfg, experts_implementation="hintrl")`.

The forward is: expert counts/offsets -> permute (stable, expert-sorted) -> grouped GEMM up ->
gate/activation -> grouped GEMM down -> unpermute-combine (weighted sum of the k outputs, fp32
accumulation), the routing steps running on kernels.ops. Router top-k lives in the model's router
module: `use_hintrl_gating(model)` points softmax-then-top-k routers at kernels.ops.topk_gating
(their weights then stay fp32), and student.router_replay hooks routers to record/replay routes.

Shape legend: T tokens, D hidden, K routed slots per token, E experts, P permuted rows (= T*K here),
F expert width (2F for fused gate/up).
"""
from __future__ import annotations

import re
import types
import weakref

import torch
import torch.nn.functional as F
from transformers.integrations.moe import ExpertsInterface

from kernels import ops

NAME = "hintrl"


def _expert_of_row(offsets_E1: torch.Tensor, num_rows: int) -> torch.Tensor:
    # Only biased experts need it; searchsorted avoids the host sync repeat_interleave would cost.
    rows_P = torch.arange(num_rows, device=offsets_E1.device, dtype=offsets_E1.dtype)
    return torch.searchsorted(offsets_E1[1:], rows_P, right=True).clamp(max=offsets_E1.numel() - 2)


def _linear(self, xs_PI: torch.Tensor, w: torch.Tensor, bias: torch.Tensor | None,
            offsets_E1: torch.Tensor) -> torch.Tensor:
    # transformers stores expert weights as (E, out, in) unless the class says is_transposed.
    w_EIO = w if self.is_transposed else w.transpose(-2, -1)
    out_PO = ops.grouped_mm(xs_PI, w_EIO, offsets_E1)
    if bias is not None:
        out_PO = out_PO + bias[_expert_of_row(offsets_E1, out_PO.size(0))]
    return out_PO


def hintrl_experts_forward(self: torch.nn.Module, hidden_states: torch.Tensor, top_k_index: torch.Tensor,
                           top_k_weights: torch.Tensor) -> torch.Tensor:
    """ExpertsInterface signature: (module, hidden_states_TD, top_k_index_TK, top_k_weights_TK) -> out_TD."""
    x_TD = hidden_states
    ids_TK = top_k_index.to(torch.long)
    _counts_E, offsets_E1 = ops.expert_counts(ids_TK, self.num_experts)
    xs_PD, pos_TK = ops.permute(x_TD, ids_TK, offsets_E1)
    ys_PD = expert_mlp(self, xs_PD, offsets_E1)
    return ops.unpermute_combine(ys_PD.to(x_TD.dtype), pos_TK, top_k_weights)


class _SwiGLU(torch.autograd.Function):
    """silu(gate) * up of h = [gate | up]: transformers' default gate, with a backward that writes
    both halves of the gradient into one buffer. Autograd through its chunk + silu + mul ends in a
    cat of the two halves; this is the same arithmetic (bitwise) without it (timings in
    benchmarks/README.md)."""

    @staticmethod
    def forward(ctx, h):
        gate, up = h.chunk(2, dim=-1)
        act = F.silu(gate)
        ctx.save_for_backward(gate, up, act)
        return act * up

    @staticmethod
    def backward(ctx, grad):
        gate, up, act = ctx.saved_tensors
        f = gate.size(-1)
        grad_h = grad.new_empty(*grad.shape[:-1], 2 * f)
        torch.ops.aten.silu_backward.grad_input(grad * up, gate, grad_input=grad_h[..., :f])
        torch.mul(grad, act, out=grad_h[..., f:])
        return grad_h


_DEFAULT_SWIGLU: "weakref.WeakKeyDictionary[torch.nn.Module, bool]" = weakref.WeakKeyDictionary()


def _is_default_swiglu(experts: torch.nn.Module) -> bool:
    """Whether `experts._apply_gate` computes silu(gate) * up of h = [gate | up] bitwise, so that
    _SwiGLU may stand in for it. Decided by calling it on a small random h (not by its name or its
    activation's class, which transformers may rename) and cached per experts module: the answer
    depends on the instance's `act_fn` (config.hidden_act) as well as on its class."""
    known = _DEFAULT_SWIGLU.get(experts)
    if known is None:
        w = experts.gate_up_proj                       # (E, 2F, D), or (E, D, 2F) when is_transposed
        shape = getattr(w, "ds_shape", w.shape)        # ZeRO-3 leaves a partitioned placeholder
        width = shape[-1] if experts.is_transposed else shape[-2]
        h = torch.randn(4, width, generator=torch.Generator().manual_seed(0)).to(w.device)
        with torch.no_grad():
            gate, up = h.chunk(2, dim=-1)
            got = experts._apply_gate(h)
            known = got.shape == up.shape and got.dtype == up.dtype and torch.equal(got, F.silu(gate) * up)
        _DEFAULT_SWIGLU[experts] = known
    return known


def expert_mlp(self: torch.nn.Module, xs_PD: torch.Tensor, offsets_E1: torch.Tensor) -> torch.Tensor:
    """The experts' MLPs on expert-sorted rows: row group e (offsets_E1[e]:offsets_E1[e+1]) goes
    through expert e of `self`'s weights. Shared with the expert-parallel forward, which calls it
    on the rows it received with its local experts' weights."""
    if self.has_gate:
        h_PF = _linear(self, xs_PD, self.gate_up_proj, getattr(self, "gate_up_proj_bias", None) if self.has_bias
                       else None, offsets_E1)
        if h_PF.requires_grad and _is_default_swiglu(self):
            h_PF = _SwiGLU.apply(h_PF)
        else:
            h_PF = self._apply_gate(h_PF)
    else:
        h_PF = _linear(self, xs_PD, self.up_proj, getattr(self, "up_proj_bias", None) if self.has_bias else None,
                       offsets_E1)
        h_PF = self.act_fn(h_PF)
    ys_PD = _linear(self, h_PF, self.down_proj, getattr(self, "down_proj_bias", None) if self.has_bias else None,
                    offsets_E1)
    if self.has_post_expert_norm:
        ys_PD = self.post_expert_norm(ys_PD)
    return ys_PD


def find_routers(model: torch.nn.Module) -> list[tuple[str, torch.nn.Module]]:
    """(name, module) of every transformers top-k router in `model`, in layer order."""
    return [(n, m) for n, m in model.named_modules() if re.search(r"topkrouter$", type(m).__name__, re.I)]


_ROUTER_KINDS: dict[type, str] = {}


def router_kind(router: torch.nn.Module) -> str:
    """How a router scores experts: "softmax_topk" (Qwen/Mixtral/Olmoe style: softmax over all
    experts in fp32, then top-k, renormalised iff the router renormalises), "topk_softmax" (GptOss:
    top-k logits, then a softmax over them in the logits' dtype), "sigmoid" (DeepseekV3 style, with
    score-correction bias). Decided by calling the router class's forward on probe weights (see
    _probe_router) and cached per class; raises NotImplementedError for a router that scores
    otherwise."""
    if hasattr(router, "e_score_correction_bias") and hasattr(router, "routed_scaling_factor"):
        return "sigmoid"
    cls = type(router)
    if cls not in _ROUTER_KINDS:
        kind, conclusive = _probe_router(router)
        if not conclusive:            # top_k of 1 or of every expert: both kinds route alike here
            return kind
        _ROUTER_KINDS[cls] = kind
    return _ROUTER_KINDS[cls]


def _router_probe_copy(router: torch.nn.Module, dtype: torch.dtype, **attrs) -> torch.nn.Module:
    """A shallow copy of `router` whose parameters are random full-size tensors of `dtype` (normal
    logits for a unit-variance input; ZeRO-3 partitioned weights are never read) and with `attrs`
    set; the router itself is untouched."""
    probe = object.__new__(type(router))
    vars(probe).update(vars(router))
    vars(probe)["_parameters"] = {}
    gen = torch.Generator().manual_seed(0)
    for name, p in router.named_parameters(recurse=False):
        shape = tuple(getattr(p, "ds_shape", p.shape))
        scale = shape[-1] ** -0.5 if len(shape) > 1 else 1.0
        vars(probe)[name] = (torch.randn(shape, generator=gen) * scale).to(device=p.device, dtype=dtype)
    vars(probe).update(attrs)
    return probe


def _probe_router(router: torch.nn.Module) -> tuple[str, bool]:
    """(kind, conclusive) of a top-k router, from what its class's forward returns for random
    weights and input: (logits (N, E), weights (N, K), ids (N, K)). The forward is called as
    `type(router).forward(copy, x)`, bypassing hooks and instance patches (use_hintrl_gating, router
    replay). Two probes:

    1. fp32, top_k=2, norm_topk_prob=False: weights equal to softmax(all logits) at the ids, not
       renormalised -> "softmax_topk" (a router that honours norm_topk_prob). Renormalised, they are
       also softmax(logits at the ids) (the two coincide), so the router always renormalises:
    2. bf16: weights equal to the fp32 softmax over all experts, renormalised, to fp32 rounding ->
       "softmax_topk" (Mixtral, which kernels.ops.topk_gating reproduces); equal to the softmax of
       the top-k logits only to bf16 rounding -> "topk_softmax" (GptOss), which is left alone.
    """
    name = type(router).__name__
    num_experts, hidden = getattr(router.weight, "ds_shape", router.weight.shape)   # (E, D), even under ZeRO-3
    x = torch.randn(16, hidden, generator=torch.Generator().manual_seed(1)).to(router.weight.device)

    def call(dtype, **attrs):
        probe = _router_probe_copy(router, dtype, **attrs)
        with torch.no_grad():
            out = type(router).forward(probe, x.to(dtype))
        if not (isinstance(out, tuple) and len(out) == 3):
            raise NotImplementedError(f"{name}: forward returns {type(out).__name__}, not (logits, weights, ids)")
        logits, weights, ids = out
        if logits.dim() != 2 or weights.shape != ids.shape or ids.size(0) != logits.size(0):
            raise NotImplementedError(f"{name}: forward returns shapes {tuple(logits.shape)}, "
                                      f"{tuple(weights.shape)}, {tuple(ids.shape)}: not (N, E), (N, K), (N, K)")
        ids = ids.long()
        probs = torch.softmax(logits.float(), dim=-1).gather(1, ids)
        return (logits, weights.float(), ids, probs, probs / probs.sum(-1, keepdim=True),
                torch.softmax(logits.gather(1, ids), dim=-1).float())

    def close(a, b, atol):
        return torch.allclose(a, b, rtol=0, atol=atol)

    k_probe = {"top_k": 2} if num_experts >= 3 else {}
    logits, w, ids, probs, renormed, _ = call(torch.float32, norm_topk_prob=False, **k_probe)
    conclusive = 2 <= ids.size(1) < logits.size(1)
    if close(w, probs, 1e-6) and not close(w, renormed, 1e-6):
        if not hasattr(router, "norm_topk_prob"):   # what _gating_forward and replay read (default: renormalise)
            raise NotImplementedError(f"{name}: leaves its top-k weights unnormalised without a norm_topk_prob "
                                      "attribute saying so")
        return "softmax_topk", conclusive
    if not close(w, renormed, 1e-6):
        raise NotImplementedError(f"{name}: unknown expert scoring (weights are neither the softmax over all "
                                  "experts at the chosen ids nor a softmax over the chosen logits)")
    _logits, w, _ids, _probs, renormed, top_softmax = call(torch.bfloat16, **k_probe)
    if close(w, renormed, 1e-6):
        return "softmax_topk", conclusive
    if close(w, top_softmax, 1e-2):
        return "topk_softmax", conclusive
    raise NotImplementedError(f"{name}: unknown expert scoring (in bf16 its weights match neither the fp32 "
                              "softmax over all experts nor the softmax over the chosen logits)")


def _gating_forward(self, hidden_states: torch.Tensor):
    x_TD = hidden_states.reshape(-1, self.hidden_dim)
    logits_TE = F.linear(x_TD, self.weight, getattr(self, "bias", None))
    w_TK, ids_TK = ops.topk_gating(logits_TE, self.top_k, bool(getattr(self, "norm_topk_prob", True)))
    return logits_TE, w_TK, ids_TK


def use_hintrl_gating(model: torch.nn.Module) -> int:
    """Run the softmax-then-top-k routers of `model` on kernels.ops.topk_gating; returns how many.
    Ties go to the lower expert id (torch.topk leaves them unspecified); otherwise the same routing."""
    patched = 0
    for _name, router in find_routers(model):
        if router_kind(router) == "softmax_topk":
            router.forward = types.MethodType(_gating_forward, router)
            patched += 1
    return patched


ExpertsInterface.register(NAME, hintrl_experts_forward)
