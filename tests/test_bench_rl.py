"""The RL benchmark harness (benchmarks/rl.py) end to end on a tiny shape: not a timed test.

It checks that each contender runs in its own process, reports its figures, and that a partial
run writes into its work folder and leaves benchmarks/results alone.
"""
import importlib.util
import json
import os
import re
import statistics
import subprocess
import sys

import pytest

from conftest import CHILD_PYTHONPATH, ROOT

HAS_TRL = importlib.util.find_spec("trl") is not None


def run_bench(work, contenders, steps=2, rounds=1):
    """The parsed rl-cpu.json of a partial run, and the run's stderr (its progress bars)."""
    env = dict(os.environ, PYTHONPATH=CHILD_PYTHONPATH, OMP_NUM_THREADS="1", DS_ACCELERATOR="cpu")
    res = subprocess.run([sys.executable, "-m", "benchmarks.rl", "--tiny", "--steps", str(steps),
                          "--rounds", str(rounds), "--contenders", contenders, "--work", str(work)],
                         cwd=ROOT, env=env, capture_output=True, text=True, timeout=600)
    assert res.returncode == 0, res.stderr[-3000:]
    return json.loads((work / "rl-cpu.json").read_text()), res.stderr


def run_order(stderr: str) -> list[str]:
    """Contender runs in the order they started: each opens its progress bar ("<name> r<round>")
    only after the previous run's process has ended."""
    order = []
    for name, round_ in re.findall(r"(?:^|\r) *(\w+) r(\d+):", stderr, flags=re.M):
        if f"{name}-round{round_}" not in order:
            order.append(f"{name}-round{round_}")
    return order


@pytest.mark.slow
def test_our_contenders_report_positive_figures_and_stage_split(tmp_path):
    records = [ROOT / "benchmarks" / "results" / name for name in ("rl-cpu.json", "rl-cpu.md")]
    before = [p.read_bytes() if p.exists() else None for p in records]
    data, stderr = run_bench(tmp_path, "grpo,hint_distill", rounds=2)
    rows = {r["contender"]: r for r in data["contenders"]}
    assert set(rows) == {"grpo", "hint_distill"}
    for name, r in rows.items():
        assert "error" not in r, r.get("error")
        # two rounds, the second in reverse order; figures pool both runs' steps
        assert r["rounds"] == 2 and [len(run["step_s"]) for run in r["runs"]] == [2, 2]
        pooled = r["runs"][0]["step_s"] + r["runs"][1]["step_s"]
        assert all(t > 0 for t in pooled) and r["median_step_s"] == statistics.median(pooled)
        assert r["median_step_s"] > 0 and r["median_cpu_s"] > 0 and r["tokens_per_s"] > 0
        assert r["peak_rss_mib"] > 100
        stages = r["median_stage_s"]
        assert stages["generation"] > 0 and stages["backward"] > 0 and stages["optimizer"] > 0
        # the stages are parts of the step: together they cannot exceed it
        assert sum(stages.values()) <= r["median_step_s"] * 1.01
    assert rows["grpo"]["median_stage_s"]["hinted / teacher scoring"] == 0.0      # grpo asks no teacher
    assert rows["grpo"]["median_stage_s"]["regeneration"] == 0.0
    assert rows["hint_distill"]["threads"] == 1
    meta = data["meta"]
    assert meta["workload"]["steps"] == 2 and meta["rounds"] == 2 and meta["load_avg_1min_start"] >= 0
    logs = sorted(p.name for p in tmp_path.glob("*.log"))
    assert logs == ["grpo-round1.log", "grpo-round2.log", "hint_distill-round1.log", "hint_distill-round2.log"]
    # the second round runs the contenders in reverse order
    assert run_order(stderr) == ["grpo-round1", "hint_distill-round1", "hint_distill-round2", "grpo-round2"]
    assert "hint_distill_step_vs_grpo" in meta["targets"]
    # tokens by what they went through: grpo scores none; the hinted scoring is of the failed rows
    tokens = {name: r["median_tokens"] for name, r in rows.items()}
    assert tokens["grpo"]["scored"] == 0 and tokens["hint_distill"]["scored"] > 0
    assert all(t["generated"] > 0 and t["trained"] >= t["generated"] for t in tokens.values())
    assert (tmp_path / "rl-cpu.md").read_text().count("| grpo |") == 2     # the step table and the tokens table
    # a partial run never overwrites the recorded results
    assert [p.read_bytes() if p.exists() else None for p in records] == before


def test_hf_tokenizer_for_trl_gives_our_ids():
    from benchmarks._trl import hf_tokenizer, prompt_text
    from student import ByteTokenizer

    tok = ByteTokenizer()
    hf = hf_tokenizer(tok)
    for prompt, hint in [("3 + 4", None), ("9 - 7", "starts with -"), ("é + 1", "ends with 8")]:
        assert hf(prompt_text(prompt, hint))["input_ids"] == tok.render_prompt(prompt, hint)
    answer = tok.render_answer("-12")
    assert hf.decode(answer, skip_special_tokens=True) == tok.decode(answer) == "-12"


@pytest.mark.skipif(not HAS_TRL, reason="trl is the `bench` extra: pip install -e '.[bench]'")
@pytest.mark.slow
def test_trl_grpo_contender_runs(tmp_path):
    data, _ = run_bench(tmp_path, "trl_grpo")
    (r,) = data["contenders"]
    assert "error" not in r, r.get("error")
    assert len(r["runs"][0]["step_s"]) == 2 and r["median_step_s"] > 0 and r["tokens_per_s"] > 0
    assert r["experts_implementation"] == "grouped_mm" and r["gradient_checkpointing"] is False
    assert data["meta"]["versions"]["trl"]
