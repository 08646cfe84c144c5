"""What a run needs on each GPU before it is launched:

    python -m rl.plan EXPERIMENT [key=value ...] --gpus N [--nodes M] [--gpu h100]

The student is built on the meta device, from its config or a checkpoint's config.json (no weight
is read), and its parameters are counted the way DeepSpeed treats them: the experts' stacked
tensors (sharded over `deepspeed.expert_parallel_size` ranks) apart from the rest, and at ZeRO-3
the small ones (under `deepspeed.param_persistence_threshold` elements) that every rank keeps
whole. Per rank, with P parameters, N ranks, L = dense + experts / ep parameters on a rank, b the
training dtype's bytes (4 fp32, 2 bf16):

    parameters      b·L; ZeRO-3: b·(small + rest / N)
    gradients       ZeRO-0: b·L; ZeRO-1/2/3: each rank keeps its partition, b·P/N (experts: a
                    partition of their own group, which comes to the same share)
    optimizer       AdamW's two fp32 moments, 8·L at ZeRO-0, 8·P/N above; DeepSpeed's fp32 master
                    partition, 4·P/N at ZeRO 1-3 (it keeps one in fp32 training too) and 4·L in
                    bf16 at ZeRO-0; `offload_optimizer` moves all of it to host memory
    reduce buffer   DeepSpeed's `reduce_bucket_size` (5e8 elements) in the training dtype, whatever
                    the model's size: held from the start at ZeRO-3, during the backward at ZeRO-1/2
    rollout copy    ZeRO-3 or expert parallelism: a full model in the student's dtype that generates
                    and scores (rl/rollout_model.py); a vLLM engine instead holds its own weights
                    and `rollout.vllm.kv_cache_gb`
    teacher copy    a frozen or EMA self-teacher: a full fp32 model (rl/teacher_weights.py)
    kv cache        generation: rows x (prompt + new tokens) x layers x 2 x kv heads x head dim x b
    activations     what autograd keeps for the backward of one micro-batch's training forward (the
                    lean forward: student/lean.py), by the formula in `activation_bytes`, and the
                    scored tokens' fp32 logits

Checked in tests/test_plan.py: the model states against the tensors real DeepSpeed engines hold
(1 and 2 ranks, ZeRO 0-3, expert parallelism 2), the activations against what autograd saves in
the real training forward, each within the tolerance it states. What it leaves out: the CUDA
context and the allocator's fragmentation (hence the 10% of the card kept free), a separate
teacher model (`teacher_distill`: plan its folder too), and transient buffers other than the
reduce bucket. The layout search varies ZeRO stage, expert parallelism, optimizer offload and
gradient accumulation (activation checkpointing is not in the trainer); the first layout that
fits, in that order of cost, is printed as overrides.
"""
from __future__ import annotations

import argparse
import sys
from dataclasses import dataclass

from rl.config import ConfigError, RunConfig

GIB = 2**30
# Memory as nvidia-smi reports it (MiB): what a rank can at most allocate.
GPUS_MIB = {"h100": 81559, "h200": 143771, "a100": 81920, "a100-40": 40960, "l40s": 46068, "rtx4090": 24564}
KEEP_FREE = 0.10               # of the card: CUDA context, allocator fragmentation, what is not modelled
DEEPSPEED_REDUCE_BUCKET = 500_000_000    # elements: DeepSpeed's reduce_bucket_size default (rl/engine.py keeps it)


@dataclass(frozen=True)
class ModelShape:
    """What the memory depends on, read off the student built on the meta device."""
    family: str
    params: int                # every parameter once (a tied head counted once)
    expert_params: int         # in the experts' stacked tensors: sharded by expert parallelism
    small_params: int          # in tensors under param_persistence_threshold: whole on every ZeRO-3 rank
    layers: int
    hidden: int
    heads: int
    kv_heads: int
    head_dim: int
    experts: int
    top_k: int
    expert_width: int
    vocab: int

    @property
    def dense_params(self) -> int:
        return self.params - self.expert_params


def model_shape(cfg: RunConfig) -> ModelShape:
    """The student as `cfg` builds it, on the meta device: from `student.checkpoint`'s config.json
    when set (no weight read), else from the student keys and the tokenizer's vocabulary."""
    import torch
    from transformers import AutoConfig, AutoModelForCausalLM

    from student.expert_parallel import experts_modules
    from student.model import build_tokenizer, model_config

    s = cfg.student
    hf = AutoConfig.from_pretrained(s.checkpoint) if s.checkpoint else model_config(s, build_tokenizer(s))
    with torch.device("meta"):
        model = AutoModelForCausalLM.from_config(hf)
    params = {id(p): p for p in model.parameters()}              # a tied head once
    expert_ids = {id(p) for _, m in experts_modules(model) for p in m.parameters()}
    threshold = cfg.deepspeed.param_persistence_threshold
    text = getattr(hf, "text_config", hf)
    heads = text.num_attention_heads
    return ModelShape(
        family=text.model_type, params=sum(p.numel() for p in params.values()),
        expert_params=sum(p.numel() for i, p in params.items() if i in expert_ids),
        small_params=sum(p.numel() for p in params.values() if p.numel() < threshold),
        layers=text.num_hidden_layers, hidden=text.hidden_size, heads=heads,
        kv_heads=getattr(text, "num_key_value_heads", None) or heads,
        head_dim=getattr(text, "head_dim", None) or text.hidden_size // heads,
        experts=getattr(text, "num_experts", None) or text.num_local_experts,
        top_k=text.num_experts_per_tok,
        expert_width=getattr(text, "moe_intermediate_size", None) or text.intermediate_size,
        vocab=text.vocab_size)


@dataclass(frozen=True)
class Layout:
    """What the search varies (the rest of the config is the run's)."""
    zero_stage: int
    expert_parallel_size: int
    offload_optimizer: bool
    gradient_accumulation_steps: int

    def overrides(self) -> list[str]:
        return [f"deepspeed.zero_stage={self.zero_stage}",
                f"deepspeed.expert_parallel_size={self.expert_parallel_size}",
                f"deepspeed.offload_optimizer={str(self.offload_optimizer).lower()}",
                f"deepspeed.gradient_accumulation_steps={self.gradient_accumulation_steps}"]


@dataclass(frozen=True)
class Line:
    name: str
    bytes: float
    on: str          # "gpu" or "host"
    note: str = ""
    held: bool = True    # for the whole step (False: allocated during the backward only)


def _count(n: float) -> str:
    return f"{n / 1e9:.2f}B" if n >= 1e9 else f"{n / 1e6:.2f}M"


def _bytes_of(dtype: str) -> int:
    return 2 if dtype in ("bf16", "bfloat16", "float16", "half") else 8 if dtype in ("float64", "double") else 4


def model_state_lines(m: ModelShape, cfg: RunConfig, world: int, layout: Layout) -> list[Line]:
    """Parameters, gradients, optimizer state and DeepSpeed's reduce buffer on one rank."""
    b = _bytes_of(cfg.deepspeed.dtype)
    ep, zero = layout.expert_parallel_size, layout.zero_stage
    local = m.dense_params + m.expert_params // ep               # parameters a rank holds whole
    share = m.params / world                                     # its partition at ZeRO 1-3
    moved = "host" if layout.offload_optimizer and zero >= 1 else "gpu"
    lines = []
    if zero == 3:
        whole = m.small_params
        lines.append(Line("parameters", b * (whole + (m.params - whole) / world),
                          "host" if cfg.deepspeed.offload_param else "gpu",
                          f"{_count(whole)} under the persistence threshold whole, the rest / {world}"))
    else:
        lines.append(Line("parameters", b * local, "gpu", _count(local) + (f" (experts / {ep})" if ep > 1 else "")))
    if zero == 0:
        lines.append(Line("gradients", b * local, "gpu", "whole"))
        lines.append(Line("optimizer", 8 * local + (4 * local if b == 2 else 0), "gpu",
                          "AdamW moments" + (" and fp32 master" if b == 2 else "")))
    else:
        lines.append(Line("gradients", b * share, "gpu", f"partition, 1/{world}"))
        lines.append(Line("optimizer", 12 * share, moved, f"fp32 master and AdamW moments, 1/{world}"))
        lines.append(Line("reduce buffer", b * DEEPSPEED_REDUCE_BUCKET, "gpu",
                          "DeepSpeed's reduce_bucket_size" + ("" if zero == 3 else ", during the backward"),
                          held=zero == 3))
    return lines


def activation_bytes(m: ModelShape, rows: int, prompt: int, completion: int, b: int) -> float:
    """What autograd keeps for the backward of the training forward over `rows` rows of `prompt`
    prompt and `completion` completion tokens (each row forwarded whole: the bound; shared prompts
    are forwarded once), from the tensors the lean forward saves per token and layer: the residual
    stream and norms (~6 x hidden), queries and keys before and after their norm, values, the
    attention output, each query's probabilities over its context (the scoring attention keeps
    them), the router's logits, and per routed slot the permuted input, the expert MLP's gate/up,
    activation and output (2·hidden + 4·expert width); then the scored tokens' fp32 logits."""
    h, d, q, kv = m.hidden, m.head_dim, m.heads, m.kv_heads
    tokens = rows * (prompt + completion - 1)
    per_token = (6 * h + 2 * (q + kv) * d + 2 * kv * d + q * d + 2 * d + m.experts
                 + m.top_k * (2 * h + 4 * m.expert_width)) * b + 16 * m.top_k
    context = (prompt + completion) / 2                          # a query's mean context, causal
    probs = tokens * q * context * b
    qkv_weights = h * (q + 2 * kv) * d * b                       # the fused projection's weight, per forward
    head = tokens * 4 * h * b + rows * completion * m.vocab * 4
    return m.layers * (tokens * per_token + probs + qkv_weights) + head


def kv_cache_bytes(m: ModelShape, rows: int, length: int, b: int) -> float:
    return rows * length * m.layers * 2 * m.kv_heads * m.head_dim * b


def plan_lines(m: ModelShape, cfg: RunConfig, world: int, layout: Layout, prompt_tokens: int) -> list[Line]:
    """Every line of one rank's memory under `layout`."""
    b_train, b_model = _bytes_of(cfg.deepspeed.dtype), _bytes_of(cfg.student.dtype)
    lines = model_state_lines(m, cfg, world, layout)
    if layout.zero_stage == 3 or layout.expert_parallel_size > 1:
        lines.append(Line("rollout copy", b_model * m.params, "gpu", "ZeRO-3 / expert parallelism: a full model"))
    mode = getattr(cfg.method, "teacher_weights", "live")
    if mode in ("ema", "frozen"):
        lines.append(Line("teacher copy", 4 * m.params, "gpu", f"{mode} self-teacher, fp32"))
    r = cfg.rollout
    rows = r.prompts_per_step * r.attempts_per_prompt // world
    completion = r.max_new_tokens * r.max_turns
    if r.engine == "vllm":
        lines.append(Line("vLLM engine", b_model * m.params + r.vllm.kv_cache_gb * GIB, "gpu",
                          f"weights and its {r.vllm.kv_cache_gb} GiB KV cache"))
    else:
        lines.append(Line("kv cache", kv_cache_bytes(m, rows, prompt_tokens + completion, b_model), "gpu",
                          f"{rows} rows x {prompt_tokens + completion} tokens"))
    micro = -(-rows // layout.gradient_accumulation_steps)
    lines.append(Line("activations", activation_bytes(m, micro, prompt_tokens, completion, b_train), "gpu",
                      f"{micro} row{'s' * (micro != 1)} a micro-batch x {prompt_tokens + completion} tokens"))
    return lines


def prompt_tokens_of(cfg: RunConfig, draw: int = 64) -> int:
    """The longest rendered prompt among `draw` problems of the run's task stream (what its
    tokenizer makes of them; a tool episode's tool results are not counted)."""
    from rl.tasks import TaskSource
    from student.model import build_tokenizer

    tok = build_tokenizer(cfg.student)
    return max(len(tok.render_prompt(p.prompt)) for p in TaskSource(cfg.task, cfg.seed).next_batch(draw))


def gpu_total(lines: list[Line]) -> float:
    return sum(x.bytes for x in lines if x.on == "gpu")


def layouts(m: ModelShape, cfg: RunConfig, world: int) -> list[Layout]:
    """Candidate layouts, cheapest first: less partitioning, then no expert sharding, no offload,
    fewer micro-batches."""
    rows = cfg.rollout.prompts_per_step * cfg.rollout.attempts_per_prompt // world
    eps = [e for e in range(1, world + 1) if world % e == 0 and m.experts % e == 0]
    accumulations = [g for g in range(1, rows + 1) if rows % g == 0]
    out = []
    for zero in (0, 1, 2, 3):
        for offload in ((False,) if zero == 0 else (False, True)):
            for ep in (eps if zero in (1, 2) else [1]):
                for ga in accumulations:
                    out.append(Layout(zero, ep, offload, ga))
    return out


def cheapest_fit(m: ModelShape, cfg: RunConfig, world: int, budget: float,
                 prompt_tokens: int) -> tuple[Layout, float, bool]:
    """(layout, its GPU bytes, fits): the first candidate that fits the budget, or else the one
    needing the least memory."""
    best = None
    for layout in layouts(m, cfg, world):
        total = gpu_total(plan_lines(m, cfg, world, layout, prompt_tokens))
        if total <= budget:
            return layout, total, True
        if best is None or total < best[1]:
            best = (layout, total)
    return best[0], best[1], False


def configured_layout(cfg: RunConfig) -> Layout:
    ds = cfg.deepspeed
    return Layout(ds.zero_stage, ds.expert_parallel_size, ds.offload_optimizer, ds.gradient_accumulation_steps)


def _table(lines: list[Line]) -> list[str]:
    out = [f"  {'per rank (every rank alike)':<26} {'GiB':>9}  where  what"]
    out += [f"  {x.name:<26} {x.bytes / GIB:>9.2f}  {x.on:<5}  {x.note}" for x in lines]
    host = sum(x.bytes for x in lines if x.on == "host")
    out.append(f"  {'GPU total':<26} {gpu_total(lines) / GIB:>9.2f}" + (f"  (and {host / GIB:.2f} GiB of host memory)"
                                                                       if host else ""))
    return out


def report(cfg: RunConfig, gpus: int, nodes: int, gpu: str, prompt_tokens: int, gpu_mib: float | None = None) -> str:
    """The plan as text: the configured layout per rank, whether it fits, and the cheapest layout
    that does (or, where none does, the one closest to fitting and what fills it)."""
    world = gpus * nodes
    mib = gpu_mib or GPUS_MIB[gpu]
    budget = mib * 2**20 * (1 - KEEP_FREE)
    m = model_shape(cfg)
    layout = configured_layout(cfg)
    lines = plan_lines(m, cfg, world, layout, prompt_tokens)
    fits = gpu_total(lines) <= budget
    out = [f"{cfg.experiment or 'run'}: {m.family}, {_count(m.params)} parameters ({_count(m.expert_params)} in "
           f"{m.experts} experts, top-{m.top_k}), {m.layers} layers, hidden {m.hidden}, vocabulary {m.vocab}",
           f"{nodes} node(s) x {gpus} {gpu} = {world} ranks, {mib / 1024:.1f} GiB a GPU of which "
           f"{1 - KEEP_FREE:.0%} is planned ({budget / GIB:.1f} GiB); prompts of {prompt_tokens} tokens, "
           f"{cfg.rollout.prompts_per_step * cfg.rollout.attempts_per_prompt // world} rows a rank", "",
           f"configured: {' '.join(layout.overrides())}: {'fits' if fits else 'does NOT fit'}", *_table(lines), ""]
    best, total, best_fits = cheapest_fit(m, cfg, world, budget, prompt_tokens)
    if best_fits and best == layout:
        out.append("the configured layout is the cheapest that fits")
        return "\n".join(out)
    best_lines = plan_lines(m, cfg, world, best, prompt_tokens)
    if best_fits:
        out.append(f"cheapest layout that fits: {' '.join(best.overrides())}")
    else:
        largest = max(best_lines, key=lambda x: x.bytes if x.on == "gpu" else 0)
        out.append(f"no layout the trainer offers fits; the closest needs {total / GIB:.2f} GiB, the most of it "
                   f"its {largest.name} ({largest.bytes / GIB:.2f} GiB): {' '.join(best.overrides())}")
    out += _table(best_lines)
    return "\n".join(out)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m rl.plan", description=__doc__.split("\n\n")[0])
    parser.add_argument("experiment", help="experiment folder (or a .yaml file)")
    parser.add_argument("overrides", nargs="*", help="key=value config overrides")
    parser.add_argument("--gpus", type=int, required=True, help="GPUs (ranks) per node")
    parser.add_argument("--nodes", type=int, default=1)
    parser.add_argument("--gpu", default="h100", help=f"one of {sorted(GPUS_MIB)}")
    parser.add_argument("--gpu-memory-gib", type=float, default=None, help="another card's memory instead of --gpu's")
    parser.add_argument("--prompt-tokens", type=int, default=None,
                        help="a prompt's length in tokens (default: the longest of 64 problems of the task, rendered)")
    args = parser.parse_intermixed_args(argv)     # overrides before or after the options
    if args.gpu not in GPUS_MIB and args.gpu_memory_gib is None:
        parser.error(f"--gpu {args.gpu!r} is unknown; choose one of {sorted(GPUS_MIB)} or give --gpu-memory-gib")
    if args.gpus < 1 or args.nodes < 1 or (args.prompt_tokens is not None and args.prompt_tokens < 1):
        parser.error("--gpus, --nodes and --prompt-tokens must be >= 1")
    from rl.configure import load_config

    try:
        # The ranks the plan is for; a multi-node config must name a port, which planning never binds.
        ranks = [f"launcher.nproc_per_node={args.gpus}", f"launcher.nnodes={args.nodes}"]
        if args.nodes > 1 and not any(o.startswith("launcher.master_port=") for o in args.overrides):
            ranks.append("launcher.master_port=29500")
        cfg = load_config(args.experiment, [*args.overrides, *ranks])
    except ConfigError as err:
        print(f"config error: {err}", file=sys.stderr)
        return 2
    prompt_tokens = args.prompt_tokens
    if prompt_tokens is None:
        try:
            prompt_tokens = prompt_tokens_of(cfg)
        except (OSError, ValueError) as err:
            print(f"the task's prompts could not be rendered to count their tokens ({err}): give --prompt-tokens",
                  file=sys.stderr)
            return 2
    mib = args.gpu_memory_gib * 1024 if args.gpu_memory_gib else None
    print(report(cfg, args.gpus, args.nodes, args.gpu if mib is None else f"{args.gpu_memory_gib:g}-GiB GPU",
                 prompt_tokens, mib))
    return 0


if __name__ == "__main__":
    sys.exit(main())
