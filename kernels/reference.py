"""Pure-PyTorch definitions of the hintrl routing ops: the spec the C++/CUDA kernels are tested
against, and the fallback `kernels.ops` uses when no compiled extension serves a device.

Shape legend: T tokens, E experts, K routed slots per token, S = T*K slots (slot s = t*K + k),
D hidden width, P permuted rows (S plus block padding).
Conventions (shared with kernels/csrc/moe_core.h): top-k ranks by logit, lower expert id first on
ties; an id outside [0, E) is a dropped slot (position -1, zero contribution); permuted order is
stable (slot order within an expert).
"""
from __future__ import annotations

import torch


def acc_dtype(dtype: torch.dtype) -> torch.dtype:
    return torch.float64 if dtype == torch.float64 else torch.float32


def permuted_rows(num_slots: int, num_experts: int, block: int) -> int:
    return num_slots + num_experts * (block - 1)


def topk_gating(logits_TE: torch.Tensor, k: int, renorm: bool = True,
                forced_ids_TK: torch.Tensor | None = None) -> tuple[torch.Tensor, torch.Tensor]:
    """softmax(logits) in fp32 (fp64 for fp64 input) -> (weights_TK, ids_TK), weights renormalised
    over the k slots when `renorm`. With forced ids, those ids are returned and the weights are the
    probabilities at them, so the gradient still reaches the logits."""
    logits_acc_TE = logits_TE.to(acc_dtype(logits_TE.dtype))
    probs_TE = torch.softmax(logits_acc_TE, dim=-1)
    if forced_ids_TK is None:
        ids_TK = torch.sort(logits_acc_TE.detach(), dim=-1, descending=True, stable=True).indices[:, :k]
        w_TK = probs_TE.gather(1, ids_TK)
    else:
        ids_TK = forced_ids_TK
        valid_TK = (ids_TK >= 0) & (ids_TK < logits_TE.size(1))
        w_TK = probs_TE.gather(1, ids_TK.clamp(0, logits_TE.size(1) - 1)) * valid_TK
    if renorm:
        w_TK = w_TK / w_TK.sum(dim=-1, keepdim=True)
    return w_TK, ids_TK


def expert_counts(ids_TK: torch.Tensor, num_experts: int, block: int = 1) -> tuple[torch.Tensor, torch.Tensor]:
    """Tokens routed to each expert (counts_E, int32) and group starts padded to `block`
    (offsets_E1, int32, offsets_E1[0] = 0). No token is dropped."""
    ids_S = ids_TK.reshape(-1)
    valid_S = (ids_S >= 0) & (ids_S < num_experts)
    counts_E = torch.bincount(ids_S[valid_S], minlength=num_experts).to(torch.int32)
    padded_E = (counts_E + block - 1) // block * block
    offsets_E1 = torch.cat([padded_E.new_zeros(1), torch.cumsum(padded_E, 0)]).to(torch.int32)
    return counts_E, offsets_E1


def permute(x_TD: torch.Tensor, ids_TK: torch.Tensor, offsets_E1: torch.Tensor,
            block: int = 1) -> tuple[torch.Tensor, torch.Tensor]:
    """Gather token rows into expert-sorted order (stable). Returns xs_PD (padding rows zero) and
    pos_TK, the row of xs each slot went to (-1 for a dropped slot)."""
    T, K = ids_TK.shape
    E = offsets_E1.numel() - 1
    ids_S = ids_TK.reshape(-1)
    key_S = torch.where((ids_S >= 0) & (ids_S < E), ids_S, torch.full_like(ids_S, E))
    order_S = torch.sort(key_S, stable=True).indices
    sorted_e_S = key_S[order_S]
    counts_E1 = torch.bincount(key_S, minlength=E + 1)
    starts_E1 = torch.cumsum(counts_E1, 0) - counts_E1
    rank_S = torch.arange(ids_S.numel(), device=ids_S.device) - starts_E1[sorted_e_S]
    offsets_ext = torch.cat([offsets_E1.long()[:E], offsets_E1.new_full((1,), -1).long()])
    pos_sorted_S = torch.where(sorted_e_S < E, offsets_ext[sorted_e_S] + rank_S, torch.full_like(rank_S, -1))
    pos_S = torch.empty_like(pos_sorted_S)
    pos_S[order_S] = pos_sorted_S
    xs_PD = x_TD.new_zeros(permuted_rows(T * K, E, block), x_TD.size(1))
    valid_S = pos_S >= 0
    token_S = torch.arange(T * K, device=x_TD.device) // K
    xs_PD = xs_PD.index_put((pos_S[valid_S],), x_TD[token_S[valid_S]])
    return xs_PD, pos_S.view(T, K)


def unpermute_combine(ys_PD: torch.Tensor, pos_TK: torch.Tensor, w_TK: torch.Tensor) -> torch.Tensor:
    """out_TD[t] = sum_k w_TK[t, k] * ys_PD[pos_TK[t, k]], accumulated in fp32 (fp64 for fp64)."""
    acc = acc_dtype(ys_PD.dtype)
    valid_TK = pos_TK >= 0
    rows_TKD = ys_PD[pos_TK.clamp(min=0)].to(acc) * valid_TK.unsqueeze(-1)
    return (rows_TKD * w_TK.to(acc).unsqueeze(-1)).sum(dim=1).to(ys_PD.dtype)


def grouped_mm_loop(xs_PI: torch.Tensor, w_EIO: torch.Tensor, offsets_E1: torch.Tensor) -> torch.Tensor:
    """Per-expert GEMM over the row groups offsets_E1[e]:offsets_E1[e+1]; rows past offsets_E1[-1]
    give zeros. Differentiable through plain torch ops."""
    bounds = offsets_E1.tolist()  # one host sync for the whole loop
    parts = []
    for e in range(w_EIO.size(0)):
        if bounds[e + 1] > bounds[e]:
            parts.append(xs_PI[bounds[e]:bounds[e + 1]] @ w_EIO[e])
        else:
            parts.append(xs_PI.new_zeros(0, w_EIO.size(2)))
    tail = xs_PI.size(0) - bounds[-1]
    parts.append(xs_PI.new_zeros(tail, w_EIO.size(2)))
    return torch.cat(parts)


def decode_attention(qkv_NJd: torch.Tensor, norm_w: torch.Tensor | None, cos_Nd: torch.Tensor, sin_Nd: torch.Tensor,
                     k_cache: torch.Tensor, v_cache: torch.Tensor, length: int, bias_NT: torch.Tensor,
                     scale: float, eps: float) -> torch.Tensor:
    """Attention of one new token per row, as a decoder layer computes it after its q/k/v projection.

    qkv_NJd: (N, H + 2 Hkv, d) projected heads: H query, Hkv key, Hkv value heads. Queries and keys
    are RMS-normalised per head when `norm_w` (H + Hkv, d) is given (Qwen3), then rotated by
    (cos_Nd, sin_Nd); the new key/value are written into k_cache/v_cache (N, Hkv, capacity, d) at
    `length`; query head i attends over the row's length+1 cached keys of key/value head
    i // (H / Hkv), scores x scale + bias_NT (N, length+1; 0 or -inf). Returns (N, H*d)."""
    n, j, d = qkv_NJd.shape
    hkv = k_cache.size(1)
    h = j - 2 * hkv
    qk, v = qkv_NJd[:, :h + hkv], qkv_NJd[:, h + hkv:]
    if norm_w is not None:
        f = qk.float()
        qk = norm_w * (f * torch.rsqrt(f.pow(2).mean(-1, keepdim=True) + eps)).to(qk.dtype)
    half = d // 2
    qk = qk * cos_Nd[:, None] + torch.cat((-qk[..., half:], qk[..., :half]), dim=-1) * sin_Nd[:, None]
    k_cache[:, :, length] = qk[:, h:]
    v_cache[:, :, length] = v
    keys, values = k_cache[:, :, :length + 1], v_cache[:, :, :length + 1]
    att = torch.matmul(qk[:, :h].reshape(n, hkv, h // hkv, d), keys.transpose(-1, -2)) * scale
    att = torch.softmax((att + bias_NT[:, None, None]).float(), dim=-1).to(qkv_NJd.dtype)
    return torch.matmul(att, values).reshape(n, h * d)
