"""Whole runs through the real CLI: run folder contents, resume, and the NaN guard."""
import json
from pathlib import Path

import pytest
import torch
import yaml

from conftest import ROOT, TINY, run_cli
from rl.config import ConfigError
from rl.configure import load_config


def read_metrics(run_dir: Path) -> list[dict]:
    lines = (run_dir / "metrics.jsonl").read_text().splitlines()
    return [{k: v for k, v in json.loads(l).items() if not k.startswith("time/")} for l in lines]


def only_run(base: Path) -> Path:
    runs = [d for d in base.iterdir() if d.is_dir()]
    assert len(runs) == 1
    return runs[0]


@pytest.mark.slow
@pytest.mark.parametrize("method, extra", [
    ("hint_distill", []), ("grpo", []),
    ("hint_distill", ["method.distill_estimator=sampled", "method.distill_span=all"]),
    ("hint_distill", ["method.teacher_weights=ema", "method.distill_estimator=top_k"]),
    ("corrected_replay", ["method.when=failed"]),
    ("self_distill", ["method.context=solution_and_feedback"]),
    ("teacher_distill", []),
])
def test_short_run_writes_a_complete_run_folder(tmp_path, tiny_overrides, method, extra, exported_teacher):
    if method == "teacher_distill":
        extra = [f"method.teacher_path={exported_teacher}"]
    out = run_cli(["experiments/default", *tiny_overrides, f"method.name={method}", *extra])
    assert out.returncode == 0, out.stderr[-3000:]
    run_dir = only_run(tmp_path / "runs" / "default")
    assert f"run folder: {run_dir}" in out.stdout
    saved = yaml.safe_load((run_dir / "config.yaml").read_text())
    assert saved["method"]["name"] == method and saved["run_name"] == run_dir.name
    assert list(run_dir.glob("events.out.tfevents.*"))
    metrics = read_metrics(run_dir)
    assert [m["step"] for m in metrics] == list(range(0, 8))        # eval at 0, then 7 steps
    assert "loss/sft" in metrics[1] and "loss/pg" in metrics[-1]
    assert {"eval/accuracy", "eval/accuracy_hinted"} <= set(metrics[-1])
    assert "train/reward_mean" in metrics[-1]
    # router replay is on by default; the training forward routes as the rollout did (same weights)
    assert all(m["router/replay_mismatch"] < 0.01 for m in metrics[4:])
    load = [v for k, v in metrics[-1].items() if k.startswith("expert_load/layer0/")]
    assert len(load) == 4 and abs(sum(load) - 1.0) < 1e-5              # logged at eval steps
    assert not any(k.startswith("expert_load/") for k in metrics[5])    # step 5: no eval
    if method == "hint_distill":
        assert any("loss/distill" in m for m in metrics[4:])
        assert {"hint/rate", "hint/leak_rate"} <= set(metrics[-1])
    if method in ("grpo", "corrected_replay"):
        assert not any("loss/distill" in m for m in metrics)
    if method == "corrected_replay":
        assert all(m["corrected/rows"] > 0 for m in metrics[4:])        # a fresh student fails: hints, rows
        assert all("loss/pg_corrected" in m for m in metrics[4:])
    if method == "teacher_distill":
        assert all("loss/distill" in m and m["budget/scored_tokens"] > 0 for m in metrics[4:])
    if method == "grpo":
        assert all(m["budget/scored_tokens"] == 0 for m in metrics[1:])
    # compute accounting on every step, running totals that only grow
    totals = [m["budget/generated_tokens_total"] for m in metrics[1:]]
    assert totals[:3] == [0, 0, 0] and all(b >= a for a, b in zip(totals, totals[1:])) and totals[-1] > 0
    assert {"eval/accuracy_with_hint", "eval/teacher_gap"} <= set(metrics[-1])
    rollouts = [json.loads(l) for l in (run_dir / "rollouts.jsonl").read_text().splitlines()]
    assert {"prompt", "attempt", "reward", "hint", "feedback", "step"} <= set(rollouts[0])
    assert {r["step"] for r in rollouts} == {4, 5, 6, 7}
    ckpts = sorted(p.name for p in (run_dir / "checkpoints").iterdir() if p.is_dir())
    assert ckpts == ["step_0000006", "step_0000007"]                  # keep_checkpoints=2


@pytest.mark.slow
def test_resume_continues_bit_identically(tmp_path):
    base = TINY + ["trainer.checkpoint_every=3", "method.name=hint_distill"]
    full = run_cli(["experiments/default", *base, f"output_dir={tmp_path / 'a'}", "run_name=r"])
    assert full.returncode == 0, full.stderr[-3000:]
    # Stop after step 3 (warm-start done, no RL yet), then resume with the full step budget.
    part = run_cli(["experiments/default", *base, f"output_dir={tmp_path / 'b'}", "run_name=r",
                    "trainer.steps=1"])  # total 4 steps: checkpoints at 3 and 4
    assert part.returncode == 0, part.stderr[-3000:]
    # Drop the step-4 checkpoint so the resume starts mid-run from step 3.
    import shutil
    shutil.rmtree(tmp_path / "b/default/r/checkpoints/step_0000004")
    resumed = run_cli(["experiments/default", *base, f"output_dir={tmp_path / 'b'}", "resume=true"])
    assert resumed.returncode == 0, resumed.stderr[-3000:]
    a, b = read_metrics(tmp_path / "a/default/r"), read_metrics(tmp_path / "b/default/r")
    assert [m["step"] for m in b] == [m["step"] for m in a]
    assert a == b, "resumed run differs from the uninterrupted one"
    ra = (tmp_path / "a/default/r/rollouts.jsonl").read_text()
    assert ra == (tmp_path / "b/default/r/rollouts.jsonl").read_text()


@pytest.mark.slow
@pytest.mark.parametrize("extra", [
    ["method.name=hint_distill", "method.teacher_weights=ema", "method.ema_rate=0.3"],
    ["method.name=self_distill", "method.context=feedback"],                 # EMA teacher, top-k JSD
    # with difficulty buckets (warm-start on one, RL on both) and the shuffled-hint control
    ["method.name=corrected_replay", "method.when=failed", "teacher.shuffle=true", "warmstart.mix={easy: 1}",
     "task.buckets={easy: {min_digits: 1, max_digits: 2}, hard: {min_digits: 3, max_digits: 3}}"],
    ["method.name=teacher_distill"],
], ids=["hint_distill-ema", "self_distill", "corrected_replay-buckets-shuffled", "teacher_distill"])
def test_resume_mid_rl_is_bit_identical(tmp_path, extra, exported_teacher):
    """Killed after RL step 3 of 4 (step 6, an eval step in both runs), resumed from that checkpoint:
    the same run, metric for metric and sample for sample; the EMA teacher comes back from the
    checkpoint (step 7's distillation and eval use it), and the budget's totals go on."""
    import shutil

    if extra == ["method.name=teacher_distill"]:
        extra = extra + [f"method.teacher_path={exported_teacher}"]
    base = TINY + ["trainer.checkpoint_every=3", *extra]
    full = run_cli(["experiments/default", *base, f"output_dir={tmp_path / 'a'}", "run_name=r"])
    assert full.returncode == 0, full.stderr[-3000:]
    part = run_cli(["experiments/default", *base, f"output_dir={tmp_path / 'b'}", "run_name=r", "trainer.steps=3"])
    assert part.returncode == 0, part.stderr[-3000:]
    ckpt = tmp_path / "b/default/r/checkpoints/step_0000006"
    if "ema" in str(extra) or "self_distill" in str(extra):
        assert (ckpt / "teacher_weights.safetensors").is_file()
    resumed = run_cli(["experiments/default", *base, f"output_dir={tmp_path / 'b'}", "resume=true"])
    assert resumed.returncode == 0, resumed.stderr[-3000:]
    a, b = read_metrics(tmp_path / "a/default/r"), read_metrics(tmp_path / "b/default/r")
    assert [m["step"] for m in b] == list(range(8))
    assert a == b, "resumed run differs from the uninterrupted one"
    ra = (tmp_path / "a/default/r/rollouts.jsonl").read_text()
    assert ra == (tmp_path / "b/default/r/rollouts.jsonl").read_text()


@pytest.mark.slow
def test_existing_run_is_not_overwritten(tmp_path, tiny_overrides):
    assert run_cli(["experiments/default", *tiny_overrides, "run_name=x"]).returncode == 0
    again = run_cli(["experiments/default", *tiny_overrides, "run_name=x"])
    assert again.returncode == 2 and "resume=true" in again.stderr


def test_nonfinite_loss_stops_without_touching_weights(tmp_path, tiny_overrides, monkeypatch):
    from rl import trainer as trainer_mod
    from rl.configure import load_config
    from rl.train import resolve_run_dir

    cfg = load_config("experiments/default", tiny_overrides + ["trainer.max_nonfinite_steps=2"])
    run_dir = resolve_run_dir(cfg)
    t = trainer_mod.Trainer(cfg, run_dir)
    before = [p.detach().clone() for p in t.model.parameters()]
    real_sft = trainer_mod.sft_loss
    monkeypatch.setattr(trainer_mod, "sft_loss",
                        lambda *args: (real_sft(*args)[0] * float("nan"), {}))
    with pytest.raises(trainer_mod.NonFiniteLossError, match="2 consecutive steps"):
        t.train()
    assert all(torch.equal(a, p) for a, p in zip(before, t.model.parameters()))
    lines = (run_dir / "metrics.jsonl").read_text().splitlines()
    assert len(lines) == 2 and "train/nonfinite_skipped" in lines[1]   # eval at 0, step 1 skipped


def test_gradient_accumulation_is_one_update_per_step(tmp_path, tiny_overrides):
    from rl.configure import load_config
    from rl.train import resolve_run_dir
    from rl.trainer import Trainer

    def run(ga):
        cfg = load_config("experiments/default", tiny_overrides + [
            f"run_name=ga{ga}", f"deepspeed.gradient_accumulation_steps={ga}"])
        t = Trainer(cfg, resolve_run_dir(cfg))
        t.train()
        return t, read_metrics(t.run_dir)

    one, m1 = run(1)
    two, m2 = run(2)
    assert two.engine.global_steps == one.engine.global_steps == 7      # 3 warm-start + 4 RL updates
    assert [m["train/lr"] for m in m2[1:]] == [m["train/lr"] for m in m1[1:]]
    # Same data, same first weights, one normaliser for the step: the same first loss.
    assert abs(m2[1]["loss/sft"] - m1[1]["loss/sft"]) < 1e-5
    assert all("loss/pg" in m for m in m2[4:])
    # Micro-batches are padded to their own prompt width; replayed routes must still line up.
    assert max(m["router/replay_mismatch"] for m in m2[4:]) < 0.01


@pytest.mark.slow
def test_resume_mid_rl_with_multi_message_episodes_is_bit_identical(tmp_path):
    """experiments/targeted-multistep at a tiny scale: a hot warm-start (40 steps at 1e-2) gives a
    student that calls the calculator (some well, some malformed), then RL with corrected replay from
    the target message; killed after RL step 2 of 4, resumed: the same run, metric for metric."""
    base = ["experiments/targeted-multistep", "task.eval_size=8", "student.hidden_size=32", "student.num_layers=1",
            "student.num_heads=2", "student.num_kv_heads=1", "student.num_experts=4", "student.expert_width=16",
            "rollout.prompts_per_step=2", "rollout.attempts_per_prompt=4", "warmstart.steps=40", "warmstart.lr=1e-2",
            "warmstart.batch_size=16", "trainer.steps=4", "trainer.eval_every=2", "trainer.checkpoint_every=42",
            "trainer.threads=1", "method.name=corrected_replay", "method.when=failed", "run_name=r"]
    full = run_cli([*base, f"output_dir={tmp_path / 'a'}"])
    assert full.returncode == 0, full.stderr[-3000:]
    part = run_cli([*base, f"output_dir={tmp_path / 'b'}", "trainer.steps=2"])
    assert part.returncode == 0, part.stderr[-3000:]
    resumed = run_cli([*base[:-1], f"output_dir={tmp_path / 'b'}", "resume=true", "run_name=r"])
    assert resumed.returncode == 0, resumed.stderr[-3000:]
    a, b = read_metrics(tmp_path / "a/targeted-multistep/r"), read_metrics(tmp_path / "b/targeted-multistep/r")
    assert [m["step"] for m in b] == list(range(45))
    assert a == b, "resumed run differs from the uninterrupted one"
    rl_steps = [m for m in a if "episode/turns_mean" in m]
    assert rl_steps and max(m["episode/turns_mean"] for m in rl_steps) > 1.0, "no multi-message episode happened"
    assert (tmp_path / "a/targeted-multistep/r/rollouts.jsonl").read_text() == \
        (tmp_path / "b/targeted-multistep/r/rollouts.jsonl").read_text()


def test_eval_at_adds_early_evaluations_to_the_curve(tmp_path):
    ran = run_cli([str(ROOT / "experiments/default"), *TINY, f"output_dir={tmp_path}", "run_name=r", "warmstart.steps=2",
                   "trainer.steps=4", "trainer.eval_every=100", "trainer.eval_at=[1,3]", "task.eval_size=4"])
    assert ran.returncode == 0, ran.stderr[-2000:]
    rows = [json.loads(line) for line in (tmp_path / "default" / "r" / "metrics.jsonl").read_text().splitlines()]
    assert [r["step"] for r in rows if "eval/accuracy" in r] == [0, 2, 3, 5, 6]   # start, warm-start end, RL 1 and 3, last
    with pytest.raises(ConfigError, match="trainer.eval_at"):
        load_config(ROOT / "experiments/default", ["trainer.eval_at=[0]"])
