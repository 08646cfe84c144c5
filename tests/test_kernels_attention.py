"""The fused decode attention (kernels/csrc/attention_cpu.cpp) against kernels.reference: outputs and
cache writes toleranced, untouched cache positions exact; schema and fake via opcheck; the fallbacks
of kernels.ops.decode_attention. The lean forward's use of it is covered by tests/test_lean.py
(generation equal to transformers, Qwen3 with q/k norm and Mixtral without)."""
import pytest
import torch

from kernels import ops, reference as ref


def _inputs(n=5, h=4, hkv=2, d=8, cap=9, length=6, norm=True, seed=7):
    g = torch.Generator().manual_seed(seed)
    qkv = torch.randn(n, h + 2 * hkv, d, generator=g)
    w = torch.randn(h + hkv, d, generator=g) if norm else None
    cos, sin = torch.randn(n, d, generator=g), torch.randn(n, d, generator=g)
    k_cache, v_cache = torch.randn(n, hkv, cap, d, generator=g), torch.randn(n, hkv, cap, d, generator=g)
    bias = torch.zeros(n, length + 1).masked_fill(torch.rand(n, length + 1, generator=g) < 0.4, float("-inf"))
    bias[:, -1] = 0                                   # the new token always sees itself
    return qkv, w, cos, sin, k_cache, v_cache, length, bias, d ** -0.5, 1e-6


def _run(fn, args):
    """fn on copies of the caches: (output, k_cache, v_cache)."""
    args = list(args)
    args[4], args[5] = args[4].clone(), args[5].clone()
    return fn(*args), args[4], args[5]


@pytest.mark.parametrize("norm", [True, False])
@pytest.mark.parametrize("h,hkv", [(4, 2), (4, 4), (6, 1)])
def test_decode_attention_matches_reference(norm, h, hkv):
    args = _inputs(h=h, hkv=hkv, norm=norm)
    out, k, v = _run(torch.ops.hintrl.decode_attention, args)
    expected, k_ref, v_ref = _run(ref.decode_attention, args)
    torch.testing.assert_close(out, expected, rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(k, k_ref, rtol=1e-5, atol=1e-5)
    assert torch.equal(v, v_ref)                      # values are copied as projected
    length, others = args[6], [t for t in range(args[4].size(2)) if t != args[6]]
    assert torch.equal(k[:, :, others], args[4][:, :, others]) and torch.equal(v[:, :, others], args[5][:, :, others])
    assert not torch.equal(k[:, :, length], args[4][:, :, length])


def test_decode_attention_masks_keys():
    # A key behind -inf bias gets no weight: changing its value leaves the output as it was.
    args = list(_inputs(norm=False))
    args[7][0, 2] = float("-inf")
    out, _, _ = _run(torch.ops.hintrl.decode_attention, args)
    args[5] = args[5].clone()
    args[5][0, :, 2] += 100.0
    changed, _, _ = _run(torch.ops.hintrl.decode_attention, args)
    assert torch.equal(out, changed)


def test_decode_attention_does_not_depend_on_thread_count():
    args = _inputs(n=64, d=32, cap=40, length=30)
    before = torch.get_num_threads()
    try:
        results = []
        for threads in (1, 2):
            torch.set_num_threads(threads)
            results.append(_run(torch.ops.hintrl.decode_attention, args))
    finally:
        torch.set_num_threads(before)
    for a, b in zip(*results):
        assert torch.equal(a, b)


def test_decode_attention_opcheck():
    torch.library.opcheck(torch.ops.hintrl.decode_attention.default, _inputs(),
                          test_utils=("test_schema", "test_faketensor"))


def test_ops_falls_back_to_the_reference_with_autograd_or_other_dtypes():
    args = list(_inputs())
    args[0] = args[0].requires_grad_()
    out, _, _ = _run(ops.decode_attention, args)
    (grad,) = torch.autograd.grad(out.sum(), args[0])          # the reference carries the graph
    assert grad.abs().sum() > 0
    bf16 = [a.bfloat16() if isinstance(a, torch.Tensor) else a for a in _inputs()]
    out, _, _ = _run(ops.decode_attention, bf16)
    assert out.dtype == torch.bfloat16


def test_decode_attention_rejects_a_full_cache():
    args = list(_inputs(cap=9, length=9))
    with pytest.raises(RuntimeError, match="outside the cache capacity"):
        torch.ops.hintrl.decode_attention(*args)
