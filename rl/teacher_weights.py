"""Whose weights the self-teacher of a distilling method runs on (`method.teacher_weights`).

    live    the student itself, as it is now. Pulling the student toward its own hinted
            distribution moves that distribution too (OPSD calls a live teacher unstable; our
            default experiment saw hinted accuracy fall with it).
    ema     θ_T ← (1 − ema_rate) θ_T + ema_rate θ after every optimizer step of the RL phase,
            starting from the student's weights when RL begins (SDPO: rate 0.05, 0.01 with rich
            feedback). The teacher lags the student by about 1 / ema_rate steps.
    frozen  the student's weights when RL begins, never updated (SDPO's "base" teacher).

The copy is a whole fp32 model beside the rollout model (rl/rollout_model.py), on the same device,
identical on every rank: it is updated from the rollout model, which at ZeRO-3 and with expert
parallelism is itself a synced full copy, so the update is the same at every ZeRO stage and with
EP. fp32 even for a bf16 student: an EMA step of 0.05 x a difference is below bf16's resolution.
Checkpoints hold it as `teacher_weights.safetensors` (written by rank 0; every rank loads it), so a
resumed run continues the same teacher bit for bit.
"""
from __future__ import annotations

from pathlib import Path
from typing import Callable

import torch

from rl import distributed as dist

MODES = ("live", "ema", "frozen")
FILE = "teacher_weights.safetensors"


class TeacherWeights:
    def __init__(self, mode: str, ema_rate: float, rollout, build_model: Callable[[], torch.nn.Module],
                 make_policy: Callable[[torch.nn.Module], object], live_policy):
        if mode not in MODES:
            raise ValueError(f"teacher_weights={mode!r}: choose one of {MODES}")
        self.mode, self.ema_rate, self.rollout = mode, ema_rate, rollout
        self.build_model, self.make_policy, self.live_policy = build_model, make_policy, live_policy
        self.module: torch.nn.Module | None = None
        self._policy = None

    @property
    def separate(self) -> bool:
        return self.mode != "live"

    @property
    def started(self) -> bool:
        return self.module is not None

    def policy(self):
        """The policy the teacher side scores with (the rollout policy when live)."""
        if not self.separate:
            return self.live_policy
        if self.module is None:
            raise RuntimeError("teacher weights are taken when RL begins; call start() first")
        return self._policy

    def _build(self) -> torch.nn.Module:
        # Built without moving the run's RNG stream (as the rollout copy is).
        with torch.random.fork_rng(devices=[]):
            module = self.build_model()
        return module.float().requires_grad_(False).to(self.rollout.engine.device).eval()

    def start(self) -> None:
        """Take the student's current weights (collective at ZeRO-3 and with EP: every rank calls it)."""
        if not self.separate or self.started:
            return
        self.rollout.sync()
        self.module = self._build()
        with torch.no_grad():
            for t, s in self._pairs():
                t.copy_(s)
        self._policy = self.make_policy(self.module)

    def update(self) -> None:
        """After an optimizer step: the EMA moves toward the student (collective, as start)."""
        if self.mode != "ema" or not self.started:
            return
        self.rollout.sync()
        with torch.no_grad():
            for t, s in self._pairs():
                t.lerp_(s.float(), self.ema_rate)

    def _pairs(self):
        student = dict(self.rollout.module.named_parameters())
        return [(t, student[name]) for name, t in self.module.named_parameters()]

    # ------------------------------------------------------------------ checkpoints
    def save(self, path: Path) -> None:
        from safetensors.torch import save_model

        if self.started and dist.rank() == 0:
            save_model(self.module, str(path / FILE))

    def load(self, path: Path) -> None:
        """Restore the copy a checkpoint holds (none: RL had not begun, start() takes it later)."""
        from safetensors.torch import load_model

        if not self.separate or not (path / FILE).is_file():
            return
        self.module = self._build()
        load_model(self.module, str(path / FILE))
        self._policy = self.make_policy(self.module)
