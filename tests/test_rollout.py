import pytest
import torch

from rl.rollout import _inverse_cdf, generate, left_pad, right_pad, score
from student import ARCHITECTURES, ByteTokenizer, StudentConfig, build_student

TOK = ByteTokenizer()


def tiny_model(arch="qwen3_moe"):
    torch.manual_seed(0)
    cfg = StudentConfig(arch=arch, hidden_size=32, num_layers=2, num_heads=2, num_kv_heads=1,
                        num_experts=4, expert_width=16)
    return build_student(cfg, TOK).eval()


def test_byte_tokenizer_layout():
    ids = TOK.render_prompt("1+2", "starts with 3")
    assert ids[0] == TOK.bos_id and ids[-1] == TOK.assistant_id and TOK.hint_id in ids
    assert TOK.decode(TOK.render_answer("-3") + [ord("9")]) == "-3"   # stops at <eos>
    assert TOK.render_prompt("1+2") == [TOK.bos_id, ord("1"), ord("+"), ord("2"), TOK.assistant_id]


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
    draws = _inverse_cdf(probs_V.expand(n, -1).contiguous())
    freq = torch.bincount(draws, minlength=50).double() / n
    assert freq[[0, 7, 49]].sum() == 0
    # each frequency within 5 binomial standard deviations of its probability
    sd = (probs_V.double() * (1 - probs_V.double()) / n).sqrt()
    assert ((freq - probs_V.double()).abs() <= 5 * sd + 1e-12).all()
    one_hot = torch.zeros(3, 50)
    one_hot[0, 0], one_hot[1, 49], one_hot[2, 21] = 1, 1, 1
    assert _inverse_cdf(one_hot).tolist() == [0, 49, 21]


def test_rollout_logprobs_equal_a_fresh_scoring_pass():
    """The KV-cached sampler's log-probs are the ones the loss treats as the old policy."""
    model = tiny_model()
    prompts = [TOK.render_prompt("12 + 35"), TOK.render_prompt("1 - 2", "ends with 1")] * 3
    torch.manual_seed(1)
    roll = generate(model, prompts, max_new_tokens=5, eos_id=TOK.eos_id, pad_id=TOK.pad_id)
    with torch.no_grad():
        logprobs, _, _ = score(model, prompts, roll.completion_ids_NC, pad_id=TOK.pad_id)
    diff = (logprobs - roll.logprobs_NC).masked_fill(~roll.mask_NC, 0).abs().max()
    assert diff < 1e-5
    # <eos> ends a row: nothing after it is masked in
    for row, mask in zip(roll.completion_ids_NC.tolist(), roll.mask_NC.tolist()):
        if TOK.eos_id in row:
            assert not any(mask[row.index(TOK.eos_id) + 1:])


def test_greedy_is_deterministic_and_batch_independent():
    model = tiny_model()
    prompts = [TOK.render_prompt("3 + 4"), TOK.render_prompt("10 + 20 + 30")]
    both = generate(model, prompts, max_new_tokens=4, eos_id=TOK.eos_id, pad_id=TOK.pad_id, greedy=True)
    alone = generate(model, prompts[:1], max_new_tokens=4, eos_id=TOK.eos_id, pad_id=TOK.pad_id, greedy=True)
    n = alone.completion_ids_NC.shape[1]
    assert torch.equal(both.completion_ids_NC[0, :n], alone.completion_ids_NC[0])


@pytest.mark.parametrize("arch", sorted(ARCHITECTURES))
def test_every_registered_family_samples_consistently(arch):
    model = tiny_model(arch)
    prompts = [TOK.render_prompt("1+1"), TOK.render_prompt("23 - 4", "ends with 9")]
    torch.manual_seed(2)
    out = generate(model, prompts, max_new_tokens=3, eos_id=TOK.eos_id, pad_id=TOK.pad_id)
    with torch.no_grad():
        logprobs, _, _ = score(model, prompts, out.completion_ids_NC, pad_id=TOK.pad_id)
    assert out.mask_NC[:, 0].all()
    assert (logprobs - out.logprobs_NC).masked_fill(~out.mask_NC, 0).abs().max() < 1e-5


@pytest.mark.parametrize("repeats", [4, 1])   # shared prefixes, and the one-forward fallback
def test_shared_prompt_scoring_equals_plain_scoring(repeats):
    from rl.rollout import score_shared_prompts

    model = tiny_model()
    distinct = [TOK.render_prompt("12 + 35", "starts with 4"), TOK.render_prompt("1 - 2", "ends with 1"),
                TOK.render_prompt("7 + 8")]                       # three lengths: left padding differs
    prompts = [p for p in distinct for _ in range(repeats)]
    torch.manual_seed(3)
    completion = generate(model, prompts, max_new_tokens=5, eos_id=TOK.eos_id, pad_id=TOK.pad_id).completion_ids_NC
    with torch.no_grad():
        want_NC, want_NCV, _ = score(model, prompts, completion, pad_id=TOK.pad_id, temperature=0.7, full=True)
    got_NC, got_NCV = score_shared_prompts(model, prompts, completion, pad_id=TOK.pad_id, temperature=0.7)
    assert got_NCV.shape == want_NCV.shape
    assert (got_NCV - want_NCV).abs().max() < 1e-5 and (got_NC - want_NC).abs().max() < 1e-5
    # one completion token: the prompt forward alone scores it
    got_N1 = score_shared_prompts(model, prompts, completion[:, :1], pad_id=TOK.pad_id, temperature=0.7)[0]
    assert (got_N1 - want_NC[:, :1]).abs().max() < 1e-5
