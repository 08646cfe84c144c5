"""Loss terms as pure functions: tensors in, (loss, metrics) out.

Every term is a SUM over its tokens divided by one normaliser `norm` that the trainer fixes for
the whole step, across gradient-accumulation micro-batches and ranks (as TRL's
`num_items_in_batch`). A term's value is then its share of the step's objective, the shares of all
micro-batches and ranks add up to the objective, and the update does not depend on how the step
is split. `method.loss_norm` picks the normaliser (`normaliser` below):

    token     the number of real completion tokens in the step (DAPO's token-level mean): a long
              answer weighs by its tokens; the scale moves with the step's lengths
    constant  rows x max_new_tokens (Dr. GRPO): a fixed constant, so no length normalisation at
              all; a token's weight does not depend on what else is in the batch

Distillation terms use the same `norm`, so distillation's share of the gradient shrinks when
failures (and so distilled tokens) get rare, instead of a single hinted token carrying the full
coefficient.

Shapes: N sequences, C completion tokens, V vocabulary, B groups. `mask_NC` marks the tokens a
term sums over.
"""
from __future__ import annotations

import math

import torch


def normaliser(kind: str, real_tokens: int, rows: int, max_new_tokens: int) -> float:
    """The step's divisor: `token` -> real completion tokens, `constant` -> rows x max_new_tokens."""
    if kind == "token":
        return float(max(1, real_tokens))
    if kind == "constant":
        return float(max(1, rows * max_new_tokens))
    raise ValueError(f"loss_norm={kind!r}: choose token or constant")


def group_advantages(rewards_N: torch.Tensor, group_N: torch.Tensor, std_norm: bool = False) -> torch.Tensor:
    """A_n = r_n - mean of r over n's group (Dr. GRPO); with std_norm divided by the group's
    (unbiased) std + 1e-4 as in GRPO, and 0 where that std is 0 or undefined (a group of one)."""
    b = int(group_N.max()) + 1 if len(group_N) else 0
    r = rewards_N.float()
    count_B = torch.zeros(b, device=r.device).index_add_(0, group_N, torch.ones_like(r))
    mean_B = torch.zeros(b, device=r.device).index_add_(0, group_N, r) / count_B
    adv_N = r - mean_B[group_N]
    if std_norm:
        sq_B = torch.zeros(b, device=r.device).index_add_(0, group_N, adv_N ** 2)
        std_B = (sq_B / (count_B - 1).clamp(min=1)).sqrt()
        std_N = std_B[group_N]
        adv_N = torch.where((std_N > 0) & (count_B[group_N] > 1), adv_N / (std_N + 1e-4), torch.zeros_like(adv_N))
    return adv_N


def policy_gradient_loss(logp_NC, old_logp_NC, adv_N, mask_NC, norm: float, clip_eps: float = 0.2,
                         weight_N=None):
    """PPO-clip:  L = -1/norm Σ_{n,t} w_n min(ρ A_n, clip(ρ, 1-ε, 1+ε) A_n),  ρ = exp(logp - old_logp).

    With one optimisation epoch per batch ρ is 1 up to numerics and L's gradient is the plain
    policy gradient; the clip guards the rare stale token. `train/clip_frac` is the share of this
    call's real tokens where the clip changes the objective (ρ > 1+ε with A > 0, or ρ < 1-ε with
    A < 0), which are exactly the tokens whose gradient it removes.
    """
    ratio = torch.exp(logp_NC - old_logp_NC)
    adv = adv_N[:, None]
    unclipped, clipped = ratio * adv, ratio.clamp(1 - clip_eps, 1 + clip_eps) * adv
    per_token = torch.minimum(unclipped, clipped)
    if weight_N is not None:
        per_token = per_token * weight_N[:, None]
    loss = -_masked_sum(per_token, mask_NC) / norm
    with torch.no_grad():
        clip_frac = _mean((clipped < unclipped).float(), mask_NC)
    return loss, {"loss/pg": loss.item(), "train/clip_frac": clip_frac}


CORRECTION_WEIGHTS = ("guide", "luffy", "is", "sft")


def guide_gamma(logp_NC, behaviour_logp_NC, mask_NC, quantile: float = 0.9) -> float:
    """Guide's γ: the `quantile` of r = π_θ / π_b over the real tokens of mask_NC, floored at 1e-4
    (guide_rl: torch.quantile over the off-policy tokens, clamp(min=1e-4)); 1 for no tokens."""
    mask = mask_NC.bool()
    ratio = torch.exp((logp_NC - behaviour_logp_NC).detach()[mask])
    return max(torch.quantile(ratio, quantile).item(), 1e-4) if ratio.numel() else 1.0


def corrected_trajectory_loss(logp_NC, behaviour_logp_NC, adv_N, mask_NC, norm: float, weight: str = "guide",
                              is_clip: float = 2.0, shape_gamma: float = 0.1, guide_quantile: float = 0.9,
                              gamma: float | None = None):
    """Policy gradient for rows sampled from another distribution: corrected trajectories, sampled
    with the hint h in context, trained without it. Per token t of a corrected row with advantage A,
    π_θ = π_θ(y_t | x, y_<t) (no hint), π_b = π_old(y_t | x, h, y_<t) (the hinted sampler), and
    r = π_θ / π_b. Each choice is an objective J = Σ_t f_t · A whose gradient is w_t · A · ∇log π_θ;
    the *gradient weight* w_t (= ∂f/∂log π_θ) is what decides whether a hint-supplied token,
    unlikely without the hint, is learned:

        guide  f = r / (r + γ), γ = the `guide_quantile` (0.9) quantile of r over the step's corrected
               tokens, floored at 1e-4, detached; no clip.            w = γ r / (r + γ)²
               (`gamma`: γ fixed by the caller for the whole step, so that splitting the step into
               micro-batches does not change it; None: taken over this call's tokens, `guide_gamma`.)
               Guide-GRPO (Nath et al., arXiv 2506.13923, Eq. 6 with the percentile γ of its code,
               guide_rl core_algos.compute_policy_loss, gamma_strategy="percentile"). γ moves with
               the batch, so a token at the batch's typical ratio keeps weight ~1/4 however small
               the ratios of the whole batch are.
        luffy  f = π_θ / (π_θ + γ), γ = `shape_gamma` (0.1), the behaviour probability taken as 1;
               no clip.                                               w = γ π_θ / (π_θ + γ)²
               LUFFY (Yan et al., arXiv 2504.14945, Eq. 6, policy shaping); Critique-GRPO likewise.
               For small π_θ, w ≈ π_θ / γ: ten times the raw ratio, still → 0 as π_θ → 0.
        is     f = min(r, c) · log π_θ with the weight detached, c = `is_clip`.   w = min(r, c)
               Truncated importance sampling. For a token the hint supplies, π_b ≈ 1 and w ≈ π_θ:
               the gradient vanishes exactly where the hint-free student finds the token unlikely.
        sft    f = log π_θ on corrections with A > 0, nothing on the others.     w = 1 (A > 0)
               STaR's rationalization (Zelikman et al., arXiv 2203.14465, Sec. 3.2): supervised
               learning on the verified corrections with the hint removed, here scaled by A so that
               its share of the step matches the policy-gradient rows'.

    Every term is summed over mask_NC and divided by `norm` (rl/losses.py's convention). Per token,
    not per sequence: a product of a sequence's ratios has a variance exponential in its length; the
    product is reported instead (`corrected/seq_weight`, over successful corrections).

    Metrics: corrected/weight_pos_mean (mean gradient weight w on tokens with A > 0, the number that
    says how much a successful correction teaches), corrected/is_ratio_mean (mean r: ≈ 1 by identity,
    E_{y~π_b}[π_θ/π_b] = 1 at every position, whatever the hint does, so it says little),
    corrected/is_clipped_frac (`is`), corrected/guide_gamma (`guide`). Returns also, outside the
    metrics dict, the per-row product of w over each row's tokens (`seq_weight_N`, detached).
    """
    if weight not in CORRECTION_WEIGHTS:
        raise ValueError(f"method.weight={weight!r}: choose one of {CORRECTION_WEIGHTS}")
    mask = mask_NC.bool()
    zero = torch.zeros((), dtype=logp_NC.dtype, device=logp_NC.device)
    # Masked-out positions may hold -inf (padding): exp(-inf - -inf) is NaN, and a NaN reaches the
    # gradient through a select's zero, so they are replaced before any arithmetic.
    logp_NC = torch.where(mask, logp_NC, zero)
    behaviour_logp_NC = torch.where(mask, behaviour_logp_NC, zero)
    adv_NC = adv_N[:, None].expand_as(logp_NC)
    log_ratio_NC = logp_NC - behaviour_logp_NC
    metrics = {}
    if weight == "guide":
        ratio_NC = torch.exp(log_ratio_NC)
        if gamma is None:
            gamma = guide_gamma(logp_NC, behaviour_logp_NC, mask_NC, guide_quantile)
        f_NC = ratio_NC / (ratio_NC + gamma)
        w_NC = (gamma * ratio_NC / (ratio_NC + gamma) ** 2).detach()
        metrics["corrected/guide_gamma"] = gamma
    elif weight == "luffy":
        p_NC = torch.exp(logp_NC)
        f_NC = p_NC / (p_NC + shape_gamma)
        w_NC = (shape_gamma * p_NC / (p_NC + shape_gamma) ** 2).detach()
    elif weight == "is":
        w_NC = torch.exp(log_ratio_NC.detach()).clamp(max=is_clip)
        # value w·1 at the current parameters, gradient w·∇log π_θ
        f_NC = w_NC * torch.exp(logp_NC - logp_NC.detach())
        metrics["corrected/is_clipped_frac"] = _mean((log_ratio_NC.detach().exp() > is_clip).float(), mask_NC)
    else:  # sft
        w_NC = (adv_NC > 0).to(logp_NC.dtype)
        f_NC = w_NC * logp_NC
    loss = -_masked_sum(f_NC * adv_NC, mask_NC) / norm
    with torch.no_grad():
        positive = mask & (adv_NC > 0)
        seq_weight_N = torch.where(mask, w_NC.clamp(min=1e-30).log(), zero).sum(1).exp()
        metrics.update({"loss/pg_corrected": loss.item(), "corrected/weight_pos_mean": _mean(w_NC, positive),
                        "corrected/is_ratio_mean": _mean(log_ratio_NC.exp(), mask_NC)})
    return loss, metrics, seq_weight_N


def span_to_first_divergence(teacher_argmax_NC, tokens_NC, mask_NC):
    """Keep tokens up to and including the first one the teacher would not have produced.

    Past that token the student's prefix is one the hinted teacher already rejects, and its
    distribution there says "this attempt is wrong, keep going" (e.g. no <eos> after a wrong
    digit), a preference the hint-free student cannot act on. Distilling those positions taught
    a 1M-parameter student to stop ending its answers (experiments/default/README.md).
    """
    disagree_NC = (teacher_argmax_NC != tokens_NC) & mask_NC
    disagreements_before_NC = disagree_NC.long().cumsum(-1) - disagree_NC.long()
    return mask_NC & (disagreements_before_NC == 0)


def distill_kl_loss(student_logp_NCV, teacher_logp_NCV, mask_NC, norm: float, kind: str = "reverse"):
    """Full-vocabulary divergence per token between student s and (detached) teacher t, summed
    over mask_NC and divided by norm.

    reverse: KL(s‖t) = Σ_v s_v (log s_v − log t_v)   mode-seeking, the on-policy distillation choice
    forward: KL(t‖s) = Σ_v t_v (log t_v − log s_v)   mass-covering, cross-entropy to t
    jsd:     ½ KL(s‖m) + ½ KL(t‖m),  m = ½ (s + t)
    Tokens where a distribution is 0 (banned ids: log-prob -inf) contribute 0.
    """
    kl = divergence(student_logp_NCV, teacher_logp_NCV.detach(), kind)
    loss = _masked_sum(kl, mask_NC) / norm
    return loss, {"loss/distill": loss.item(), "hint/kl_per_token": _mean(kl.detach(), mask_NC)}


def divergence(s, t, kind: str):
    """Per-position divergence between log-distributions s (student) and t (teacher) over the last axis."""
    if kind == "reverse":
        return _xlogy_diff(s, s, t)
    if kind == "forward":
        return _xlogy_diff(t, t, s)
    if kind == "jsd":
        m = torch.logaddexp(s, t) - math.log(2.0)
        return 0.5 * _xlogy_diff(s, s, m) + 0.5 * _xlogy_diff(t, t, m)
    raise ValueError(f"distill kind {kind!r}: choose reverse, forward or jsd")


def _log_rest(top_logp_NCK):
    """log(1 - Σ_k exp(top)), the log-mass outside the top k, floored at log(1e-12) so that a
    top-k holding (numerically) all the mass gives a finite bucket and a finite gradient."""
    return torch.log((-torch.expm1(torch.logsumexp(top_logp_NCK, dim=-1))).clamp(min=1e-12))


def topk_distill_loss(student_logp_NCV, teacher_topk_logp_NCK, teacher_topk_ids_NCK, mask_NC, norm: float,
                      kind: str = "reverse"):
    """The divergence over K + 1 buckets: the teacher's k most likely tokens, and all the others
    as one tail bucket (SDPO's top-k distillation with the tail added). The student's bucket
    log-probs are its log-probs at the teacher's top-k ids and the log of its remaining mass.

    Why the teacher's support and not the student's (SDPO's local objective uses the student's
    top-k): teacher scores are computed before the training forward and keep only O(k) numbers
    per token; the student's top-k is known only in that forward. Student mass outside the
    teacher's top-k is still penalised, through the tail bucket. TRL's SDPO does the same when
    its teacher is served.
    """
    s_top = student_logp_NCV.gather(-1, teacher_topk_ids_NCK)
    s = torch.cat([s_top, _log_rest(s_top)[..., None]], dim=-1)
    t_top = teacher_topk_logp_NCK.detach()
    t = torch.cat([t_top, _log_rest(t_top)[..., None]], dim=-1)
    kl = divergence(s, t, kind)
    loss = _masked_sum(kl, mask_NC) / norm
    return loss, {"loss/distill": loss.item(), "hint/kl_per_token": _mean(kl.detach(), mask_NC)}


def _xlogy_diff(p_log, a_log, b_log):
    """Σ_v exp(p_log) (a_log - b_log), with 0 where exp(p_log) is 0 (no -inf - -inf NaNs)."""
    diff = torch.where(torch.isinf(p_log), torch.zeros_like(a_log), a_log - b_log)
    return (p_log.exp() * diff).sum(-1)


def sampled_distill_loss(student_logp_NC, teacher_logp_NC, mask_NC, norm: float):
    """Reverse KL on sampled tokens only (on-policy distillation with a per-token advantage):

        A_t = −(log s(y_t) − log t(y_t)),  L = −1/norm Σ_t A_t · log s(y_t)   (A_t detached)

    For y_t ~ s its expected gradient is that of Σ_t KL(s‖t) at each position (the score-function
    identity: E_s[∇ log s · (log s − log t)] = ∇ KL(s‖t)). Reports the k1 estimate of the KL.
    """
    adv = torch.where(mask_NC, -(student_logp_NC - teacher_logp_NC).detach(), 0.0)
    loss = -_masked_sum(adv * student_logp_NC, mask_NC) / norm
    return loss, {"loss/distill": loss.item(), "hint/kl_per_token": _mean(-adv, mask_NC)}


def sft_loss(logp_NC, mask_NC, norm: float):
    """Negative log-likelihood of demonstration tokens, summed and divided by norm."""
    loss = -_masked_sum(logp_NC, mask_NC) / norm
    return loss, {"loss/sft": loss.item()}


def _masked_sum(x_NC, mask_NC) -> torch.Tensor:
    """Σ x over mask_NC. A select, not a product: positions outside the mask may hold -inf (the
    log-prob of a padding token, which the policy never samples) and -inf * 0 is NaN."""
    return torch.where(mask_NC.bool(), x_NC, torch.zeros((), dtype=x_NC.dtype, device=x_NC.device)).sum()


def _mean(x_NC, mask_NC) -> float:
    return (_masked_sum(x_NC, mask_NC) / mask_NC.sum().clamp(min=1)).item()
