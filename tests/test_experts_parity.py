"""experts_implementation="hintrl" against transformers' "eager" on tiny random MoE models of several
families (outputs and gradients, fp32 tolerance), and router replay on and off."""
import pytest
import torch
from transformers import (AutoModelForCausalLM, DeepseekV3Config, GptOssConfig, MixtralConfig, OlmoeConfig,
                          Qwen2MoeConfig, Qwen3MoeConfig)
from transformers.integrations.moe import ALL_EXPERTS_FUNCTIONS

import student.experts  # noqa: F401  (registers "hintrl")
from student.router_replay import RouterReplay

BASE = dict(vocab_size=64, hidden_size=32, num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2,
            intermediate_size=48, max_position_embeddings=64)
FAMILIES = {
    "qwen3_moe": lambda: Qwen3MoeConfig(**BASE, head_dim=8, moe_intermediate_size=16, num_experts=8,
                                        num_experts_per_tok=2, norm_topk_prob=True),
    "mixtral": lambda: MixtralConfig(**BASE, num_local_experts=6, num_experts_per_tok=2),
    "olmoe": lambda: OlmoeConfig(**BASE, num_experts=8, num_experts_per_tok=3),
    "qwen2_moe": lambda: Qwen2MoeConfig(**BASE, moe_intermediate_size=16, shared_expert_intermediate_size=16,
                                        num_experts=8, num_experts_per_tok=2),
    "deepseek_v3": lambda: DeepseekV3Config(**BASE, moe_intermediate_size=16, n_routed_experts=8, num_experts_per_tok=2,
                                            n_group=2, topk_group=1, first_k_dense_replace=0, kv_lora_rank=8,
                                            q_lora_rank=8, qk_rope_head_dim=4, qk_nope_head_dim=4, v_head_dim=8),
    "gpt_oss": lambda: GptOssConfig(**BASE, head_dim=8, num_local_experts=6, num_experts_per_tok=2),
}


# Every parity test below runs where the kernels do: the CPU extension, and the CUDA one on a GPU
# (scripts/gpu_check.sh runs this file there).
DEVICES = ["cpu", pytest.param("cuda", marks=pytest.mark.skipif(not torch.cuda.is_available(), reason="no CUDA device"))]


def _model(family: str, impl: str = "hintrl", device: str = "cpu"):
    torch.manual_seed(0)
    model = AutoModelForCausalLM.from_config(FAMILIES[family](), experts_implementation=impl).float()
    with torch.no_grad():  # from_config leaves some expert tensors at zero: randomise everything
        for p in model.parameters():
            p.normal_(0, 0.1) if p.dim() > 1 else p.uniform_(-0.1, 0.1)
    return model.to(device)


def _fwd_bwd(model, ids):
    model.zero_grad()
    logits = model(ids).logits
    logits.square().mean().backward()
    return logits.detach(), {n: p.grad.clone() for n, p in model.named_parameters() if p.grad is not None}


def test_registered_under_hintrl():
    assert ALL_EXPERTS_FUNCTIONS["hintrl"] is student.experts.hintrl_experts_forward


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("family", sorted(FAMILIES))
def test_hintrl_matches_eager(family, device):
    model = _model(family, "eager", device)
    ids = torch.randint(0, 64, (2, 11), generator=torch.Generator().manual_seed(1)).to(device)
    out_eager, grads_eager = _fwd_bwd(model, ids)
    model.set_experts_implementation("hintrl")
    assert model.config._experts_implementation == "hintrl"
    out, grads = _fwd_bwd(model, ids)
    torch.testing.assert_close(out, out_eager, rtol=1e-4, atol=1e-5)
    assert grads.keys() == grads_eager.keys()
    expert_grads = [n for n in grads if "experts" in n]
    assert expert_grads, "no expert parameter received a gradient"
    for n in grads:
        torch.testing.assert_close(grads[n], grads_eager[n], rtol=1e-4, atol=1e-6, msg=n)


@pytest.mark.parametrize("device", DEVICES)
def test_hintrl_bf16_close_to_eager(device):
    model = _model("qwen3_moe", "eager", device).to(torch.bfloat16)
    ids = torch.randint(0, 64, (2, 7), generator=torch.Generator().manual_seed(2)).to(device)
    ref = model(ids).logits.float()
    model.set_experts_implementation("hintrl")
    torch.testing.assert_close(model(ids).logits.float(), ref, rtol=5e-2, atol=5e-2)


@pytest.mark.parametrize("family", ["qwen3_moe", "mixtral", "gpt_oss", "deepseek_v3"])
def test_router_replay_of_own_routes_is_identity(family):
    model = _model(family)
    ids = torch.randint(0, 64, (2, 9), generator=torch.Generator().manual_seed(3))
    replay = RouterReplay(model)
    assert replay.num_layers == 2
    with replay.record() as rec:
        out_free, grads_free = _fwd_bwd(model, ids)
    routes = rec.routes(batch_size=2)
    assert routes[0].shape == (2, 9, replay.top_k)
    with replay.replay(routes):
        out_replayed, grads_replayed = _fwd_bwd(model, ids)
    torch.testing.assert_close(out_replayed, out_free, rtol=1e-5, atol=1e-6)
    for n in grads_free:
        torch.testing.assert_close(grads_replayed[n], grads_free[n], rtol=1e-4, atol=1e-6, msg=n)
    assert replay.stats()["mismatch_rate"] == 0.0 and replay.stats()["slots"] == 2 * 2 * 9 * replay.top_k


@pytest.mark.parametrize("family", ["qwen3_moe", "gpt_oss", "deepseek_v3"])
def test_router_replay_forces_ids_and_counts_mismatches(family):
    model = _model(family)
    ids = torch.randint(0, 64, (2, 9), generator=torch.Generator().manual_seed(4))
    replay = RouterReplay(model)
    with replay.record() as rec:
        out_free = model(ids).logits
    num_experts = model.config.num_local_experts if family == "gpt_oss" else (
        model.config.n_routed_experts if family == "deepseek_v3" else model.config.num_experts)
    routes = rec.routes(batch_size=2)
    shifted = [(r + 1) % num_experts for r in routes]
    shifted[0][:, :3] = -1  # first three positions of layer 0 stay free
    seen = []
    handle = model.model.layers[1].mlp.experts.register_forward_pre_hook(lambda m, a: seen.append(a[1].clone()))
    with replay.replay(shifted):
        out, grads = _fwd_bwd(model, ids)
    handle.remove()
    assert torch.equal(seen[0], shifted[1].reshape(-1, replay.top_k).to(seen[0].dtype))  # experts saw forced ids
    assert not torch.allclose(out, out_free)
    router_grads = [g for n, g in grads.items() if n.endswith(("gate.weight", "router.weight"))]
    assert len(router_grads) == 2 and all(g.abs().sum() > 0 for g in router_grads)  # gradient reaches routers
    stats = replay.stats()
    forced_slots = (2 * 9 - 2 * 3) * replay.top_k + 2 * 9 * replay.top_k
    assert stats["slots"] == forced_slots
    # shifting every id by one leaves an id in the router's own top-k only where two picks were adjacent
    assert 0.3 < stats["mismatch_rate"] <= 1.0


def test_router_replay_pads_missing_tail_positions():
    model = _model("qwen3_moe")
    replay = RouterReplay(model)
    ids = torch.randint(0, 64, (2, 6), generator=torch.Generator().manual_seed(5))
    with replay.record() as rec:
        model.generate(ids, max_new_tokens=3, do_sample=False, pad_token_id=0)
    routes = rec.routes(batch_size=2)
    assert routes[0].shape == (2, 8, replay.top_k)  # the last generated token is never fed back
    full = torch.cat([ids, torch.randint(0, 64, (2, 3))], dim=1)
    with replay.replay(routes):
        model(full)
    assert replay.stats()["slots"] == 2 * 2 * 8 * replay.top_k
    with pytest.raises(ValueError):
        with replay.replay(routes[:1]):
            pass


@pytest.mark.parametrize("family", ["qwen3_moe", "mixtral", "olmoe"])
def test_hintrl_gating_matches_transformers_router(family):
    model = _model(family)
    ids = torch.randint(0, 64, (2, 9), generator=torch.Generator().manual_seed(6))
    out_ref, grads_ref = _fwd_bwd(model, ids)
    assert student.experts.use_hintrl_gating(model) == 2
    out, grads = _fwd_bwd(model, ids)
    torch.testing.assert_close(out, out_ref, rtol=1e-4, atol=1e-5)
    for n in grads_ref:
        torch.testing.assert_close(grads[n], grads_ref[n], rtol=1e-4, atol=1e-6, msg=n)
    replay = RouterReplay(model)  # replay hooks wrap the patched routers too
    with replay.record() as rec:
        model(ids)
    with replay.replay(rec.routes()):
        torch.testing.assert_close(model(ids).logits, out, rtol=1e-5, atol=1e-6)
    assert replay.stats()["mismatch_rate"] == 0.0


def test_gpt_oss_router_is_left_alone_by_gating_patch():
    assert student.experts.use_hintrl_gating(_model("gpt_oss")) == 0


def test_swiglu_function_is_bitwise_transformers_default_gate():
    # expert_mlp's fused gate (one gradient buffer instead of autograd's cat of two halves) must be
    # the same arithmetic as transformers' _default_apply_gate, forward and backward.
    from student.experts import _is_default_swiglu, _SwiGLU
    experts = _model("qwen3_moe").model.layers[0].mlp.experts
    assert _is_default_swiglu(experts)
    assert not _is_default_swiglu(_model("gpt_oss").model.layers[0].mlp.experts)   # clamped, own gate
    h = torch.randn(37, 32, generator=torch.Generator().manual_seed(0))
    grad = torch.randn(37, 16, generator=torch.Generator().manual_seed(1))
    results = []
    for fn in (experts._apply_gate, _SwiGLU.apply):
        x = h.clone().requires_grad_()
        out = fn(x)
        results.append((out, *torch.autograd.grad(out, x, grad)))
    for a, b in zip(*results):
        assert torch.equal(a, b)


def test_swiglu_check_is_per_module_not_per_class():
    # The same experts class with another activation (config.hidden_act) is not the default SwiGLU.
    from student.experts import _is_default_swiglu
    silu = _model("qwen3_moe").model.layers[0].mlp.experts
    torch.manual_seed(0)
    gelu = AutoModelForCausalLM.from_config(
        Qwen3MoeConfig(**BASE, head_dim=8, moe_intermediate_size=16, num_experts=8, num_experts_per_tok=2,
                       hidden_act="gelu")).model.layers[0].mlp.experts
    assert type(silu) is type(gelu)
    assert _is_default_swiglu(silu) and not _is_default_swiglu(gelu) and _is_default_swiglu(silu)


ROUTER_KINDS = {"qwen3_moe": "softmax_topk", "qwen2_moe": "softmax_topk", "mixtral": "softmax_topk",
                "olmoe": "softmax_topk", "gpt_oss": "topk_softmax", "deepseek_v3": "sigmoid"}


@pytest.mark.parametrize("family", sorted(FAMILIES))
def test_router_kind_from_the_routers_behaviour(family):
    from student.experts import _probe_router, find_routers, router_kind
    model = _model(family)
    router = find_routers(model)[0][1]
    assert router_kind(router) == ROUTER_KINDS[family]
    student.experts.use_hintrl_gating(model)       # an instance patch does not change the class's kind
    assert router_kind(router) == ROUTER_KINDS[family]
    if family != "deepseek_v3":
        # ZeRO-3 leaves a parameter an empty placeholder with its full shape in ds_shape: the probe
        # runs on weights of its own, never the router's.
        full = router.weight.shape
        router.weight.data = torch.empty(0)
        router.weight.ds_shape = full
        assert _probe_router(router) == (ROUTER_KINDS[family], True)


def test_router_kind_refuses_an_unknown_scoring():
    from student.experts import router_kind

    class SigmoidTopKRouter(torch.nn.Module):    # sigmoid scores, without DeepseekV3's attributes
        def __init__(self):
            super().__init__()
            self.top_k, self.hidden_dim = 2, 8
            self.weight = torch.nn.Parameter(torch.randn(6, 8))

        def forward(self, hidden_states):
            logits = torch.nn.functional.linear(hidden_states, self.weight)
            ids = logits.topk(self.top_k, dim=-1).indices
            return logits, logits.sigmoid().gather(1, ids), ids

    with pytest.raises(NotImplementedError, match="SigmoidTopKRouter: unknown expert scoring"):
        router_kind(SigmoidTopKRouter())


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("device", DEVICES)
def test_sdpa_attention_matches_eager_with_our_experts(device, dtype):
    """student.attn_implementation=sdpa (torch's fused attention: its flash kernel on a GPU in
    bf16) computes what eager attention does, around our experts."""
    torch.manual_seed(0)
    ids = torch.randint(0, 64, (2, 13), generator=torch.Generator().manual_seed(7)).to(device)
    logits = {}
    for attn in ("eager", "sdpa"):
        model = _model("qwen3_moe", "hintrl", device).to(dtype)
        model.set_attn_implementation(attn)
        assert model.config._attn_implementation == attn
        logits[attn] = model(ids).logits.float()
    tol = dict(rtol=1e-4, atol=1e-5) if dtype == torch.float32 else dict(rtol=5e-2, atol=5e-2)
    torch.testing.assert_close(logits["sdpa"], logits["eager"], **tol)
