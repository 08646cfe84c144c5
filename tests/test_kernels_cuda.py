"""CUDA side of the routing kernels. The build check runs wherever torch is a CUDA build and nvcc is
present (it needs no GPU); the kernel checks need a GPU and are skipped without one.

Shape legend: T tokens, E experts, K slots per token, D hidden, P permuted rows.
"""
import os
import shutil

import pytest
import torch

from kernels import ops, reference as ref

CUDA_HOME = os.environ.get("CUDA_HOME") or next(
    (d for d in ("/usr/local/cuda-13.0", "/usr/local/cuda") if os.path.exists(os.path.join(d, "bin", "nvcc"))), None)
HAVE_NVCC = bool(CUDA_HOME and os.path.exists(os.path.join(CUDA_HOME, "bin", "nvcc"))) or shutil.which("nvcc")
_skip_without_gpu = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")


def gpu(fn):
    return pytest.mark.gpu(_skip_without_gpu(fn))


@pytest.mark.skipif(torch.version.cuda is None or not HAVE_NVCC, reason="CPU-only torch or no nvcc: no CUDA build")
def test_cuda_extension_built_and_imports():
    assert ops.CUDA_EXTENSION_ERROR is None, ops.CUDA_EXTENSION_ERROR
    import kernels._cuda  # noqa: F401


@gpu
@pytest.mark.parametrize("T,E,K,D", [(1, 4, 1, 8), (37, 16, 4, 24), (300, 128, 8, 64), (64, 8, 8, 130)])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float16])
@pytest.mark.parametrize("block", [1, 16])
def test_cuda_ops_match_reference(T, E, K, D, dtype, block):
    g = torch.Generator().manual_seed(T + E)
    logits = torch.randn(T, E, generator=g).to(dtype)
    w, ids = torch.ops.hintrl.topk_gating(logits.cuda(), K, True, None)
    w_ref, ids_ref = ref.topk_gating(logits, K, True)
    assert torch.equal(ids.cpu(), ids_ref)
    torch.testing.assert_close(w.cpu(), w_ref, rtol=1e-5, atol=1e-6)
    counts, offsets = torch.ops.hintrl.expert_counts(ids, E, block)
    counts_ref, offsets_ref = ref.expert_counts(ids_ref, E, block)
    assert torch.equal(counts.cpu(), counts_ref) and torch.equal(offsets.cpu(), offsets_ref)
    x = torch.randn(T, D, generator=g).to(dtype)
    xs, pos = torch.ops.hintrl.permute(x.cuda(), ids, offsets, block)
    xs_ref, pos_ref = ref.permute(x, ids_ref, offsets_ref, block)
    assert torch.equal(pos.cpu(), pos_ref) and torch.equal(xs.cpu(), xs_ref)
    ys = torch.randn(xs.shape, generator=g).to(dtype)
    out = torch.ops.hintrl.unpermute_combine(ys.cuda(), pos, w)
    tol = 2e-2 if dtype != torch.float32 else 1e-5
    torch.testing.assert_close(out.cpu(), ref.unpermute_combine(ys, pos_ref, w_ref), rtol=tol, atol=tol)


@gpu
@pytest.mark.parametrize("D", [64, 130])                  # 16-byte packs, and rows that do not allow them
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float16])
def test_cuda_combine_backward_writes_every_row_as_the_cpu_does(D, dtype):
    """One warp per slot, then zeros on the rows no slot points at (block padding, a dropped slot),
    into memory that is not zeroed first: recycled NaNs must not survive anywhere."""
    T, E, K, block = 50, 8, 2, 16
    g = torch.Generator().manual_seed(D)
    ids = torch.randint(0, E, (T, K), generator=g)
    ids[3, 1] = E                                          # a dropped slot (expert-parallel sentinel)
    _c, offsets = torch.ops.hintrl.expert_counts(ids, E, block)
    _xs, pos = torch.ops.hintrl.permute(torch.randn(T, D, generator=g).to(dtype), ids, offsets, block)
    ys = torch.randn(_xs.shape, generator=g).to(dtype)
    w, grad_out = torch.rand(T, K, generator=g), torch.randn(T, D, generator=g).to(dtype)
    gys_cpu, gw_cpu = torch.ops.hintrl.unpermute_combine_backward(grad_out, ys, pos, w)
    del _c
    torch.full((4 * ys.numel(),), float("nan"), device="cuda", dtype=dtype)   # freed into the cache: reused below
    gys, gw = torch.ops.hintrl.unpermute_combine_backward(grad_out.cuda(), ys.cuda(), pos.cuda(), w.cuda())
    assert torch.equal(gys.cpu(), gys_cpu)                 # w * g: the same arithmetic, row for row
    tol = 2e-2 if dtype != torch.float32 else 1e-5         # the dot's order differs (lanes, then shuffles)
    torch.testing.assert_close(gw.cpu(), gw_cpu, rtol=tol, atol=tol)
    assert gw[3, 1] == 0 and (gys.cpu()[~torch.isin(torch.arange(len(ys)), pos[pos >= 0])] == 0).all()


@gpu
def test_cuda_gradcheck_float64():
    dev = "cuda"
    T, E, K, D = 6, 5, 2, 3
    logits = torch.randn(T, E, device=dev, dtype=torch.float64, requires_grad=True)
    assert torch.autograd.gradcheck(lambda l: ops.topk_gating(l, K, True)[0], (logits,))
    ids = torch.randint(0, E, (T, K), device=dev)
    _c, off = ops.expert_counts(ids, E, 1)
    x = torch.randn(T, D, device=dev, dtype=torch.float64, requires_grad=True)
    assert torch.autograd.gradcheck(lambda a: ops.permute(a, ids, off, 1)[0], (x,))
    _xs, pos = ops.permute(x.detach(), ids, off, 1)
    ys = torch.randn(T * K, D, device=dev, dtype=torch.float64, requires_grad=True)
    w = torch.rand(T, K, device=dev, dtype=torch.float64, requires_grad=True)
    assert torch.autograd.gradcheck(lambda y, ww: ops.unpermute_combine(y, pos, ww), (ys, w))


@gpu
def test_cuda_op_rejects_cpu_inputs_clearly():
    x = torch.randn(4, 8, device="cuda")
    ids = torch.zeros(4, 2, dtype=torch.long)  # left on the CPU by mistake
    offsets = torch.tensor([0, 8], dtype=torch.int32, device="cuda")
    with pytest.raises(RuntimeError, match="needs CUDA tensors"):
        torch.ops.hintrl.permute(x, ids, offsets, 1)


@gpu
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_cuda_experts_parity_with_eager(dtype):
    from transformers import AutoModelForCausalLM, Qwen3MoeConfig

    import student.experts

    cfg = Qwen3MoeConfig(vocab_size=64, hidden_size=64, num_hidden_layers=2, num_attention_heads=4,
                         num_key_value_heads=2, head_dim=16, intermediate_size=64, moe_intermediate_size=32,
                         num_experts=16, num_experts_per_tok=4)
    torch.manual_seed(0)
    model = AutoModelForCausalLM.from_config(cfg, experts_implementation="eager").to("cuda", dtype)
    with torch.no_grad():
        for p in model.parameters():
            p.normal_(0, 0.1)
    ids = torch.randint(0, 64, (2, 33), device="cuda")
    outs = {}
    for impl in ("eager", "hintrl"):
        model.set_experts_implementation(impl)
        model.zero_grad()
        logits = model(ids).logits
        logits.float().square().mean().backward()
        outs[impl] = (logits.float(), model.model.layers[0].mlp.experts.down_proj.grad.float().clone())
    student.experts.use_hintrl_gating(model)
    model.zero_grad()
    gated = model(ids).logits.float()
    tol = 1e-4 if dtype == torch.float32 else 5e-2
    torch.testing.assert_close(outs["hintrl"][0], outs["eager"][0], rtol=tol, atol=tol)
    torch.testing.assert_close(outs["hintrl"][1], outs["eager"][1], rtol=tol, atol=tol)
    torch.testing.assert_close(gated, outs["eager"][0], rtol=tol, atol=tol)
