"""The model that rollouts, hinted scoring and evaluation run on, kept equal to the trained one.

ZeRO 0-2: the training module itself; every rank holds every parameter.

ZeRO-3: parameters are partitioned, and every forward of the training module all-gathers them
module by module. Generation stops early when all rows have ended, hinted scoring runs only when
a rank has hinted rows, and evaluation shards differ in length, so ranks would disagree on the
number of forwards and hang. Instead each rank keeps a full copy for everything that needs no
gradient, refreshed after each optimizer step by gathering the partitions one parameter at a time
(peak: one parameter beyond the copy). This is the contract of a vLLM rollout engine too (weights
pushed after each step); the copy costs one model's memory per rank, which generating with the
full model needs anyway.

Expert parallelism has the same constraint (every forward is an all-to-all over the EP group), so
it gets the same copy, refreshed by gathering each layer's expert shards.
"""
from __future__ import annotations

import torch

from student.expert_parallel import copy_full_weights, is_sharded


class RolloutModel:
    def __init__(self, engine, build_full_model):
        self.engine = engine
        self.expert_sharded = is_sharded(engine.module)
        self.partitioned = engine.zero_optimization_partition_weights() or self.expert_sharded
        if self.partitioned:
            # A second construction must not move the training run's RNG stream: rollouts at
            # ZeRO-3 then sample exactly what ZeRO-0 samples on the same seed.
            with torch.random.fork_rng(devices=[]):
                self.module = build_full_model()
            self.module.requires_grad_(False).to(engine.device)     # beside the engine: CPU here, a GPU there
        else:
            self.module = engine.module
        self._synced_at = -1

    def sync(self) -> None:
        """Copy the current trained weights in (a no-op unless partitioned and stale)."""
        if not self.partitioned or self._synced_at == self.engine.global_steps:
            return
        if self.expert_sharded:
            copy_full_weights(self.engine.module, self.module)
            self._synced_at = self.engine.global_steps
            return
        import deepspeed

        full = dict(self.module.named_parameters())
        for name, param in self.engine.module.named_parameters():
            with deepspeed.zero.GatheredParameters([param]):   # collective: same order on every rank
                full[name].data.copy_(param.data)
        self._synced_at = self.engine.global_steps
