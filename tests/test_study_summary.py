"""rl/study.py's summary on fake run folders: paired per-seed differences against the baseline arm,
the extra evals, provenance (commit, config hashes, eval-set digests), the teacher gap over a plain
retry, and the `oracle` arm kind of study.yaml."""
import json
import subprocess

import pytest

from conftest import ROOT
from rl.config import ConfigError
from rl.configure import load_config
from rl.contamination import set_digest
from rl.stats import paired_difference
from rl.study import config_hash, load_study, summarize
from rl.study_tables import results_markdown

CONFIG = f"""base: {ROOT / 'experiments/repro-guide'}
warmstart: {{steps: 10}}
trainer: {{steps: 20, eval_every: 10}}
"""
STUDY = """seeds: [0, 1, 2]
target: {bucket: hard, arm: grpo}
arms:
  grpo: [method.name=grpo]
  guide: [method.name=corrected_replay]
  oracle: {kind: oracle}
"""
# Final held-out accuracy per arm and seed (hard bucket); easy is hard + 0.5.
FINAL = {"grpo": [0.10, 0.20, 0.30], "guide": [0.15, 0.22, 0.38], "oracle": [0.40, 0.50, 0.70]}


def fake_run(run_dir, finals, seed, logprob: bool):
    """metrics.jsonl of a finished run: warm-start end at step 10 (0.05 hard), a peak at 20, final at 30."""
    run_dir.mkdir(parents=True)
    rows = []
    for step, hard in ((0, 0.0), (10, 0.05), (20, finals[seed] + 0.01), (30, finals[seed])):
        row = {"step": step, "eval/accuracy": hard, "eval/accuracy/easy": hard + 0.5, "eval/accuracy/hard": hard,
               "budget/generated_tokens_total": 100.0 * step, "budget/scored_tokens_total": 0.0,
               "budget/trained_tokens_total": 50.0 * step, "time/step_s": 1.0}
        if logprob:
            for b, shift in (("easy", 0.0), ("hard", -2.0)):
                row[f"eval/reference_logprob/{b}"] = -5.0 + shift + hard * 10
                row[f"eval/pass@k/{b}"] = min(1.0, 2 * hard)
        rows.append(row)
    (run_dir / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    (run_dir / "eval_sets.json").write_text(json.dumps({"heldout/easy": ["a1", "b2"], "heldout/hard": ["c3"]}))


@pytest.fixture
def study_with_runs(tmp_path):
    folder = tmp_path / "paired"
    folder.mkdir()
    (folder / "config.yaml").write_text(CONFIG)
    (folder / "study.yaml").write_text(STUDY)
    out = tmp_path / "runs"
    base = out / load_config(folder).experiment
    for arm, finals in FINAL.items():
        for seed in range(3):
            if (arm, seed) != ("guide", 2):                  # guide's seed 2 never finished
                fake_run(base / f"{arm}-s{seed}", finals, seed, logprob=arm != "guide")
    return folder, out, base


def test_paired_differences_against_the_baseline(study_with_runs):
    folder, out, _ = study_with_runs
    summary = summarize(load_study(folder), out)
    arms = summary["arms"]
    assert "vs_baseline" not in arms["grpo"]
    guide = arms["guide"]["vs_baseline"]["final"]["hard"]
    # guide ran seeds 0 and 1: differences +0.05, +0.02; t(1) = 12.706, sample std of the two 0.0212
    assert guide["n"] == 2 and guide["per_seed"] == {0: pytest.approx(0.05), 1: pytest.approx(0.02)}
    assert guide["mean"] == pytest.approx(0.035)
    half = 12.706 * (0.03 / 2 ** 0.5) / 2 ** 0.5
    assert (guide["low"], guide["high"]) == (pytest.approx(0.035 - half), pytest.approx(0.035 + half))
    assert "reference_logprob_final" not in arms["guide"]["vs_baseline"]   # guide's runs do not log it
    oracle = arms["oracle"]["vs_baseline"]
    assert oracle["final"]["easy"] == paired_difference({0: 0.9, 1: 1.0, 2: 1.2}, {0: 0.6, 1: 0.7, 2: 0.8})
    assert oracle["peak"]["hard"]["mean"] == pytest.approx((0.3 + 0.3 + 0.4) / 3)
    # log p rises 10x the accuracy in fake_run: the difference is 10x accuracy's
    assert oracle["reference_logprob_final"]["hard"]["mean"] == pytest.approx(10 * (0.3 + 0.3 + 0.4) / 3)
    assert oracle["reference_logprob_peak"]["easy"]["n"] == 3
    # the arms' own spreads: sample std, n=1 has none
    assert arms["oracle"]["reference_logprob"]["final"]["hard"]["mean"] == pytest.approx(-7.0 + 16 / 3)
    assert arms["oracle"]["pass@k"]["final"]["hard"]["mean"] == pytest.approx((0.8 + 1.0 + 1.0) / 3)
    assert arms["grpo"]["final"]["hard"]["std"] == pytest.approx(0.1)
    assert arms["oracle"]["kind"] == "oracle" and arms["grpo"]["kind"] == ""


def test_the_tables_show_n_and_the_paired_intervals(study_with_runs):
    folder, out, _ = study_with_runs
    table = results_markdown(summarize(load_study(folder), out))
    assert "Paired difference vs `grpo`, per seed, 95% interval" in table
    guide = "+0.035 [-0.156, +0.226] (n=2)"        # at the first RL evaluation, final and peak alike here
    assert f"| `guide` | hard | {guide} | {guide} | {guide} | — | — |" in table
    assert "| `oracle` | hard | +0.333 [+0.190, +0.477] (n=3) |" in table
    assert "final reference_logprob" in table and "pass@k hard" in table
    assert "± 0.000" not in table


def test_provenance_commit_config_hashes_and_eval_sets(study_with_runs):
    folder, out, _ = study_with_runs
    summary = summarize(load_study(folder), out)
    head = subprocess.run(["git", "-C", str(ROOT), "rev-parse", "HEAD"], capture_output=True, text=True).stdout.strip()
    assert summary["commit"] == head and isinstance(summary["dirty"], bool)
    assert summary["eval_sets"] == {"heldout/easy": {"digest": set_digest(["a1", "b2"]), "n": 2},
                                    "heldout/hard": {"digest": set_digest(["c3"]), "n": 1}}
    hashes = {name: a["config_hash"] for name, a in summary["arms"].items()}
    assert len(set(hashes.values())) == 3 and all(len(h) == 10 for h in hashes.values())
    # The hash names the arm's config, not where or as what a run of it was saved.
    study = load_study(folder)
    oracle = next(a for a in study.arms if a.name == "oracle")
    assert config_hash(folder, oracle, 0, out / "elsewhere") == hashes["oracle"]
    assert config_hash(folder, oracle, 1, out) != hashes["oracle"]


def test_a_differing_eval_set_is_named_per_run(study_with_runs):
    folder, out, base = study_with_runs
    (base / "oracle-s1" / "eval_sets.json").write_text(json.dumps({"heldout/easy": ["a1"], "heldout/hard": ["c3"]}))
    sets = summarize(load_study(folder), out)["eval_sets"]
    assert sets["heldout/hard"]["digest"] == set_digest(["c3"])
    assert sets["heldout/easy"]["digest"] is None and sets["heldout/easy"]["by_run"]["oracle-s1"] == set_digest(["a1"])


def test_summary_without_runs_still_renders(tmp_path):
    folder = tmp_path / "empty"
    folder.mkdir()
    (folder / "config.yaml").write_text(CONFIG)
    (folder / "study.yaml").write_text(STUDY)
    summary = summarize(load_study(folder), tmp_path / "runs")
    assert summary["arms"] == {} and summary["eval_sets"] == {}
    assert "| arm | seeds |" in results_markdown(summary)


def gap(none_gap: float, rule_gap: float, over_none: float | None) -> dict:
    kind = lambda g: {"accuracy": 0.2 + g, "gap": g, "pass@G": 0.5, "rescued_all_fail": 0.1, "hinted": 1.0}  # noqa: E731
    out = {"plain": {"accuracy": 0.2, "pass@G": 0.4, "all_fail": 0.6}, "rule": kind(rule_gap)}
    if over_none is not None:
        out["none"] = kind(none_gap)
        out["rule"]["over_none"] = {"mean": over_none, "low": over_none - 0.01, "high": over_none + 0.01, "n": 50}
    return {"hard": out}


def test_teacher_gap_is_read_over_the_plain_retry_when_measured(study_with_runs):
    folder, out, base = study_with_runs
    for seed, over in enumerate((0.02, 0.04, 0.06)):
        (base / f"teacher_gap-s{seed}.json").write_text(json.dumps(gap(0.1, 0.1 + over, over)))
    table = results_markdown(summarize(load_study(folder), out))
    assert "| bucket | plain | pass@G | all-fail | none: gap | rule over none |" in table
    assert "| hard | 0.200 | 0.400 | 0.600 | +0.100 (0.10) | +0.040 (0.10) |" in table
    assert "adds over a plain retry" in table
    # An old gap JSON (no none kind): each kind's gap over the first attempt, as before.
    for seed in range(3):
        (base / f"teacher_gap-s{seed}.json").write_text(json.dumps(gap(0.0, 0.15, None)))
    table = results_markdown(summarize(load_study(folder), out))
    assert "| bucket | plain | pass@G | all-fail | rule |" in table and "| hard | 0.200 | 0.400 | 0.600 | +0.150 (0.10) |" in table


@pytest.mark.parametrize("arm, message", [
    ("{kind: nope}", "kind 'nope' is unknown; choose one of ['oracle']"),
    ("{kind: oracle, overrides: [method.name=grpo]}", "drop method.name"),
    ("{kind: oracle, lr: 1}", "is a list of overrides or a mapping"),
])
def test_bad_arm_kinds_are_named(tmp_path, arm, message):
    (tmp_path / "config.yaml").write_text(CONFIG)
    (tmp_path / "study.yaml").write_text(f"arms:\n  grpo: [method.name=grpo]\n  x: {arm}\n")
    with pytest.raises(ConfigError, match=message.replace("[", r"\[").replace("]", r"\]")):
        load_study(tmp_path)


def test_the_oracle_kind_expands_to_the_oracle_method(tmp_path):
    (tmp_path / "config.yaml").write_text(CONFIG)
    (tmp_path / "study.yaml").write_text("arms:\n  grpo: [method.name=grpo]\n"
                                         "  oracle: {kind: oracle, overrides: [trainer.lr=3.0e-4], seeds: [1]}\n")
    study = load_study(tmp_path)
    oracle = study.arms[1]
    assert (oracle.kind, oracle.overrides, oracle.seeds) == ("oracle", ["method.name=oracle", "trainer.lr=3.0e-4"], [1])
    assert load_config(tmp_path, oracle.overrides).method.name == "oracle"


@pytest.mark.parametrize("name", sorted(p.parent.name for p in (ROOT / "experiments").glob("*/study.yaml")))
def test_every_study_has_an_oracle_arm(name):
    arms = {a.name: a for a in load_study(ROOT / "experiments" / name).arms}
    assert arms["oracle"].kind == "oracle" and arms["oracle"].overrides == ["method.name=oracle"]
