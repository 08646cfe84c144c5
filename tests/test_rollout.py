"""The policy interface (student/policy.py) on both implementations: sampling, scoring, what each
`need` returns, banned tokens, and the chunked vocabulary projection."""
import pytest
import torch

from rl.warmstart import right_pad
from student import STUDENT_FAMILIES, ByteTokenizer, StudentConfig, build_student
from student.hf_policy import HFPolicy
from student.lean_policy import LeanPolicy
from student.build import build_policy
from student.policy import Sampling, inverse_cdf, left_pad

TOK = ByteTokenizer()


def tiny_model(arch="qwen3_moe"):
    torch.manual_seed(0)
    cfg = StudentConfig(arch=arch, hidden_size=32, num_layers=2, num_heads=2, num_kv_heads=1,
                        num_experts=4, expert_width=16)
    return build_student(cfg, TOK).eval()


def policies(model):
    """Both implementations where the family has a lean forward, else transformers' alone."""
    hf = HFPolicy(model, pad_id=TOK.pad_id, banned_ids=TOK.never_sampled)
    lean = build_policy(model, pad_id=TOK.pad_id, banned_ids=TOK.never_sampled)
    return [hf] + ([lean] if isinstance(lean, LeanPolicy) else [])


def sampling(new=5, **kw):
    return Sampling(max_new_tokens=new, eos_id=TOK.eos_id, pad_id=TOK.pad_id, **kw)


def test_byte_tokenizer_layout():
    ids = TOK.render_prompt("1+2", "starts with 3")
    assert ids[0] == TOK.bos_id and ids[-1] == TOK.assistant_id and TOK.hint_id in ids
    assert TOK.decode(TOK.render_answer("-3") + [ord("9")]) == "-3"   # stops at <eos>
    assert TOK.render_prompt("1+2") == [TOK.bos_id, ord("1"), ord("+"), ord("2"), TOK.assistant_id]
    assert TOK.eos_id not in TOK.never_sampled and TOK.pad_id in TOK.never_sampled


def test_padding_helpers():
    ids, mask = left_pad([[1, 2, 3], [4]], pad_id=0)
    assert ids.tolist() == [[1, 2, 3], [0, 0, 4]] and mask.tolist() == [[1, 1, 1], [0, 0, 1]]
    ids, mask = right_pad([[1, 2, 3], [4]], pad_id=0)
    assert ids.tolist() == [[1, 2, 3], [4, 0, 0]] and mask.tolist() == [[True] * 3, [True, False, False]]


def test_sampler_draws_from_the_distribution():
    torch.manual_seed(0)
    probs_V = torch.softmax(torch.randn(50) * 2, -1)
    probs_V[[0, 7, 49]] = 0.0                        # first, middle and last tokens: never drawn
    probs_V /= probs_V.sum()
    n = 200_000
    draws = inverse_cdf(probs_V.expand(n, -1).contiguous())
    freq = torch.bincount(draws, minlength=50).double() / n
    assert freq[[0, 7, 49]].sum() == 0
    # each frequency within 5 binomial standard deviations of its probability
    sd = (probs_V.double() * (1 - probs_V.double()) / n).sqrt()
    assert ((freq - probs_V.double()).abs() <= 5 * sd + 1e-12).all()
    one_hot = torch.zeros(3, 50)
    one_hot[0, 0], one_hot[1, 49], one_hot[2, 21] = 1, 1, 1
    assert inverse_cdf(one_hot).tolist() == [0, 49, 21]


def test_rollout_logprobs_equal_a_fresh_scoring_pass():
    """The KV-cached sampler's log-probs are the ones the loss treats as the old policy."""
    for policy in policies(tiny_model()):
        prompts = [TOK.render_prompt("12 + 35"), TOK.render_prompt("1 - 2", "ends with 1")] * 3
        torch.manual_seed(1)
        roll = policy.generate(prompts, sampling())
        with torch.no_grad():
            scores = policy.score(prompts, roll.completion_ids_NC)
        diff = (scores.logprobs_NC - roll.logprobs_NC).masked_fill(~roll.mask_NC, 0).abs().max()
        assert diff < 1e-5, type(policy).__name__
        # <eos> ends a row: nothing after it is masked in
        for row, mask in zip(roll.completion_ids_NC.tolist(), roll.mask_NC.tolist()):
            if TOK.eos_id in row:
                assert not any(mask[row.index(TOK.eos_id) + 1:])


def test_special_tokens_are_never_sampled_or_scored():
    """Even a model that prefers <pad> and <hint> above all never emits them: the policy's
    distribution has them removed, in sampling and scoring alike, so a sampled token never
    vanishes from the decoded text or opens a hole in the loss mask."""
    model = tiny_model()
    prompt = TOK.render_prompt("1 + 2")
    with torch.no_grad():
        # untie the output projection, and give every special token 3x the logit of the first
        # position's favourite token
        model.lm_head.weight = torch.nn.Parameter(model.lm_head.weight.detach().clone())
        favourite = model(torch.tensor([prompt])).logits[0, -1].argmax()
        for i in TOK.never_sampled:
            model.lm_head.weight[i] = 3 * model.lm_head.weight[favourite]
    unbanned = HFPolicy(model, pad_id=TOK.pad_id).generate([prompt] * 16, sampling(new=6))
    assert set(unbanned.completion_ids_NC[:, 0].tolist()) & set(TOK.never_sampled)   # the test can fail
    for policy in policies(model):
        torch.manual_seed(0)
        roll = policy.generate([prompt] * 16, sampling(new=6))
        emitted = set(roll.completion_ids_NC[roll.mask_NC].tolist())
        assert not emitted & set(TOK.never_sampled), type(policy).__name__
        assert roll.mask_NC[:, 0].all()              # a real token first: no hole at position 0
        with torch.no_grad():
            full = policy.score([prompt], roll.completion_ids_NC[:1], need="full").logp_NCV
        assert torch.isinf(full[..., list(TOK.never_sampled)]).all()
        assert torch.allclose(full.exp().sum(-1), torch.ones(1, full.size(1)))


def test_greedy_is_deterministic_and_batch_independent():
    for policy in policies(tiny_model()):
        prompts = [TOK.render_prompt("3 + 4"), TOK.render_prompt("10 + 20 + 30")]
        both = policy.generate(prompts, sampling(4, greedy=True))
        alone = policy.generate(prompts[:1], sampling(4, greedy=True))
        n = alone.completion_ids_NC.shape[1]
        assert torch.equal(both.completion_ids_NC[0, :n], alone.completion_ids_NC[0])


@pytest.mark.parametrize("arch", sorted(STUDENT_FAMILIES))
def test_every_registered_family_samples_consistently(arch):
    policy = HFPolicy(tiny_model(arch), pad_id=TOK.pad_id, banned_ids=TOK.never_sampled)
    prompts = [TOK.render_prompt("1+1"), TOK.render_prompt("23 - 4", "ends with 9")]
    torch.manual_seed(2)
    out = policy.generate(prompts, sampling(3))
    with torch.no_grad():
        scores = policy.score(prompts, out.completion_ids_NC)
    assert out.mask_NC[:, 0].all()
    assert (scores.logprobs_NC - out.logprobs_NC).masked_fill(~out.mask_NC, 0).abs().max() < 1e-5
    # the recorded routes replay: scoring under them equals free scoring (same routes chosen)
    with torch.no_grad():
        replayed = policy.score(prompts, out.completion_ids_NC, routes=out.routes)
    assert (replayed.logprobs_NC - scores.logprobs_NC).abs().max() < 1e-5
    assert policy.take_replay_mismatch() == 0.0


def test_needs_return_what_they_say_and_agree_with_the_full_distribution():
    for policy in policies(tiny_model()):
        prompts = [TOK.render_prompt(f"{i} + 4", "starts with 1") for i in range(3)] * 2
        torch.manual_seed(3)
        completion = policy.generate(prompts, sampling()).completion_ids_NC
        with torch.no_grad():
            full = policy.score(prompts, completion, temperature=0.7, need="full")
            argmax = policy.score(prompts, completion, temperature=0.7, need="argmax")
            topk = policy.score(prompts, completion, temperature=0.7, need="topk", k=5)
            plain = policy.score(prompts, completion, temperature=0.7)
        logp = full.logp_NCV
        assert plain.logp_NCV is None and plain.argmax_NC is None and argmax.logp_NCV is None
        for s in (argmax, topk, plain):
            torch.testing.assert_close(s.logprobs_NC, full.logprobs_NC, atol=1e-5, rtol=0)
        assert torch.equal(argmax.argmax_NC, logp.argmax(-1))
        want, ids = logp.topk(5, dim=-1)
        torch.testing.assert_close(topk.topk_logp_NCK, want, atol=1e-5, rtol=0)
        assert torch.equal(topk.topk_ids_NCK, ids)
        rest = 1 - want.exp().sum(-1)
        torch.testing.assert_close(topk.tail_logp_NC.exp(), rest, atol=1e-5, rtol=0)


def test_chunked_projection_equals_one_projection():
    """Without gradient the vocabulary projection runs in chunks of positions; with a chunk
    smaller than the batch it must give what one projection gives."""
    from student.policy import Distribution
    torch.manual_seed(0)
    hidden, weight = torch.randn(3, 7, 16), torch.randn(40, 16)
    tokens = torch.randint(0, 40, (3, 7))
    dist = Distribution(banned_ids=(0, 1))
    with torch.no_grad():
        chunked = dist.scores(hidden, lambda h: h @ weight.T, 40, tokens, 0.9, "topk", 3, chunk_logits=40 * 4)
    with torch.enable_grad():
        whole = dist.scores(hidden, lambda h: h @ weight.T, 40, tokens, 0.9, "topk", 3)
    for name in ("logprobs_NC", "argmax_NC", "topk_logp_NCK", "topk_ids_NCK", "tail_logp_NC"):
        torch.testing.assert_close(getattr(chunked, name), getattr(whole, name).detach(), msg=name)


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
def test_policies_work_where_the_module_lives():
    """Nothing in a policy makes a tensor on a fixed device: on a GPU everything stays there, and
    results match the CPU's."""
    cpu = tiny_model()
    gpu = tiny_model().cuda()
    prompts = [TOK.render_prompt("12 + 35"), TOK.render_prompt("1 - 2", "ends with 1")] * 2
    for on_cpu, on_gpu in zip(policies(cpu), policies(gpu)):
        roll = on_gpu.generate(prompts, sampling(greedy=True))
        assert roll.completion_ids_NC.is_cuda and roll.routes.prompt[0].is_cuda
        ref = on_cpu.generate(prompts, sampling(greedy=True))
        assert torch.equal(roll.completion_ids_NC.cpu(), ref.completion_ids_NC)
        with torch.no_grad():
            scores = on_gpu.score(prompts, roll.completion_ids_NC, need="topk", k=3, routes=roll.routes)
        assert scores.logprobs_NC.is_cuda and scores.topk_ids_NCK.is_cuda
        loss = on_gpu.score(prompts, roll.completion_ids_NC, router_aux=True)
        assert loss.aux_loss.is_cuda
