"""DeepSpeed engine for the student: process group, DeepSpeed config, model, optimizer, schedule.

The optimizer is torch AdamW (DeepSpeed's C++ Adam does not resume bit-identically on CPU).
The schedule covers both phases of a run, so one engine and one checkpoint format serve
warm-start and RL alike: linear warm-up to `warmstart.lr`, then linear warm-up to `trainer.lr`.

ZeRO-3: a student loaded from `student.checkpoint` is constructed partitioned (transformers'
`HfDeepSpeedConfig` wraps `from_pretrained` in `deepspeed.zero.Init`), so a checkpoint larger
than one rank's memory loads. A student initialised from config is built whole and partitioned by
`deepspeed.initialize`: zero.Init draws its random init differently, and a run must start from
the same weights at every ZeRO stage. Each MoE block is a ZeRO-3 leaf module, fetched whole, because which experts
a batch touches differs between ranks and per-expert fetching would make ranks disagree on the
order of collectives.
"""
from __future__ import annotations

import atexit
import math
import os
import warnings
from typing import Callable

import torch

from rl.distributed import free_port, shutdown


def init_distributed() -> None:
    """One process group per run: gloo on CPU, NCCL on GPUs; single-process runs need no launcher."""
    import deepspeed
    from deepspeed.accelerator import get_accelerator

    if "WORLD_SIZE" not in os.environ:
        # Not started by a launcher: a one-rank group on a free loopback port, so that several
        # runs (or a run and the tests) can share a machine.
        os.environ.update(RANK="0", LOCAL_RANK="0", WORLD_SIZE="1", MASTER_ADDR="127.0.0.1",
                          MASTER_PORT=str(free_port()))
    accel = get_accelerator()
    if accel.device_name() == "cpu":
        # DeepSpeed JIT-compiles a shared-memory all-reduce op (minutes) on CPU at first init;
        # gloo serves our ranks well, so mark that op unavailable instead of paying for it.
        builder = accel.create_op_builder("ShareMemCommBuilder")
        if builder is not None:
            deepspeed.ops.__compatible_ops__[builder.NAME] = False
    # DeepSpeed still calls collectives that torch 2.14 renamed; one warning per call is noise.
    warnings.filterwarnings("ignore", message=r".*is deprecated\. Please use `torch\.distributed",
                            category=FutureWarning)
    if not torch.distributed.is_initialized():
        deepspeed.init_distributed(dist_backend="gloo" if accel.device_name() == "cpu" else "nccl")
        atexit.register(shutdown)   # rl/distributed.py::shutdown says why


def deepspeed_config(cfg) -> dict:
    """The `deepspeed.*` section as a DeepSpeed config dict (every key typed in rl/config.py)."""
    ds = cfg.deepspeed
    zero: dict = {"stage": ds.zero_stage}
    if ds.offload_optimizer:
        zero["offload_optimizer"] = {"device": "cpu"}
    if ds.offload_param:
        zero["offload_param"] = {"device": "cpu"}
    if ds.zero_stage == 3:
        zero["stage3_param_persistence_threshold"] = ds.param_persistence_threshold
    return {
        "train_micro_batch_size_per_gpu": 1,   # batches are built by the trainer, not DeepSpeed
        "gradient_accumulation_steps": ds.gradient_accumulation_steps,
        "gradient_clipping": ds.gradient_clipping,
        "zero_optimization": zero,
        "bf16": {"enabled": ds.dtype == "bf16"},
        # torch AdamW with offload: DeepSpeed would otherwise insist on its C++ CPU Adam.
        "zero_force_ds_cpu_optimizer": False,
        "zero_allow_untested_optimizer": True,
        "steps_per_print": 10**9,
        "wall_clock_breakdown": False,
    }


def lr_at(step: int, cfg) -> float:
    """Absolute learning rate at optimizer step `step` (0-based) of the whole run."""
    ws, tr = cfg.warmstart, cfg.trainer
    if step < ws.steps:
        if ws.decay == "none" or step < ws.warmup_steps:
            return ws.lr * min(1.0, (step + 1) / max(1, ws.warmup_steps))
        progress = (step - ws.warmup_steps) / max(1, ws.steps - 1 - ws.warmup_steps)    # 0 .. 1 at the last step
        shape = 0.5 * (1 + math.cos(math.pi * progress)) if ws.decay == "cosine" else 1 - progress
        return ws.lr * (ws.min_lr_ratio + (1 - ws.min_lr_ratio) * shape)
    rl_step = step - ws.steps
    return tr.lr * min(1.0, (rl_step + 1) / max(1, tr.warmup_steps))


def moe_block_types(model: torch.nn.Module) -> list[type]:
    """Classes of the modules that own a router (the sparse MoE blocks)."""
    from student.experts import find_routers

    routers = {id(r) for _, r in find_routers(model)}
    return sorted({type(m) for m in model.modules()
                   if any(id(c) in routers for c in m.children())}, key=lambda t: t.__name__)


def call_through(engine, fn):
    """fn() run as `engine`'s forward, for a forward computed outside the module's own `forward`
    (the lean forward, student/lean.py, at ZeRO 0-2 without expert parallelism).

    Why not fn() alone: DeepSpeed's `DeepSpeedEngine.forward` (0.19) does more than call
    `self.module(...)`: it resets the ZeRO optimizer's per-step backward counters
    (`clear_backward_seen_flag`), runs the module under its autocast setting, runs the module's
    forward pre/post hooks it registered (timers, profiler, ZeRO-3 parameter discovery), and hooks
    the outputs (`register_output_backward_hooks`) so that the first gradient to reach them runs
    `_backward_prologue`: it copies the engine's gradient-accumulation boundary into the ZeRO 1/2
    optimizer, whose per-parameter gradient hooks read it during that backward (whether to reduce,
    to accumulate into or copy to the offloaded fp32 buffer), and enters the optimizer's backward
    scope (`enter_backward`, the post-backward callback). Called outside it, those hooks read the
    previous micro-batch's boundary (tests/test_engine.py shows it); the one-rank updates we
    compared (fp32 and bf16, with and without optimizer offload) came out the same regardless, which
    DeepSpeed does not promise for other configurations or more ranks.

    DeepSpeed offers no call that runs an arbitrary function in that frame, so `module.forward` is
    shadowed for one call of `engine()` (an instance attribute wins over the class's `forward`,
    and torch's `Module.__call__` runs the hooks around it). If DeepSpeed's forward stops calling
    the module, fn never runs and this raises rather than return something else;
    tests/test_engine.py holds the updates equal to `engine(...)`'s at ZeRO 0 and 2."""
    module = engine.module
    calls = []

    def forward():
        calls.append(None)
        return fn()

    module.forward = forward              # an instance attribute shadows the class's forward
    try:
        out = engine()
    finally:
        del module.forward
    if len(calls) != 1:
        import deepspeed
        raise RuntimeError(
            f"deepspeed {deepspeed.__version__}: {type(engine).__name__}.forward called its module {len(calls)} "
            "times, not once, so rl.engine.call_through cannot run the lean forward inside it (tested with "
            "deepspeed 0.19); set student.lean_forward=false or update rl/engine.py::call_through")
    return out


def build_engine(build_model: Callable[[], torch.nn.Module], cfg):
    """(engine, optimizer, scheduler). Under ZeRO-3 `build_model` loading `student.checkpoint`
    runs partitioned (see the module docstring); with expert parallelism the experts are sharded
    before DeepSpeed sees the model."""
    import deepspeed
    from deepspeed.utils import set_z3_leaf_modules
    from transformers.integrations import HfDeepSpeedConfig

    from student.expert_parallel import optimizer_param_groups, shard_experts

    init_distributed()
    ds_config = deepspeed_config(cfg)
    if cfg.deepspeed.zero_stage == 3 and cfg.student.checkpoint:
        # transformers reads ZeRO-3 from this object while it is alive (a weak reference): drop it
        # after construction, so later full-size models (the rollout copy, export) are built whole.
        hf_ds = HfDeepSpeedConfig(ds_config)
        model = build_model()
        del hf_ds
    else:
        model = build_model()
    if cfg.deepspeed.zero_stage == 3:
        set_z3_leaf_modules(model, moe_block_types(model))
    # Each rank keeps its share of the experts; DeepSpeed reduces them over expert-data-parallel groups.
    shard_experts(model, cfg.deepspeed.expert_parallel_size, cfg.deepspeed.zero_stage)
    # fused: one kernel over all parameters instead of a dozen ops per tensor (CPU and CUDA).
    optimizer = torch.optim.AdamW(optimizer_param_groups(model), lr=1.0, betas=(0.9, 0.999), eps=1e-8,
                                  weight_decay=cfg.trainer.weight_decay, fused=True)
    # The optimizer's base lr is 1, so the factor IS the lr. A plain function, not a callable
    # object: LambdaLR checkpoints an object's __dict__ and would restore the old config on
    # resume, silently ignoring a changed trainer.lr.
    scheduler = torch.optim.lr_scheduler.LambdaLR(optimizer, lambda step: lr_at(step, cfg))
    engine, optimizer, _, scheduler = deepspeed.initialize(
        model=model, optimizer=optimizer, lr_scheduler=scheduler, config=ds_config)
    if cfg.deepspeed.zero_stage == 0 and torch.distributed.get_world_size() == 1:
        # Nothing to reduce, yet DeepSpeed would flatten every gradient into one buffer, all-reduce
        # it over the one rank and copy it back (benchmarks/README.md has what it cost).
        # (ZeRO-1/2 keep it: their reduction also moves gradients into the optimizer's partitions.)
        engine.enable_backward_allreduce = False
    return engine, optimizer, scheduler
