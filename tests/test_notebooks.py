"""notebooks/ and rl.analysis / rl.report on two tiny runs made through the real CLI."""
import json
import subprocess
import sys
from html.parser import HTMLParser

import nbformat
import pytest
import yaml

from conftest import ROOT, TINY, run_cli
from rl.analysis import eval_curve, group_curves, load_run, load_runs, steps_to_reach
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


def cell_outputs(nb, marker: str) -> list:
    """The outputs of the one code cell whose source contains `marker`."""
    (cell,) = [c for c in nb.cells if c.cell_type == "code" and marker in c.source]
    return cell.outputs


class _TableParser(HTMLParser):
    """The <tr> rows of pandas' HTML tables as lists of cell texts: thead rows, then tbody rows."""

    def __init__(self):
        super().__init__()
        self.head, self.body, self._section, self._row, self._cell = [], [], None, None, None

    def handle_starttag(self, tag, attrs):
        if tag in ("thead", "tbody"):
            self._section = tag
        elif tag == "tr":
            self._row = []
        elif tag in ("th", "td"):
            self._cell = ""

    def handle_data(self, data):
        if self._cell is not None:
            self._cell += data

    def handle_endtag(self, tag):
        if tag in ("th", "td") and self._row is not None:
            self._row.append(self._cell)
            self._cell = None
        elif tag == "tr":
            (self.head if self._section == "thead" else self.body).append(self._row)


def html_tables(outputs) -> list[tuple[list[str], list[list[str]]]]:
    """(column names, rows as [index, *cells]) of every DataFrame the outputs displayed."""
    tables = []
    for out in outputs:
        html = out.get("data", {}).get("text/html")
        if html:
            parser = _TableParser()
            parser.feed(html)
            tables.append((parser.head[0][1:], parser.body))
    return tables


def number(cell: str):
    """A displayed number; None for a missing value."""
    return None if cell in ("None", "NaN", "<NA>") else float(cell)


def read_run_folder(folder):
    """What a run folder holds, read without rl.analysis: config, metrics merged per step, rollouts."""
    config = yaml.safe_load((folder / "config.yaml").read_text())
    merged = {}
    for line in (folder / "metrics.jsonl").read_text().splitlines():
        row = json.loads(line)
        merged.setdefault(row["step"], {}).update(row)
    rollouts = [json.loads(line) for line in (folder / "rollouts.jsonl").read_text().splitlines()]
    return config, dict(sorted(merged.items())), rollouts


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


@pytest.mark.slow
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


@pytest.mark.slow
def test_curves_compare_and_steps_to_reach(runs_root):
    a, b = load_runs([runs_root])
    curve = eval_curve(a)
    assert curve.index[0] == 0 and len(curve) >= 2 and curve.between(0, 1).all()
    assert steps_to_reach(a, 0.0) == 0                       # step 0 is an eval-only line
    assert steps_to_reach(a, 1.01) is None
    stats = group_curves([a, b], "eval/accuracy")
    assert set(stats.index.get_level_values("group")) == {"grpo", "hint_distill"}
    assert (stats["n"] == 1).all() and (stats["std"] == 0).all()
    assert stats.loc[("grpo", curve.index[-1]), "mean"] == curve.iloc[-1]
    # Only hint_distill logs hint/rate: grpo is left out rather than plotted as zeros.
    assert set(group_curves([a, b], "hint/rate").index.get_level_values("group")) == {"hint_distill"}


@pytest.mark.slow
def test_analyze_run_notebook_plots_the_given_run(runs_root, tmp_path):
    nb = execute_notebook(ROOT / "notebooks" / "analyze_run.ipynb", [runs_root / "b"], tmp_path, timeout=120)
    text = outputs_text(nb)
    assert f"run b at {runs_root / 'b'}" in text              # HINTRL_RUN_DIRS won over the default
    assert "expert load: not logged" not in text             # the trainer logs it at eval steps
    # The summary and tables show what the run folder holds.
    config, metrics, rollouts = read_run_folder(runs_root / "b")
    steps = list(metrics)
    assert (f"method {config['method']['name']}, task {config['task']['name']}, {len(steps)} logged steps "
            f"(last {steps[-1]}), {len(rollouts)} rollouts") in text
    (columns, rows), = html_tables(cell_outputs(nb, "run = load_run("))   # the last evals
    eval_keys = sorted({k for m in metrics.values() for k in m if "eval/" in k})
    assert sorted(columns) == eval_keys and "eval/accuracy" in eval_keys
    eval_steps = [s for s, m in metrics.items() if any(k in m for k in eval_keys)]
    assert [int(r[0]) for r in rows] == eval_steps[-5:]
    for step, *cells in rows:
        for key, cell in zip(columns, cells):
            want = metrics[int(step)].get(key)
            assert number(cell) == (None if want is None else pytest.approx(want, abs=1e-6)), (step, key)
    # Example rollouts: the last logged step's attempts, failed ones first.
    (columns, rows), = html_tables(cell_outputs(nb, "display(last.sort_values"))
    last = [r for r in rollouts if r["step"] == rollouts[-1]["step"]]
    want = sorted(last, key=lambda r: r["reward"])[:12]         # sorted() is stable, as the notebook's sort
    shown = [dict(zip(columns, cells)) for _, *cells in rows]
    assert [(int(r["step"]), r["prompt"], r["answer"], float(r["reward"])) for r in shown] == \
        [(r["step"], r["prompt"], r["answer"], r["reward"]) for r in want]
    assert [r["hint"] if r["hint"] not in ("None", "NaN") else None for r in shown] == [r["hint"] for r in want]
    assert_pngs(tmp_path, ["reward", "accuracy", "hints", "kl_per_token", "loss_pg", "router_replay_mismatch",
                           "expert_load"])


@pytest.mark.slow
def test_compare_runs_notebook_groups_by_method(runs_root, tmp_path):
    nb = execute_notebook(ROOT / "notebooks" / "compare_runs.ipynb", [runs_root / "a", runs_root / "b"],
                          tmp_path, timeout=120)
    folders = {name: read_run_folder(runs_root / name) for name in ("a", "b")}
    # One overview row per run, as its folder has it.
    (columns, rows), = html_tables(cell_outputs(nb, "overview = pd.DataFrame"))
    shown = {cells[0]: dict(zip(columns, cells)) for _, *cells in rows}
    assert list(shown) == ["a", "b"]
    for name, (config, metrics, _) in folders.items():
        row = shown[name]
        final = [m["eval/accuracy"] for m in metrics.values() if "eval/accuracy" in m][-1]
        assert (row["method.name"], int(row["seed"]), int(row["last step"])) == \
            (config["method"]["name"], config["seed"], list(metrics)[-1])
        assert number(row["final eval/accuracy"]) == pytest.approx(final, abs=1e-6)
    assert {row["method.name"] for row in shown.values()} == {"grpo", "hint_distill"}
    # Steps to reach the threshold, per run and per method.
    outputs = cell_outputs(nb, "reach = pd.DataFrame")
    (threshold,) = [float(o["text"].split(">=")[1]) for o in outputs if o.get("name") == "stdout"]
    (columns, rows), (group_columns, group_rows) = html_tables(outputs)
    reach = {}
    for name, (config, metrics, _) in folders.items():
        reached = [s for s, m in metrics.items() if m.get("eval/accuracy", -1) >= threshold]
        reach[config["method"]["name"]] = reached[0] if reached else None
    assert {cells[1]: number(cells[2]) for _, *cells in rows} == reach
    assert {group: (int(cells[group_columns.index("reached")]), int(cells[group_columns.index("runs")]))
            for group, *cells in group_rows} == {method: (int(s is not None), 1) for method, s in reach.items()}
    assert_pngs(tmp_path, ["compare_accuracy", "compare_accuracy_hinted", "compare_reward"])


@pytest.mark.slow
def test_report_cli_writes_html_next_to_the_run(runs_root):
    out = subprocess.run([sys.executable, "-m", "rl.report", str(runs_root / "a")], cwd=ROOT,
                         capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr[-3000:]
    html = runs_root / "a" / "report.html"
    assert out.stdout.strip() == str(html)
    body = html.read_text()
    assert "<html" in body and "data:image/png;base64" in body and "held-out accuracy" in body


@pytest.mark.slow
def test_compare_runs_notebook_groups_a_studys_runs_by_arm(runs_root, tmp_path):
    """rl.study names runs <arm>-s<seed>; GROUP_BY="arm" (HINTRL_GROUP_BY) groups the seeds of an arm."""
    import shutil

    study = tmp_path / "study"
    for name, arm in (("a", "x-s0"), ("b", "x-s1")):
        shutil.copytree(runs_root / name, study / arm)
    nb = execute_notebook(ROOT / "notebooks" / "compare_runs.ipynb", [study], tmp_path / "figs", timeout=120,
                          group_by="arm")
    (columns, rows), = html_tables(cell_outputs(nb, "overview = pd.DataFrame"))
    assert "arm" in columns and {dict(zip(columns, cells))["arm"] for _, *cells in rows} == {"x"}
    (_, _), (group_columns, group_rows) = html_tables(cell_outputs(nb, "reach = pd.DataFrame"))
    assert [g for g, *_ in group_rows] == ["x"] and int(group_rows[0][1:][group_columns.index("runs")]) == 2
