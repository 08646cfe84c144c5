"""Each loss on small cases worked out by hand."""
import math

import torch

from rl.losses import (distill_kl_loss, group_advantages, policy_gradient_loss,
                       sampled_distill_loss, sft_loss, span_to_first_divergence)


def test_group_advantages_dr_grpo_and_std():
    r = torch.tensor([[1.0, 0.0, 0.0, 1.0], [1.0, 1.0, 1.0, 1.0]])
    assert torch.equal(group_advantages(r), torch.tensor([[0.5, -0.5, -0.5, 0.5], [0.0] * 4]))
    # std of [1,0,0,1] (unbiased) = sqrt(1/3)
    expected = 0.5 / (math.sqrt(1 / 3) + 1e-4)
    assert torch.allclose(group_advantages(r, std_norm=True)[0], torch.tensor([1, -1, -1, 1.0]) * expected)


def test_policy_gradient_on_policy_is_token_mean_of_minus_advantage():
    logp = torch.log(torch.tensor([[0.5, 0.25, 0.9], [0.2, 0.4, 0.1]]))
    mask = torch.tensor([[True, True, False], [True, True, True]])
    adv = torch.tensor([1.0, -2.0])
    loss, m = policy_gradient_loss(logp, logp.clone(), adv, mask)
    # ratio = 1: per-token -A, masked mean over 5 tokens = -(1 + 1 - 2 - 2 - 2) / 5 = 0.8
    assert math.isclose(loss.item(), 0.8, rel_tol=1e-6)
    assert m["train/clip_frac"] == 0.0


def test_policy_gradient_gradient_is_minus_advantage_over_tokens():
    logp = torch.zeros(1, 2, requires_grad=True)
    loss, _ = policy_gradient_loss(logp, torch.zeros(1, 2), torch.tensor([3.0]), torch.ones(1, 2, dtype=torch.bool))
    loss.backward()
    assert torch.allclose(logp.grad, torch.tensor([[-1.5, -1.5]]))


def test_policy_gradient_clips_ratio():
    # ratio = e^1 = 2.718 > 1.2 with A > 0: clipped objective 1.2 * A wins the min.
    logp, old = torch.tensor([[1.0]], requires_grad=True), torch.tensor([[0.0]])
    loss, m = policy_gradient_loss(logp, old, torch.tensor([2.0]), torch.ones(1, 1, dtype=torch.bool), 0.2)
    assert math.isclose(loss.item(), -2.4, rel_tol=1e-6) and m["train/clip_frac"] == 1.0
    loss.backward()
    assert logp.grad.abs().sum() == 0          # clipped tokens carry no gradient
    # With A < 0 the unclipped (more pessimistic) term wins: -min(2.718*-2, 1.2*-2) = 5.436
    loss, _ = policy_gradient_loss(torch.tensor([[1.0]]), old, torch.tensor([-2.0]), torch.ones(1, 1, dtype=torch.bool), 0.2)
    assert math.isclose(loss.item(), 2 * math.e, rel_tol=1e-6)


def _two_token_case():
    s = torch.log(torch.tensor([[[0.5, 0.5], [0.9, 0.1]]]))
    t = torch.log(torch.tensor([[[0.25, 0.75], [0.9, 0.1]]]))
    return s, t, torch.ones(1, 2, dtype=torch.bool)


def test_reverse_kl_by_hand():
    s, t, mask = _two_token_case()
    # token 0: 0.5 ln(0.5/0.25) + 0.5 ln(0.5/0.75); token 1: 0
    kl0 = 0.5 * math.log(2) + 0.5 * math.log(2 / 3)
    loss, _ = distill_kl_loss(s, t, mask, "reverse")
    assert math.isclose(loss.item(), kl0 / 2, rel_tol=1e-5)


def test_forward_kl_by_hand():
    s, t, mask = _two_token_case()
    kl0 = 0.25 * math.log(0.5) + 0.75 * math.log(1.5)
    loss, _ = distill_kl_loss(s, t, mask, "forward")
    assert math.isclose(loss.item(), kl0 / 2, rel_tol=1e-5)


def test_jsd_by_hand_and_symmetric():
    s, t, mask = _two_token_case()
    m = [0.375, 0.625]
    js0 = 0.5 * (0.5 * math.log(0.5 / m[0]) + 0.5 * math.log(0.5 / m[1])) \
        + 0.5 * (0.25 * math.log(0.25 / m[0]) + 0.75 * math.log(0.75 / m[1]))
    loss, _ = distill_kl_loss(s, t, mask, "jsd")
    assert math.isclose(loss.item(), js0 / 2, rel_tol=1e-5)
    assert math.isclose(distill_kl_loss(t, s, mask, "jsd")[0].item(), loss.item(), rel_tol=1e-6)


def test_distill_gradient_reaches_student_only():
    s, t, mask = _two_token_case()
    s.requires_grad_(True)
    t.requires_grad_(True)
    distill_kl_loss(s, t, mask, "reverse")[0].backward()
    assert s.grad.abs().sum() > 0 and t.grad is None


def test_sampled_distill_advantage_and_estimate():
    s = torch.log(torch.tensor([[0.5, 0.2]])).requires_grad_(True)
    t = torch.log(torch.tensor([[0.25, 0.4]]))
    loss, m = sampled_distill_loss(s, t, torch.ones(1, 2, dtype=torch.bool))
    # k1 estimate: mean(log s - log t) = (ln 2 + ln 0.5) / 2 = 0
    assert math.isclose(m["loss/distill"], 0.0, abs_tol=1e-6)
    loss.backward()
    # d/ds_t of -(A_t s_t)/2 = -A_t/2 with A = -(ln2, -ln2): grads (ln2/2, -ln2/2)
    assert torch.allclose(s.grad, torch.tensor([[math.log(2) / 2, -math.log(2) / 2]]))


def test_sft_is_masked_mean_nll():
    logp = torch.log(torch.tensor([[0.5, 0.25, 0.1]]))
    loss, _ = sft_loss(logp, torch.tensor([[True, True, False]]))
    assert math.isclose(loss.item(), (math.log(2) + math.log(4)) / 2, rel_tol=1e-6)


def test_distill_span_stops_after_first_teacher_disagreement():
    # teacher argmax per position: 1, 2, 0, 0 ; student tokens: 1, 0, 0, 3 -> disagrees at t=1
    t = torch.log(torch.tensor([[[0.1, 0.7, 0.1, 0.1], [0.1, 0.1, 0.7, 0.1],
                                 [0.7, 0.1, 0.1, 0.1], [0.7, 0.1, 0.1, 0.1]]]))
    tokens = torch.tensor([[1, 0, 0, 3]])
    mask = torch.tensor([[True, True, True, True]])
    assert span_to_first_divergence(t, tokens, mask).tolist() == [[True, True, False, False]]
    # an attempt the teacher fully agrees with keeps every real token, padding stays out
    agree = torch.tensor([[1, 2, 0, 0]])
    assert span_to_first_divergence(t, agree, torch.tensor([[True, True, True, False]])).tolist() \
        == [[True, True, True, False]]
