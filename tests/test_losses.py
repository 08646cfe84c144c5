"""Each loss on small cases worked out by hand. Every term divides its sum by the step's
normaliser (rl/losses.py); the cases pass the number of real tokens, i.e. `loss_norm=token`."""
import math

import torch

import pytest

from rl.losses import (corrected_trajectory_loss, distill_kl_loss, group_advantages, normaliser,
                       policy_gradient_loss, sampled_distill_loss, sft_loss, span_to_first_divergence,
                       topk_distill_loss)


def test_group_advantages_dr_grpo_and_std():
    r = torch.tensor([1.0, 0.0, 0.0, 1.0, 1.0, 1.0, 1.0, 1.0])
    g = torch.tensor([0, 0, 0, 0, 1, 1, 1, 1])
    assert torch.equal(group_advantages(r, g), torch.tensor([0.5, -0.5, -0.5, 0.5] + [0.0] * 4))
    # std of [1,0,0,1] (unbiased) = sqrt(1/3); a constant group has std 0 and gets 0, not NaN
    expected = 0.5 / (math.sqrt(1 / 3) + 1e-4)
    std = group_advantages(r, g, std_norm=True)
    assert torch.allclose(std[:4], torch.tensor([1, -1, -1, 1.0]) * expected)
    assert torch.equal(std[4:], torch.zeros(4))


def test_group_advantages_follow_the_group_index_not_the_order():
    # groups interleaved and of different sizes (a method may add rows to a group)
    r = torch.tensor([1.0, 0.0, 0.0, 1.0, 0.0])
    g = torch.tensor([0, 1, 0, 1, 0])
    assert torch.allclose(group_advantages(r, g), torch.tensor([2 / 3, -0.5, -1 / 3, 0.5, -1 / 3]))
    # a group of one has no spread: 0 with std normalisation too
    assert group_advantages(torch.tensor([1.0]), torch.tensor([0]), std_norm=True).tolist() == [0.0]


def test_normalisers():
    assert normaliser("token", real_tokens=37, rows=8, max_new_tokens=6) == 37.0
    assert normaliser("constant", real_tokens=37, rows=8, max_new_tokens=6) == 48.0
    assert normaliser("token", real_tokens=0, rows=8, max_new_tokens=6) == 1.0     # nothing to divide
    with pytest.raises(ValueError, match="token or constant"):
        normaliser("sequence", 1, 1, 1)


def test_policy_gradient_on_policy_is_token_mean_of_minus_advantage():
    logp = torch.log(torch.tensor([[0.5, 0.25, 0.9], [0.2, 0.4, 0.1]]))
    mask = torch.tensor([[True, True, False], [True, True, True]])
    adv = torch.tensor([1.0, -2.0])
    loss, m = policy_gradient_loss(logp, logp.clone(), adv, mask, norm=5)
    # ratio = 1: per-token -A, masked sum over 5 tokens / 5 = -(1 + 1 - 2 - 2 - 2) / 5 = 0.8
    assert math.isclose(loss.item(), 0.8, rel_tol=1e-6)
    assert m["train/clip_frac"] == 0.0


def test_policy_gradient_gradient_is_minus_advantage_over_tokens():
    logp = torch.zeros(1, 2, requires_grad=True)
    loss, _ = policy_gradient_loss(logp, torch.zeros(1, 2), torch.tensor([3.0]), torch.ones(1, 2, dtype=torch.bool),
                                   norm=2)
    loss.backward()
    assert torch.allclose(logp.grad, torch.tensor([[-1.5, -1.5]]))


def test_policy_gradient_row_weights_and_constant_normaliser():
    logp = torch.zeros(2, 3, requires_grad=True)
    mask = torch.tensor([[True, True, False], [True, False, False]])
    loss, _ = policy_gradient_loss(logp, torch.zeros(2, 3), torch.tensor([1.0, 1.0]), mask, norm=2 * 3,
                                   weight_N=torch.tensor([1.0, 0.5]))
    # Dr. GRPO's constant: rows x max_new_tokens = 6, whatever the lengths; row 1 weighs half
    assert math.isclose(loss.item(), -(1 + 1 + 0.5) / 6, rel_tol=1e-6)
    loss.backward()
    assert torch.allclose(logp.grad, torch.tensor([[-1 / 6, -1 / 6, 0], [-0.5 / 6, 0, 0]]))


def test_masked_out_minus_infinity_does_not_poison_the_loss():
    # a padding position's token is never sampled: its log-prob is -inf; it must not make NaN
    logp = torch.tensor([[-0.5, float("-inf")]], requires_grad=True)
    mask = torch.tensor([[True, False]])
    loss, _ = policy_gradient_loss(logp, torch.tensor([[-0.5, 0.0]]), torch.tensor([1.0]), mask, norm=1)
    sft, _ = sft_loss(logp, mask, norm=1)
    (loss + sft).backward()
    assert torch.isfinite(loss) and torch.isfinite(sft) and torch.isfinite(logp.grad).all()


def test_policy_gradient_clips_ratio():
    # ratio = e^1 = 2.718 > 1.2 with A > 0: clipped objective 1.2 * A wins the min.
    logp, old = torch.tensor([[1.0]], requires_grad=True), torch.tensor([[0.0]])
    one = torch.ones(1, 1, dtype=torch.bool)
    loss, m = policy_gradient_loss(logp, old, torch.tensor([2.0]), one, 1, 0.2)
    assert math.isclose(loss.item(), -2.4, rel_tol=1e-6) and m["train/clip_frac"] == 1.0
    loss.backward()
    assert logp.grad.abs().sum() == 0          # clipped tokens carry no gradient
    # With A < 0 the unclipped (more pessimistic) term wins: -min(2.718*-2, 1.2*-2) = 5.436, and the
    # clip changes nothing there, so it does not count as clipped
    loss, m = policy_gradient_loss(torch.tensor([[1.0]]), old, torch.tensor([-2.0]), one, 1, 0.2)
    assert math.isclose(loss.item(), 2 * math.e, rel_tol=1e-6) and m["train/clip_frac"] == 0.0
    # ratio below 1 - eps: clipped only where the advantage is negative
    low = torch.tensor([[-1.0]])
    assert policy_gradient_loss(low, old, torch.tensor([-1.0]), one, 1, 0.2)[1]["train/clip_frac"] == 1.0
    assert policy_gradient_loss(low, old, torch.tensor([1.0]), one, 1, 0.2)[1]["train/clip_frac"] == 0.0


def _two_token_case():
    s = torch.log(torch.tensor([[[0.5, 0.5], [0.9, 0.1]]]))
    t = torch.log(torch.tensor([[[0.25, 0.75], [0.9, 0.1]]]))
    return s, t, torch.ones(1, 2, dtype=torch.bool)


def test_reverse_kl_by_hand():
    s, t, mask = _two_token_case()
    # token 0: 0.5 ln(0.5/0.25) + 0.5 ln(0.5/0.75); token 1: 0
    kl0 = 0.5 * math.log(2) + 0.5 * math.log(2 / 3)
    loss, _ = distill_kl_loss(s, t, mask, 2, "reverse")
    assert math.isclose(loss.item(), kl0 / 2, rel_tol=1e-5)


def test_forward_kl_by_hand():
    s, t, mask = _two_token_case()
    kl0 = 0.25 * math.log(0.5) + 0.75 * math.log(1.5)
    loss, _ = distill_kl_loss(s, t, mask, 2, "forward")
    assert math.isclose(loss.item(), kl0 / 2, rel_tol=1e-5)


def test_jsd_by_hand_and_symmetric():
    s, t, mask = _two_token_case()
    m = [0.375, 0.625]
    js0 = 0.5 * (0.5 * math.log(0.5 / m[0]) + 0.5 * math.log(0.5 / m[1])) \
        + 0.5 * (0.25 * math.log(0.25 / m[0]) + 0.75 * math.log(0.75 / m[1]))
    loss, _ = distill_kl_loss(s, t, mask, 2, "jsd")
    assert math.isclose(loss.item(), js0 / 2, rel_tol=1e-5)
    assert math.isclose(distill_kl_loss(t, s, mask, 2, "jsd")[0].item(), loss.item(), rel_tol=1e-6)


@pytest.mark.parametrize("kind", ["reverse", "forward", "jsd"])
def test_divergences_ignore_tokens_both_sides_rule_out(kind):
    # banned ids have log-prob -inf in student and teacher: 0 * (-inf - -inf) must not be NaN
    inf = float("-inf")
    s = torch.log(torch.tensor([[[0.5, 0.5, 0.0]]])).requires_grad_(True)
    t = torch.tensor([[[math.log(0.25), math.log(0.75), inf]]])
    loss, _ = distill_kl_loss(s, t, torch.ones(1, 1, dtype=torch.bool), 1, kind)
    loss.backward()
    assert torch.isfinite(loss) and torch.isfinite(s.grad[..., :2]).all()
    finite, _ = distill_kl_loss(s.detach()[..., :2], t[..., :2], torch.ones(1, 1, dtype=torch.bool), 1, kind)
    assert math.isclose(loss.item(), finite.item(), rel_tol=1e-6)


def test_distill_gradient_reaches_student_only():
    s, t, mask = _two_token_case()
    s.requires_grad_(True)
    t.requires_grad_(True)
    distill_kl_loss(s, t, mask, 2, "reverse")[0].backward()
    assert s.grad.abs().sum() > 0 and t.grad is None


def test_sampled_distill_advantage_and_estimate():
    s = torch.log(torch.tensor([[0.5, 0.2]])).requires_grad_(True)
    t = torch.log(torch.tensor([[0.25, 0.4]]))
    loss, m = sampled_distill_loss(s, t, torch.ones(1, 2, dtype=torch.bool), 2)
    # k1 estimate: mean(log s - log t) = (ln 2 + ln 0.5) / 2 = 0
    assert math.isclose(m["hint/kl_per_token"], 0.0, abs_tol=1e-6)
    loss.backward()
    # d/ds_t of -(A_t s_t)/2 = -A_t/2 with A = -(ln2, -ln2): grads (ln2/2, -ln2/2)
    assert torch.allclose(s.grad, torch.tensor([[math.log(2) / 2, -math.log(2) / 2]]))


def test_sft_is_masked_nll_over_the_normaliser():
    logp = torch.log(torch.tensor([[0.5, 0.25, 0.1]]))
    loss, _ = sft_loss(logp, torch.tensor([[True, True, False]]), 2)
    assert math.isclose(loss.item(), (math.log(2) + math.log(4)) / 2, rel_tol=1e-6)


def test_distill_span_stops_after_first_teacher_disagreement():
    # teacher argmax per position: 1, 2, 0, 0 ; student tokens: 1, 0, 0, 3 -> disagrees at t=1
    t = torch.log(torch.tensor([[[0.1, 0.7, 0.1, 0.1], [0.1, 0.1, 0.7, 0.1],
                                 [0.7, 0.1, 0.1, 0.1], [0.7, 0.1, 0.1, 0.1]]]))
    tokens = torch.tensor([[1, 0, 0, 3]])
    mask = torch.tensor([[True, True, True, True]])
    assert span_to_first_divergence(t.argmax(-1), tokens, mask).tolist() == [[True, True, False, False]]
    # an attempt the teacher fully agrees with keeps every real token, padding stays out
    agree = torch.tensor([[1, 2, 0, 0]])
    assert span_to_first_divergence(t.argmax(-1), agree, torch.tensor([[True, True, True, False]])).tolist() \
        == [[True, True, True, False]]


# ---------------------------------------------------------------------- top-k distillation
def test_topk_distill_by_hand():
    """Buckets = the teacher's top 2 ids + the rest. Student (0.5, 0.3, 0.2) over ids (0, 1, 2), teacher
    (0.1, 0.7, 0.2): teacher top-2 = ids 1, 0 -> teacher buckets (0.7, 0.1, 0.2), student (0.3, 0.5, 0.2)."""
    s = torch.log(torch.tensor([0.5, 0.3, 0.2]))[None, None]
    t = torch.log(torch.tensor([0.1, 0.7, 0.2]))
    top, ids = t.topk(2)
    mask = torch.ones(1, 1, dtype=torch.bool)
    loss, m = topk_distill_loss(s, top[None, None], ids[None, None], mask, norm=2.0, kind="reverse")
    sb, tb = [0.3, 0.5, 0.2], [0.7, 0.1, 0.2]
    expected = sum(p * math.log(p / q) for p, q in zip(sb, tb))
    assert loss.item() == pytest.approx(expected / 2, rel=1e-5)
    assert m["hint/kl_per_token"] == pytest.approx(expected, rel=1e-5)
    fwd, _ = topk_distill_loss(s, top[None, None], ids[None, None], mask, 1.0, "forward")
    assert fwd.item() == pytest.approx(sum(q * math.log(q / p) for p, q in zip(sb, tb)), rel=1e-5)


def test_topk_distill_with_every_token_in_the_top_k_is_the_full_divergence():
    g = torch.Generator().manual_seed(0)
    s = torch.log_softmax(torch.randn(2, 3, 5, generator=g), -1)
    t = torch.log_softmax(torch.randn(2, 3, 5, generator=g), -1)
    mask = torch.tensor([[True, True, False], [True, False, False]])
    top, ids = t.topk(5, dim=-1)
    for kind in ("reverse", "forward", "jsd"):
        full, _ = distill_kl_loss(s, t, mask, 3.0, kind)
        topk, _ = topk_distill_loss(s, top, ids, mask, 3.0, kind)
        # the tail bucket holds (numerically) nothing: floored at 1e-12 on both sides
        assert topk.item() == pytest.approx(full.item(), abs=1e-6), kind


def test_topk_distill_gradient_moves_student_toward_teacher_buckets():
    theta = torch.zeros(1, 1, 4, requires_grad=True)
    t = torch.log(torch.tensor([0.7, 0.2, 0.05, 0.05]))
    top, ids = t.topk(1)
    loss, _ = topk_distill_loss(torch.log_softmax(theta, -1), top[None, None], ids[None, None],
                                torch.ones(1, 1, dtype=torch.bool), 1.0, "jsd")
    loss.backward()
    # descending the loss raises the teacher's top token, lowers the others
    assert theta.grad[0, 0, 0] < 0 and (theta.grad[0, 0, 1:] > 0).all()


# ---------------------------------------------------------------------- corrected rows
def test_truncated_is_weight_value_gradient_and_clip():
    """weight=is: two tokens with ratios 0.5 and 3 (clip 2), advantage 1, norm 4: value -(0.5 + 2) / 4;
    the gradient on each token's log-prob is -min(ratio, clip) * A / norm; a padded -inf stays out."""
    old = torch.log(torch.tensor([[0.4, 0.1, 0.5]]))
    logp = torch.log(torch.tensor([[0.2, 0.3, 0.0]])).requires_grad_(True)    # last: -inf, masked out
    mask = torch.tensor([[True, True, False]])
    loss, m, seq = corrected_trajectory_loss(logp, old, torch.tensor([1.0]), mask, norm=4.0, weight="is", is_clip=2.0)
    assert loss.item() == pytest.approx(-(0.5 + 2.0) / 4, rel=1e-5)
    loss.backward()
    torch.testing.assert_close(logp.grad, torch.tensor([[-0.5 / 4, -2.0 / 4, 0.0]]))
    assert m["corrected/is_ratio_mean"] == pytest.approx((0.5 + 3.0) / 2, rel=1e-5)
    assert m["corrected/is_clipped_frac"] == pytest.approx(0.5)
    assert m["corrected/weight_pos_mean"] == pytest.approx((0.5 + 2.0) / 2, rel=1e-5)
    assert seq.item() == pytest.approx(0.5 * 2.0, rel=1e-5)          # the product of the row's weights
    assert m["loss/pg_corrected"] == pytest.approx(loss.item())


# Three tokens of one corrected row, advantage A = 0.5, norm 2: hint-free probabilities p, hinted
# (behaviour) probabilities b. The first two are tokens the hint supplies (b ≈ 1, p small).
P, B, A, NORM = [0.01, 0.001, 0.4], [0.9, 0.95, 0.5], 0.5, 2.0


def _corrected(weight, **kw):
    logp = torch.log(torch.tensor([P + [1.0]], dtype=torch.float64)).requires_grad_(True)   # 4th: padding
    old = torch.log(torch.tensor([B + [1.0]], dtype=torch.float64))
    mask = torch.tensor([[True, True, True, False]])
    loss, m, seq = corrected_trajectory_loss(logp, old, torch.tensor([A], dtype=torch.float64), mask, NORM, weight, **kw)
    loss.backward()
    return loss.item(), logp.grad[0, :3].tolist(), m, seq.item()


def test_guide_weight_is_the_shaped_ratio_with_the_batch_percentile_gamma():
    """Guide: f = r/(r+γ), γ = the 90th percentile of r over the corrected tokens (torch.quantile's
    linear interpolation), gradient on log π: γ r/(r+γ)² · A; no clip."""
    r = [p / b for p, b in zip(P, B)]
    s = sorted(r)
    gamma = s[1] + 0.8 * (s[2] - s[1])          # position 0.9 * (3 - 1) = 1.8 between the 2nd and 3rd
    value, grad, m, seq = _corrected("guide", guide_quantile=0.9)
    assert value == pytest.approx(-sum(x / (x + gamma) for x in r) * A / NORM, rel=1e-9)
    w = [gamma * x / (x + gamma) ** 2 for x in r]
    assert grad == pytest.approx([-wi * A / NORM for wi in w], rel=1e-9)
    assert m["corrected/guide_gamma"] == pytest.approx(gamma, rel=1e-9)
    assert m["corrected/weight_pos_mean"] == pytest.approx(sum(w) / 3, rel=1e-9)
    assert seq == pytest.approx(w[0] * w[1] * w[2], rel=1e-6)
    # For r << γ the weight is r/γ: with a token at r ≈ 0.8 in the batch γ ≈ 0.64, and the
    # hint-supplied tokens weigh only ~1.5x their raw ratio (the percentile is not a floor).
    assert w[1] == pytest.approx(r[1] / gamma, rel=0.01)


def test_luffy_weight_takes_the_behaviour_probability_as_one():
    """LUFFY: f = π/(π+γ) with the hinted probability ignored, gradient γ π/(π+γ)² · A."""
    gamma = 0.1
    value, grad, m, _ = _corrected("luffy", shape_gamma=gamma)
    assert value == pytest.approx(-sum(p / (p + gamma) for p in P) * A / NORM, rel=1e-9)
    w = [gamma * p / (p + gamma) ** 2 for p in P]
    assert grad == pytest.approx([-wi * A / NORM for wi in w], rel=1e-9)
    assert m["corrected/weight_pos_mean"] == pytest.approx(sum(w) / 3, rel=1e-9)
    # ≈ p/γ for small p: ten times what the truncated ratio gives on a hint-supplied token
    assert w[1] == pytest.approx(P[1] / gamma, rel=0.03)


def test_sft_weight_is_one_and_only_on_successes():
    """STaR: every token of a successful correction gets weight 1 (gradient -A/norm on its log-prob);
    a failed correction (A < 0) is not trained on."""
    value, grad, m, seq = _corrected("sft")
    assert value == pytest.approx(-sum(math.log(p) for p in P) * A / NORM, rel=1e-9)
    assert grad == pytest.approx([-A / NORM] * 3, rel=1e-12)
    assert m["corrected/weight_pos_mean"] == 1.0 and seq == 1.0
    logp = torch.log(torch.tensor([[0.2, 0.3]])).requires_grad_(True)
    loss, _, _ = corrected_trajectory_loss(logp, logp.detach(), torch.tensor([-0.5]), torch.ones(1, 2, dtype=torch.bool),
                                           1.0, "sft")
    loss.backward()
    assert loss.item() == 0.0 and logp.grad.abs().max().item() == 0.0


def test_is_weight_vanishes_on_hint_supplied_tokens():
    """On a hint-supplied token (p = 0.001, b = 0.95) the gradient weight is ~p under every shaped
    weight: `is` gives p/b, guide r/γ (here 1.6x that), luffy p/γ (9x), sft 1 (~1000x)."""
    g = {w: abs(_corrected(w)[1][1]) for w in ("is", "guide", "luffy", "sft")}
    assert g["is"] == pytest.approx((P[1] / B[1]) * A / NORM, rel=1e-9)
    assert g["is"] < g["guide"] < 2 * g["is"] < g["luffy"] < g["sft"] / 50


def test_unknown_correction_weight_names_the_choices():
    with pytest.raises(ValueError, match="guide"):
        corrected_trajectory_loss(torch.zeros(1, 1), torch.zeros(1, 1), torch.ones(1), torch.ones(1, 1, dtype=torch.bool),
                                  1.0, "ppo")
