"""Tests that something learns: the loss terms, driven through the real policy interface on a tiny
MoE student, move the policy where they should. Small enough for the fast tier; each asserts a
margin well outside what chance gives at these seeds and sizes."""
import functools
import math

import pytest
import torch

from rl.losses import (distill_kl_loss, group_advantages, normaliser, policy_gradient_loss, sampled_distill_loss,
                       topk_distill_loss)
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


def _distill(estimator: str, steps: int = 30, k: int = 0) -> tuple[float, float]:
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
        need = {"full": "full", "top_k": "topk", "sampled": "logprobs"}[estimator]
        with torch.no_grad():
            target = teacher.score(prompts * 4, roll.completion_ids_NC, need=need, k=k)
        scores = student.score(prompts * 4, roll.completion_ids_NC, need="full" if estimator != "sampled" else need)
        if estimator == "full":
            loss, _ = distill_kl_loss(scores.logp_NCV, target.logp_NCV, roll.mask_NC, norm, "reverse")
        elif estimator == "top_k":
            loss, _ = topk_distill_loss(scores.logp_NCV, target.topk_logp_NCK, target.topk_ids_NCK, roll.mask_NC,
                                        norm, "reverse")
        else:
            loss, _ = sampled_distill_loss(scores.logprobs_NC, target.logprobs_NC, roll.mask_NC, norm)
        opt.zero_grad()
        loss.backward()
        opt.step()
    return before, _exact_reverse_kl(student, teacher, prompts, probe)


def test_full_distillation_lowers_the_kl_to_a_fixed_teacher():
    before, after = _distill("full")
    assert after < 0.5 * before, (before, after)


def test_top_k_distillation_lowers_the_full_kl_to_a_fixed_teacher():
    # The teacher's 64 likeliest of 256 tokens and a tail bucket: the tail's shape is not matched,
    # so the full KL falls less far than under full distillation (measured: to 0.41 of its start,
    # full distillation to 0.26).
    before, after = _distill("top_k", k=64)
    assert after < 0.6 * before, (before, after)


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


# ---------------------------------------------------------------------- learning from hints
# A toy version of the hint methods' setting: eight prompts whose answer is a two-digit number the
# student never samples at first (it answers nothing or another number), and a student that has
# learned to copy a hint into its answer (what warm-start with hints teaches the real student). One
# answer for all prompts: a 1-layer, 32-wide student memorises eight different ones too slowly for
# a unit test, and what is tested is the signal, not the memory.
TARGETS = {f"q{i}": "37" for i in range(8)}
THREE = Sampling(max_new_tokens=3, eos_id=TOK.eos_id, pad_id=TOK.pad_id)


def _hint_copier(seed: int = 3, steps: int = 300):
    """A tiny student trained (SFT) to answer a hint's two digits, on prompts other than TARGETS'
    (trained once per seed; each call gets a fresh copy)."""
    model, policy = tiny_policy(seed)
    model.load_state_dict(_hint_copier_weights(seed, steps))
    return model, policy


@functools.lru_cache(maxsize=None)
def _hint_copier_weights(seed: int, steps: int) -> dict:
    import random

    from rl.losses import sft_loss
    from rl.warmstart import right_pad

    model, policy = tiny_policy(seed)
    opt = torch.optim.Adam(model.parameters(), lr=3e-3)
    g = random.Random(seed)
    for _ in range(steps):
        hints = [str(g.randrange(10, 100)) for _ in range(32)]
        prompts = [TOK.render_prompt(f"r{g.randrange(100)}", h) for h in hints]
        answers, mask = right_pad([TOK.render_answer(h) for h in hints], TOK.pad_id)
        loss, _ = sft_loss(policy.score(prompts, answers).logprobs_NC, mask, float(mask.sum()))
        opt.zero_grad()
        loss.backward()
        opt.step()
    return {k: v.clone() for k, v in model.state_dict().items()}


def _correct(roll) -> torch.Tensor:
    return torch.tensor([float(TOK.decode(row.tolist()) == TARGETS[q])
                         for q, row in zip(_toy_rows(), roll.completion_ids_NC)])


def _toy_rows(per_prompt: int = 8) -> list[str]:
    return [q for q in TARGETS for _ in range(per_prompt)]


def _target_logprob(policy) -> float:
    """Mean over the prompts of log p(answer + <eos> | prompt, no hint)."""
    from rl.warmstart import right_pad

    answers, mask = right_pad([TOK.render_answer(a) for a in TARGETS.values()], TOK.pad_id)
    with torch.no_grad():
        logp = policy.score([TOK.render_prompt(q) for q in TARGETS], answers).logprobs_NC
    return (logp * mask).sum(1).mean().item()


def _rl_on_toy(weight: str | None, steps: int = 30, seed: int = 0) -> tuple[float, float]:
    """GRPO on the toy task, with (weight = a `method.weight`) or without (None) corrected replay's
    rows: regenerated with the answer as the hint in every all-fail group, trained hint-free
    (rl/losses.py::corrected_trajectory_loss) beside the rollout rows, which share the parameters.
    The hint copier and the RL sampling both follow `seed`."""
    from rl.losses import corrected_trajectory_loss

    model, policy = _hint_copier(3 + seed)
    torch.manual_seed(seed)
    opt = torch.optim.Adam(model.parameters(), lr=3e-3)
    before = _target_logprob(policy)
    names = _toy_rows()
    plain = [TOK.render_prompt(q) for q in names]
    group = torch.arange(len(TARGETS)).repeat_interleave(8)
    for _ in range(steps):
        roll = policy.generate(plain, THREE)
        rewards = _correct(roll)
        comp, old, mask, rows_group, prompts, n = roll.completion_ids_NC, roll.logprobs_NC, roll.mask_NC, group, plain, len(plain)
        all_fail = [i for i in range(n) if rewards[group == group[i]].sum() == 0]
        if weight and all_fail:
            fix = policy.generate([TOK.render_prompt(names[i], TARGETS[names[i]]) for i in all_fail], THREE)
            fixed = torch.tensor([float(TOK.decode(r.tolist()) == TARGETS[names[i]])
                                  for i, r in zip(all_fail, fix.completion_ids_NC)])
            width = max(comp.size(1), fix.completion_ids_NC.size(1))
            pad = lambda x, fill: torch.cat([x, x.new_full((x.size(0), width - x.size(1)), fill)], 1)
            comp = torch.cat([pad(comp, TOK.pad_id), pad(fix.completion_ids_NC, TOK.pad_id)])
            old = torch.cat([pad(old, 0.0), pad(fix.logprobs_NC, 0.0)])
            mask = torch.cat([pad(mask, False), pad(fix.mask_NC, False)])
            rewards, rows_group = torch.cat([rewards, fixed]), torch.cat([group, group[all_fail]])
            prompts = plain + [plain[i] for i in all_fail]
        adv = group_advantages(rewards, rows_group)
        norm = normaliser("token", int(mask.sum()), len(prompts), 3)
        logp = policy.score(prompts, comp).logprobs_NC
        is_rollout = (torch.arange(len(prompts)) < n)[:, None]
        loss, _ = policy_gradient_loss(logp, old, adv, mask & is_rollout, norm)
        if len(prompts) > n:
            extra, _, _ = corrected_trajectory_loss(logp, old, adv, mask & ~is_rollout, norm, weight)
            loss = loss + extra
        opt.zero_grad()
        loss.backward()
        opt.step()
    return before, _target_logprob(policy)


# Measured on this toy (2026-12-05, 2-core CPU; gain in hint-free log p(answer + <eos>), nats; the
# start is -16.0, -15.0, -11.3, -21.7, -11.3 on seeds 0-4):
#
#   weight   30 steps: seeds 0-4                 60 steps: seeds 0-4
#   sft      +16.0 +15.0 +10.0 +21.7 +11.1       +16.0 +15.0 +11.1 +21.7 +11.3   (all the way, every seed)
#   guide     -1.9  +5.8  +3.6 +17.4  +5.7        -3.5 +15.0  +9.8 +21.7 +11.2
#   luffy     -0.3  +2.7  +2.5 +15.3  +6.0        +0.0  +3.3  +7.0 +15.2  +9.6
#   is        -0.9  +3.7  +2.7 +21.7  +3.8        +0.5  +2.6  +6.6 +21.7  +8.4
#
# A second machine (2026-12-07, 2-core AMD EPYC; start -16.2, -15.0, -11.3, -18.0, -8.5), log p
# after the steps (above -2.5 counts as learnt):
#
#   weight   30 steps: seeds 0-4                 60 steps: seeds 0-4
#   sft       -9.5  -0.0  -1.0  -0.1  -1.1        -1.0  -0.0  -0.1  -0.0  -0.0
#   guide    -16.7  -8.1  -9.4  -3.7  -6.9       -16.6  -0.0  -1.7  -2.9  -5.9
#   luffy     -7.1 -12.1  -3.1  -0.0  -4.4        -0.0 -11.3  -0.0  -0.0  -5.1
#   is       -23.6 -17.6  -6.7  -6.7  -6.7       -24.9 -17.7  -3.5  -5.0  -6.7
#
# Only `sft` learns the answer reliably: every other weight gives a hint-supplied token a gradient
# about its hint-free probability (over γ), so whether it learns depends on the seed's luck in the
# first steps. The same seed run with 2 threads instead of 1 gave guide +6.5, luffy +4.4, is +4.7
# and sft +11.8 on seed 0: the tests assert only what held with margin on all five seeds.


def test_grpo_cannot_find_the_answer():
    """Every group fails, so GRPO has no signal and the hint-free log p(answer) does not move."""
    before, grpo = _rl_on_toy(None)
    # In the full suite the hint copier's rounding differs (measured there: -14.5 -> -16.2): GRPO
    # may drift on a rare success elsewhere, but it never learns the answer.
    assert before < -8 and grpo < before + 1.0, (before, grpo)


@pytest.mark.parametrize("seed", [0, pytest.param(1, marks=pytest.mark.slow), pytest.param(2, marks=pytest.mark.slow),
                                  pytest.param(3, marks=pytest.mark.slow), pytest.param(4, marks=pytest.mark.slow)])
def test_sft_corrections_learn_the_answer(seed):
    """STaR's weight: the verified corrections, trained hint-free, teach the answer within 60 steps
    (measured on two machines: log p(answer) from -8.5 to -21.7 up to -1.1 or better on seeds 0-4
    at 60 steps; at 30 steps one seed of the second machine was still at -9.5)."""
    before, after = _rl_on_toy("sft", steps=60, seed=seed)
    assert before < -8 and after > -2.5, (before, after)


@pytest.mark.slow
def test_shaped_weights_reach_the_answer_on_fewer_seeds_than_sft():
    """Within 30 steps sft brings log p(answer) above -2.5 on 5 of seeds 0-4 on one machine and 4
    on a second; guide, luffy and is did on at most one of them on either (is on seed 3 on the
    first, luffy on seed 3 on the second; the tables above). A toy RL run amplifies rounding, so
    runs differ by machine and thread count, and the bound is two."""
    reached = {w: sum(_rl_on_toy(w, steps=30, seed=s)[1] > -2.5 for s in range(5)) for w in ("guide", "luffy", "is")}
    assert all(n <= 2 for n in reached.values()), reached


def test_self_distillation_toward_a_frozen_teacher_shown_the_answer_learns_it():
    """SDPO's update on the toy task: the student's own samples, scored by a frozen copy that sees
    the answer in its context; top-k (+ tail) JSD toward it teaches the hint-free student."""
    import copy

    from rl.losses import topk_distill_loss

    torch.manual_seed(0)
    model, policy = _hint_copier()
    teacher = LeanPolicy(copy.deepcopy(model).requires_grad_(False), pad_id=TOK.pad_id, banned_ids=TOK.never_sampled)
    before = _target_logprob(policy)
    opt = torch.optim.Adam(model.parameters(), lr=3e-3)
    names = _toy_rows(4)
    plain = [TOK.render_prompt(q) for q in names]
    shown = [TOK.render_prompt(q, f"{TARGETS[q]}") for q in names]
    for _ in range(30):
        roll = policy.generate(plain, THREE)
        with torch.no_grad():
            t = teacher.score(shown, roll.completion_ids_NC, need="topk", k=8)
        s = policy.score(plain, roll.completion_ids_NC, need="full")
        loss, _ = topk_distill_loss(s.logp_NCV, t.topk_logp_NCK, t.topk_ids_NCK, roll.mask_NC,
                                    float(roll.mask_NC.sum()), "jsd")
        opt.zero_grad()
        loss.backward()
        opt.step()
    after = _target_logprob(policy)
    assert before < -8 and after > before + 5, (before, after)     # measured: -16.0 -> -5.9 alone, -14.5 -> -7.6 in the suite
