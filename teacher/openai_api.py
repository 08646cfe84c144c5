"""`teacher.kind=openai`: any OpenAI-compatible chat-completions endpoint writes the hints
(`vllm serve`, `transformers serve`, hosted APIs). Plain HTTP from the standard library.

    POST {base_url}/chat/completions  {"model", "messages", "max_tokens", "temperature"}

Requests run `teacher.concurrency` at a time; each has `teacher.timeout_s` per socket wait and
up to `teacher.retries` retries with exponential backoff (`backoff_s`, doubling). A request that
still fails gives no hint (`Hint.error == "teacher_error"`, counted by the run as
`hint/teacher_errors`); the first failure is reported once on stderr, later ones only counted.
After `concurrency` failures in a row the endpoint is skipped for `cooldown_s` seconds, so a
dead server costs each step almost nothing instead of timeouts times retries.
(The module is not named `openai.py`: that would shadow the `openai` package.)
"""
from __future__ import annotations

import json
import os
import sys
import threading
import time
import urllib.request
from concurrent.futures import ThreadPoolExecutor

from teacher.base import TeacherConfig, register_teacher
from teacher.llm import ChatTeacher


class EndpointDown(RuntimeError):
    pass


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

    def complete(self, chats: list[list[dict]]) -> list[str | None]:
        return list(self._pool.map(self._complete_one, chats))

    def _complete_one(self, chat: list[dict]) -> str | None:
        cfg = self.cfg
        body = {"model": cfg.model, "messages": chat, "max_tokens": cfg.max_new_tokens,
                "temperature": cfg.temperature}
        error: Exception | None = None
        for attempt in range(cfg.retries + 1):
            try:
                if time.monotonic() < self._down_until:
                    raise EndpointDown(f"skipped: endpoint failed repeatedly, retrying after {cfg.cooldown_s:.0f} s")
                reply = self._post(body)
                with self._lock:
                    self._failures_in_a_row = 0
                return reply
            except EndpointDown as err:
                error = err
                break
            except (OSError, ValueError, KeyError, IndexError, TypeError) as err:
                # OSError covers refused connections, timeouts and HTTP errors; the others a
                # response that is not a chat completion.
                error = err
                if attempt < cfg.retries:
                    time.sleep(cfg.backoff_s * 2 ** attempt)
        self._record_failure(error)
        return None

    def _post(self, body: dict) -> str:
        request = urllib.request.Request(self.url, data=json.dumps(body).encode(), headers=self.headers)
        with urllib.request.urlopen(request, timeout=self.cfg.timeout_s) as response:
            payload = json.loads(response.read())
        content = payload["choices"][0]["message"]["content"]
        if not isinstance(content, str):
            raise TypeError(f"reply content is {type(content).__name__}, not text")
        return content

    def _record_failure(self, error: Exception | None) -> None:
        with self._lock:
            self._failures_in_a_row += 1
            if self._failures_in_a_row >= max(1, self.cfg.concurrency):
                self._down_until = time.monotonic() + self.cfg.cooldown_s
            if self._warned:
                return
            self._warned = True
        print(f"[teacher] {self.url} failed ({type(error).__name__}: {error}); the run goes on "
              "without hints for such attempts, counted in hint/teacher_errors (warned once)",
              file=sys.stderr, flush=True)


register_teacher("openai")(OpenAITeacher)
