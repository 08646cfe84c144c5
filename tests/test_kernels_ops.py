"""The hintrl routing ops (compiled CPU extension) against kernels.reference: exact on ids/counts/
positions, toleranced on floats; gradcheck in float64; torch.library.opcheck for schema, fake and
autograd registrations. Runs on CUDA too when present (see test_kernels_cuda.py for GPU-only checks).

Shape legend: T tokens, E experts, K slots per token, D hidden, P permuted rows.
"""
import pytest
import torch

from kernels import ops, reference as ref


def test_cpu_extension_is_built():
    # CI must prove the extension builds: no silent fallback to the torch reference here.
    assert ops.CPU_EXTENSION_ERROR is None, ops.CPU_EXTENSION_ERROR
    assert ops.backend("cpu")[0] == "cpu-ext"
    assert hasattr(torch.ops.hintrl, "permute")


def _close(a, b, dtype):
    tol = {torch.float64: 1e-12, torch.float32: 1e-5, torch.bfloat16: 2e-2, torch.float16: 2e-3}[dtype]
    torch.testing.assert_close(a, b, rtol=tol, atol=tol)


CASES = [  # T, E, K, D
    (1, 4, 1, 8), (7, 6, 3, 5), (33, 16, 4, 24), (64, 8, 8, 16), (200, 128, 8, 32), (5, 3, 3, 4),
]


@pytest.mark.parametrize("T,E,K,D", CASES)
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float64])
@pytest.mark.parametrize("renorm", [True, False])
def test_topk_gating_matches_reference(T, E, K, D, dtype, renorm):
    g = torch.Generator().manual_seed(T * 1000 + E)
    logits_TE = torch.randn(T, E, generator=g).to(dtype)
    w, ids = torch.ops.hintrl.topk_gating(logits_TE, K, renorm, None)
    w_ref, ids_ref = ref.topk_gating(logits_TE, K, renorm)
    assert torch.equal(ids, ids_ref)
    assert w.dtype == ref.acc_dtype(dtype)
    _close(w, w_ref, torch.float64 if dtype == torch.float64 else torch.float32)
    forced_TK = torch.stack([torch.randperm(E, generator=g)[:K] for _ in range(T)])
    w_f, ids_f = torch.ops.hintrl.topk_gating(logits_TE, K, renorm, forced_TK)
    assert torch.equal(ids_f, forced_TK)
    _close(w_f, ref.topk_gating(logits_TE, K, renorm, forced_TK)[0], torch.float64 if dtype == torch.float64 else torch.float32)


def test_topk_gating_ties_pick_lower_expert_id():
    logits_TE = torch.tensor([[1.0, 3.0, 3.0, 0.0, 3.0], [2.0, 2.0, 2.0, 2.0, 2.0]])
    _w, ids = torch.ops.hintrl.topk_gating(logits_TE, 3, True, None)
    assert ids.tolist() == [[1, 2, 4], [0, 1, 2]]
    assert torch.equal(ids, ref.topk_gating(logits_TE, 3, True)[1])


def test_topk_gating_k_equals_e_gives_full_softmax():
    logits_TE = torch.randn(9, 6)
    w, ids = torch.ops.hintrl.topk_gating(logits_TE, 6, False, None)
    probs = torch.softmax(logits_TE, -1).gather(1, ids)
    _close(w, probs, torch.float32)
    assert torch.equal(ids.sort(-1).values, torch.arange(6).expand(9, 6))


@pytest.mark.parametrize("T,E,K,D", CASES)
@pytest.mark.parametrize("block", [1, 4])
def test_counts_and_permute_match_reference(T, E, K, D, block):
    g = torch.Generator().manual_seed(T + E + K)
    # Leave the last expert empty on purpose (an expert with no tokens).
    ids_TK = torch.stack([torch.randperm(max(E - 1, K), generator=g)[:K] for _ in range(T)]) % E
    counts, offsets = torch.ops.hintrl.expert_counts(ids_TK, E, block)
    counts_ref, offsets_ref = ref.expert_counts(ids_TK, E, block)
    assert torch.equal(counts, counts_ref) and torch.equal(offsets, offsets_ref)
    assert int(counts.sum()) == T * K  # no token dropped
    for dtype in (torch.float32, torch.bfloat16, torch.float16):
        x_TD = torch.randn(T, D, generator=g).to(dtype)
        xs, pos = torch.ops.hintrl.permute(x_TD, ids_TK, offsets, block)
        xs_ref, pos_ref = ref.permute(x_TD, ids_TK, offsets, block)
        assert torch.equal(pos, pos_ref)
        assert torch.equal(xs, xs_ref)  # a gather: bit-exact
        ys_PD = torch.randn(xs.shape, generator=g).to(dtype)
        w_TK = torch.rand(T, K, generator=g)
        _close(torch.ops.hintrl.unpermute_combine(ys_PD, pos, w_TK), ref.unpermute_combine(ys_PD, pos, w_TK), dtype)


def test_permute_is_stable_and_groups_by_expert():
    ids_TK = torch.tensor([[2, 0], [0, 2], [2, 1]])
    counts, offsets = torch.ops.hintrl.expert_counts(ids_TK, 3, 1)
    x_TD = torch.arange(3.0).unsqueeze(1)
    xs, pos = torch.ops.hintrl.permute(x_TD, ids_TK, offsets, 1)
    assert counts.tolist() == [2, 1, 3] and offsets.tolist() == [0, 2, 3, 6]
    assert xs.squeeze(1).tolist() == [0.0, 1.0, 2.0, 0.0, 1.0, 2.0]  # expert 0: t0, t1; 1: t2; 2: t0, t1, t2
    assert pos.tolist() == [[3, 0], [1, 4], [5, 2]]


def test_dropped_slots_contribute_nothing():
    # ids outside [0, E) follow transformers' expert-parallel sentinel convention.
    ids_TK = torch.tensor([[0, 5], [1, 0]])
    counts, offsets = torch.ops.hintrl.expert_counts(ids_TK, 2, 1)
    assert counts.tolist() == [2, 1]
    xs, pos = torch.ops.hintrl.permute(torch.ones(2, 3), ids_TK, offsets, 1)
    assert pos[0, 1] == -1 and xs[3].abs().sum() == 0
    out = torch.ops.hintrl.unpermute_combine(xs, pos, torch.ones(2, 2))
    assert out.tolist() == [[1.0] * 3, [2.0] * 3]


def test_gradcheck_float64():
    g = torch.Generator().manual_seed(1)
    T, E, K, D = 6, 5, 2, 3
    logits = torch.randn(T, E, generator=g, dtype=torch.float64, requires_grad=True)
    for renorm in (True, False):
        assert torch.autograd.gradcheck(lambda l: ops.topk_gating(l, K, renorm)[0], (logits,))
        forced = torch.randint(0, E, (T, K), generator=g)
        assert torch.autograd.gradcheck(lambda l: ops.topk_gating(l, K, renorm, forced)[0], (logits,))
    ids = torch.randint(0, E, (T, K), generator=g)
    _c, offsets = ops.expert_counts(ids, E, 2)
    x = torch.randn(T, D, generator=g, dtype=torch.float64, requires_grad=True)
    assert torch.autograd.gradcheck(lambda a: ops.permute(a, ids, offsets, 2)[0], (x,))
    _xs, pos = ops.permute(x.detach(), ids, offsets, 2)
    ys = torch.randn(_xs.shape, generator=g, dtype=torch.float64, requires_grad=True)
    w = torch.rand(T, K, generator=g, dtype=torch.float64, requires_grad=True)
    assert torch.autograd.gradcheck(lambda y, ww: ops.unpermute_combine(y, pos, ww), (ys, w))


def test_backward_matches_reference_autograd():
    g = torch.Generator().manual_seed(2)
    T, E, K, D = 40, 12, 3, 16
    logits = torch.randn(T, E, generator=g, requires_grad=True)
    x = torch.randn(T, D, generator=g, requires_grad=True)

    def layer(impl):
        w, ids = impl.topk_gating(logits, K, True)
        _c, off = impl.expert_counts(ids, E, 1)
        xs, pos = impl.permute(x, ids, off, 1)
        return impl.unpermute_combine(torch.tanh(xs) * 3, pos, w)

    out_ref = layer(ref)
    grads_ref = torch.autograd.grad(out_ref.square().sum(), (logits, x))
    out = layer(ops)
    grads = torch.autograd.grad(out.square().sum(), (logits, x))
    _close(out, out_ref, torch.float32)
    for a, b in zip(grads, grads_ref):
        _close(a, b, torch.float32)


def test_opcheck():
    g = torch.Generator().manual_seed(3)
    T, E, K, D = 8, 6, 2, 4
    logits = torch.randn(T, E, generator=g, requires_grad=True)
    ids = torch.randint(0, E, (T, K), generator=g)
    _c, offsets = ops.expert_counts(ids, E, 1)
    x = torch.randn(T, D, generator=g, requires_grad=True)
    _xs, pos = ops.permute(x.detach(), ids, offsets, 1)
    ys = torch.randn(T * K, D, generator=g, requires_grad=True)
    w = torch.rand(T, K, generator=g, requires_grad=True)
    tests = ("test_schema", "test_autograd_registration", "test_faketensor")
    torch.library.opcheck(torch.ops.hintrl.topk_gating.default, (logits, K, True, None), test_utils=tests)
    torch.library.opcheck(torch.ops.hintrl.topk_gating.default, (logits, K, False, ids), test_utils=tests)
    torch.library.opcheck(torch.ops.hintrl.expert_counts.default, (ids, E, 4), test_utils=tests)
    torch.library.opcheck(torch.ops.hintrl.permute.default, (x, ids, offsets, 1), test_utils=tests)
    torch.library.opcheck(torch.ops.hintrl.unpermute_combine.default, (ys, pos, w), test_utils=tests)
    xs = torch.randn(T * K, D, generator=g, requires_grad=True)
    w_EDO = torch.randn(E, D, 3, generator=g, requires_grad=True)
    _counts, offsets = ops.expert_counts(ids, E)
    torch.library.opcheck(torch.ops.hintrl.grouped_mm.default, (xs, w_EDO, offsets), test_utils=tests)


def test_grouped_mm_matches_loop():
    g = torch.Generator().manual_seed(4)
    offsets = torch.tensor([0, 3, 3, 10], dtype=torch.int32)     # an empty expert; rows 10, 11 in none
    for i, o in ((8, 12), (5, 7)):
        xs = torch.randn(12, i, generator=g)
        w = torch.randn(3, i, o, generator=g)
        out = ops.grouped_mm(xs, w, offsets)
        _close(out, ref.grouped_mm_loop(xs, w, offsets), torch.float32)
        assert out[10:].abs().sum() == 0
        _close(ops.grouped_mm(xs, w.transpose(1, 2).contiguous().transpose(1, 2), offsets),
               ref.grouped_mm_loop(xs, w, offsets), torch.float32)
        _close(ops.grouped_mm(xs.bfloat16(), w.bfloat16(), offsets).float(),
               ref.grouped_mm_loop(xs.bfloat16(), w.bfloat16(), offsets).float(), torch.bfloat16)
    _close(ops.grouped_mm(xs.double(), w.double(), offsets), ref.grouped_mm_loop(xs.double(), w.double(), offsets),
           torch.float64)


def test_grouped_mm_few_rows_match_the_loop():
    # Experts with few rows and weights as transformers stores them ((E, out, in), used through a
    # transposed view) take the small-GEMM kernel: every row count up to past its threshold (48),
    # row tails of 1-3, an empty expert, and rows of x with a stride.
    g = torch.Generator().manual_seed(8)
    counts = [0, 1, 2, 3, 4, 5, 7, 16, 17, 31, 48, 49, 64]
    offsets = torch.tensor([0] + counts, dtype=torch.int32).cumsum(0, dtype=torch.int32)
    P = int(offsets[-1])
    for i, o in ((128, 512), (256, 128), (8, 4)):
        w_EOI = torch.randn(len(counts), o, i, generator=g) * i ** -0.5     # outputs of order 1
        wide = torch.randn(P, i + 8, generator=g)
        for xs in (wide[:, :i].contiguous(), wide[:, :i]):       # contiguous and row-strided inputs
            out = ops.grouped_mm(xs, w_EOI.transpose(1, 2), offsets)
            _close(out, ref.grouped_mm_loop(xs, w_EOI.transpose(1, 2), offsets), torch.float32)


def test_grouped_mm_gradients():
    g = torch.Generator().manual_seed(5)
    offsets = torch.tensor([0, 4, 4, 9], dtype=torch.int32)
    xs = torch.randn(11, 5, generator=g, dtype=torch.float64, requires_grad=True)
    w_EOI = torch.randn(3, 6, 5, generator=g, dtype=torch.float64, requires_grad=True)
    # The experts' weights as transformers stores them, (E, out, in), used through a transposed view.
    assert torch.autograd.gradcheck(lambda a, b: ops.grouped_mm(a, b.transpose(1, 2), offsets), (xs, w_EOI))
    out = ops.grouped_mm(xs, w_EOI.transpose(1, 2), offsets)
    grads = torch.autograd.grad(out, (xs, w_EOI), torch.ones_like(out))
    assert grads[1][1].abs().sum() == 0                          # the empty expert gets no gradient
    expected = torch.autograd.grad(ref.grouped_mm_loop(xs, w_EOI.transpose(1, 2), offsets), (xs, w_EOI),
                                   torch.ones_like(out))
    for a, b in zip(grads, expected):
        _close(a, b, torch.float64)


def test_grouped_mm_does_not_depend_on_thread_count():
    # Work is split into fixed blocks (experts), never by the thread count: a run resumed with
    # other threads computes the same numbers.
    g = torch.Generator().manual_seed(6)
    offsets = torch.tensor([0, 40, 41, 300, 300, 512], dtype=torch.int32)
    xs = torch.randn(512, 64, generator=g, requires_grad=True)
    w = torch.randn(5, 96, 64, generator=g, requires_grad=True)
    results = []
    before = torch.get_num_threads()
    try:
        for threads in (1, 2):
            torch.set_num_threads(threads)
            out = ops.grouped_mm(xs, w.transpose(1, 2), offsets)
            results.append((out, *torch.autograd.grad(out.square().sum(), (xs, w))))
            with torch.inference_mode():    # the worker threads run in the caller's mode
                assert torch.equal(ops.grouped_mm(xs, w.transpose(1, 2), offsets), out)
    finally:
        torch.set_num_threads(before)
    for a, b in zip(*results):
        assert torch.equal(a, b)


def test_gating_with_more_slots_than_the_kernels_hold_takes_the_reference():
    # the backward keeps a row's K slot terms in registers (kMaxTopK in moe_core.h): the op refuses
    # more by name, and ops.topk_gating (what the student calls) takes the reference instead
    logits = torch.randn(3, 40, requires_grad=True)
    assert torch.ops.hintrl.topk_gating(logits.detach(), ops.KERNEL_MAX_TOP_K, True, None)[1].shape == (3, 32)
    with pytest.raises(RuntimeError, match="k=33 is above the 32 slots per row"):
        torch.ops.hintrl.topk_gating(logits.detach(), 33, True, None)
    w, ids = ops.topk_gating(logits, 33, True)
    logits_ref = logits.detach().clone().requires_grad_()
    w_ref, ids_ref = ref.topk_gating(logits_ref, 33, True)
    assert torch.equal(ids, ids_ref) and torch.equal(w, w_ref)
    upstream = torch.randn_like(w)          # not ones: renormalised weights sum to 1, whose gradient is 0
    (w * upstream).sum().backward()
    (w_ref * upstream).sum().backward()
    assert logits.grad.abs().max() > 1e-3
    torch.testing.assert_close(logits.grad, logits_ref.grad)


def test_permute_rejects_offsets_of_other_ids():
    ids_TK = torch.tensor([[0, 1], [0, 1]])
    wrong_offsets = torch.tensor([0, 1, 4], dtype=torch.int32)  # expert 0 has two slots, not one
    with pytest.raises(RuntimeError, match="offsets do not fit ids"):
        torch.ops.hintrl.permute(torch.ones(2, 4), ids_TK, wrong_offsets, 1)


def test_info_reports_backends():
    import subprocess
    import sys
    out = subprocess.run([sys.executable, "-m", "kernels.info"], capture_output=True, text=True, check=True).stdout
    assert "cpu  permute            cpu-ext" in out
    assert ops.backend("mps")[0] == "torch"  # no kernels for other devices: the reference path


def test_routing_ops_compile_fullgraph():
    # Fake implementations + autograd registrations let torch.compile trace the ops without breaks.
    def routing(x_TD, logits_TE):
        w, ids = ops.topk_gating(logits_TE, 2, True)
        _c, off = ops.expert_counts(ids, 6)
        xs, pos = ops.permute(x_TD, ids, off)
        return ops.unpermute_combine(torch.tanh(xs), pos, w)

    x = torch.randn(10, 8, requires_grad=True)
    logits = torch.randn(10, 6, requires_grad=True)
    compiled = torch.compile(routing, backend="aot_eager", fullgraph=True)
    out = compiled(x, logits)
    grads = torch.autograd.grad(out.square().sum(), (x, logits))
    x2, l2 = x.detach().requires_grad_(), logits.detach().requires_grad_()
    out_eager = routing(x2, l2)
    grads_eager = torch.autograd.grad(out_eager.square().sum(), (x2, l2))
    torch.testing.assert_close(out, out_eager)
    for a, b in zip(grads, grads_eager):
        torch.testing.assert_close(a, b)
