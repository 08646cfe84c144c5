"""HTML reports of runs: `python -m rl.report RUN_DIR...` (scripts/report.sh).

One run folder executes notebooks/analyze_run.ipynb and writes <run_dir>/report.html; several
(run folders, experiment folders or globs, as rl.analysis.load_runs reads them) execute
notebooks/compare_runs.ipynb and write compare.html in the runs' common parent folder. The
figures are also kept as PNGs in a `<report>_figures/` folder beside the HTML.
"""
from __future__ import annotations

import argparse
import os
from pathlib import Path

import nbformat
from nbclient import NotebookClient
from nbconvert import HTMLExporter

from rl.analysis import load_runs

NOTEBOOKS = Path(__file__).resolve().parents[1] / "notebooks"
CELL_TIMEOUT_S = 600


def execute_notebook(notebook: Path, run_dirs: list[Path], report_dir: Path | None = None,
                     timeout: int = CELL_TIMEOUT_S, group_by: str | None = None) -> nbformat.NotebookNode:
    """Run the notebook headless against `run_dirs` (HINTRL_RUN_DIRS; compare_runs groups them by
    `group_by`, HINTRL_GROUP_BY) and return it with outputs; raises nbclient's CellExecutionError
    on the first failing cell."""
    nb = nbformat.read(notebook, as_version=4)
    env = dict(os.environ, HINTRL_RUN_DIRS=os.pathsep.join(str(Path(d).resolve()) for d in run_dirs))
    if group_by:
        env["HINTRL_GROUP_BY"] = group_by
    if report_dir is not None:
        env["HINTRL_REPORT_DIR"] = str(Path(report_dir).resolve())
    # cwd is notebooks/, as in Jupyter, so the notebooks' own relative defaults resolve alike.
    client = NotebookClient(nb, kernel_name="python3", timeout=timeout,
                            resources={"metadata": {"path": str(notebook.parent)}})
    client.execute(env=env)
    return nb


def write_report(run_dirs: list[str], group_by: str | None = None) -> Path:
    runs = load_runs(run_dirs)  # fails early, naming the folder, when something is not a run
    if len(runs) == 1:
        notebook, html = NOTEBOOKS / "analyze_run.ipynb", runs[0].path / "report.html"
    else:
        parent = Path(os.path.commonpath([r.path.resolve() for r in runs]))
        notebook, html = NOTEBOOKS / "compare_runs.ipynb", parent / "compare.html"
    nb = execute_notebook(notebook, [r.path for r in runs], html.with_name(f"{html.stem}_figures"), group_by=group_by)
    body, _ = HTMLExporter().from_notebook_node(nb)
    html.write_text(body, encoding="utf-8")
    return html


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="python -m rl.report", description=__doc__.splitlines()[0])
    parser.add_argument("run_dirs", nargs="+", metavar="RUN_DIR",
                        help="run folder(s), experiment folder(s) or globs of them")
    parser.add_argument("--group-by", default=None,
                        help='compare: config key the runs are grouped by (default method.name; "arm" for a study)')
    args = parser.parse_args(argv)
    print(write_report(args.run_dirs, args.group_by))


if __name__ == "__main__":
    main()
