"""Loss terms as pure functions: tensors in, (loss, metrics) out.

Shapes: B prompts, G attempts per prompt, N = B*G sequences (or the hinted subset), C completion
tokens, V vocabulary. `mask_NC` marks real completion tokens. All token sums are normalised by
the number of real tokens in the batch (token-level normalisation, as in DAPO / Dr. GRPO), so a
long answer weighs by its tokens, not as one sample.
"""
from __future__ import annotations

import torch


def group_advantages(rewards_BG: torch.Tensor, std_norm: bool = False) -> torch.Tensor:
    """A_bg = r_bg - mean_g r_bg   (Dr. GRPO; with std_norm, divided by std_g + 1e-4 as in GRPO)."""
    adv = rewards_BG - rewards_BG.mean(dim=1, keepdim=True)
    if std_norm:
        adv = adv / (rewards_BG.std(dim=1, keepdim=True) + 1e-4)
    return adv


def _token_mean(x_NC: torch.Tensor, mask_NC: torch.Tensor) -> torch.Tensor:
    return (x_NC * mask_NC).sum() / mask_NC.sum().clamp(min=1)


def policy_gradient_loss(logp_NC, old_logp_NC, adv_N, mask_NC, clip_eps: float = 0.2):
    """PPO-clip:  L = -1/T Σ_{n,t} min(ρ A_n, clip(ρ, 1-ε, 1+ε) A_n),  ρ = exp(logp - old_logp).

    With one optimisation epoch per batch ρ is 1 up to numerics, and L's gradient is the plain
    policy gradient; the clip guards the rare stale token.
    """
    mask = mask_NC.float()
    ratio = torch.exp(logp_NC - old_logp_NC)
    adv = adv_N[:, None]
    unclipped, clipped = ratio * adv, ratio.clamp(1 - clip_eps, 1 + clip_eps) * adv
    loss = -_token_mean(torch.minimum(unclipped, clipped), mask)
    with torch.no_grad():
        clip_frac = _token_mean(((ratio - 1).abs() > clip_eps).float(), mask)
    return loss, {"loss/pg": loss.item(), "train/clip_frac": clip_frac.item()}


def span_to_first_divergence(teacher_logp_NCV, tokens_NC, mask_NC):
    """Keep tokens up to and including the first one the teacher would not have produced.

    Past that token the student's prefix is one the hinted teacher already rejects, and its
    distribution there says "this attempt is wrong, keep going" (e.g. no <eos> after a wrong
    digit) — a preference the hint-free student cannot act on. Distilling those positions taught
    a 1M-parameter student to stop ending its answers (experiments/default/README.md).
    """
    disagree_NC = (teacher_logp_NCV.argmax(-1) != tokens_NC) & mask_NC
    disagreements_before_NC = disagree_NC.long().cumsum(-1) - disagree_NC.long()
    return mask_NC & (disagreements_before_NC == 0)


def distill_kl_loss(student_logp_NCV, teacher_logp_NCV, mask_NC, kind: str = "reverse"):
    """Full-vocabulary KL per token between student s and (detached) teacher t, token-mean.

    reverse: KL(s‖t) = Σ_v s_v (log s_v − log t_v)   mode-seeking, the on-policy distillation choice
    forward: KL(t‖s) = Σ_v t_v (log t_v − log s_v)   mass-covering, cross-entropy to t
    jsd:     ½ KL(s‖m) + ½ KL(t‖m),  m = ½ (s + t)
    """
    s, t = student_logp_NCV, teacher_logp_NCV.detach()
    if kind == "reverse":
        kl = (s.exp() * (s - t)).sum(-1)
    elif kind == "forward":
        kl = (t.exp() * (t - s)).sum(-1)
    elif kind == "jsd":
        m = torch.logaddexp(s, t) - torch.log(torch.tensor(2.0))
        kl = 0.5 * (s.exp() * (s - m)).sum(-1) + 0.5 * (t.exp() * (t - m)).sum(-1)
    else:
        raise ValueError(f"distill kind {kind!r}: choose reverse, forward or jsd")
    loss = _token_mean(kl, mask_NC.float())
    return loss, {"loss/distill": loss.item()}


def sampled_distill_loss(student_logp_NC, teacher_logp_NC, mask_NC):
    """Reverse KL on sampled tokens only (on-policy distillation with a per-token advantage):

        A_t = −(log s(y_t) − log t(y_t)),  L = −1/T Σ_t A_t · log s(y_t)   (A_t detached)

    Its expected gradient equals that of KL(s‖t) when y_t ~ s. Reports the k1 KL estimate.
    """
    mask = mask_NC.float()
    adv = -(student_logp_NC - teacher_logp_NC).detach()
    loss = -_token_mean(adv * student_logp_NC, mask)
    return loss, {"loss/distill": _token_mean(-adv, mask).item()}


def sft_loss(logp_NC, mask_NC):
    """Negative log-likelihood of demonstration tokens, token-mean."""
    loss = -_token_mean(logp_NC, mask_NC.float())
    return loss, {"loss/sft": loss.item()}
