"""Packed scoring (student/lean_policy.py::pack_rows): rows whose prompts share a prefix but not the
whole prompt (a self-teacher's contexts: the problem, then each row's own feedback) are forwarded
as shared heads plus unpadded continuations, and score as transformers' whole-row forward does,
with and without gradient, with routes replayed, through SDPA on long rows (SDPA_MIN_KEYS)."""
import random

import pytest
import torch

from student import ByteTokenizer, StudentConfig, build_student
from student.hf_policy import HFPolicy
from student.lean import SDPA_MIN_KEYS
from student.lean_policy import PACK_AT_MOST, LeanPolicy, pack_rows, shared_heads
from student.policy import Sampling, distinct_prompts

TOK = ByteTokenizer()


def model_of(arch="qwen3_moe"):
    torch.manual_seed(0)
    return build_student(StudentConfig(arch=arch, hidden_size=64, num_layers=2, num_heads=4, num_kv_heads=2,
                                       num_experts=4, top_k=2, expert_width=32), TOK)


def feedback_contexts(groups=3, size=4):
    """Each group's problem, then a per-row feedback of its own length (some past SDPA_MIN_KEYS)."""
    rnd = random.Random(0)
    out = []
    for g in range(groups):
        problem = f"{rnd.randint(0, 99)} + {rnd.randint(0, 9)}"
        for i in range(size):
            said = "x" * rnd.randint(0, 40)
            out.append(TOK.render_prompt(problem, f"feedback on your answer: incorrect: '{said}{i}' is wrong"))
    return out


def test_heads_share_what_saves_tokens():
    grpo = [TOK.render_prompt(p) for p in ("3 + 4", "3 + 5", "12 - 7") for _ in range(8)]
    distinct, of_row = distinct_prompts(grpo)
    rows = torch.bincount(of_row).tolist()
    # a group's prompt is forwarded once; groups sharing "3 + " stay apart (8 tails each would cost more)
    assert sorted(len(m) for m, _ in shared_heads(distinct, rows)) == [1, 1, 1]
    contexts = feedback_contexts()
    heads = shared_heads(contexts, [1] * len(contexts))
    assert sorted(len(m) for m, _ in heads) == [4, 4, 4]
    for members, length in heads:                        # the problem and the feedback's opening
        assert length > len(TOK.render_prompt("1 + 1")) + 20
        assert all(contexts[u][:length] == contexts[members[0]][:length] for u in members)
    assert shared_heads([[1, 2], [3, 4]], [1, 1]) == [([0], 2), ([1], 2)]   # nothing in common


def test_packing_holds_every_real_token_once():
    contexts = feedback_contexts()
    distinct, of_row = distinct_prompts(contexts)
    pack = pack_rows(distinct, of_row, 5, torch.float32)
    shared = sum(length * (len(m) - 1) for m, length in shared_heads(distinct, [1] * len(distinct)))
    assert pack.source_T.numel() == sum(map(len, contexts)) + 5 * len(contexts) - shared
    assert pack.scored_NS.shape == (len(contexts), 6)
    whole = len(contexts) * (max(map(len, contexts)) + 5)
    assert pack.source_T.numel() <= PACK_AT_MOST * whole     # so scoring them takes the packed pass
    assert max(map(len, contexts)) + 5 > SDPA_MIN_KEYS      # and the long rows attend through SDPA


@pytest.mark.parametrize("routes", [False, True])
def test_packed_scores_equal_whole_row_forward(routes):
    model = model_of()
    contexts = feedback_contexts()
    hf, lean = (cls(model, pad_id=TOK.pad_id, banned_ids=TOK.never_sampled) for cls in (HFPolicy, LeanPolicy))
    torch.manual_seed(1)
    roll = lean.generate(contexts, Sampling(max_new_tokens=8, eos_id=TOK.eos_id, pad_id=TOK.pad_id))
    ids, kw = roll.completion_ids_NC, dict(routes=roll.routes) if routes else {}
    results = []
    for policy in (hf, lean):
        model.zero_grad()
        s = policy.score(contexts, ids, need="full", router_aux=True, **kw)
        finite = torch.isfinite(s.logp_NCV)
        (s.logprobs_NC.sum() + s.logp_NCV.exp().mul(s.logp_NCV.where(finite, 0)).sum() + 10 * s.aux_loss).backward()
        results.append((s.logp_NCV.detach(), s.aux_loss.detach(),
                        {n: p.grad.clone() for n, p in model.named_parameters() if p.grad is not None}))
    (a, aux_a, ga), (b, aux_b, gb) = results
    torch.testing.assert_close(a, b, atol=2e-5, rtol=0)
    torch.testing.assert_close(aux_a, aux_b, atol=1e-6, rtol=1e-6)
    assert set(ga) == set(gb)
    for name in ga:
        torch.testing.assert_close(ga[name], gb[name], atol=1e-4, rtol=1e-4, msg=name)
    if routes:
        assert lean.take_replay_mismatch() == 0.0
    with torch.no_grad():          # the teacher's top-k targets: the same tokens, the same log-probs
        ref, got = (p.score(contexts, ids, need="topk", k=5, **kw) for p in (hf, lean))
    torch.testing.assert_close(ref.topk_logp_NCK, got.topk_logp_NCK, atol=2e-5, rtol=0)
    torch.testing.assert_close(ref.tail_logp_NC, got.tail_logp_NC, atol=2e-5, rtol=0)
    assert torch.equal(ref.argmax_NC, got.argmax_NC)
    assert (ref.topk_ids_NCK != got.topk_ids_NCK).float().mean() < 0.01   # ties may swap order
