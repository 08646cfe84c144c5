"""scripts/reproduce.sh's engine (rl/study.py): study.yaml checks, the summary's arithmetic, and a
tiny study run end to end (warm-start shared per seed, arms resumed from it, table, figure)."""
import json
import subprocess
import sys

import pytest

from conftest import ROOT
from rl.config import ConfigError
from rl.study import BEGIN, END, load_study, reach, spread

TINY_STUDY = f"""base: {ROOT / 'experiments/repro-guide'}
task: {{eval_size: 8}}
student: {{hidden_size: 32, num_layers: 1, num_heads: 2, num_kv_heads: 1, num_experts: 4, expert_width: 16}}
rollout: {{prompts_per_step: 4, attempts_per_prompt: 4}}
warmstart: {{steps: 4, batch_size: 8}}
trainer: {{steps: 4, eval_every: 2, checkpoint_every: 2}}
"""


def folder(tmp_path, study: str):
    (tmp_path / "config.yaml").write_text(TINY_STUDY)
    (tmp_path / "study.yaml").write_text(study)
    return tmp_path


STUDIES = sorted(p.parent.name for p in (ROOT / "experiments").glob("*/study.yaml"))


def test_the_study_folders_are_found():
    assert {"repro-guide", "repro-sdpo", "repro-opd", "composer-targeted-hint", "guide-partial-hints"} <= set(STUDIES)


# Studies of one seed, each with why (their READMEs label every number n=1).
ONE_SEED = {"smol-moe": "a 373M-parameter pretrained student on 2 CPU cores: one seed, labelled as such"}


@pytest.mark.parametrize("name", STUDIES)
def test_every_study_folder_loads(name):
    study = load_study(ROOT / "experiments" / name)
    assert study.seeds[:3] == ([0] if name in ONE_SEED else [0, 1, 2]), "three seeds at least, or a reason"
    assert study.target_bucket in ("hard", "hidden") and study.target_arm == "grpo"
    assert any("shuffle" in o or "easy" in o or "decoy" in o for a in study.arms for o in a.overrides), "a control arm"


@pytest.mark.parametrize("study, message", [
    ("arms: {a: [seed=3]}", "change what the arms share"),
    ("arms: {a: [warmstart.steps=3]}", "change what the arms share"),
    ("arms: {a: [task.eval_size=3]}", "change what the arms share"),
    ("arms: {a: ['task.mix={nope: 1}']}", "task.mix names ['nope'], not buckets"),
    ("arms: {a: [method.name=nope]}", "method.name='nope'"),
    ("arms: {a: []}\ntarget: {arm: b}", "target.arm 'b' is not an arm"),
    ("arms: {a: []}\ntarget: {bucket: middle}", "target.bucket 'middle' is not a bucket"),
    ("arm: {a: []}", "unknown keys ['arm']"),
    ("seeds: [0]", "no arms"),
])
def test_bad_study_yaml_is_named(tmp_path, study, message):
    with pytest.raises(ConfigError, match=message.replace("[", r"\[").replace("]", r"\]")):
        load_study(folder(tmp_path, study))


def test_an_arm_may_change_the_rl_mix_only(tmp_path):
    study = load_study(folder(tmp_path, 'arms: {a: [method.name=grpo, "task.mix={easy: 1, hard: 1}"], '
                                        'b: [method.name=grpo, task.mix.easy=2]}'))
    assert [a.overrides for a in study.arms] == [["method.name=grpo", "task.mix={easy: 1, hard: 1}"],
                                                 ["method.name=grpo", "task.mix.easy=2"]]


def test_reach_and_spread():
    curve = {"step": [10, 20, 30, 40], "generated": [0, 100, 200, 300], "hard": [0.0, 0.1, 0.3, 0.2]}
    assert reach(curve, "hard", 0.25) == (20, 200)
    assert reach(curve, "hard", 0.0) == (10, 100)          # the warm-start point does not count
    assert reach(curve, "hard", 0.5) == (None, None)
    assert spread([1.0, 3.0, None]) == {"mean": 2.0, "std": pytest.approx(2 ** 0.5), "n": 2}
    assert spread([None])["mean"] is None


@pytest.mark.slow
def test_tiny_study_runs_every_arm_and_writes_the_table(tmp_path):
    (tmp_path / "tiny").mkdir()
    study = folder(tmp_path / "tiny", """seeds: [0, 1]
target: {bucket: hard, arm: grpo}
arms:
  grpo: [method.name=grpo]
  guide_shuffled: [method.name=corrected_replay, teacher.shuffle=true]
  lr: {overrides: [method.name=grpo, trainer.lr=3.0e-4], seeds: [0]}
""")
    (study / "README.md").write_text(f"# tiny\n\nintro\n\n{BEGIN}\nold table\n{END}\n\nafter\n")
    out = tmp_path / "runs"
    cmd = [sys.executable, "-m", "rl.study", str(study), "--output_dir", str(out)]
    first = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, timeout=600)
    assert first.returncode == 0, first.stderr[-3000:]
    runs = sorted(p.name for p in (out / "tiny").iterdir() if p.is_dir() and p.name != "logs")
    assert runs == ["grpo-s0", "grpo-s1", "guide_shuffled-s0", "guide_shuffled-s1", "lr-s0"]
    assert len(list((out / "_warmstart").iterdir())) == 2            # one warm-start per seed, shared
    summary = json.loads((study / "results" / "summary.json").read_text())
    assert summary["arms"]["grpo"]["seeds"] == [0, 1] and summary["arms"]["lr"]["seeds"] == [0]
    assert set(summary["teacher_gap"]) == {"0", "1"}
    grpo = summary["arms"]["grpo"]
    assert grpo["tokens"]["generated"]["mean"] > 0 and grpo["final"]["hard"]["n"] == 2
    shuffled = summary["arms"]["guide_shuffled"]
    assert shuffled["tokens"]["generated"]["mean"] > grpo["tokens"]["generated"]["mean"]   # regenerations
    readme = (study / "README.md").read_text()
    assert "old table" not in readme and readme.count(BEGIN) == 1 and "intro" in readme and "after" in readme
    assert "| `guide_shuffled` | 2 |" in readme
    assert (study / "results.png").stat().st_size > 1000
    # Rerunning reuses the finished runs and replaces the table.
    stamp = (out / "tiny" / "grpo-s0" / "metrics.jsonl").stat().st_mtime
    again = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, timeout=600)
    assert again.returncode == 0, again.stderr[-3000:]
    assert (out / "tiny" / "grpo-s0" / "metrics.jsonl").stat().st_mtime == stamp
    assert (study / "README.md").read_text().count(BEGIN) == 1
    # Another folder that warm-starts alike shares the warm-start, and copies an identical arm.
    (tmp_path / "twin").mkdir()
    twin = folder(tmp_path / "twin", "seeds: [0]\narms:\n  plain: [method.name=grpo]\n")
    third = subprocess.run([sys.executable, "-m", "rl.study", str(twin), "--output_dir", str(out)], cwd=ROOT,
                           capture_output=True, text=True, timeout=600)
    assert third.returncode == 0, third.stderr[-3000:]
    assert len(list((out / "_warmstart").iterdir())) == 2
    assert not (out / "twin" / "logs" / "plain-s0.log").exists()
    assert ((out / "twin" / "plain-s0" / "metrics.jsonl").read_text()
            == (out / "tiny" / "grpo-s0" / "metrics.jsonl").read_text())
    # A folder that only evaluates more often shares the warm-start too, and its arms evaluate as it
    # says, although they resume a warm-start saved without those evaluations.
    (tmp_path / "finer").mkdir()
    finer = folder(tmp_path / "finer", "seeds: [0]\narms:\n  grpo: [method.name=grpo]\n")
    config = (finer / "config.yaml").read_text()
    (finer / "config.yaml").write_text(config.replace("trainer: {steps: 4,", "trainer: {steps: 4, eval_at: [1],"))
    fourth = subprocess.run([sys.executable, "-m", "rl.study", str(finer), "--output_dir", str(out)], cwd=ROOT,
                            capture_output=True, text=True, timeout=600)
    assert fourth.returncode == 0, fourth.stderr[-3000:]
    assert len(list((out / "_warmstart").iterdir())) == 2
    def evaluated(run):       # the steps with an evaluation; RL step 1 is step 5 (4 warm-start steps)
        rows = [json.loads(line) for line in (out / run / "metrics.jsonl").read_text().splitlines()]
        return {r["step"] for r in rows if "eval/accuracy" in r}

    assert 5 in evaluated("finer/grpo-s0") and 5 not in evaluated("tiny/grpo-s0")


def test_overview_has_one_line_per_study_with_its_verdict(tmp_path):
    from rl.study import overview

    stat = lambda m: {"mean": m, "std": 0.01, "n": 3}
    (tmp_path / "results").mkdir()
    (tmp_path / "results" / "summary.json").write_text(json.dumps({
        "target": {"bucket": "hard"},
        "arms": {"grpo": {"seeds": [0, 1, 2], "final": {"hard": stat(0.1)}},
                 "guide": {"seeds": [0, 1, 2], "final": {"hard": stat(0.25)}}}}))
    (tmp_path / "README.md").write_text("# x\n\n**Verdict: not reproduced.** Because.\n")
    table = overview([tmp_path, tmp_path / "missing"]).splitlines()
    assert len(table) == 3
    assert "`grpo` 0.100 ± 0.010 (n=3); `guide` 0.250 ± 0.010 (n=3)" in table[2]
    assert table[2].endswith("| not reproduced |")
    # A verdict wrapped over lines, as a README's prose has it, is read whole.
    (tmp_path / "README.md").write_text("# x\n\n**Verdict: not reproduced: the teacher is\nno better.** Because.\n")
    assert overview([tmp_path]).splitlines()[2].endswith("| not reproduced: the teacher is no better |")


def test_forgetting_is_final_minus_the_same_seeds_warm_start():
    from rl.study_tables import _forgetting
    curve = lambda base, hidden: {"step": [0, 50], "generated": [0, 1], "base": base, "hidden": hidden}   # noqa: E731
    summary = {"buckets": ["base", "hidden"],
               "arms": {"grpo": {"curves": {"0": curve([1.0, 0.9], [0.0, 0.5]), "1": curve([0.8, 0.8], [0.0, 0.7])}}}}
    lines = _forgetting(summary)
    row = next(line for line in lines if line.startswith("| `grpo`"))
    assert row.startswith("| `grpo` | -0.050 [") and "+0.600 [" in row and row.count("(n=2)") == 2


def test_folders_that_differ_only_in_the_rl_phase_share_a_warm_start(tmp_path):
    """The warm-start key ignores what only the RL phase reads (its steps, its extra evaluations,
    the method), and not what the warm-start does."""
    from rl.study import warmstart_key

    def folder(name, text):
        (tmp_path / name).mkdir()
        (tmp_path / name / "config.yaml").write_text(f"base: {ROOT / 'experiments' / 'default'}\n{text}")
        return tmp_path / name

    plain = folder("plain", "")
    rl_only = folder("rl_only", "trainer: {steps: 7, eval_at: [5, 10]}\nmethod: {name: hint_distill}\n")
    longer = folder("longer", "warmstart: {steps: 3}\n")
    assert warmstart_key(plain, 0) == warmstart_key(rl_only, 0) != warmstart_key(plain, 1)
    assert warmstart_key(longer, 0) != warmstart_key(plain, 0)
