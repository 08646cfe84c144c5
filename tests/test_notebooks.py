"""notebooks/ and rl.analysis / rl.report on two tiny runs made through the real CLI."""
import subprocess
import sys

import nbformat
import pytest

from conftest import ROOT, TINY, run_cli
from rl.analysis import compare, eval_curve, load_run, load_runs, steps_to_reach
from rl.report import execute_notebook

NOTEBOOKS = ["analyze_run.ipynb", "compare_runs.ipynb"]
PNG_MAGIC = b"\x89PNG\r\n\x1a\n"


@pytest.fixture(scope="module")
def runs_root(tmp_path_factory):
    """<tmp>/default/a (grpo) and <tmp>/default/b (hint_distill): 3 warm-start + 4 RL steps each."""
    root = tmp_path_factory.mktemp("runs")
    for name, method in [("a", "grpo"), ("b", "hint_distill")]:
        out = run_cli(["experiments/default", *TINY, f"output_dir={root}", f"method.name={method}",
                       f"run_name={name}"])
        assert out.returncode == 0, out.stderr[-3000:]
    return root / "default"


def outputs_text(nb) -> str:
    """Everything the executed cells printed or displayed as text."""
    parts = []
    for cell in nb.cells:
        for out in cell.get("outputs", []):
            parts.append(out.get("text", "") + out.get("data", {}).get("text/plain", ""))
    return "\n".join(parts)


def assert_pngs(folder, names):
    for name in names:
        data = (folder / f"{name}.png").read_bytes()
        assert data.startswith(PNG_MAGIC) and len(data) > 5000, name   # a drawn plot, not a stub


@pytest.mark.parametrize("name", NOTEBOOKS)
def test_notebooks_are_stored_without_outputs_and_take_parameters(name):
    nb = nbformat.read(ROOT / "notebooks" / name, as_version=4)
    code = [c for c in nb.cells if c.cell_type == "code"]
    assert all(c.execution_count is None and c.outputs == [] for c in code), f"clear the outputs of {name}"
    assert "parameters" in code[0].metadata.get("tags", []) and "RUN_DIRS" in code[0].source


def test_load_runs_reads_both_runs(runs_root):
    runs = load_runs([runs_root])                           # an experiment folder expands to its runs
    assert [r.name for r in runs] == ["a", "b"]
    assert [r.config_value("method.name") for r in runs] == ["grpo", "hint_distill"]
    assert [r.name for r in load_runs([str(runs_root / "*"), runs_root / "a"])] == ["a", "b"]
    a = runs[0]
    assert list(a.metrics.index) == list(range(8))
    assert {"prompt", "attempt", "hint", "reward"} <= set(a.rollouts.columns)
    assert set(a.rollouts["step"]) == {4, 5, 6, 7}
    with pytest.raises(FileNotFoundError, match="checkpoints"):
        load_run(runs_root / "a" / "checkpoints")


def test_curves_compare_and_steps_to_reach(runs_root):
    a, b = load_runs([runs_root])
    curve = eval_curve(a)
    assert curve.index[0] == 0 and len(curve) >= 2 and curve.between(0, 1).all()
    assert steps_to_reach(a, 0.0) == 0                       # step 0 is an eval-only line
    assert steps_to_reach(a, 1.01) is None
    stats = compare([a, b], "eval/accuracy")
    assert set(stats.index.get_level_values("group")) == {"grpo", "hint_distill"}
    assert (stats["n"] == 1).all() and (stats["std"] == 0).all()
    assert stats.loc[("grpo", curve.index[-1]), "mean"] == curve.iloc[-1]
    # Only hint_distill logs hint/rate: grpo is left out rather than plotted as zeros.
    assert set(compare([a, b], "hint/rate").index.get_level_values("group")) == {"hint_distill"}


def test_analyze_run_notebook_plots_the_given_run(runs_root, tmp_path):
    nb = execute_notebook(ROOT / "notebooks" / "analyze_run.ipynb", [runs_root / "b"], tmp_path, timeout=120)
    text = outputs_text(nb)
    assert f"run b at {runs_root / 'b'}" in text              # HINTRL_RUN_DIRS won over the default
    assert "expert load: not logged" not in text             # the trainer logs it at eval steps
    assert_pngs(tmp_path, ["reward", "accuracy", "hints", "loss_distill", "loss_pg", "router_replay_mismatch",
                           "expert_load"])


def test_compare_runs_notebook_groups_by_method(runs_root, tmp_path):
    nb = execute_notebook(ROOT / "notebooks" / "compare_runs.ipynb", [runs_root / "a", runs_root / "b"],
                          tmp_path, timeout=120)
    text = outputs_text(nb)
    assert "grpo" in text and "hint_distill" in text
    assert_pngs(tmp_path, ["compare_accuracy", "compare_accuracy_hinted", "compare_reward"])


def test_report_cli_writes_html_next_to_the_run(runs_root):
    out = subprocess.run([sys.executable, "-m", "rl.report", str(runs_root / "a")], cwd=ROOT,
                         capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr[-3000:]
    html = runs_root / "a" / "report.html"
    assert out.stdout.strip() == str(html)
    body = html.read_text()
    assert "<html" in body and "data:image/png;base64" in body and "held-out accuracy" in body
