"""`teacher.kind=openai`: any OpenAI-compatible chat-completions endpoint writes the hints
(`vllm serve`, `transformers serve`, hosted APIs). Plain HTTP from the standard library.

    POST {base_url}/chat/completions  {"model", "messages", "max_tokens", "temperature"}

Requests run `teacher.concurrency` at a time. Each try has `teacher.timeout_s` for its whole reply:
connecting, waiting and reading, so a server that accepts and never answers, or trickles bytes,
cannot hold it longer. A failed try is retried up to `teacher.retries` times with exponential
backoff (`backoff_s`, doubling): a request costs at most timeout_s x (retries + 1) plus backoffs.

A request that still fails gives no hint (`Hint.error == "teacher_error"`), counted by the run per
step in `hint/teacher_errors` (failed attempts: identical attempts share one request) and, by why
its last try failed (`Hint.fault`), in exactly one of

    hint/teacher_errors/timeout          no complete reply within timeout_s (slow, hung, trickling)
    hint/teacher_errors/http_5xx         an HTTP 5xx status (server error, overloaded)
    hint/teacher_errors/http_4xx         an HTTP 4xx status (unknown model name, bad key, prompt too long)
    hint/teacher_errors/malformed_reply  a body that is not a chat completion (not JSON, no
                                         choices[0].message.content text, a garbled HTTP reply);
                                         a completion whose text is no hint is hint/malformed instead
    hint/teacher_errors/connection_cut   the connection reset or closed before the reply was whole
    hint/teacher_errors/refused          connection refused: nothing listens (the server is down)
    hint/teacher_errors/skipped          not sent: the endpoint was cooling down (below)
    hint/teacher_errors/other            anything else (e.g. a host name that does not resolve)

which add up to `hint/teacher_errors`. The first failure is reported once on stderr (with its
fault and the server's words, for an HTTP error), later ones only counted. After `concurrency`
failures in a row the endpoint is skipped for `cooldown_s` seconds, so a dead server costs each
step almost nothing instead of timeouts times retries; skipped requests do not prolong the
cool-down, so the first request after it tries the endpoint again.
(The module is not named `openai.py`: that would shadow the `openai` package.)
"""
from __future__ import annotations

import http.client
import json
import os
import socket
import sys
import threading
import time
import urllib.error
import urllib.request
from concurrent.futures import ThreadPoolExecutor

from teacher.base import TeacherConfig
from teacher.llm import ChatTeacher, NoReply

# What a failed try raises: OSError covers refused and cut connections, timeouts and HTTP errors;
# http.client.HTTPException a garbled or incomplete HTTP reply; the others a body that is not a
# chat completion.
_FAILURES = (OSError, http.client.HTTPException, ValueError, KeyError, IndexError, TypeError)


def fault_of(error: BaseException) -> str:
    """The TEACHER_FAULTS name of a failed try's exception."""
    if isinstance(error, urllib.error.HTTPError):
        return "http_5xx" if error.code >= 500 else "http_4xx"   # urllib raises it for statuses it does not follow
    if isinstance(error, urllib.error.URLError) and isinstance(error.reason, BaseException):
        error = error.reason            # what failed while connecting or sending, wrapped by urllib
    if isinstance(error, TimeoutError):                 # socket.timeout is TimeoutError
        return "timeout"
    if isinstance(error, ConnectionRefusedError):
        return "refused"
    # reset, aborted, broken pipe; RemoteDisconnected (closed before a status line) is a ConnectionResetError
    if isinstance(error, (ConnectionError, http.client.IncompleteRead)):
        return "connection_cut"
    if isinstance(error, (http.client.HTTPException, ValueError, KeyError, IndexError, TypeError)):
        return "malformed_reply"
    return "other"


class _Deadline:
    """One try's limit for its whole reply. urllib's timeout bounds each socket wait, not the
    request: a server sending a byte now and then would hold a try forever. When the time is up the
    try's socket is shut down, which ends the read in progress with an error."""

    def __init__(self, seconds: float):
        self.expired = False
        self._sock: socket.socket | None = None
        self._lock = threading.Lock()
        self._timer = threading.Timer(seconds, self._expire)
        self._timer.daemon = True
        self._timer.start()

    def watch(self, sock: socket.socket) -> None:
        with self._lock:
            self._sock = sock
            if self.expired:            # connected only after the time was up
                self._shut()

    def cancel(self) -> None:
        self._timer.cancel()

    def _expire(self) -> None:
        with self._lock:
            self.expired = True
            self._shut()

    def _shut(self) -> None:
        if self._sock is not None:
            try:
                self._sock.shutdown(socket.SHUT_RDWR)
            except OSError:             # already closed: the try is over anyway
                pass


class _Watched:
    """An http.client connection that hands its socket to the try's deadline."""

    def __init__(self, *args, deadline: _Deadline, **kwargs):
        super().__init__(*args, **kwargs)
        self._deadline = deadline

    def connect(self):
        super().connect()
        self._deadline.watch(self.sock)


class _WatchedHTTP(_Watched, http.client.HTTPConnection):
    pass


class _WatchedHTTPS(_Watched, http.client.HTTPSConnection):
    pass


class _DeadlineHandler(urllib.request.HTTPHandler, urllib.request.HTTPSHandler):
    """urllib's http and https handlers (it uses this one instead of both), opening watched connections."""

    def __init__(self, deadline: _Deadline):
        super().__init__()
        self._deadline = deadline

    def http_open(self, req):
        return self.do_open(_WatchedHTTP, req, deadline=self._deadline)

    def https_open(self, req):
        return self.do_open(_WatchedHTTPS, req, context=self._context, deadline=self._deadline)


class OpenAITeacher(ChatTeacher):
    def __init__(self, cfg: TeacherConfig):
        super().__init__(cfg)
        if not cfg.base_url or not cfg.model:
            raise ValueError("teacher.kind=openai needs teacher.base_url (e.g. http://127.0.0.1:8000/v1) "
                             "and teacher.model (the served model's name)")
        self.url = cfg.base_url.rstrip("/") + "/chat/completions"
        self.headers = {"Content-Type": "application/json"}
        if cfg.api_key_env:
            key = os.environ.get(cfg.api_key_env)
            if not key:
                raise ValueError(f"teacher.api_key_env={cfg.api_key_env!r}: that environment variable is not set")
            self.headers["Authorization"] = f"Bearer {key}"
        self._lock = threading.Lock()
        self._failures_in_a_row = 0
        self._down_until = 0.0
        self._warned = False
        self._pool = ThreadPoolExecutor(max_workers=max(1, cfg.concurrency), thread_name_prefix="teacher")

    def complete(self, chats: list[list[dict]]) -> list[str | NoReply]:
        return list(self._pool.map(self._complete_one, chats))

    def _complete_one(self, chat: list[dict]) -> str | NoReply:
        cfg = self.cfg
        body = {"model": cfg.model, "messages": chat, "max_tokens": cfg.max_new_tokens,
                "temperature": cfg.temperature}
        for attempt in range(max(0, cfg.retries) + 1):        # one try at least
            if time.monotonic() < self._down_until:
                # Not a failure of its own: it must not prolong the cool-down, or a run asking
                # more often than cooldown_s would never try the endpoint again.
                return NoReply("skipped")
            try:
                reply = self._post(body)
            except _FAILURES as err:
                error = err
                if attempt < cfg.retries:
                    time.sleep(cfg.backoff_s * 2 ** attempt)
                continue
            with self._lock:
                self._failures_in_a_row = 0
            return reply
        fault = fault_of(error)
        self._record_failure(error, fault)
        return NoReply(fault)

    def _post(self, body: dict) -> str:
        """One try: the reply's text, or one of _FAILURES."""
        deadline = _Deadline(self.cfg.timeout_s)
        try:
            return self._exchange(body, deadline)
        except _FAILURES:
            if deadline.expired:
                # The deadline shut the socket mid-reply: whatever broke then (a cut, a short
                # body) is the slowness showing.
                raise TimeoutError(f"no complete reply within teacher.timeout_s={self.cfg.timeout_s:g} s") from None
            raise
        finally:
            deadline.cancel()

    def _exchange(self, body: dict, deadline: _Deadline) -> str:
        opener = urllib.request.build_opener(_DeadlineHandler(deadline))
        request = urllib.request.Request(self.url, data=json.dumps(body).encode(), headers=self.headers)
        try:
            with opener.open(request, timeout=self.cfg.timeout_s) as response:
                payload = json.loads(response.read())
        except urllib.error.HTTPError as err:
            # Its body usually says why (an unknown model name, a prompt too long): keep its start.
            detail = _start_of_body(err)
            if detail:
                err.msg = f"{err.msg}: {detail}"
            raise
        content = payload["choices"][0]["message"]["content"]
        if not isinstance(content, str):
            raise TypeError(f"reply content is {type(content).__name__}, not text")
        return content

    def _record_failure(self, error: Exception, fault: str) -> None:
        with self._lock:
            self._failures_in_a_row += 1
            if self._failures_in_a_row >= max(1, self.cfg.concurrency):
                self._down_until = time.monotonic() + self.cfg.cooldown_s
            if self._warned:
                return
            self._warned = True
        print(f"[teacher] {self.url} failed ({fault}: {type(error).__name__}: {error}); the run goes on "
              f"without hints for such attempts, counted in hint/teacher_errors and by fault, here "
              f"hint/teacher_errors/{fault} (warned once)", file=sys.stderr, flush=True)


def _start_of_body(err: urllib.error.HTTPError) -> str:
    try:
        return err.read(200).decode(errors="replace").strip()
    except _FAILURES:
        return ""
    finally:
        err.close()

