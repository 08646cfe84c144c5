"""rl.analysis curves against compute budget keys, and compare_runs.ipynb's equal-cost figure, on
run folders written by hand (no training)."""
import json

import nbformat
import pandas as pd
import pytest
import yaml

from conftest import ROOT
from rl.analysis import eval_curve, group_curves, load_run, load_runs, x_axis

GEN, SCORED = "budget/generated_tokens_total", "budget/scored_tokens_total"
PNG_MAGIC = b"\x89PNG\r\n\x1a\n"


def write_run(folder, method, seed, lines):
    """A run folder as rl/runlog.py writes it: config.yaml and one metrics.jsonl line per dict."""
    folder.mkdir(parents=True)
    (folder / "config.yaml").write_text(yaml.safe_dump({"method": {"name": method}, "seed": seed,
                                                        "task": {"name": "arith"}}))
    (folder / "metrics.jsonl").write_text("".join(json.dumps(line) + "\n" for line in lines))
    return folder


def budget_lines(accuracy, generated, scored, steps=4):
    """Step 0: the initial eval only. Steps 1..steps: per-step and cumulative budget keys (the
    totals start above one step's spend, as warm-start tokens count too), train and budget logged
    in one line and the eval at even steps in a second line of the same step."""
    lines = [{"step": 0, "eval/accuracy": accuracy[0]}]
    for step in range(1, steps + 1):
        lines.append({"step": step, "train/reward_mean": 0.1 * step,
                      "budget/generated_tokens": generated, "budget/scored_tokens": scored,
                      "budget/trained_tokens": 7, GEN: generated * (step + 1), SCORED: scored * (step + 1),
                      "budget/trained_tokens_total": 7 * step})
        if step % 2 == 0:
            lines.append({"step": step, "eval/accuracy": accuracy[step // 2]})
    return lines


@pytest.fixture
def budget_runs(tmp_path):
    """grpo seeds 0 and 1 (seed 1 generates 3x the tokens), hint_distill seed 0; evals at 0, 2, 4."""
    root = tmp_path / "runs"
    write_run(root / "grpo-s0", "grpo", 0, budget_lines([0.1, 0.3, 0.5], generated=100, scored=0))
    write_run(root / "grpo-s1", "grpo", 1, budget_lines([0.2, 0.4, 0.7], generated=300, scored=0))
    write_run(root / "hint-s0", "hint_distill", 0, budget_lines([0.1, 0.6, 0.8], generated=50, scored=40))
    return root


def old_compare(runs, key="eval/accuracy", group_by="method.name"):
    """group_curves() as it was before the x axis, to check x="step" is unchanged."""
    curves = [eval_curve(r, key).rename("value").to_frame().assign(group=str(r.config_value(group_by)))
              for r in runs if key in r.metrics]
    stats = pd.concat(curves).reset_index().groupby(["group", "step"])["value"].agg(["mean", "std", "count"])
    return stats.rename(columns={"count": "n"}).fillna({"std": 0.0})


def test_eval_curve_on_a_budget_axis(budget_runs):
    run = load_run(budget_runs / "grpo-s1")
    curve = eval_curve(run, x=GEN)
    assert curve.index.name == GEN
    # Step 0 (initial eval, no budget keys) sits at 0; steps 2 and 4 at the cumulative totals there.
    assert list(curve.index) == [0, 900, 1500]
    assert list(curve) == [0.2, 0.4, 0.7]
    # x="step" is the curve as before.
    by_step = eval_curve(run)
    assert by_step.index.name == "step" and list(by_step.index) == [0, 2, 4] and list(by_step) == [0.2, 0.4, 0.7]
    pd.testing.assert_series_equal(eval_curve(run, x="step"), by_step)


def test_cumulative_keys_are_carried_forward_over_steps_that_did_not_log_them(tmp_path):
    run = load_run(write_run(tmp_path / "gappy", "grpo", 0, [
        {"step": 0, "eval/accuracy": 0.0},
        {"step": 1, GEN: 120, "budget/generated_tokens": 120},
        {"step": 2, "eval/accuracy": 0.25},                   # an eval step without budget keys
        {"step": 3, "eval/accuracy": 0.5, GEN: 400, "budget/generated_tokens": 280},
        {"step": 4, "eval/accuracy": 0.75},
    ]))
    assert list(x_axis(run, GEN)) == [0, 120, 120, 400, 400]
    curve = eval_curve(run, x=GEN)
    assert list(curve.index) == [0, 120, 400, 400] and list(curve) == [0.0, 0.25, 0.5, 0.75]
    # A per-step key is not carried forward: steps that did not log it have no place on that axis.
    per_step = eval_curve(run, x="budget/generated_tokens")
    assert list(per_step.index) == [280] and list(per_step) == [0.5]


def test_missing_x_key_names_the_run_and_what_it_has(tmp_path, budget_runs):
    old = load_run(write_run(tmp_path / "old", "grpo", 0, [
        {"step": 0, "eval/accuracy": 0.1}, {"step": 1, "train/reward_mean": 0.2, "eval/accuracy": 0.3}]))
    with pytest.raises(KeyError, match=f"{old.path}.*{GEN}.*no budget/ keys"):
        eval_curve(old, x=GEN)
    run = load_run(budget_runs / "grpo-s0")
    with pytest.raises(KeyError, match="budget/teacher_tokens_total.*budget/generated_tokens, ") as err:
        eval_curve(run, x="budget/teacher_tokens_total")
    assert str(run.path) in str(err.value) and SCORED in str(err.value)
    with pytest.raises(KeyError, match=GEN):
        group_curves([old], x=GEN)
    with pytest.raises(KeyError, match="eval/nothing"):        # the y key is still checked first
        eval_curve(run, "eval/nothing", x=GEN)


def test_compare_on_a_budget_axis_averages_x_across_seeds(budget_runs):
    runs = load_runs([budget_runs])
    stats = group_curves(runs, "eval/accuracy", x=GEN)
    assert list(stats.columns) == ["mean", "std", "n", "x"]
    assert stats.index.names == ["group", "step"]
    grpo = stats.loc["grpo"]
    assert list(grpo.index) == [0, 2, 4] and (grpo["n"] == 2).all()
    # Seeds log the same steps but spend 100 and 300 tokens a step: x is the mean of their totals.
    assert list(grpo["x"]) == [0, (300 + 900) / 2, (500 + 1500) / 2]
    assert list(grpo["mean"]) == pytest.approx([0.15, 0.35, 0.6])
    assert list(grpo["std"]) == pytest.approx([pd.Series(p).std() for p in ([0.1, 0.2], [0.3, 0.4], [0.5, 0.7])])
    hint = stats.loc["hint_distill"]
    assert list(hint["x"]) == [0, 150, 250] and list(hint["std"]) == [0, 0, 0]
    assert list(group_curves(runs, x=SCORED).loc["hint_distill", "x"]) == [0, 120, 200]
    # The same statistics as per step; only the x column is added.
    pd.testing.assert_frame_equal(stats.drop(columns="x"), group_curves(runs, "eval/accuracy"))


def test_compare_by_step_is_unchanged(budget_runs):
    runs = load_runs([budget_runs])
    for key in ("eval/accuracy", "train/reward_mean"):
        stats = group_curves(runs, key)
        assert list(stats.columns) == ["mean", "std", "n"]
        pd.testing.assert_frame_equal(stats, old_compare(runs, key))
        pd.testing.assert_frame_equal(group_curves(runs, key, x="step"), stats)


def executed_text(nb) -> str:
    return "\n".join(out.get("text", "") for cell in nb.cells for out in cell.get("outputs", []))


def test_compare_runs_notebook_plots_accuracy_against_budget(budget_runs, tmp_path):
    from rl.report import execute_notebook
    stored = nbformat.read(ROOT / "notebooks" / "compare_runs.ipynb", as_version=4)
    assert all(c.execution_count is None and c.outputs == [] for c in stored.cells if c.cell_type == "code")
    figures = tmp_path / "figures"
    nb = execute_notebook(ROOT / "notebooks" / "compare_runs.ipynb",
                          [budget_runs / "grpo-s0", budget_runs / "grpo-s1", budget_runs / "hint-s0"],
                          figures, timeout=120)
    assert "figure skipped" not in executed_text(nb)
    data = (figures / "compare_accuracy_budget.png").read_bytes()
    assert data.startswith(PNG_MAGIC) and len(data) > 5000     # a drawn plot, not a stub
    assert (figures / "compare_accuracy.png").is_file()


def test_compare_runs_notebook_skips_the_budget_figure_for_runs_without_accounting(tmp_path):
    from rl.report import execute_notebook
    old = [write_run(tmp_path / name, method, 0, [{"step": 0, "eval/accuracy": 0.1},
                                                  {"step": 2, "train/reward_mean": 0.3, "eval/accuracy": 0.4}])
           for name, method in (("old-a", "grpo"), ("old-b", "hint_distill"))]
    figures = tmp_path / "figures"
    nb = execute_notebook(ROOT / "notebooks" / "compare_runs.ipynb", old, figures, timeout=120)
    notes = [line for line in executed_text(nb).splitlines() if "figure skipped" in line]
    assert len(notes) == 1 and "old-a, old-b" in notes[0]
    assert not (figures / "compare_accuracy_budget.png").exists()
    assert (figures / "compare_accuracy.png").is_file()      # the rest of the notebook still ran


def test_corrected_successes_count_the_logged_corrected_rows_per_bucket(tmp_path):
    from rl.analysis import corrected_successes

    rows = [{"step": 1, "prompt": "1 + 2", "reward": 1.0, "source": "corrected"},
            {"step": 1, "prompt": "1 + 2", "reward": 0.0, "source": "corrected"},
            {"step": 1, "prompt": "100 + 200", "reward": 0.0, "source": "corrected"},
            {"step": 1, "prompt": "100 + 200", "reward": 1.0}]                  # a rollout row: not counted
    (tmp_path / "rollouts.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    bucket = lambda prompt: "hard" if "100" in prompt else "easy"
    assert corrected_successes(tmp_path, bucket) == {"easy": (1, 2), "hard": (0, 1)}
