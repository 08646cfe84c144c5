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

import inspect
import re
import types

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
    cat of the two halves; this is the same arithmetic (bitwise) without it: fwd + bwd of a
    (1920, 512) activation 1.15-1.31 -> 0.84-0.96 ms."""

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


def _is_default_swiglu(experts: torch.nn.Module) -> bool:
    return (getattr(type(experts)._apply_gate, "__name__", "") == "_default_apply_gate"
            and type(experts.act_fn).__name__ in ("SiLUActivation", "SiLU"))


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


def router_kind(router: torch.nn.Module) -> str:
    """How a router scores experts: "softmax_topk" (Qwen/Mixtral/Olmoe style), "topk_softmax" (GptOss),
    "sigmoid" (DeepseekV3 style, with score-correction bias)."""
    if hasattr(router, "e_score_correction_bias") and hasattr(router, "routed_scaling_factor"):
        return "sigmoid"
    src = inspect.getsource(type(router).forward)  # the class's: use_hintrl_gating patches instances
    if re.search(r"topk\(router_logits", src) and "softmax(router_top_value" in src:
        return "topk_softmax"
    if re.search(r"softmax\(router_logits", src):
        return "softmax_topk"
    raise NotImplementedError(f"{type(router).__name__}: unknown expert scoring")


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
