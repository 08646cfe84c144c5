"""Experiment API: launch, watch, stop and compare training runs (`python -m rl.runs VERB ...`).

For people and for agents: every verb prints a short table, or with `--json` one JSON document on
stdout and nothing else (docs/runs.md gives each document's fields). The same verbs are Python
functions (`launch`, `status`, `list_runs`, `wait`, `stop`, `compare`), so an experiment script can
drive its stages through them:

    from rl import runs
    run = runs.launch("experiments/default", ["seed=1", "trainer.lr=3e-4"])   # -> the run folder
    final = runs.wait(run)                         # the status object, once it no longer runs
    runs.compare([run, other])["winner"]

A run is started exactly as `python -m rl.train EXPERIMENT_DIR key=value ... run_name=<resolved>`
(the folder resolved as rl.train does: rl/train.py::resolve_run_dir), under a small supervisor
process in a session of its own, so it outlives the shell or agent that launched it. Besides what
the trainer writes (rl/runlog.py), rl.runs writes three files into the run folder:

    runs/<experiment>/<run>/train.log   the trainer's stdout and stderr, appended; each launch
                                        starts with a "== rl.runs launch" line
                            run.pid     JSON: the trainer's and the supervisor's pid, each with its
                                        start time (/proc/<pid>/stat field 22, so a pid the system
                                        has since given to another process is not taken for the
                                        run), process group, host, command, cwd, started,
                                        experiment, total_steps
                            exit.json   JSON, written (atomically) when the trainer exits:
                                        returncode, signal, stopped, ended

State of a run: "running" (its trainer or supervisor is alive), "finished" (exit code 0),
"failed" (another exit code), "killed" (ended by a signal, by `stop`, or gone without an
exit.json: a stale pid). A folder made by plain scripts/train.sh has no run.pid: "finished"
once metrics.jsonl reaches the last step, else "unknown" (it may be running; nothing says); so
is a run launched on another machine (run.pid's host) that has not written exit.json.

Verbs:
    launch EXPERIMENT_DIR [key=value ...] [--detach] [--json]   start a run (waits unless --detach)
    status [RUN] [--json]                                        one run (default: the newest)
    list [--json]                                                every run under the output folder
    wait RUN... [--timeout S] [--json]                           until none of them runs
    stop RUN [--timeout S] [--json]                              SIGTERM its process group, then SIGKILL
    compare RUN... [--metric KEY] [--minimize] [--json]          final and peak of a metric; the winner

RUN is a run folder, `experiment/run_name` or a bare run name under --output-dir (default runs).
Exit codes: 0 ok; 1 a run that cannot be acted on (stop of a run that is not running, a launch
that could not start); 2 an unknown run or a config error; `launch` without --detach exits with
the run's own exit code.
"""
from __future__ import annotations

import argparse
import codecs
import contextlib
import io
import json
import math
import os
import re
import shlex
import signal
import socket
import statistics
import subprocess
import sys
import time
from datetime import datetime
from pathlib import Path

import yaml

from rl.runlog import LogError, read_log

LOG, PID, EXIT = "train.log", "run.pid", "exit.json"
STATES = ("running", "finished", "failed", "killed", "unknown")
HEADER = "== rl.runs launch "
ROOT = Path(__file__).resolve().parents[1]
ETA_WINDOW = 20                  # recent time/step_s values whose median prices a remaining step


class RunError(Exception):
    """A run that cannot be found or acted on, phrased in one line; `code` is the CLI's exit status."""

    def __init__(self, message: str, code: int = 2):
        super().__init__(message)
        self.code = code


# ------------------------------------------------------------------ processes

def _proc_stat(pid: int) -> tuple[str, int, int] | None:
    """(state, process group, start time in clock ticks after boot) of process `pid`; None when
    there is none."""
    try:
        text = Path(f"/proc/{int(pid)}/stat").read_text()
    except (OSError, ValueError):
        return None
    fields = text[text.rindex(")") + 2:].split()      # after "pid (comm) ": field 3 onwards
    return fields[0], int(fields[2]), int(fields[19])


def start_time(pid: int) -> int | None:
    """Field 22 of /proc/<pid>/stat: with the pid, names one process even after the pid is reused."""
    stat = _proc_stat(pid)
    return stat[2] if stat else None


def _reap(pid: int) -> None:
    """Collect `pid` if it is a child of ours that has exited (a Python caller's supervisor)."""
    try:
        os.waitpid(pid, os.WNOHANG)
    except (ChildProcessError, OSError):
        pass


def _alive(pid, started) -> bool:
    """Process `pid` exists, is not a zombie, and (when `started` is known) is the same process."""
    if not isinstance(pid, int) or pid <= 0:
        return False
    _reap(pid)
    stat = _proc_stat(pid)
    if stat is None:
        if Path("/proc/self/stat").exists():
            return False
        try:                                         # no /proc: the pid alone
            os.kill(pid, 0)
        except ProcessLookupError:
            return False
        except PermissionError:
            return True
        return True
    return stat[0] not in ("Z", "X") and (started is None or stat[2] == started)


def _group_members(pgid: int) -> list[int]:
    """Live (not zombie) processes of process group `pgid`."""
    members = []
    for entry in Path("/proc").iterdir() if Path("/proc").is_dir() else ():
        if entry.name.isdigit():
            stat = _proc_stat(int(entry.name))
            if stat and stat[1] == pgid and stat[0] not in ("Z", "X"):
                members.append(int(entry.name))
    return members


# ------------------------------------------------------------------ files

def _now() -> str:
    return datetime.now().astimezone().isoformat(timespec="seconds")


def _mtime_iso(path: Path) -> str | None:
    try:
        return datetime.fromtimestamp(path.stat().st_mtime).astimezone().isoformat(timespec="seconds")
    except OSError:
        return None


def _write_json(path: Path, value: dict) -> None:
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    tmp.write_text(json.dumps(value, indent=1) + "\n")
    os.replace(tmp, path)


def _read_json(path: Path) -> dict | None:
    try:
        value = json.loads(path.read_text())
    except (OSError, ValueError):
        return None
    return value if isinstance(value, dict) else None


def _metrics(run_dir: Path) -> list[dict]:
    """metrics.jsonl's rows with a step (rl/runlog.py: a line cut short, the one being written, is skipped)."""
    return [row for row in read_log(run_dir / "metrics.jsonl") if isinstance(row.get("step"), int)]


def _config(run_dir: Path) -> dict:
    """The run's resolved config.yaml as plain data ({} when there is none yet)."""
    try:
        value = yaml.safe_load((run_dir / "config.yaml").read_text())
    except (OSError, yaml.YAMLError):
        return {}
    return value if isinstance(value, dict) else {}


def _total_steps(run_dir: Path, cfg: dict, pid_info: dict) -> int | None:
    """warmstart.steps + trainer.steps of the run's config.yaml (the resolved config the trainer
    saved); before the trainer has written it, the total launch resolved (run.pid). A config.yaml
    without the keys is read through rl.configure.load_config, which fills in the defaults."""
    try:
        return int(cfg["warmstart"]["steps"]) + int(cfg["trainer"]["steps"])
    except (KeyError, TypeError, ValueError):
        pass
    if (run_dir / "config.yaml").is_file():
        try:
            from rl.configure import load_config

            loaded = load_config(run_dir)
            return loaded.warmstart.steps + loaded.trainer.steps
        except Exception:            # noqa: BLE001  (an old or damaged config: the total is unknown)
            pass
    value = pid_info.get("total_steps")
    return value if isinstance(value, int) else None


_ERROR_LINE = re.compile(
    r"Traceback \(most recent call last\)"                 # a traceback's first line
    r"|[A-Za-z_][\w.]*(Error|Exception|Interrupt)(:.*)?"   # its last: "ValueError: ...", "KeyboardInterrupt"
    r"|[A-Za-z][\w -]* error: .*"                          # rl.train's: "config error: ...", "checkpoint error: ..."
    r"|error: .*")


def last_error(log: Path, tail_bytes: int = 1 << 20) -> str | None:
    """The last line of the log's latest launch that looks like an error, or None."""
    try:
        with log.open("rb") as f:
            f.seek(0, os.SEEK_END)
            size = f.tell()
            f.seek(max(0, size - tail_bytes))
            text = f.read().decode("utf-8", "replace")
    except OSError:
        return None
    start = text.rfind("\n" + HEADER)
    if start >= 0:
        text = text[start + 1:]
    found = None
    for line in re.split(r"[\r\n]", text):
        line = line.rstrip()
        if line and _ERROR_LINE.fullmatch(line):
            found = line
    return found


def _clean(value):
    """JSON-safe: NaN and infinities (which metrics.jsonl may hold) become null."""
    if isinstance(value, float) and not math.isfinite(value):
        return None
    if isinstance(value, dict):
        return {k: _clean(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_clean(v) for v in value]
    return value


# ------------------------------------------------------------------ finding runs

def _is_run_dir(path: Path) -> bool:
    """A run as rl.runs sees one: also a run it launched that has not written its config yet (run.pid
    only), which rl/runlog.py::is_run_folder (a folder the trainer has written to) is not."""
    return (path / "config.yaml").is_file() or (path / PID).is_file()


def _run_dirs(output_dir: Path) -> list[Path]:
    """<output_dir>/<experiment>/<run>/ folders holding config.yaml or run.pid."""
    if not output_dir.is_dir():
        return []
    return sorted(run for exp in output_dir.iterdir() if exp.is_dir()
                  for run in exp.iterdir() if run.is_dir() and _is_run_dir(run))


def _launched_at(run_dir: Path) -> float:
    for name in (PID, "config.yaml"):
        with contextlib.suppress(OSError):
            return (run_dir / name).stat().st_mtime
    return run_dir.stat().st_mtime


def find_run(run: str | Path | None = None, output_dir: str | Path = "runs") -> Path:
    """The run folder (absolute) that `run` names: a run folder's path, `experiment/run_name` or a
    bare run name under output_dir; None = the most recently launched run there."""
    out = Path(output_dir)
    if run is None or str(run) == "":
        runs = _run_dirs(out)
        if not runs:
            raise RunError(f"no runs under {out}")
        return max(runs, key=_launched_at).resolve()
    path = Path(run)
    for candidate in (path, out / path):
        if candidate.is_dir() and _is_run_dir(candidate):
            return candidate.resolve()
    if len(path.parts) == 1:
        matches = [d for d in _run_dirs(out) if d.name == path.name]
        if len(matches) == 1:
            return matches[0].resolve()
        if matches:
            raise RunError(f"run name {str(run)!r} is ambiguous under {out}: "
                           f"{', '.join(f'{d.parent.name}/{d.name}' for d in matches)}")
    if path.is_dir():
        raise RunError(f"unknown run {str(run)!r}: the folder holds no config.yaml or {PID}, so it is not a run folder")
    raise RunError(f"unknown run {str(run)!r}: not a run folder, nor experiment/run_name under {out}")


# ------------------------------------------------------------------ status

def _state(run_dir: Path, exit_info: dict | None, pid_info: dict, step, total) -> tuple[str, str]:
    """(state, detail): how the state was told."""
    if exit_info is not None:
        rc = exit_info.get("returncode")
        if rc == 0:
            return "finished", "exit.json: returncode 0"
        if exit_info.get("stopped"):
            return "killed", f"stopped by rl.runs stop (returncode {rc})"
        if not isinstance(rc, int) or rc < 0:
            return "killed", f"exit.json: killed by {exit_info.get('signal') or 'a signal'}"
        return "failed", f"exit.json: returncode {rc}"
    if pid_info:
        pid, sup = pid_info.get("pid"), pid_info.get("supervisor_pid")
        host = pid_info.get("host")
        if host and host != socket.gethostname():
            return "unknown", f"launched on {host}, not this machine ({socket.gethostname()}): ask there"
        if _alive(pid, pid_info.get("start_time")):
            return "running", f"trainer pid {pid} is alive"
        if _alive(sup, pid_info.get("supervisor_start_time")):
            return "running", f"supervisor pid {sup} is alive (the trainer has ended; exit.json comes next)"
        return "killed", f"pid {pid} is gone (or reused) and left no exit.json: a stale pid"
    if step is not None and total is not None and step >= total:
        return "finished", f"no {PID} (not launched by rl.runs): metrics.jsonl reaches step {total}"
    try:
        age = f"; metrics.jsonl last written {time.time() - (run_dir / 'metrics.jsonl').stat().st_mtime:.0f} s ago"
    except OSError:
        age = ""
    return "unknown", (f"no {PID} (not launched by rl.runs) and metrics.jsonl short of the last step: still "
                       f"running, or ended early (failed or killed){age}")


def _status(run_dir: Path) -> dict:
    pid_info = _read_json(run_dir / PID) or {}
    exit_info = _read_json(run_dir / EXIT)
    cfg = _config(run_dir)
    try:
        rows, unreadable = _metrics(run_dir), None
    except LogError as err:              # one damaged run is shown as such; `runs list` still lists the others
        rows, unreadable = [], str(err)
    step = rows[-1]["step"] if rows else None
    total = _total_steps(run_dir, cfg, pid_info)
    state, detail = _state(run_dir, exit_info, pid_info, step, total)
    if unreadable:
        detail = f"{detail}; metrics unreadable: {unreadable}" if detail else f"metrics unreadable: {unreadable}"

    last_evals = None
    for row in reversed(rows):
        evals = {k: v for k, v in row.items() if k.startswith("eval/")}
        if evals:
            last_evals = {"step": row["step"], "metrics": evals}
            break
    eta = None
    if state == "running" and step is not None and total is not None:
        recent = [r["time/step_s"] for r in rows[-ETA_WINDOW:]
                  if isinstance(r.get("time/step_s"), (int, float)) and math.isfinite(r["time/step_s"])]
        if recent:
            eta = round(max(0, total - step) * statistics.median(recent), 1)
    ended = exit_info.get("ended") if exit_info else None
    if ended is None and state == "finished":
        ended = _mtime_iso(run_dir / "metrics.jsonl")
    log = run_dir / LOG
    rc = exit_info.get("returncode") if exit_info else None
    return _clean({
        "run": str(run_dir),
        "experiment": cfg.get("experiment") or pid_info.get("experiment") or run_dir.parent.name,
        "name": run_dir.name,
        "state": state,
        "detail": detail,
        "pid": pid_info.get("pid"),
        "returncode": rc,
        "signal": exit_info.get("signal") if exit_info else None,
        "step": step,
        "total_steps": total,
        "last_evals": last_evals,
        "eta_s": eta,
        "started": pid_info.get("started") or _mtime_iso(run_dir / "config.yaml"),
        "ended": ended,
        "log": str(log) if log.is_file() else None,
        "last_error": last_error(log),
    })


def status(run: str | Path | None = None, output_dir: str | Path = "runs") -> dict:
    """The status object of one run (docs/runs.md); run None = the newest under output_dir."""
    return _status(find_run(run, output_dir))


def list_runs(output_dir: str | Path = "runs") -> list[dict]:
    """The status object of every run folder under output_dir, by experiment and name."""
    return [_status(d.resolve()) for d in _run_dirs(Path(output_dir))]


def wait(run: str | Path, output_dir: str | Path = "runs", timeout: float | None = None,
         poll: float = 1.0) -> dict:
    """Blocks until the run no longer runs; returns its status. TimeoutError after `timeout` s."""
    run_dir = find_run(run, output_dir)
    deadline = None if timeout is None else time.monotonic() + timeout
    while True:
        st = _status(run_dir)
        if st["state"] != "running":
            return st
        if deadline is not None and time.monotonic() > deadline:
            raise TimeoutError(f"run {run_dir} still running after {timeout} s")
        time.sleep(poll)


# ------------------------------------------------------------------ launch

def _resolve(experiment: str | Path, overrides: list[str]):
    """The config and run folder rl.train would use (rl/train.py::main, before any work)."""
    from rl.config import ConfigError
    from rl.configure import load_config
    from rl.train import resolve_run_dir

    cfg = load_config(experiment, overrides)
    named = bool(cfg.run_name)
    if cfg.launcher.nnodes > 1 and not cfg.run_name:
        raise ConfigError("launcher.nnodes > 1: pass the same run_name=... on every node")
    run_dir = resolve_run_dir(cfg)
    if cfg.resume and (run_dir / "config.yaml").is_file():
        cfg = load_config(run_dir, overrides)
        cfg.run_name = run_dir.name
        named = True
    return cfg, run_dir, named or cfg.resume


def _claim(run_dir: Path, named: bool) -> Path:
    """Creates the run folder. An automatic name (time stamp, method, seed) that another launch
    took in the same second gets a suffix (-2, -3, ...); a named one may exist (a relaunch)."""
    run_dir.parent.mkdir(parents=True, exist_ok=True)
    if named:
        run_dir.mkdir(exist_ok=True)
        return run_dir
    for n in range(1, 1000):
        candidate = run_dir if n == 1 else run_dir.with_name(f"{run_dir.name}-{n}")
        try:
            candidate.mkdir()
            return candidate
        except FileExistsError:
            continue
    raise RunError(f"no free run folder name next to {run_dir}", code=1)


def _child_env() -> dict:
    env = dict(os.environ, PYTHONUNBUFFERED="1")
    env["PYTHONPATH"] = os.pathsep.join([str(ROOT), *filter(None, [os.environ.get("PYTHONPATH")])])
    return env


def launch(experiment: str | Path, overrides: list[str] | tuple = (), *, detach: bool = True,
           output=None) -> Path:
    """Starts `python -m rl.train EXPERIMENT overrides... run_name=<resolved>` under a supervisor
    and returns the run folder once its run.pid is written (so `status` already says "running").
    A config problem raises rl.config.ConfigError before anything starts. detach=False waits for
    the run, copying train.log to `output` (a binary or text stream, default sys.stdout) as it
    grows, and Ctrl-C stops the run; the returned run's status then holds the outcome."""
    overrides = [str(o) for o in overrides]
    cfg, run_dir, named = _resolve(experiment, overrides)
    if run_dir.is_dir() and _status(run_dir.resolve())["state"] == "running":
        raise RunError(f"run {run_dir} is already running (pid {(_read_json(run_dir / PID) or {}).get('pid')}); "
                       "stop it first", code=1)
    try:
        run_dir = _claim(run_dir, named).resolve()
        for name in (EXIT, PID):                         # a relaunch (resume) starts a new record
            with contextlib.suppress(FileNotFoundError):
                (run_dir / name).unlink()
        log = (run_dir / LOG).open("ab")
    except OSError as err:
        raise RunError(f"run folder error: cannot write {run_dir}: {err.strerror or err}", code=1) from None
    if run_dir.name != cfg.run_name:
        cfg.run_name = run_dir.name
    cmd = [sys.executable, "-m", "rl.train", str(experiment), *overrides, f"run_name={cfg.run_name}"]
    total = cfg.warmstart.steps + cfg.trainer.steps
    with log:
        log.write(f"{HEADER}{_now()}: {shlex.join(cmd)}\n".encode())
        log.flush()
        offset = log.tell()
        proc = subprocess.Popen(
            [sys.executable, "-m", "rl.runs", "_supervise", str(run_dir), str(total), cfg.experiment, "--", *cmd],
            stdin=subprocess.DEVNULL, stdout=log, stderr=log, start_new_session=True, env=_child_env(),
            close_fds=True)
    deadline = time.monotonic() + 120
    while True:                                          # until the supervisor has started the trainer
        info = _read_json(run_dir / PID)
        if info and info.get("supervisor_pid") == proc.pid:
            break
        if proc.poll() is not None:
            if (run_dir / EXIT).is_file():
                break
            raise RunError(f"launch error: the supervisor exited ({proc.returncode}) before starting the trainer; "
                           f"see {run_dir / LOG}", code=1)
        if time.monotonic() > deadline:
            raise RunError(f"launch error: the supervisor wrote no {PID} in 120 s; see {run_dir / LOG}", code=1)
        time.sleep(0.05)
    if not detach:
        try:
            _follow(run_dir, proc, offset, output if output is not None else sys.stdout)
        except KeyboardInterrupt:
            with contextlib.suppress(RunError):
                stop(run_dir)
            raise
    return run_dir


def _follow(run_dir: Path, proc: subprocess.Popen, offset: int, output) -> None:
    """Copies train.log from `offset` to `output` (a binary or text stream) until the supervisor
    has exited."""
    decoder = codecs.getincrementaldecoder("utf-8")("replace") if isinstance(output, io.TextIOBase) else None
    with (run_dir / LOG).open("rb") as f:
        f.seek(offset)
        while True:
            done = proc.poll() is not None
            chunk = f.read()
            if chunk:
                output.write(decoder.decode(chunk) if decoder else chunk)
                output.flush()
            if done:
                return
            if not chunk:
                time.sleep(0.2)


def _signal_name(number: int) -> str | None:
    try:
        return signal.Signals(number).name
    except ValueError:
        return None


def _supervise(run_dir: Path, total_steps: int, experiment: str, cmd: list[str]) -> int:
    """The process `launch` starts (stdout and stderr: train.log; a session of its own): runs the
    trainer, writes run.pid, and exit.json when the trainer exits. A SIGTERM/SIGINT/SIGHUP (what
    `stop` sends the whole process group) is noted, not obeyed: the trainer gets it too, and its
    exit is recorded with stopped=true."""
    signals = []
    for sig in (signal.SIGTERM, signal.SIGINT, signal.SIGHUP):
        signal.signal(sig, lambda signum, frame: signals.append(signum))
    try:
        child = subprocess.Popen(cmd, stdin=subprocess.DEVNULL)
    except OSError as err:
        print(f"launch error: cannot start {cmd[0]}: {err.strerror or err}", flush=True)
        _write_json(run_dir / EXIT, {"returncode": 127, "signal": None, "stopped": False, "ended": _now()})
        return 127
    _write_json(run_dir / PID, {
        "pid": child.pid, "start_time": start_time(child.pid),
        "supervisor_pid": os.getpid(), "supervisor_start_time": start_time(os.getpid()),
        "pgid": os.getpgid(0), "host": socket.gethostname(), "command": cmd, "cwd": os.getcwd(),
        "started": _now(), "experiment": experiment, "total_steps": total_steps,
    })
    rc = child.wait()           # a signal's handler returns and the wait goes on (PEP 475)
    sig = _signal_name(-rc) if rc < 0 else None
    _write_json(run_dir / EXIT, {"returncode": rc, "signal": sig, "stopped": bool(signals), "ended": _now()})
    print(f"== rl.runs: the trainer exited with {rc}{f' ({sig})' if sig else ''}", flush=True)
    return 0


# ------------------------------------------------------------------ stop

def stop(run: str | Path, output_dir: str | Path = "runs", timeout: float = 30.0) -> dict:
    """SIGTERM to the run's process group (supervisor, trainer and whatever it started: torchrun's
    ranks, a vLLM engine), SIGKILL to what is left after `timeout` s; returns the status after,
    state "killed" (or "finished" if the run had ended with 0 meanwhile). RunError (code 1) for
    a run that is not running."""
    run_dir = find_run(run, output_dir)
    st = _status(run_dir)
    if st["state"] != "running":
        raise RunError(f"run {run_dir} is not running (state: {st['state']})", code=1)
    info = _read_json(run_dir / PID) or {}
    pgid = None
    for pid_key, start_key in (("supervisor_pid", "supervisor_start_time"), ("pid", "start_time")):
        if _alive(info.get(pid_key), info.get(start_key)):
            pgid = _proc_stat(info[pid_key])[1]
            break
    if pgid is None:
        return _status(run_dir)      # it ended between the two looks

    # The group the supervisor made (launch: a session of its own). A run.pid that names another
    # group (written by hand, or the pid's group changed) gets its own processes signalled only.
    whole_group = pgid == info.get("pgid")
    ours = [(info.get(k), info.get(t)) for k, t in (("supervisor_pid", "supervisor_start_time"), ("pid", "start_time"))]

    def gone() -> bool:
        return not (any(_alive(*p) for p in ours) or (whole_group and _group_members(pgid)))

    def send(sig: int) -> None:
        if whole_group:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(pgid, sig)
            return
        for pid, started in ours:
            if _alive(pid, started):
                with contextlib.suppress(ProcessLookupError):
                    os.kill(pid, sig)

    killed = False
    send(signal.SIGTERM)
    deadline = time.monotonic() + timeout
    while not gone() and time.monotonic() < deadline:
        time.sleep(0.1)
    if not gone():
        killed = True
        send(signal.SIGKILL)
        deadline = time.monotonic() + 10
        while not gone() and time.monotonic() < deadline:
            time.sleep(0.1)
    record = _read_json(run_dir / EXIT)
    if record is None:           # the supervisor was killed before it could write one
        record = {"returncode": None, "signal": "SIGKILL" if killed else "SIGTERM", "ended": _now()}
    if record.get("returncode") != 0:
        record["stopped"] = True
    _write_json(run_dir / EXIT, record)
    return _status(run_dir)


def run_all(jobs: list[tuple[str | Path, list[str]]], parallel: int = 1, poll: float = 5.0) -> list[Path]:
    """Runs every (experiment, overrides) job to its end, `parallel` at a time, and returns their run
    folders in the order given. Each job names its run (`run_name=...` among its overrides): a run
    that already finished is reused, one still running is waited for, one that stopped early is
    relaunched with resume=true (it continues from its last checkpoint). A run that ends in any state
    but finished raises RunError with its last error line. What a chain of stages is built on
    (experiments/model-chain/chain.py)."""
    from rl.configure import load_config

    folders = []
    for experiment, overrides in jobs:
        cfg = load_config(experiment, list(overrides))
        if not cfg.run_name:
            raise RunError(f"run_all: {experiment} {overrides}: name the run (run_name=...)", code=2)
        folders.append((Path(cfg.output_dir) / cfg.experiment / cfg.run_name).resolve())
    pending, running = list(range(len(jobs))), set()
    while pending or running:
        while pending and len(running) < parallel:
            k = pending.pop(0)
            run_dir, (experiment, overrides) = folders[k], jobs[k]
            state = _status(run_dir)["state"] if _is_run_dir(run_dir) else None
            if state == "finished":
                continue
            if state != "running":
                launch(experiment, [*overrides, *(["resume=true"] if state is not None else [])], detach=True)
            running.add(k)
        for k in sorted(running):
            st = _status(folders[k])
            if st["state"] == "running":
                continue
            running.discard(k)
            if st["state"] != "finished":
                raise RunError(f"run {folders[k]} ended {st['state']}: {st['last_error'] or 'see ' + str(st['log'])}",
                               code=1)
        if running:
            time.sleep(poll)
    return [folders[k] for k in range(len(jobs))]


# ------------------------------------------------------------------ compare

def compare(runs: list[str | Path], metric: str = "eval/accuracy", minimize: bool = False,
            output_dir: str | Path = "runs") -> dict:
    """Per run: the metric's final (last logged) value and its peak (max, or min with minimize);
    the winner is the run with the best final value. Runs that never logged the metric (or only
    NaN) have final null and cannot win; ties go to the run named first."""
    dirs = [find_run(r, output_dir) for r in runs]
    better = (lambda a, b: a < b) if minimize else (lambda a, b: a > b)
    rows, winner, best = [], None, None
    for run_dir in dirs:
        st = _status(run_dir)
        try:
            rows_of_run = _metrics(run_dir)
        except LogError:                 # st["detail"] says so; the run has no value to compare
            rows_of_run = []
        values = [(r["step"], float(r[metric])) for r in rows_of_run
                  if isinstance(r.get(metric), (int, float)) and not isinstance(r.get(metric), bool)
                  and math.isfinite(r[metric])]
        final = values[-1] if values else (None, None)
        peak = (None, None)
        for step, value in values:
            if peak[1] is None or better(value, peak[1]):
                peak = (step, value)
        rows.append({"run": str(run_dir), "experiment": st["experiment"], "name": st["name"],
                     "state": st["state"], "step": st["step"], "total_steps": st["total_steps"],
                     "final": final[1], "final_step": final[0], "peak": peak[1], "peak_step": peak[0],
                     "points": len(values)})
        if final[1] is not None and (best is None or better(final[1], best)):
            winner, best = str(run_dir), final[1]
    return {"metric": metric, "minimize": minimize, "runs": rows, "winner": winner}


# ------------------------------------------------------------------ command line

def _fmt(value, digits: int = 4) -> str:
    if value is None:
        return "-"
    if isinstance(value, float):
        return f"{value:.{digits}g}"
    return str(value)


def _duration(seconds) -> str:
    if seconds is None:
        return "-"
    seconds = int(seconds)
    if seconds >= 3600:
        return f"{seconds // 3600}h{seconds % 3600 // 60:02d}m"
    return f"{seconds // 60}m{seconds % 60:02d}s"


def _table(header: list[str], rows: list[list[str]]) -> str:
    widths = [max(len(str(c)) for c in col) for col in zip(header, *rows)]
    return "\n".join("  ".join(str(c).ljust(w) for c, w in zip(line, widths)).rstrip() for line in [header, *rows])


def _print_status(st: dict) -> None:
    evals = st["last_evals"]
    lines = [
        ("run", st["run"]), ("state", f"{st['state']}  ({st['detail']})"),
        ("step", f"{_fmt(st['step'])} / {_fmt(st['total_steps'])}"),
        ("pid", _fmt(st["pid"])), ("returncode", _fmt(st["returncode"])),
        ("last evals", "-" if not evals else f"step {evals['step']}: " + ", ".join(
            f"{k}={_fmt(v, 3)}" for k, v in evals["metrics"].items())),
        ("eta", _duration(st["eta_s"])), ("started", _fmt(st["started"])), ("ended", _fmt(st["ended"])),
        ("log", _fmt(st["log"])), ("last error", _fmt(st["last_error"])),
    ]
    print("\n".join(f"{k:<11} {v}" for k, v in lines))


def _status_row(st: dict) -> list[str]:
    acc = (st["last_evals"] or {}).get("metrics", {}).get("eval/accuracy")
    return [f"{st['experiment']}/{st['name']}", st["state"], f"{_fmt(st['step'])}/{_fmt(st['total_steps'])}",
            _fmt(acc, 3), _duration(st["eta_s"]), _fmt(st["started"])]


@contextlib.contextmanager
def _stdout_to_stderr(active: bool):
    """With --json, whatever the work prints (a library's notice, even from C) goes to stderr;
    stdout is kept for the one JSON document."""
    if not active:
        yield
        return
    sys.stdout.flush()
    saved = os.dup(1)
    os.dup2(2, 1)
    try:
        with contextlib.redirect_stdout(sys.stderr):
            yield
    finally:
        sys.stdout.flush()
        os.dup2(saved, 1)
        os.close(saved)


def _exit_code(st: dict) -> int:
    """A finished launch's exit status: the trainer's, 128 + N for signal N (as a shell says)."""
    rc = st["returncode"]
    if isinstance(rc, int) and rc >= 0:
        return rc
    if isinstance(rc, int):
        return 128 - rc
    return 128 + signal.Signals[st["signal"]].value if st["signal"] in signal.Signals.__members__ else 1


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="python -m rl.runs", formatter_class=argparse.RawDescriptionHelpFormatter,
        description="Launch, watch, stop and compare training runs. Every verb takes --json: one JSON "
                    "document on stdout (fields: docs/runs.md).",
        epilog="RUN: a run folder, experiment/run_name or a bare run name under --output-dir (default runs).\n"
               "Exit codes: 0 ok, 1 a run that cannot be acted on, 2 an unknown run or a config error;\n"
               "launch without --detach exits with the run's exit code.")
    verbs = parser.add_subparsers(dest="verb", required=True, metavar="VERB")

    def verb(name: str, help: str, output_dir: bool = True) -> argparse.ArgumentParser:
        p = verbs.add_parser(name, help=help, description=help)
        p.add_argument("--json", action="store_true", help="print one JSON document (docs/runs.md)")
        if output_dir:
            p.add_argument("--output-dir", default="runs", metavar="DIR",
                           help="where experiment/run_name names are looked up (default: runs)")
        return p

    p = verb("launch", "start a run: python -m rl.train EXPERIMENT_DIR overrides... under a supervisor "
                       "(its output in RUN/train.log); waits for it unless --detach", output_dir=False)
    p.add_argument("experiment", metavar="EXPERIMENT_DIR", help="experiment folder holding config.yaml")
    p.add_argument("overrides", nargs="*", metavar="key=value", help="config overrides, e.g. trainer.steps=50")
    p.add_argument("--detach", action="store_true",
                   help="return once the run has started, printing its folder (or, with --json, {run, pid, log})")
    p = verb("status", "state, step, last evals, ETA and last error of one run (default: the newest)")
    p.add_argument("run", nargs="?", metavar="RUN")
    verb("list", "every run under the output folder with its status")
    p = verb("wait", "block until none of the runs is running; print their status")
    p.add_argument("runs", nargs="+", metavar="RUN")
    p.add_argument("--timeout", type=float, default=None, metavar="S", help="give up after S seconds (exit 1)")
    p = verb("stop", "stop a running run: SIGTERM to its process group, SIGKILL after --timeout; status says killed")
    p.add_argument("run", metavar="RUN")
    p.add_argument("--timeout", type=float, default=30.0, metavar="S", help="seconds between SIGTERM and SIGKILL")
    p = verb("compare", "final and peak value of a metric per run, and the winner (best final value)")
    p.add_argument("runs", nargs="+", metavar="RUN")
    p.add_argument("--metric", default="eval/accuracy", help="any metrics.jsonl key (default: eval/accuracy)")
    p.add_argument("--minimize", action="store_true", help="lower is better (e.g. a loss)")
    return parser


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else list(argv)
    if argv[:1] == ["_supervise"]:                   # launch's own: _supervise RUN_DIR TOTAL EXPERIMENT -- CMD...
        run_dir, total, experiment, dashes, *cmd = argv[1:]
        assert dashes == "--" and cmd, "usage: _supervise RUN_DIR TOTAL_STEPS EXPERIMENT -- CMD..."
        return _supervise(Path(run_dir), int(total), experiment, cmd)
    parser = _parser()
    args, extra = parser.parse_known_args(argv)
    if extra and args.verb == "launch" and all("=" in e and not e.startswith("-") for e in extra):
        args.overrides += extra          # overrides on both sides of an option: launch EXP a=1 --detach b=2
    elif extra:
        parser.error(f"unrecognized arguments: {' '.join(extra)}")
    from_json = args.json

    def emit(value) -> None:
        print(json.dumps(_clean(value), indent=1, allow_nan=False))

    try:
        if args.verb == "launch":
            from rl.config import ConfigError

            try:
                with _stdout_to_stderr(from_json):
                    run_dir = launch(args.experiment, args.overrides, detach=args.detach,
                                     output=sys.stderr.buffer if from_json else sys.stdout.buffer)
            except ConfigError as err:
                print(f"config error: {err}", file=sys.stderr)
                return 2
            except KeyboardInterrupt:
                print("interrupted: the run was stopped", file=sys.stderr)
                return 130
            info = _read_json(run_dir / PID) or {}
            record = {"run": str(run_dir), "experiment": run_dir.parent.name, "name": run_dir.name,
                      "pid": info.get("pid"), "supervisor_pid": info.get("supervisor_pid"),
                      "log": str(run_dir / LOG), "command": info.get("command")}
            if args.detach:
                emit(record) if from_json else print(run_dir)
                return 0
            st = _status(run_dir)
            if from_json:
                emit({**record, "state": st["state"], "returncode": st["returncode"]})
            return _exit_code(st)
        if args.verb == "status":
            st = status(args.run, args.output_dir)
            emit(st) if from_json else _print_status(st)
        elif args.verb == "list":
            runs = list_runs(args.output_dir)
            if from_json:
                emit({"output_dir": str(Path(args.output_dir).resolve()), "runs": runs})
            elif not runs:
                print(f"no runs under {args.output_dir}")
            else:
                print(_table(["RUN", "STATE", "STEP", "EVAL/ACC", "ETA", "STARTED"], [_status_row(s) for s in runs]))
        elif args.verb == "wait":
            dirs = [find_run(r, args.output_dir) for r in args.runs]
            deadline = None if args.timeout is None else time.monotonic() + args.timeout
            done = [wait(d, timeout=None if deadline is None else max(0.0, deadline - time.monotonic()))
                    for d in dirs]
            if from_json:
                emit({"runs": done})
            else:
                print(_table(["RUN", "STATE", "STEP", "EVAL/ACC", "ETA", "STARTED"], [_status_row(s) for s in done]))
        elif args.verb == "stop":
            st = stop(args.run, args.output_dir, timeout=args.timeout)
            emit(st) if from_json else print(f"{st['state']}: {st['run']}")
        elif args.verb == "compare":
            result = compare(args.runs, args.metric, args.minimize, args.output_dir)
            if from_json:
                emit(result)
            else:
                print(_table(["RUN", "STATE", "STEP", "FINAL", "PEAK", "PEAK STEP"], [
                    [f"{r['experiment']}/{r['name']}", r["state"], f"{_fmt(r['step'])}/{_fmt(r['total_steps'])}",
                     _fmt(r["final"]), _fmt(r["peak"]), _fmt(r["peak_step"])] for r in result["runs"]]))
                print(f"winner ({'lowest' if args.minimize else 'highest'} final {args.metric}): "
                      f"{result['winner'] or '- (no run logged it)'}")
    except RunError as err:
        print(err, file=sys.stderr)
        return err.code
    except TimeoutError as err:
        print(f"timeout: {err}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    try:
        sys.exit(main())
    except BrokenPipeError:              # `... | head`: the reader has gone
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        sys.exit(1)
