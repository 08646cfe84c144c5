"""The MoE benchmark harness (benchmarks/moe.py) at a tiny shape: not a timed test. Every row is
written as it is measured (a run stopped by a time limit keeps what it measured) and --profile
adds each layer row's per-operator breakdown."""
import json
import os
import signal
import subprocess
import sys

import pytest

from conftest import CHILD_PYTHONPATH, ROOT

pytestmark = pytest.mark.slow               # five benchmark subprocesses per run

ENV = dict(os.environ, PYTHONPATH=CHILD_PYTHONPATH, OMP_NUM_THREADS="1")


def test_rows_profiles_and_the_table(tmp_path):
    res = subprocess.run([sys.executable, "-m", "benchmarks.moe", "--shapes", "tiny", "--iters", "1", "--threads", "1",
                          "--device", "cpu", "--profile", "--out", str(tmp_path)],
                         cwd=ROOT, env=ENV, capture_output=True, text=True, timeout=600)
    assert res.returncode == 0, res.stderr[-3000:]
    rows = json.loads((tmp_path / "moe-cpu.json").read_text())["rows"]
    assert [(r["kind"], r["impl"]) for r in rows] == [("layer", "hintrl"), ("layer", "grouped_mm"), ("layer", "eager"),
                                                     ("routing", "hintrl"), ("routing", "grouped_mm")]
    assert all("error" not in r and r["seconds"] > 0 for r in rows)
    for r in rows[:3]:
        assert r["profile_top"] and all(p["self_ms"] >= 0 and p["calls"] >= 1 for p in r["profile_top"])
        assert "Self CPU" in (tmp_path / f"moe-cpu-profile-tiny-{r['impl']}.txt").read_text()
    table = (tmp_path / "moe-cpu.md").read_text()
    assert "| tiny | hintrl |" in table and "Profile (one forward + backward" in table


def test_a_run_killed_after_its_first_row_keeps_it(tmp_path):
    proc = subprocess.Popen([sys.executable, "-m", "benchmarks.moe", "--shapes", "tiny", "--iters", "1", "--threads",
                             "1", "--device", "cpu", "--out", str(tmp_path)],
                            cwd=ROOT, env=ENV, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True)
    try:
        first = json.loads(proc.stdout.readline())        # printed after the row was written
        proc.send_signal(signal.SIGKILL)
    finally:
        proc.wait(timeout=60)
    kept = json.loads((tmp_path / "moe-cpu.json").read_text())["rows"]
    assert kept[0] == first and 1 <= len(kept) < 5
    assert "| tiny | hintrl |" in (tmp_path / "moe-cpu.md").read_text()
