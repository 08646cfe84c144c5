"""Sparse upcycling (Komatsuzaki et al. 2023, arXiv 2212.05055): a dense decoder's checkpoint as
the initialisation of a Mixture-of-Experts one, so an MoE student starts from a pretrained model.

    python -m student.upcycle DENSE_FOLDER OUT_FOLDER --experts 8 --top-k 2 [--noise 0.01]

A Llama-family dense model becomes a Mixtral-family MoE (student.arch=mixtral) of the same shape:
embeddings, attention, norms and output head copied; every expert of a layer a copy of that
layer's dense MLP (gate, up and down projections), optionally with relative Gaussian noise
(`noise` x each weight matrix's std) so that the experts can diverge; the router freshly
initialised (normal, std `initializer_range`). Mixtral renormalises the top-k router weights to
sum to 1, so with identical experts every token's MoE output is the dense MLP's whatever the
router picks: at step 0 (noise 0) the upcycled model computes the dense model's function, up to
float rounding (tests/test_upcycle.py: SmolLM2-135M-Instruct, logits and greedy decoding). The
router still learns: its gradient flows once the experts differ.

The tokenizer and chat template are the dense model's; the CLI copies them beside the weights.
"""
from __future__ import annotations

import argparse
import sys
from pathlib import Path

import torch
from transformers import MixtralConfig, MixtralForCausalLM, PreTrainedModel

# Dense families upcycled, and the MoE family each becomes.
SOURCES = {"llama": "mixtral"}


def mixtral_config(dense, num_experts: int, top_k: int) -> MixtralConfig:
    """The Mixtral config of the same shape as a Llama config, with `num_experts` experts a layer."""
    if dense.model_type not in SOURCES:
        raise ValueError(f"upcycle: a {dense.model_type!r} model; upcycling reads {sorted(SOURCES)} "
                         "(dense decoders with a gated SiLU MLP)")
    if getattr(dense, "attention_bias", False) or getattr(dense, "mlp_bias", False):
        raise ValueError("upcycle: the dense model has attention or MLP biases, which Mixtral has no place for")
    if not 1 <= top_k <= num_experts:
        raise ValueError(f"upcycle: top_k={top_k} must be in 1..num_experts={num_experts}")
    return MixtralConfig(
        vocab_size=dense.vocab_size, hidden_size=dense.hidden_size, intermediate_size=dense.intermediate_size,
        num_hidden_layers=dense.num_hidden_layers, num_attention_heads=dense.num_attention_heads,
        num_key_value_heads=dense.num_key_value_heads, head_dim=dense.head_dim, hidden_act=dense.hidden_act,
        max_position_embeddings=dense.max_position_embeddings, rms_norm_eps=dense.rms_norm_eps,
        rope_parameters=dict(dense.rope_parameters), tie_word_embeddings=dense.tie_word_embeddings,
        initializer_range=dense.initializer_range, attention_dropout=dense.attention_dropout, sliding_window=None,
        bos_token_id=dense.bos_token_id, eos_token_id=dense.eos_token_id, pad_token_id=dense.pad_token_id,
        num_local_experts=num_experts, num_experts_per_tok=top_k, router_jitter_noise=0.0,
    )


@torch.no_grad()
def upcycle(dense: PreTrainedModel, num_experts: int, top_k: int = 2, noise: float = 0.0,
            seed: int = 0) -> MixtralForCausalLM:
    """The Mixtral-family MoE upcycled from `dense` (a Llama-family causal LM), in its dtype."""
    torch.manual_seed(seed)
    moe = MixtralForCausalLM(mixtral_config(dense.config, num_experts, top_k)).to(dense.dtype)
    src = dense.state_dict()
    dst = moe.state_dict()
    copied = set()
    for name, value in src.items():
        if ".mlp." in name:
            continue
        if name not in dst or dst[name].shape != value.shape:
            raise ValueError(f"upcycle: the dense weight {name} {tuple(value.shape)} has no place in the MoE")
        dst[name].copy_(value)
        copied.add(name)
    for i in range(dense.config.num_hidden_layers):
        mlp, block = f"model.layers.{i}.mlp", moe.model.layers[i].mlp
        gate_up = torch.cat([src[f"{mlp}.gate_proj.weight"], src[f"{mlp}.up_proj.weight"]])   # (2I, H): gate, then up
        down = src[f"{mlp}.down_proj.weight"]                                                  # (H, I)
        for e in range(num_experts):
            block.experts.gate_up_proj[e].copy_(_noisy(gate_up, noise))
            block.experts.down_proj[e].copy_(_noisy(down, noise))
        copied |= {f"{mlp}.experts.gate_up_proj", f"{mlp}.experts.down_proj"}
    # What the dense model did not give: only the routers (and a tied head, which follows the embeddings).
    fresh = {n for n in dst if n not in copied and not n.endswith(".mlp.gate.weight")}
    if moe.config.tie_word_embeddings:
        fresh.discard("lm_head.weight")
    if fresh:
        raise ValueError(f"upcycle: MoE weights the dense model does not fill: {sorted(fresh)[:5]}")
    moe.tie_weights()
    return moe.eval()


def _noisy(weight: torch.Tensor, noise: float) -> torch.Tensor:
    return weight if noise == 0 else weight + noise * weight.float().std().to(weight.dtype) * torch.randn_like(weight)


def main(argv: list[str] | None = None) -> int:
    from transformers import AutoModelForCausalLM, AutoTokenizer

    parser = argparse.ArgumentParser(prog="python -m student.upcycle", description=__doc__.splitlines()[0])
    parser.add_argument("dense", help="a Hugging Face folder of a Llama-family causal LM")
    parser.add_argument("out", help="where the MoE folder goes (weights, config, tokenizer)")
    parser.add_argument("--experts", type=int, default=8, help="experts per layer")
    parser.add_argument("--top-k", type=int, default=2, help="experts per token")
    parser.add_argument("--noise", type=float, default=0.0, help="relative Gaussian noise on each expert copy")
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args(argv)
    try:
        dense = AutoModelForCausalLM.from_pretrained(args.dense)
        moe = upcycle(dense, args.experts, args.top_k, args.noise, args.seed)
    except (OSError, ValueError) as err:
        print(f"upcycle error: {err}", file=sys.stderr)
        return 1
    out = Path(args.out)
    moe.save_pretrained(out)
    AutoTokenizer.from_pretrained(args.dense).save_pretrained(out)
    n = sum(p.numel() for p in moe.parameters())
    print(f"{out}: mixtral, {args.experts} experts top-{args.top_k}, {n / 1e6:.1f}M parameters")
    return 0


if __name__ == "__main__":
    sys.exit(main())
