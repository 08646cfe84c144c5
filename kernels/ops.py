"""The one Python entry to the hintrl MoE routing ops.

Loads the compiled extensions (kernels._C: op schemas + CPU kernels; kernels._cuda: CUDA kernels),
registers autograd formulas and fake (meta) implementations for torch.compile, and falls back to
kernels.reference, per device, when no extension serves it. `backend()` / `python -m kernels.info`
say which path each device takes and why; the tests insist on the compiled path.

Shape legend: T tokens, E experts, K routed slots per token, S = T*K, D hidden width, P permuted
rows (S plus block padding), I/O input/output width of a grouped GEMM. Semantics: kernels.reference.
"""
from __future__ import annotations

import torch

from kernels import reference

CPU_EXTENSION_ERROR: str | None = None
CUDA_EXTENSION_ERROR: str | None = None
try:
    from kernels import _C  # noqa: F401  (defines torch.ops.hintrl.* and the CPU kernels)
except ImportError as exc:
    CPU_EXTENSION_ERROR = f"kernels._C did not import ({exc}); build it with `pip install --no-build-isolation -e .`"

if torch.version.cuda is None:
    CUDA_EXTENSION_ERROR = "torch is a CPU-only build"
elif CPU_EXTENSION_ERROR is not None:
    CUDA_EXTENSION_ERROR = "needs kernels._C, which holds the op schemas"
else:
    try:
        from kernels import _cuda  # noqa: F401
    except ImportError as exc:
        CUDA_EXTENSION_ERROR = (f"kernels._cuda did not import ({exc}); it is built when torch is a CUDA build and "
                                "nvcc is found via CUDA_HOME")

OPS = ("topk_gating", "expert_counts", "permute", "unpermute_combine", "grouped_mm")
# The gating kernels keep a row's K slot terms in registers (kMaxTopK in csrc/moe_core.h); a router
# with more slots takes the reference.
KERNEL_MAX_TOP_K = 32


def backend(device_type: str) -> tuple[str, str]:
    """(backend, reason) for the routing ops on a device type: 'cpu-ext', 'cuda-ext' or 'torch'."""
    if device_type == "cpu":
        return ("cpu-ext", "kernels._C loaded") if CPU_EXTENSION_ERROR is None else ("torch", CPU_EXTENSION_ERROR)
    if device_type == "cuda":
        if CUDA_EXTENSION_ERROR is None:
            return "cuda-ext", "kernels._cuda loaded"
        return "torch", CUDA_EXTENSION_ERROR
    return "torch", f"no kernels are built for device type {device_type!r}"


def _compiled(t: torch.Tensor) -> bool:
    return backend(t.device.type)[0] != "torch"


def topk_gating(logits_TE: torch.Tensor, k: int, renorm: bool = True,
                forced_ids_TK: torch.Tensor | None = None) -> tuple[torch.Tensor, torch.Tensor]:
    """Router logits -> (weights_TK fp32, ids_TK int64); see reference.topk_gating."""
    if forced_ids_TK is not None:
        forced_ids_TK = forced_ids_TK.to(device=logits_TE.device, dtype=torch.long)
    if not _compiled(logits_TE) or k > KERNEL_MAX_TOP_K:
        return reference.topk_gating(logits_TE, k, renorm, forced_ids_TK)
    return torch.ops.hintrl.topk_gating(logits_TE, k, renorm, forced_ids_TK)


def expert_counts(ids_TK: torch.Tensor, num_experts: int, block: int = 1) -> tuple[torch.Tensor, torch.Tensor]:
    """(counts_E, offsets_E1), int32; see reference.expert_counts."""
    if not _compiled(ids_TK):
        return reference.expert_counts(ids_TK, num_experts, block)
    return torch.ops.hintrl.expert_counts(ids_TK, num_experts, block)


def permute(x_TD: torch.Tensor, ids_TK: torch.Tensor, offsets_E1: torch.Tensor,
            block: int = 1) -> tuple[torch.Tensor, torch.Tensor]:
    """(xs_PD, pos_TK); see reference.permute."""
    if not _compiled(x_TD):
        return reference.permute(x_TD, ids_TK, offsets_E1, block)
    return torch.ops.hintrl.permute(x_TD, ids_TK, offsets_E1, block)


def unpermute_combine(ys_PD: torch.Tensor, pos_TK: torch.Tensor, w_TK: torch.Tensor) -> torch.Tensor:
    """out_TD = sum_k w_TK * ys_PD[pos_TK]; see reference.unpermute_combine."""
    if not _compiled(ys_PD):
        return reference.unpermute_combine(ys_PD, pos_TK, w_TK)
    return torch.ops.hintrl.unpermute_combine(ys_PD, pos_TK, w_TK)


_NATIVE_GROUPED_MM = getattr(torch.nn.functional, "grouped_mm", None) or getattr(torch, "_grouped_mm", None)


def _aligned_16(t: torch.Tensor) -> bool:
    # torch's grouped GEMM rejects operands whose base or non-unit strides are not 16-byte multiples.
    return t.data_ptr() % 16 == 0 and all(st * t.element_size() % 16 == 0 for st in t.stride() if st != 1)


def grouped_mm(xs_PI: torch.Tensor, w_EIO: torch.Tensor, offsets_E1: torch.Tensor) -> torch.Tensor:
    """Row group e of xs (offsets_E1[e]:offsets_E1[e+1]) times w_EIO[e]; rows past offsets_E1[-1]
    give zeros. On the CPU extension: our kernel (one product per expert, BLAS or a few-row kernel,
    the experts dealt over the threads by rows). Elsewhere torch's grouped GEMM where it takes the operands (fp32/bf16/fp16,
    16-byte aligned), a per-expert loop otherwise."""
    xs_PI = xs_PI.to(w_EIO.dtype)
    if xs_PI.device.type == "cpu" and CPU_EXTENSION_ERROR is None:
        return torch.ops.hintrl.grouped_mm(xs_PI, w_EIO, offsets_E1)
    if (_NATIVE_GROUPED_MM is not None and w_EIO.dtype in (torch.float32, torch.bfloat16, torch.float16)
            and _aligned_16(xs_PI) and _aligned_16(w_EIO)):
        return _NATIVE_GROUPED_MM(xs_PI, w_EIO, offs=offsets_E1[1:])
    return reference.grouped_mm_loop(xs_PI, w_EIO, offsets_E1)


def decode_attention(qkv_NJd: torch.Tensor, norm_w: torch.Tensor | None, cos_Nd: torch.Tensor, sin_Nd: torch.Tensor,
                     k_cache: torch.Tensor, v_cache: torch.Tensor, length: int, bias_NT: torch.Tensor,
                     scale: float, eps: float) -> torch.Tensor:
    """Decode attention, fused (writes the new key/value into the caches); see
    reference.decode_attention. Our kernel serves fp32 on the CPU without autograd (decoding);
    anything else takes the reference."""
    args = (qkv_NJd, norm_w, cos_Nd, sin_Nd, k_cache, v_cache, length, bias_NT, scale, eps)
    tensors = [t for t in args if isinstance(t, torch.Tensor)]
    if (qkv_NJd.device.type != "cpu" or CPU_EXTENSION_ERROR is not None
            or any(t.dtype != torch.float32 for t in tensors)
            or (torch.is_grad_enabled() and any(t.requires_grad for t in tensors))):
        return reference.decode_attention(*args)
    return torch.ops.hintrl.decode_attention(*args)


def _register_autograd_and_fakes() -> None:
    lib = "hintrl::"

    @torch.library.register_fake(lib + "topk_gating")
    def _(logits, k, renorm, forced_ids):
        T = logits.size(0)
        return (logits.new_empty(T, k, dtype=reference.acc_dtype(logits.dtype)),
                logits.new_empty(T, k, dtype=torch.long))

    @torch.library.register_fake(lib + "topk_gating_backward")
    def _(grad_w, logits, ids, renorm):
        return torch.empty_like(logits)

    @torch.library.register_fake(lib + "expert_counts")
    def _(ids, num_experts, block):
        return ids.new_empty(num_experts, dtype=torch.int32), ids.new_empty(num_experts + 1, dtype=torch.int32)

    @torch.library.register_fake(lib + "permute")
    def _(x, ids, offsets, block):
        rows = reference.permuted_rows(ids.numel(), offsets.size(0) - 1, block)
        return x.new_empty(rows, x.size(1)), torch.empty_like(ids)

    @torch.library.register_fake(lib + "permute_backward")
    def _(grad_xs, pos):
        return grad_xs.new_empty(pos.size(0), grad_xs.size(1))

    @torch.library.register_fake(lib + "unpermute_combine")
    def _(ys, pos, w):
        return ys.new_empty(pos.size(0), ys.size(1))

    @torch.library.register_fake(lib + "unpermute_combine_backward")
    def _(grad_out, ys, pos, w):
        return torch.empty_like(ys), w.new_empty(w.shape, dtype=reference.acc_dtype(ys.dtype))

    def gating_setup(ctx, inputs, output):
        logits, _k, renorm, _forced = inputs
        ctx.save_for_backward(logits, output[1])
        ctx.renorm = renorm

    def gating_backward(ctx, grad_w, _grad_ids):
        logits, ids = ctx.saved_tensors
        grad = torch.ops.hintrl.topk_gating_backward(grad_w.contiguous(), logits, ids, ctx.renorm)
        return grad, None, None, None

    torch.library.register_autograd(lib + "topk_gating", gating_backward, setup_context=gating_setup)

    def permute_setup(ctx, inputs, output):
        ctx.save_for_backward(output[1])

    def permute_backward(ctx, grad_xs, _grad_pos):
        (pos,) = ctx.saved_tensors
        return torch.ops.hintrl.permute_backward(grad_xs.contiguous(), pos), None, None, None

    torch.library.register_autograd(lib + "permute", permute_backward, setup_context=permute_setup)

    def combine_setup(ctx, inputs, output):
        ys, pos, w = inputs
        ctx.save_for_backward(ys, pos, w)

    def combine_backward(ctx, grad_out):
        ys, pos, w = ctx.saved_tensors
        grad_ys, grad_w = torch.ops.hintrl.unpermute_combine_backward(grad_out.contiguous(), ys, pos, w)
        return grad_ys, None, grad_w.to(w.dtype)

    torch.library.register_autograd(lib + "unpermute_combine", combine_backward, setup_context=combine_setup)

    @torch.library.register_fake(lib + "grouped_mm")
    def _(x, w, offsets):
        return x.new_empty(x.size(0), w.size(2))

    @torch.library.register_fake(lib + "decode_attention")
    def _(qkv, norm_w, cos, sin, k_cache, v_cache, length, bias, scale, eps):
        return qkv.new_empty(qkv.size(0), (qkv.size(1) - 2 * k_cache.size(1)) * qkv.size(2))

    @torch.library.register_fake(lib + "grouped_mm_weight_grad")
    def _(x, grad_out, w, offsets):
        return torch.empty_like(w)

    def gmm_setup(ctx, inputs, output):
        x, w, offsets = inputs
        ctx.save_for_backward(x, w, offsets)

    def gmm_backward(ctx, grad_out):
        x, w, offsets = ctx.saved_tensors
        grad_out = grad_out.contiguous()
        grad_x = torch.ops.hintrl.grouped_mm(grad_out, w.transpose(1, 2), offsets) if ctx.needs_input_grad[0] else None
        grad_w = torch.ops.hintrl.grouped_mm_weight_grad(x, grad_out, w, offsets) if ctx.needs_input_grad[1] else None
        return grad_x, grad_w, None

    torch.library.register_autograd(lib + "grouped_mm", gmm_backward, setup_context=gmm_setup)


if CPU_EXTENSION_ERROR is None:
    _register_autograd_and_fakes()
