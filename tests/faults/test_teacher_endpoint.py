"""Teacher endpoint faults beyond "dead": a real HTTP server on a loopback port answers slowly, not
at all, with an error status, with a body that is no chat completion, or cuts the connection. Each
failed request must be named (`Hint.fault`), counted by the run under
hint/teacher_errors/<fault> (the per-fault counts adding up to hint/teacher_errors), never raise,
and never cost more than teacher.timeout_s x (retries + 1) plus backoffs. The client is tested
fault by fault (fast); one run through the real CLI meets every fault in turn (slow).
"""
import json
import os
import socket
import struct
import subprocess
import sys
import threading
import time
from collections import Counter

import pytest

from conftest import CHILD_PYTHONPATH, ROOT, TINY
from rl.distributed import free_port
from rl.hints import hint_failed_attempts
from rl.tasks import Problem, Verdict
from student.tokenizer import ByteTokenizer
from teacher import HintRequest, LeakGuard, TeacherConfig, build_teacher
from teacher.base import TEACHER_FAULTS

TIMEOUT_S, RETRIES, BACKOFF_S = 0.3, 1, 0.02
# The most one request may take, whatever the server does; the tests send their requests all at
# once (concurrency = their number), so it bounds a whole call too.
WORST_S = TIMEOUT_S * (RETRIES + 1) + BACKOFF_S
HEALTHY = {"id": "c1", "object": "chat.completion", "model": "m",
           "choices": [{"index": 0, "finish_reason": "stop",
                        "message": {"role": "assistant", "content": "MESSAGE: 2\nHINT: check the ones digit"}}]}


def request(problem: str, attempt: str, answer: str) -> HintRequest:
    return HintRequest([{"role": "user", "content": problem}, {"role": "assistant", "content": attempt}],
                       f"incorrect: {attempt!r} does not match the expected answer", answer)


REQUESTS = [request("62 - 87", "-35", "-25"), request("12 + 35", "57", "47"),
            request("9 + 8", "18", "17"), request("80 - 15", "75", "65")]


def _reply(status: str, body: bytes, content_type: str = "application/json", length: int | None = None) -> bytes:
    head = (f"HTTP/1.1 {status}\r\nContent-Type: {content_type}\r\n"
            f"Content-Length: {len(body) if length is None else length}\r\nConnection: close\r\n\r\n")
    return head.encode() + body


def _read_request(conn: socket.socket) -> bytes:
    """One HTTP request's bytes: headers, then Content-Length bytes of body."""
    data = b""
    while b"\r\n\r\n" not in data:
        chunk = conn.recv(65536)
        if not chunk:
            return data
        data += chunk
    head, body = data.split(b"\r\n\r\n", 1)
    length = next((int(line.split(b":")[1]) for line in head.split(b"\r\n")
                   if line.lower().startswith(b"content-length:")), 0)
    while len(body) < length:
        chunk = conn.recv(65536)
        if not chunk:
            break
        body += chunk
    return head + b"\r\n\r\n" + body


class Endpoint:
    """A chat-completions endpoint on 127.0.0.1 that misbehaves as `mode()` says, per connection:

        healthy          a valid chat completion
        slow             the valid reply, but only after 3 x timeout_s
        hang             accepts, reads nothing, answers nothing
        trickle_headers  a status line, then one header byte every 50 ms, forever
        trickle_body     headers, then one body byte every 50 ms, forever
        http_500         500 with a JSON error body (vLLM's shape)
        http_404         404 with a JSON error body (an unknown model)
        not_json         200 with an HTML page
        no_content       200 with JSON that has no choices
        cut              headers promising 500 bytes, 20 of them, then close
        reset            reads the request, then resets the connection (RST)
        refuse           the port is closed while this mode holds: connecting is refused
    """

    def __init__(self, mode):
        """mode: one mode for every connection, or a function of the endpoint giving the mode now."""
        self._mode = mode
        self.connections: Counter[str] = Counter()
        self._lock = threading.Lock()
        self._stop = threading.Event()
        listener = socket.create_server(("127.0.0.1", 0))
        self.port = listener.getsockname()[1]
        self.url = f"http://127.0.0.1:{self.port}/v1"
        self._acceptor = threading.Thread(target=self._accept, args=(listener,), daemon=True)
        self._acceptor.start()

    def mode(self) -> str:
        return self._mode(self) if callable(self._mode) else self._mode

    def close(self) -> None:
        self._stop.set()
        self._acceptor.join(timeout=5)

    def _accept(self, listener: socket.socket | None) -> None:
        while not self._stop.is_set():
            if self.mode() == "refuse":
                if listener is not None:
                    listener.close()
                    listener = None
                time.sleep(0.01)
                continue
            if listener is None:         # the same port again (create_server sets SO_REUSEADDR)
                listener = socket.create_server(("127.0.0.1", self.port))
            listener.settimeout(0.01)
            try:
                conn = listener.accept()[0]
            except TimeoutError:
                continue
            threading.Thread(target=self._serve, args=(conn,), daemon=True).start()
        if listener is not None:
            listener.close()

    def _serve(self, conn: socket.socket) -> None:
        mode = self.mode()
        with self._lock:
            self.connections[mode] += 1
        with conn:
            try:
                self._misbehave(conn, mode)
            except OSError:              # the client gave up first: what it saw is what counts
                pass

    def _misbehave(self, conn: socket.socket, mode: str) -> None:
        if mode == "refuse":             # came in just before the port closed
            return
        if mode == "hang":
            self._stop.wait()
            return
        _read_request(conn)
        if mode in ("healthy", "slow"):
            if mode == "slow" and self._stop.wait(3 * TIMEOUT_S):
                return
            conn.sendall(_reply("200 OK", json.dumps(HEALTHY).encode()))
        elif mode in ("trickle_headers", "trickle_body"):
            conn.sendall(b"HTTP/1.1 200 OK\r\n" + (b"X-Pad: " if mode == "trickle_headers" else
                                                   b"Content-Length: 100000\r\n\r\n"))
            while not self._stop.wait(0.05):
                conn.sendall(b"a")
        elif mode == "http_500":
            conn.sendall(_reply("500 Internal Server Error", b'{"error": {"message": "CUDA out of memory"}}'))
        elif mode == "http_404":
            conn.sendall(_reply("404 Not Found", b'{"error": {"message": "The model `m` does not exist."}}'))
        elif mode == "not_json":
            conn.sendall(_reply("200 OK", b"<html><body>502 Bad Gateway</body></html>", "text/html"))
        elif mode == "no_content":
            conn.sendall(_reply("200 OK", b'{"object": "error", "message": "busy"}'))
        elif mode == "cut":
            conn.sendall(_reply("200 OK", json.dumps(HEALTHY).encode()[:20], length=500))
        elif mode == "reset":
            # linger on, 0 s: closing sends a reset instead of a clean end
            conn.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
        else:
            raise AssertionError(f"unknown mode {mode!r}")


def teacher_for(url: str, **overrides):
    cfg = dict(kind="openai", base_url=url, model="m", timeout_s=TIMEOUT_S, retries=RETRIES,
               backoff_s=BACKOFF_S, concurrency=len(REQUESTS), cooldown_s=0.0)
    return build_teacher(TeacherConfig(**{**cfg, **overrides}))


def timed_hints(teacher, requests=REQUESTS):
    start = time.perf_counter()
    hints = teacher.write_hints(requests)
    return hints, time.perf_counter() - start


@pytest.fixture
def endpoint(request):
    server = Endpoint(request.param)
    yield server
    server.close()


# ------------------------------------------------------------------ the client, fault by fault
@pytest.mark.parametrize("endpoint, fault", [
    ("slow", "timeout"), ("hang", "timeout"), ("trickle_headers", "timeout"), ("trickle_body", "timeout"),
    ("http_500", "http_5xx"), ("http_404", "http_4xx"),
    ("not_json", "malformed_reply"), ("no_content", "malformed_reply"),
    ("cut", "connection_cut"), ("reset", "connection_cut"),
], indirect=["endpoint"])
def test_each_fault_is_named_counted_and_bounded(endpoint, fault, record, capfd):
    hints, elapsed = timed_hints(teacher_for(endpoint.url))
    counted = sum(h.fault == fault for h in hints)
    record("teacher_endpoint", "counted" if counted == len(REQUESTS) else "failed",
           fault=fault, mode=endpoint.mode(), requests=len(REQUESTS), counted=counted)
    assert [(h.error, h.fault, h.text) for h in hints] == [("teacher_error", fault, "")] * len(REQUESTS)
    # Every request was tried 1 + retries times, all at once, none past its deadline.
    assert endpoint.connections[endpoint.mode()] == len(REQUESTS) * (RETRIES + 1)
    assert elapsed < WORST_S + 1.0
    err = capfd.readouterr().err
    assert err.count("[teacher]") == 1 and f"hint/teacher_errors/{fault}" in err
    if fault.startswith("http_"):         # the server's own words say why
        assert "CUDA out of memory" in err or "does not exist" in err


@pytest.mark.parametrize("endpoint", ["healthy"], indirect=True)
def test_healthy_endpoint_gives_hints(endpoint, capfd):
    hints, _ = timed_hints(teacher_for(endpoint.url))
    assert [(h.error, h.fault, h.text, h.target_index) for h in hints] == [("", "", "check the ones digit", 1)] * 4
    assert "[teacher]" not in capfd.readouterr().err


def test_refused_when_nothing_listens(record):
    hints, elapsed = timed_hints(teacher_for(f"http://127.0.0.1:{free_port()}/v1"))
    counted = sum(h.fault == "refused" for h in hints)
    record("teacher_endpoint", "counted" if counted == len(REQUESTS) else "failed",
           fault="refused", requests=len(REQUESTS), counted=counted)
    assert [(h.error, h.fault) for h in hints] == [("teacher_error", "refused")] * len(REQUESTS)
    assert elapsed < WORST_S + 1.0


def test_skipped_while_the_endpoint_cools_down(record):
    teacher = teacher_for(f"http://127.0.0.1:{free_port()}/v1", concurrency=2, retries=0, cooldown_s=30.0)
    first, _ = timed_hints(teacher, REQUESTS[:2])      # two failures in a row (= concurrency): cool-down
    hints, elapsed = timed_hints(teacher)
    counted = sum(h.fault == "skipped" for h in hints)
    record("teacher_endpoint", "counted" if counted == len(REQUESTS) else "failed",
           fault="skipped", requests=len(REQUESTS), counted=counted)
    assert [h.fault for h in first] == ["refused", "refused"]
    assert [(h.error, h.fault) for h in hints] == [("teacher_error", "skipped")] * len(REQUESTS)
    assert elapsed < 0.2                                 # not sent at all


def test_retry_after_a_failed_try_gets_the_reply():
    server = Endpoint(lambda ep: "healthy" if ep.connections else "http_500")
    try:
        hints, _ = timed_hints(teacher_for(server.url, concurrency=1), REQUESTS[:1])
    finally:
        server.close()
    assert hints[0].text == "check the ones digit" and not hints[0].error
    assert server.connections == Counter(http_500=1, healthy=1)


def test_endpoint_is_tried_again_once_the_cool_down_ends():
    """Skipped requests do not prolong the cool-down: asked every 50 ms, a recovered endpoint is
    used again cooldown_s after the last real failure."""
    mode = ["http_500"]
    server = Endpoint(lambda ep: mode[0])
    try:
        teacher = teacher_for(server.url, concurrency=1, retries=0, cooldown_s=0.3)
        assert teacher.write_hints(REQUESTS[:1])[0].fault == "http_5xx"
        failed_at, mode[0] = time.monotonic(), "healthy"
        faults = []
        while time.monotonic() - failed_at < 2:
            hint = teacher.write_hints(REQUESTS[:1])[0]
            if not hint.error:
                break
            faults.append(hint.fault)
            time.sleep(0.05)
        recovered_after = time.monotonic() - failed_at
    finally:
        server.close()
    assert hint.text == "check the ones digit"
    assert faults and set(faults) == {"skipped"}
    assert 0.25 <= recovered_after < 0.8


def test_run_counts_add_up_by_fault():
    """What the hint methods log: one count per fault, every fault named, adding up to the total."""
    mix = ["healthy", "http_500", "http_404", "not_json", "cut", "reset", "slow"]
    server = Endpoint(lambda ep: mix[sum(ep.connections.values()) % len(mix)])
    problems = [Problem(i, f"{i} + 1", str(i + 1), {}) for i in range(len(mix))]
    try:
        teacher = teacher_for(server.url, concurrency=1, retries=0)     # one at a time: in mix's order
        hinted = hint_failed_attempts(teacher, LeakGuard(), ByteTokenizer(), problems, ["0"] * len(mix),
                                      [Verdict(0.0, "incorrect")] * len(mix))
    finally:
        server.close()
    counts = hinted.fault_counts()
    assert set(counts) == {f"hint/teacher_errors/{f}" for f in TEACHER_FAULTS}
    assert {k.split("/")[-1]: v for k, v in counts.items() if v} == {
        "http_5xx": 1, "http_4xx": 1, "malformed_reply": 1, "connection_cut": 2, "timeout": 1}
    assert sum(counts.values()) == hinted.count("teacher_error") == len(mix) - 1
    assert hinted.rows == [0]                                            # the healthy reply's hint


# ------------------------------------------------------------------ a run through every fault
# Step s of the run meets the s-th mode (the server reads the run's metrics.jsonl to know the
# step): all of that step's requests fail alike, and after `concurrency` failures in a row the
# cool-down skips the step's other requests, queued right behind them. It lasts 1 ms: a TINY step
# outside the teacher takes ~10 ms, so the next step's requests reach the server again.
RUN_MODES = ["healthy", "slow", "http_500", "not_json", "cut", "hang", "http_404", "refuse"]
MODE_FAULT = {"slow": "timeout", "hang": "timeout", "http_500": "http_5xx", "http_404": "http_4xx",
              "not_json": "malformed_reply", "cut": "connection_cut", "refuse": "refused"}


def rl_step_rows(metrics) -> list[dict]:
    """The RL steps' rows of a metrics.jsonl that may be being written (a partial line is skipped)."""
    if not metrics.exists():
        return []
    return [row for line in metrics.read_text().splitlines(keepends=True) if line.endswith("\n")
            for row in [json.loads(line)] if "hint/teacher_errors" in row]


@pytest.mark.slow
def test_run_counts_every_fault_and_finishes(tmp_path, record):
    out = tmp_path / "runs"
    metrics = out / "default" / "faults" / "metrics.jsonl"
    server = Endpoint(lambda ep: RUN_MODES[len(rl_step_rows(metrics)) % len(RUN_MODES)])
    args = [str(ROOT / "experiments" / "default"), *TINY, f"output_dir={out}", "run_name=faults",
            "warmstart.steps=0", f"trainer.steps={len(RUN_MODES)}", "trainer.eval_every=100",
            "trainer.checkpoint_every=100", "task.eval_size=4",
            "teacher.kind=openai", f"teacher.base_url={server.url}", "teacher.model=m",
            "teacher.timeout_s=0.5", "teacher.retries=1", "teacher.backoff_s=0.05",
            "teacher.concurrency=2", "teacher.cooldown_s=0.001"]
    env = dict(os.environ, PYTHONPATH=CHILD_PYTHONPATH, OMP_NUM_THREADS="1")
    start = time.perf_counter()
    try:
        run = subprocess.run([sys.executable, "-m", "rl.train", *args], cwd=ROOT, env=env,
                             capture_output=True, text=True, timeout=240)
    finally:
        server.close()
    elapsed = time.perf_counter() - start
    assert run.returncode == 0, run.stderr[-3000:]
    rows = rl_step_rows(metrics)
    assert len(rows) == len(RUN_MODES)
    totals = Counter({f: sum(r[f"hint/teacher_errors/{f}"] for r in rows) for f in TEACHER_FAULTS})
    failed = sum(r["hint/teacher_errors"] for r in rows)
    for fault in TEACHER_FAULTS[:-1]:
        record("teacher_endpoint", "counted" if totals[fault] > 0 else "failed", fault=fault, level="run",
               requests=failed, counted=totals[fault])
    for row in rows:                              # the per-fault counts make up the total, step by step
        assert row["hint/teacher_errors"] == sum(row[f"hint/teacher_errors/{f}"] for f in TEACHER_FAULTS)
    for row, mode in zip(rows, RUN_MODES):        # each step met its mode
        if mode == "healthy":
            assert row["hint/teacher_errors"] == 0 and row["hint/rate"] > 0
        else:
            assert row[f"hint/teacher_errors/{MODE_FAULT[mode]}"] > 0, (mode, row)
    assert all(totals[f] > 0 for f in TEACHER_FAULTS[:-1]), totals      # skipped too
    assert totals["other"] == 0
    assert run.stderr.count("[teacher]") == 1
    assert elapsed < 120, f"the run took {elapsed:.0f} s"
