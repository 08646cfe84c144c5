"""Tests that something learns: the loss terms, driven through the real policy interface on a tiny
MoE student, move the policy where they should. Small enough for the fast tier; each asserts a
margin well outside what chance gives at these seeds and sizes."""
import math

import torch

from rl.losses import distill_kl_loss, group_advantages, normaliser, policy_gradient_loss, sampled_distill_loss
from student import ByteTokenizer, StudentConfig, build_student
from student.lean_policy import LeanPolicy
from student.policy import Sampling

TOK = ByteTokenizer()
DIGITS = set(b"0123456789")


def tiny_policy(seed=0):
    torch.manual_seed(seed)
    model = build_student(StudentConfig(hidden_size=32, num_layers=1, num_heads=2, num_kv_heads=1, num_experts=4,
                                        expert_width=16), TOK)
    return model, LeanPolicy(model, pad_id=TOK.pad_id, banned_ids=TOK.never_sampled)


def test_policy_gradient_bandit_reward_rises():
    """One-token answers, reward 1 for a digit (10 of 257 allowed tokens, ~4% at the start): GRPO's
    loss (group advantages, PPO-clip, token normaliser) must raise the rewarded share."""
    torch.manual_seed(0)
    model, policy = tiny_policy()
    opt = torch.optim.Adam(model.parameters(), lr=3e-3)
    prompts = [TOK.render_prompt(f"{a} + {b}") for a in range(4) for b in range(2)]
    groups, size = len(prompts), 8
    rows = [p for p in prompts for _ in range(size)]
    one = Sampling(max_new_tokens=1, eos_id=TOK.eos_id, pad_id=TOK.pad_id)

    def reward_rate(roll):
        return torch.tensor([float(t in DIGITS) for t in roll.completion_ids_NC[:, 0].tolist()])

    rates = []
    for _ in range(40):
        roll = policy.generate(rows, one)
        rewards = reward_rate(roll)
        rates.append(rewards.mean().item())
        adv = group_advantages(rewards, torch.arange(groups).repeat_interleave(size))
        norm = normaliser("token", int(roll.mask_NC.sum()), len(rows), 1)
        scores = policy.score(rows, roll.completion_ids_NC, routes=roll.routes)
        loss, _ = policy_gradient_loss(scores.logprobs_NC, roll.logprobs_NC, adv, roll.mask_NC, norm)
        opt.zero_grad()
        loss.backward()
        opt.step()
    start, end = sum(rates[:5]) / 5, sum(rates[-5:]) / 5
    assert start < 0.1 and end > 0.4, (start, end)


def _exact_reverse_kl(student, teacher, prompts, completion):
    """Mean over the given positions of the exact full-vocabulary KL(student || teacher)."""
    with torch.no_grad():
        s = student.score(prompts, completion, need="full").logp_NCV
        t = teacher.score(prompts, completion, need="full").logp_NCV
        mask = torch.ones(completion.shape, dtype=torch.bool)
        return distill_kl_loss(s, t, mask, completion.numel(), "reverse")[0].item()


def _distill(estimator: str, steps: int = 30) -> tuple[float, float]:
    torch.manual_seed(1)
    model, student = tiny_policy(seed=1)
    teacher_model, teacher = tiny_policy(seed=2)      # a fixed, different model, with sharper outputs
    with torch.no_grad():
        teacher_model.lm_head.weight = torch.nn.Parameter(4 * teacher_model.lm_head.weight.detach())
    opt = torch.optim.Adam(model.parameters(), lr=3e-3)
    prompts = [TOK.render_prompt(f"{i} - 3") for i in range(8)]
    four = Sampling(max_new_tokens=4, eos_id=TOK.eos_id, pad_id=TOK.pad_id)
    probe = student.generate(prompts, four).completion_ids_NC
    before = _exact_reverse_kl(student, teacher, prompts, probe)
    for _ in range(steps):
        roll = student.generate(prompts * 4, four)
        norm = normaliser("token", int(roll.mask_NC.sum()), roll.mask_NC.size(0), 4)
        need = "full" if estimator == "full" else "logprobs"
        with torch.no_grad():
            target = teacher.score(prompts * 4, roll.completion_ids_NC, need=need)
        scores = student.score(prompts * 4, roll.completion_ids_NC, need=need)
        if estimator == "full":
            loss, _ = distill_kl_loss(scores.logp_NCV, target.logp_NCV, roll.mask_NC, norm, "reverse")
        else:
            loss, _ = sampled_distill_loss(scores.logprobs_NC, target.logprobs_NC, roll.mask_NC, norm)
        opt.zero_grad()
        loss.backward()
        opt.step()
    return before, _exact_reverse_kl(student, teacher, prompts, probe)


def test_full_distillation_lowers_the_kl_to_a_fixed_teacher():
    before, after = _distill("full")
    assert after < 0.5 * before, (before, after)


def test_sampled_distillation_lowers_the_kl_to_a_fixed_teacher():
    before, after = _distill("sampled", steps=90)         # one sampled token a position: noisier
    assert after < 0.75 * before, (before, after)


def test_sampled_estimator_gradient_is_the_reverse_kl_gradient_in_expectation():
    """E_{y~s}[∇ of the sampled loss] = ∇ KL(s‖t), checked on a 6-way categorical with 200k draws:
    every component of the mean sampled gradient lies within 5 standard errors of the exact one
    (a false alarm per component has probability < 1e-6)."""
    g = torch.Generator().manual_seed(0)
    theta = torch.randn(6, generator=g, dtype=torch.float64).requires_grad_(True)
    teacher = torch.log_softmax(torch.randn(6, generator=g, dtype=torch.float64), -1)
    one = torch.ones(1, 1, dtype=torch.bool)
    exact_loss, _ = distill_kl_loss(torch.log_softmax(theta, -1)[None, None], teacher[None, None], one, 1, "reverse")
    exact = torch.autograd.grad(exact_loss, theta)[0]

    m = 200_000
    s = torch.log_softmax(theta, -1)
    y = torch.multinomial(s.detach().exp(), m, replacement=True, generator=g)
    loss, _ = sampled_distill_loss(s[y][:, None], teacher[y][:, None], torch.ones(m, 1, dtype=torch.bool), m)
    mean = torch.autograd.grad(loss, theta)[0]
    # per-draw gradients: (log s(y) - log t(y)) (onehot(y) - s); their spread gives the standard error
    p = s.detach().exp()
    per_draw = (s.detach()[y] - teacher[y])[:, None] * (torch.nn.functional.one_hot(y, 6).double() - p)
    torch.testing.assert_close(per_draw.mean(0), mean)   # autograd = the formula
    stderr = per_draw.std(0) / math.sqrt(m)
    assert ((mean - exact).abs() <= 5 * stderr).all(), (mean, exact, stderr)
    assert exact.abs().max() > 20 * stderr.max()        # and the test has the power to see a wrong sign
