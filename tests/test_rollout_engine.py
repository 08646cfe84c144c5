"""The rollout-engine registry (student/rollout_engine.py): `rollout.engine` names an entry, an
engine out of the tree plugs in by registering a class, and the trainer keeps an engine with
weights of its own up to date (the vLLM engine itself: tests/test_vllm_engine.py)."""
import json

import pytest
import torch

from conftest import TINY


class SnapshotRollout:
    """An engine with weights of its own: what it was last pushed. Generating with anything older
    than the trainer's weights is the failure this engine counts."""
    pushes_weights = True
    opened: list["SnapshotRollout"] = []

    def __init__(self, request):
        self.module, self.local = request.module, request.local
        self.pushed, self.labels, self.generations, self.stale, self.closed = None, [], 0, 0, False
        self.log_path = request.log_path
        self.policy = self
        SnapshotRollout.opened.append(self)

    def push_weights(self, module, label):
        self.pushed = [p.detach().clone() for p in module.parameters()]
        self.labels.append(label)
        return 0.25

    def close(self):
        self.closed = True

    # the policy: the trainer's local one, after checking the pushed weights are the current ones
    def generate(self, prompts, sampling, turns=None):
        self.generations += 1
        current = list(self.module.parameters())
        if self.pushed is None or any(not torch.equal(a, b) for a, b in zip(self.pushed, current)):
            self.stale += 1
        return self.local.generate(prompts, sampling, turns)

    def __getattr__(self, name):          # score, device, num_routed_layers, take_replay_mismatch
        return getattr(self.local, name)


def test_an_engine_registered_out_of_the_tree_generates_with_every_update_pushed(tmp_path):
    from rl.configure import load_config
    from rl.train import resolve_run_dir
    from rl.trainer import Trainer
    from student.rollout_engine import ROLLOUT_ENGINES

    ROLLOUT_ENGINES.register("snapshot", SnapshotRollout)
    try:
        cfg = load_config("experiments/default", TINY + [f"output_dir={tmp_path}", "rollout.engine=snapshot"])
        run_dir = resolve_run_dir(cfg)
        Trainer(cfg, run_dir).train()
    finally:                # the other tests see the tree's registry
        ROLLOUT_ENGINES._entries.pop("snapshot")
    engine = SnapshotRollout.opened[-1]
    assert engine.log_path == run_dir / "snapshot-engine-rank0.log"
    assert engine.generations >= cfg.trainer.steps and engine.stale == 0 and engine.closed
    # one push per optimizer step that a generation followed, never two for the same step
    assert len(engine.labels) == len(set(engine.labels)) >= cfg.trainer.steps
    steps = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    synced = [s["time/weight_sync_s"] for s in steps if "time/weight_sync_s" in s]
    assert len(synced) == cfg.warmstart.steps + cfg.trainer.steps and sum(synced) > 0


def test_the_local_engine_pushes_nothing_and_logs_no_sync_time(tmp_path):
    from rl.configure import load_config
    from rl.train import resolve_run_dir
    from rl.trainer import Trainer
    from student.rollout_engine import LocalRollout

    cfg = load_config("experiments/default", TINY + [f"output_dir={tmp_path}", "warmstart.steps=0", "trainer.steps=2"])
    run_dir = resolve_run_dir(cfg)
    trainer = Trainer(cfg, run_dir)
    assert isinstance(trainer.rollout_engine, LocalRollout) and trainer.policy is trainer.rollout_engine.policy
    trainer.train()
    steps = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    assert steps and not any("time/weight_sync_s" in s for s in steps)


def test_a_bad_engine_setting_is_refused_by_its_key(tmp_path):
    """(An unknown rollout.engine is refused in tests/test_config.py.)"""
    from rl.config import ConfigError
    from rl.configure import load_config

    with pytest.raises(ConfigError, match=r"rollout.vllm.cpus='0-' is not a list of cores for taskset"):
        load_config("experiments/default", [f"output_dir={tmp_path}", "rollout.vllm.cpus=0-"])
