"""student/lean.py against the transformers forward it replaces: same tokens, log-probs, aux loss,
gradients and routes, for every family it supports, with and without shared prompts."""
import random

import pytest
import torch

from student import STUDENT_FAMILIES, ByteTokenizer, StudentConfig, build_student
from student.hf_policy import HFPolicy
from student.lean import LeanForward, unsupported
from student.lean_policy import LeanPolicy
from student.policy import Sampling

TOK = ByteTokenizer()
LEAN = [name for name in STUDENT_FAMILIES if STUDENT_FAMILIES[name].lean_forward]
TRANSFORMERS_ONLY = [name for name in STUDENT_FAMILIES if name not in LEAN]


def model_of(arch):
    torch.manual_seed(0)
    return build_student(StudentConfig(arch=arch, hidden_size=64, num_layers=2, num_heads=4, num_kv_heads=2,
                                       num_experts=4, top_k=2, expert_width=32), TOK)


def grouped_prompts(groups=3, size=4):
    rnd = random.Random(0)
    base = [TOK.render_prompt(f"{rnd.randint(0, 99)} + {rnd.randint(0, 9)}") for _ in range(groups)]
    return [p for p in base for _ in range(size)]


def pair(model):
    """transformers' forward and the lean forward over the same module."""
    common = dict(pad_id=TOK.pad_id, banned_ids=TOK.never_sampled)
    return HFPolicy(model, **common), LeanPolicy(model, **common)


def gen(policy, prompts, **kw):
    torch.manual_seed(1)
    return policy.generate(prompts, Sampling(max_new_tokens=8, eos_id=TOK.eos_id, pad_id=TOK.pad_id, **kw))


@pytest.mark.parametrize("arch", LEAN)
def test_generation_and_routes_equal_transformers(arch):
    model = model_of(arch).eval()
    (hf, lean), prompts = pair(model), grouped_prompts()
    ref, out = gen(hf, prompts), gen(lean, prompts)
    assert torch.equal(ref.completion_ids_NC, out.completion_ids_NC)
    torch.testing.assert_close(ref.logprobs_NC, out.logprobs_NC, atol=1e-5, rtol=0)
    for a, b in zip(ref.routes.per_row(), out.routes.per_row()):
        assert torch.equal(a, b)
    assert len(out.routes.prompt[0]) == 3                       # each distinct prompt prefilled once
    assert torch.equal(gen(hf, prompts[::4], greedy=True).completion_ids_NC,
                       gen(lean, prompts[::4], greedy=True).completion_ids_NC)


@pytest.mark.parametrize("arch", LEAN)
@pytest.mark.parametrize("shared", [True, False])
def test_scoring_aux_loss_and_gradients_equal_transformers(arch, shared):
    model = model_of(arch)
    prompts = grouped_prompts() if shared else [TOK.render_prompt(f"{i} - 3") for i in range(12)]
    policies = pair(model)
    completion = gen(policies[0], prompts).completion_ids_NC
    results = []
    for policy in policies:
        model.zero_grad()
        s = policy.score(prompts, completion, need="full", router_aux=True)
        logp, logp_full, aux = s.logprobs_NC, s.logp_NCV, s.aux_loss
        finite = torch.isfinite(logp_full)
        (logp.sum() + logp_full.exp().mul(logp_full.where(finite, 0)).sum() + 10 * aux).backward()
        results.append((logp, logp_full, aux, {n: p.grad.clone() for n, p in model.named_parameters()
                                               if p.grad is not None}))
    (a, av, aux_a, ga), (b, bv, aux_b, gb) = results
    torch.testing.assert_close(a, b, atol=2e-5, rtol=0)
    torch.testing.assert_close(av, bv, atol=2e-5, rtol=0)
    torch.testing.assert_close(aux_a, aux_b, atol=1e-6, rtol=1e-6)
    assert set(ga) == set(gb) and len(ga) > 10                  # every weight, router and embeddings too
    for name in ga:
        torch.testing.assert_close(ga[name], gb[name], atol=1e-4, rtol=1e-4, msg=name)
    with torch.no_grad():          # the no-gradient paths (chunked projection) agree too
        plain = [p.score(prompts, completion, need="full").logp_NCV for p in policies]
    torch.testing.assert_close(plain[0], plain[1], atol=2e-5, rtol=0)
    torch.testing.assert_close(plain[0], av.detach(), atol=2e-5, rtol=0)


def test_replayed_routes_force_the_experts_and_count_mismatches():
    model = model_of("qwen3_moe").eval()
    (hf, lean), prompts = pair(model), grouped_prompts()
    roll = gen(lean, prompts)
    ids = roll.completion_ids_NC
    with torch.no_grad():
        ref = hf.score(prompts, ids, routes=roll.routes).logprobs_NC
        assert hf.take_replay_mismatch() == 0.0
        got = lean.score(prompts, ids, routes=roll.routes).logprobs_NC
        torch.testing.assert_close(ref, got, atol=2e-5, rtol=0)
        assert lean.replay.stats()["slots"] > 0 and lean.take_replay_mismatch() == 0.0
        # A row subset (a gradient-accumulation micro-batch) gets its own routes, on both paths.
        for policy in (hf, lean):
            part = policy.score(prompts[4:10], ids[4:10], routes=roll.routes.select(slice(4, 10))).logprobs_NC
            torch.testing.assert_close(part, got[4:10], atol=2e-5, rtol=0)
        # Other routes change the result, and the counters see them.
        other = roll.routes.select(slice(0, 12))
        other.completion = [(r + 1) % 4 for r in roll.routes.completion]
        for policy in (hf, lean):
            moved = policy.score(prompts, ids, routes=other).logprobs_NC
            assert (moved - got)[roll.mask_NC].abs().max() > 1e-3 and policy.take_replay_mismatch() > 0


@pytest.mark.parametrize("arch", TRANSFORMERS_ONLY)
def test_other_families_say_why_they_need_transformers(arch):
    model = model_of(arch)
    assert "model_type" in unsupported(model)
    with pytest.raises(ValueError, match="no lean forward"):
        LeanForward(model)


def test_static_cache_decodes_one_token_per_row():
    # StaticKV attends through the fused decode op, which takes one new token per row and forward.
    from student.lean import Collect, StaticKV, prompt_bias
    model = model_of("qwen3_moe").eval()
    lean = LeanForward(model)
    ids = torch.tensor([TOK.render_prompt("1 + 2")])
    pos = torch.arange(ids.size(1))[None]
    prefix = Collect()
    with torch.inference_mode():
        lean(ids, pos, prompt_bias(torch.ones_like(ids), torch.float32), prefix)
        kv = StaticKV(prefix, torch.tensor([0]), ids.size(1) + 4)
        with pytest.raises(ValueError, match="one token per row"):
            lean(ids[:, :2], pos[:, :2] + ids.size(1), torch.zeros(1, 1, 2, ids.size(1) + 2), kv, logits_from=0)
