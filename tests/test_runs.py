"""The experiment API (`python -m rl.runs`), driven as an agent drives it: the command line only,
JSON read back from stdout, real processes (a real trainer where the state comes from one)."""
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from conftest import CHILD_PYTHONPATH, ROOT, TINY

VERBS = ("launch", "status", "list", "wait", "stop", "compare")
# TINY's student, fewer steps: 4 warm-start + 2 RL, evals at 0, 3, 4 (end of warm-start) and 6.
SHORT = TINY + ["warmstart.steps=4", "trainer.steps=2", "trainer.eval_every=3", "task.eval_size=8",
                "rollout.prompts_per_step=2", "warmstart.batch_size=8", "trainer.checkpoint_every=6"]


def runs_cli(*args, timeout=120) -> subprocess.CompletedProcess:
    env = dict(os.environ, PYTHONPATH=CHILD_PYTHONPATH, OMP_NUM_THREADS="1")
    return subprocess.run([sys.executable, "-m", "rl.runs", *map(str, args)], cwd=ROOT, env=env,
                          capture_output=True, text=True, timeout=timeout)


def runs_json(*args, timeout=120):
    out = runs_cli(*args, "--json", timeout=timeout)
    assert out.returncode == 0, out.stderr[-3000:]
    return json.loads(out.stdout)          # the whole of stdout is one JSON document


def wait_until(predicate, timeout: float, what: str, poll: float = 0.5):
    import time

    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        value = predicate()
        if value:
            return value
        time.sleep(poll)
    raise AssertionError(f"timed out after {timeout} s waiting for {what}")


@pytest.fixture
def out_dir(tmp_path):
    """The runs' output folder; whatever still runs at the end is stopped (a failing test must
    not leave trainers behind)."""
    out = tmp_path / "runs"
    yield out
    listing = runs_cli("list", "--json", "--output-dir", out)
    for st in json.loads(listing.stdout)["runs"] if listing.returncode == 0 else []:
        if st["state"] == "running" and st["experiment"] == "default":     # launched, not hand-made
            runs_cli("stop", st["run"], "--timeout", "5")


def fake_run(out: Path, name: str, rows=(), pid_info=None, exit_info=None, log="") -> Path:
    """A run folder as the trainer and rl.runs leave it, written by hand."""
    run = out / "exp" / name
    run.mkdir(parents=True)
    (run / "config.yaml").write_text(yaml.safe_dump({"experiment": "exp", "run_name": name,
                                                     "warmstart": {"steps": 2}, "trainer": {"steps": 2}}))
    (run / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    if pid_info is not None:
        (run / "run.pid").write_text(json.dumps(pid_info))
    if exit_info is not None:
        (run / "exit.json").write_text(json.dumps(exit_info))
    if log:
        (run / "train.log").write_text(log)
    return run


def dead_pid() -> int:
    proc = subprocess.Popen(["true"])
    proc.wait()
    return proc.pid


def alive(pid: int) -> bool:
    """Process pid exists and is not a zombie (an orphan waits a moment for init to reap it)."""
    try:
        text = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return False
    return text[text.rindex(")") + 2:].split()[0] not in ("Z", "X")


def proc_start_time(pid: int) -> int:
    text = Path(f"/proc/{pid}/stat").read_text()
    return int(text[text.rindex(")") + 2:].split()[19])


def test_help_lists_every_verb():
    out = runs_cli("--help")
    assert out.returncode == 0
    for verb in VERBS:
        assert f"\n    {verb} " in out.stdout, verb
        sub = runs_cli(verb, "--help")
        assert sub.returncode == 0 and "--json" in sub.stdout
    assert "_supervise" not in out.stdout


def test_unknown_run_is_one_line_and_exit_2(out_dir):
    fake_run(out_dir, "known", rows=[{"step": 0}])
    for verb in ("status", "stop", "compare"):
        out = runs_cli(verb, "exp/nosuch", "--output-dir", out_dir)
        assert out.returncode == 2 and out.stdout == ""
        assert out.stderr.strip().count("\n") == 0 and "'exp/nosuch'" in out.stderr
    out = runs_cli("status", "--json", "--output-dir", out_dir / "empty")
    assert out.returncode == 2 and out.stdout == "" and "no runs under" in out.stderr


def test_stale_and_reused_pids_read_as_killed(out_dir):
    rows = [{"step": 0, "eval/accuracy": 0.0}, {"step": 1, "time/step_s": 0.5}]
    fake_run(out_dir, "stale", rows, pid_info={"pid": dead_pid(), "supervisor_pid": dead_pid(),
                                               "started": "2024-01-01T00:00:00+00:00"})
    # this test's own pid: alive, but a different process than the one that started at tick 1
    me = os.getpid()
    fake_run(out_dir, "reused", rows, pid_info={"pid": me, "start_time": 1, "supervisor_pid": me,
                                                "supervisor_start_time": 1})
    fake_run(out_dir, "alive", rows, pid_info={"pid": me, "start_time": proc_start_time(me)})
    fake_run(out_dir, "elsewhere", rows, pid_info={"pid": dead_pid(), "host": "another-machine"})
    fake_run(out_dir, "plain-done", rows + [{"step": 4, "eval/accuracy": 0.5}])   # scripts/train.sh, no run.pid
    fake_run(out_dir, "plain-short", rows)
    listing = runs_json("list", "--output-dir", out_dir)
    states = {st["name"]: st for st in listing["runs"]}
    assert {n: s["state"] for n, s in states.items()} == {
        "stale": "killed", "reused": "killed", "alive": "running", "elsewhere": "unknown",
        "plain-done": "finished", "plain-short": "unknown"}
    assert "stale pid" in states["stale"]["detail"]
    assert states["alive"]["eta_s"] == 1.5 and states["stale"]["eta_s"] is None   # (4 - 1) x 0.5 s
    assert states["plain-done"]["last_evals"] == {"step": 4, "metrics": {"eval/accuracy": 0.5}}
    assert states["plain-done"]["step"] == states["plain-done"]["total_steps"] == 4
    one = runs_json("status", "exp/stale", "--output-dir", out_dir)
    assert one == states["stale"]
    out = runs_cli("stop", "stale", "--output-dir", out_dir)           # a bare run name works too
    assert out.returncode == 1 and "not running (state: killed)" in out.stderr
    assert out.stderr.strip().count("\n") == 0
    (out_dir / "exp" / "alive" / "run.pid").unlink()     # names this test's process: nothing may stop it


def test_a_run_with_a_damaged_log_is_listed_as_such(out_dir):
    """A bad line in the middle of metrics.jsonl (not the one being written) is an error in that
    run's status, not in the listing of every run."""
    fake_run(out_dir, "fine", [{"step": 0}, {"step": 4, "eval/accuracy": 0.5}])
    damaged = fake_run(out_dir, "damaged", [{"step": 0}])
    with (damaged / "metrics.jsonl").open("a") as f:
        f.write("{not json\n" + json.dumps({"step": 1}) + "\n")
    states = {st["name"]: st for st in runs_json("list", "--output-dir", out_dir)["runs"]}
    assert states["fine"]["state"] == "finished"
    assert "metrics unreadable" in states["damaged"]["detail"] and "metrics.jsonl:2" in states["damaged"]["detail"]
    assert states["damaged"]["step"] is None
    rows = runs_json("compare", "exp/fine", "exp/damaged", "--output-dir", out_dir)["runs"]
    assert [r["final"] for r in rows] == [0.5, None]


def test_exit_records_and_last_error(out_dir):
    log = ("== rl.runs launch 2024-01-01T00:00:00+00:00: python -m rl.train ...\n"
           "Traceback (most recent call last):\n  File \"x.py\", line 1\nKeyError: 'old'\n"
           "== rl.runs launch 2024-01-02T00:00:00+00:00: python -m rl.train ...\n"
           "step 1\rstep 2\nTraceback (most recent call last):\n  File \"x.py\", line 1, in <module>\n"
           "    raise ValueError('boom')\nValueError: boom\n== rl.runs: the trainer exited with 1\n")
    fake_run(out_dir, "failed", [{"step": 1}], pid_info={"pid": dead_pid()},
             exit_info={"returncode": 1, "signal": None, "stopped": False, "ended": "t"}, log=log)
    fake_run(out_dir, "signalled", [{"step": 1}], pid_info={"pid": dead_pid()},
             exit_info={"returncode": -9, "signal": "SIGKILL", "stopped": False, "ended": "t"})
    fake_run(out_dir, "done", [{"step": 4}], pid_info={"pid": dead_pid()},
             exit_info={"returncode": 0, "signal": None, "stopped": False, "ended": "t"},
             log=log.split("== rl.runs launch 2024-01-02")[0] + "== rl.runs launch 2024-01-03: again\nok\n")
    states = {st["name"]: st for st in runs_json("list", "--output-dir", out_dir)["runs"]}
    assert states["failed"]["state"] == "failed" and states["failed"]["returncode"] == 1
    assert states["failed"]["last_error"] == "ValueError: boom"
    assert states["signalled"]["state"] == "killed" and states["signalled"]["signal"] == "SIGKILL"
    assert states["done"]["state"] == "finished" and states["done"]["last_error"] is None   # errors of an older launch


def test_stop_escalates_to_sigkill_and_signals_only_the_runs_processes(out_dir):
    """A run.pid naming a process of this test's own process group (no "pgid" of its own): stop
    signals that process, not the group, and SIGKILLs it when it ignores SIGTERM."""
    stubborn = subprocess.Popen(["sh", "-c", 'trap "" TERM; exec sleep 60'])
    try:
        fake_run(out_dir, "stubborn", [{"step": 1}],
                 pid_info={"pid": stubborn.pid, "start_time": proc_start_time(stubborn.pid)})
        assert runs_json("status", "exp/stubborn", "--output-dir", out_dir)["state"] == "running"
        st = runs_json("stop", "exp/stubborn", "--output-dir", out_dir, "--timeout", "1")
        assert stubborn.wait(timeout=10) == -9
        assert st["state"] == "killed" and st["signal"] == "SIGKILL" and st["returncode"] is None
        assert json.loads((out_dir / "exp" / "stubborn" / "exit.json").read_text())["stopped"] is True
    finally:
        stubborn.kill()
        stubborn.wait()


def test_a_config_error_stops_launch_before_anything_starts(out_dir):
    out = runs_cli("launch", "experiments/default", *SHORT, f"output_dir={out_dir}", "--detach",
                   "trainer.stepz=3", "--json")            # an override after an option is one still
    assert out.returncode == 2 and out.stdout == ""
    assert out.stderr.strip().splitlines()[-1].startswith("config error:") and "trainer.stepz" in out.stderr
    assert not out_dir.exists()


def test_a_run_that_fails_in_the_trainer(out_dir):
    """Config and run folder fine, then the trainer fails: resume=true of a run whose only
    checkpoint is unusable. launch without --detach waits and exits with the run's code."""
    (out_dir / "default" / "broken" / "checkpoints" / "step_0000004").mkdir(parents=True)
    out = runs_cli("launch", "experiments/default", *SHORT, f"output_dir={out_dir}",
                   "resume=true", "run_name=broken", "--json")                      # waits for the run
    assert out.returncode == 1, out.stderr[-3000:]
    launched = json.loads(out.stdout)
    assert launched["state"] == "failed" and launched["returncode"] == 1
    assert "checkpoint error: no usable checkpoint" in out.stderr                    # the log, streamed
    st = runs_json("status", "default/broken", "--output-dir", out_dir)
    assert st["state"] == "failed" and st["returncode"] == 1 and st["total_steps"] == 6
    assert st["last_error"].startswith("checkpoint error: no usable checkpoint")
    assert Path(st["log"]) == out_dir.resolve() / "default" / "broken" / "train.log"


def test_stop_a_detached_run(out_dir):
    launched = runs_json("launch", "experiments/default", *SHORT, f"output_dir={out_dir}",
                         "trainer.steps=100000", "run_name=long", "--detach")
    run = launched["run"]
    assert runs_json("status", run)["state"] == "running"        # at once: run.pid is written
    st = wait_until(lambda: (s := runs_json("status", run))["step"] is not None and s, 60, "a first step")
    assert st["state"] == "running" and st["total_steps"] == 100004 and st["pid"] == launched["pid"]
    stopped = runs_json("stop", "default/long", "--output-dir", out_dir, "--timeout", "20")
    assert stopped["state"] == "killed" and stopped["signal"] == "SIGTERM", stopped
    assert "stopped by rl.runs stop" in stopped["detail"] and stopped["eta_s"] is None
    assert not alive(launched["pid"]) and not alive(launched["supervisor_pid"])
    assert json.loads((Path(run) / "exit.json").read_text())["stopped"] is True
    out = runs_cli("stop", run)
    assert out.returncode == 1 and out.stderr.strip() == f"run {run} is not running (state: killed)"


@pytest.mark.slow
def test_three_detached_runs_then_compare(out_dir):
    """Launch three short runs (different seeds and learning rates), poll until none runs, check
    each finished with its evals, then let compare pick the winner."""
    variants = [["seed=0", "trainer.lr=1e-4"], ["seed=1", "trainer.lr=3e-4"], ["seed=2", "warmstart.lr=3e-3"]]
    env = dict(os.environ, PYTHONPATH=CHILD_PYTHONPATH, OMP_NUM_THREADS="1")
    procs = [subprocess.Popen([sys.executable, "-m", "rl.runs", "launch", "experiments/default", *SHORT,
                               f"output_dir={out_dir}", *v, "--detach", "--json"],
                              cwd=ROOT, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
             for v in variants]                                  # three launches at once
    launched = []
    for proc in procs:
        stdout, stderr = proc.communicate(timeout=120)
        assert proc.returncode == 0, stderr[-3000:]
        launched.append(json.loads(stdout))
    runs = [l["run"] for l in launched]
    assert len(set(runs)) == 3 and all(Path(r).parent == out_dir.resolve() / "default" for r in runs)
    newest = max(runs, key=lambda r: (Path(r) / "run.pid").stat().st_mtime)
    assert runs_json("status", "--output-dir", out_dir)["run"] == newest         # no RUN: the newest

    listing = wait_until(lambda: (l := runs_json("list", "--output-dir", out_dir)) and
                         not any(s["state"] == "running" for s in l["runs"]) and l, 180, "the runs to end", poll=1)
    assert sorted(s["run"] for s in listing["runs"]) == sorted(runs)
    for st in listing["runs"]:
        assert st["state"] == "finished" and st["returncode"] == 0, st
        assert st["step"] == st["total_steps"] == 6 and st["eta_s"] is None and st["last_error"] is None
        assert st["last_evals"]["step"] == 6 and "eval/accuracy" in st["last_evals"]["metrics"]

    def final(run, metric):
        rows = [json.loads(l) for l in (Path(run) / "metrics.jsonl").read_text().splitlines()]
        return [r[metric] for r in rows if metric in r][-1]

    result = runs_json("compare", *runs)
    assert result["metric"] == "eval/accuracy" and [r["run"] for r in result["runs"]] == runs
    finals = [final(r, "eval/accuracy") for r in runs]
    assert [r["final"] for r in result["runs"]] == finals
    assert result["winner"] == runs[finals.index(max(finals))]          # ties: the first named
    # A metric where the runs differ, lower is better: the warm-start loss.
    result = runs_json("compare", *runs, "--metric", "loss/sft", "--minimize")
    losses = [final(r, "loss/sft") for r in runs]
    assert result["winner"] == runs[losses.index(min(losses))]
    assert all(r["final_step"] == 4 and r["peak"] <= r["final"] for r in result["runs"])


def test_run_all_reuses_a_finished_run_and_needs_names(out_dir):
    """A chain resumed after its first stage: run_all finds the stage's run finished and launches
    nothing; a job without a run name is refused before anything starts."""
    from rl.runs import RunError, run_all

    run = out_dir / "default" / "stage1"
    run.mkdir(parents=True)
    (run / "config.yaml").write_text(yaml.safe_dump({"experiment": "default", "run_name": "stage1",
                                                     "warmstart": {"steps": 0}, "trainer": {"steps": 1}}))
    (run / "metrics.jsonl").write_text(json.dumps({"step": 1, "eval/accuracy": 0.5}) + "\n")
    (run / "exit.json").write_text(json.dumps({"returncode": 0, "signal": None, "stopped": False, "ended": "x"}))
    jobs = [(ROOT / "experiments" / "default", [f"output_dir={out_dir}", "run_name=stage1"])]
    assert run_all(jobs, parallel=2, poll=0.1) == [run.resolve()]
    assert not (run / "run.pid").exists() and not (run / "train.log").exists()      # nothing was launched
    with pytest.raises(RunError, match="name the run"):
        run_all([(ROOT / "experiments" / "default", [f"output_dir={out_dir}"])])
