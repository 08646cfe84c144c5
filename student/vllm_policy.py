"""vLLM as a rollout engine behind the policy interface (student/policy.py).

    engine = VLLMEngine(module, settings, log_path)    # starts the engine process, waits for health
    policy = VLLMPolicy(engine, local=build_policy(module, ...), banned_ids=..., pad_id=...)
    engine.push_weights(module, label)                 # after every optimizer step
    policy.generate(prompts, sampling, turns)          # rollouts: tokens, log-probs, routes
    policy.score(...)                                  # no gradient: through the engine; else local

The engine is its own process (student/vllm_engine/server.py) in its own environment
(`.venv-vllm`: vLLM pins a torch and transformers that differ from the trainer's), pinned to a
chosen core set, talking JSON over HTTP on 127.0.0.1. Everything the trainer waits on has a
timeout, and a dead, failed or hung engine raises `VLLMEngineError` naming the engine's log file,
never a hang.

Weights travel as safetensors buckets in shared memory (/dev/shm where it exists), in the
checkpoint names vLLM loads (transformers' `revert_weight_conversion`: per-expert tensors), each
with a digest the engine checks before loading. Sampling seeds come from torch's global RNG, one per
row and message, so a run's rollouts follow its seed and resume like the local engine's.

Scoring without gradient of sampled-token or top-k log-probs (`need` logprobs, argmax, topk) asks
the engine for log p over the whole vocabulary at temperature 1 (prompt log-probs are raw) and
applies the policy's temperature and banned ids here, so engine scores are exactly the policy's
distribution. The engine's answer is sized for small vocabularies (this project's byte
tokenizer): above `max_engine_vocab` scoring stays local. So do whole-distribution scores
(`need="full"`: the reply would be rows x tokens x vocabulary, where the local forward on the same
weights agrees to ~1e-6), and whatever needs the trainer's own forward: gradients, routes forced by
replay, router losses.
"""
from __future__ import annotations

import atexit
import base64
import json
import os
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import time
import urllib.error
import urllib.request
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch

from student.policy import Distribution, Rollout, Routes, Sampling, Scores, Turns, distinct_prompts
from student.rollout_engine import EngineRequest, RolloutEngineError

ROOT = Path(__file__).resolve().parent.parent
SERVER = Path(__file__).resolve().parent / "vllm_engine" / "server.py"


class VLLMEngineError(RolloutEngineError):
    pass


@dataclass
class EngineSettings:
    """The engine process's settings: `rollout.vllm.*` in a run's config (rl/config.py)."""
    python: str = ""                  # its environment's python; "" = .venv-vllm (bootstrapped on first use)
    cpus: str = ""                    # cores it runs on (taskset -c), e.g. "1"; "" = any
    threads: int = 1                  # its torch / OpenMP threads
    kv_cache_gb: int = 1              # VLLM_CPU_KVCACHE_SPACE
    startup_timeout_s: float = 300.0
    request_timeout_s: float = 600.0  # a request taking longer: the engine is hung, the run stops
    bucket_mb: int = 64               # weight-sync bucket size
    max_engine_vocab: int = 4096      # engine scoring returns whole-vocabulary log-probs up to this

    def check(self) -> list[str]:
        if self.cpus and not re.fullmatch(r"\d+(-\d+(:\d+)?)?(,\d+(-\d+(:\d+)?)?)*", self.cpus):
            return [f"rollout.vllm.cpus={self.cpus!r} is not a list of cores for taskset -c (e.g. 1 or 0-3,6; "
                    "\"\" = any)"]
        return []


def _unpack(d: dict) -> np.ndarray:
    return np.frombuffer(base64.b64decode(d["data"]), dtype=d["dtype"]).reshape(d["shape"])


def checkpoint_tensors(module: torch.nn.Module) -> dict[str, torch.Tensor]:
    """The module's weights under the names a checkpoint (and vLLM's loader) uses, on the CPU.
    A tied output head is stored once, as the embedding."""
    from transformers.modeling_utils import revert_weight_conversion

    state = revert_weight_conversion(module, module.state_dict())
    if getattr(module.config, "tie_word_embeddings", False):
        state.pop("lm_head.weight", None)
    return {name: t.detach().to("cpu").contiguous() for name, t in state.items()}


def write_model_folder(module: torch.nn.Module, folder: Path) -> None:
    """config.json + model.safetensors in checkpoint names: what the engine starts from. Written
    here rather than by `save_pretrained`, which leaves files to the main process of a
    distributed run (every rank starts its own engine)."""
    from safetensors.torch import save_file

    folder.mkdir(parents=True, exist_ok=True)
    config = module.config.to_dict()
    config["architectures"] = [type(module).__name__]
    config.pop("experts_implementation", None)       # ours; vLLM runs its own experts
    (folder / "config.json").write_text(json.dumps(config, indent=1))
    save_file(checkpoint_tensors(module), str(folder / "model.safetensors"), metadata={"format": "pt"})


def vllm_python(settings: EngineSettings) -> Path:
    """The vLLM environment's python, bootstrapped on first use (scripts/bootstrap_vllm.sh)."""
    python = Path(settings.python) if settings.python else ROOT / ".venv-vllm" / "bin" / "python"
    if not settings.python and not (ROOT / ".venv-vllm" / ".hintrl-installed").exists():
        print("[vllm] creating the vLLM environment .venv-vllm (first use: a few minutes)", file=sys.stderr)
        subprocess.run(["bash", str(ROOT / "scripts" / "bootstrap_vllm.sh")], check=True)
    if not python.exists():
        raise VLLMEngineError(f"rollout.vllm.python={str(python)!r} does not exist "
                              f"(the vLLM environment: scripts/bootstrap_vllm.sh creates .venv-vllm)")
    return python


class VLLMEngine:
    """The engine process: started with `module`'s weights, stopped by `close()` (or at exit)."""

    def __init__(self, module: torch.nn.Module, settings: EngineSettings, log_path: Path, *,
                 dtype: str = "float32", seed: int = 0):
        self.settings, self.log_path, self.dtype, self.seed = settings, Path(log_path), dtype, seed
        self.vocab_size = module.config.vocab_size
        # Weight buckets go through shared memory when it has room for two copies of the model
        # (containers often give /dev/shm 64 MB), else through the temporary directory's disk.
        size = sum(t.numel() * t.element_size() for t in module.state_dict().values())
        shm = Path("/dev/shm")
        roomy = shm.is_dir() and shutil.disk_usage(shm).free > 2 * size
        self.shm = Path(tempfile.mkdtemp(prefix="hintrl-vllm-", dir=shm if roomy else None))
        self.process: subprocess.Popen | None = None
        model_dir = self.shm / "model"
        try:
            write_model_folder(module, model_dir)
            self._start(model_dir)
        except BaseException:
            self.close()
            raise
        (model_dir / "model.safetensors").unlink(missing_ok=True)    # loaded; the config stays
        atexit.register(self.close)

    # ------------------------------------------------------------------ process
    def _start(self, model_dir: Path) -> None:
        s = self.settings
        # The engine binds a port the system picks and names it in this file once it serves: a port
        # picked here and bound there later could be taken meanwhile (CI saw it: EADDRINUSE).
        port_file = self.shm / "port"
        self.port = None
        cmd = [str(vllm_python(s)), str(SERVER), "--model", str(model_dir), "--port-file", str(port_file),
               "--dtype", self.dtype, "--seed", str(self.seed), "--threads", str(s.threads)]
        if s.cpus:
            cmd = ["taskset", "-c", s.cpus] + cmd
        env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "VIRTUAL_ENV", "PYTHONHOME")}
        env.update(VLLM_ENABLE_V1_MULTIPROCESSING="0", VLLM_CPU_KVCACHE_SPACE=str(s.kv_cache_gb),
                   OMP_NUM_THREADS=str(s.threads), VLLM_CPU_OMP_THREADS_BIND=s.cpus or "auto",
                   VLLM_LOGGING_LEVEL=env.get("VLLM_LOGGING_LEVEL", "WARNING"))
        self.log_path.parent.mkdir(parents=True, exist_ok=True)
        self._log = open(self.log_path, "ab")
        self.process = subprocess.Popen(cmd, stdout=self._log, stderr=subprocess.STDOUT, env=env,
                                        start_new_session=True)    # a Ctrl-C reaches the trainer, which stops it
        deadline = time.monotonic() + s.startup_timeout_s
        while True:
            if self.process.poll() is not None:
                raise VLLMEngineError(f"the vLLM engine exited with code {self.process.returncode} while starting; "
                                      f"log: {self.log_path}\n{self._tail()}")
            if self.port is None and port_file.exists():
                self.port = int(port_file.read_text())
            health = None
            if self.port is not None:
                try:
                    with urllib.request.urlopen(f"{self.url}/health", timeout=2) as r:
                        health = json.loads(r.read())
                except (urllib.error.URLError, ConnectionError, TimeoutError, OSError):
                    pass
            if health is not None:
                if health.get("reload_problem"):        # it could generate, but never take new weights
                    raise VLLMEngineError(f"rollout.engine=vllm: {health['reload_problem']}")
                return
            if time.monotonic() > deadline:
                self._kill()
                raise VLLMEngineError(f"the vLLM engine did not answer /health within rollout.vllm.startup_timeout_s="
                                      f"{s.startup_timeout_s:g}; stopped it; log: {self.log_path}\n{self._tail()}")
            time.sleep(0.5)

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def _tail(self, lines: int = 15) -> str:
        try:
            text = self.log_path.read_text(errors="replace").splitlines()
        except OSError:
            return ""
        return "\n".join("    " + line for line in text[-lines:])

    def _kill(self) -> None:
        if self.process is not None and self.process.poll() is None:
            os.killpg(self.process.pid, signal.SIGKILL)
            self.process.wait()

    def close(self) -> None:
        """Stop the engine (politely, then by force) and remove its shared-memory folder."""
        if self.process is not None and self.process.poll() is None:
            try:
                self.post("/shutdown", {}, timeout=10)
                self.process.wait(timeout=20)
            except (VLLMEngineError, subprocess.TimeoutExpired):
                self._kill()
        if hasattr(self, "_log"):
            self._log.close()
        shutil.rmtree(self.shm, ignore_errors=True)

    def post(self, path: str, body: dict, timeout: float | None = None) -> dict:
        timeout = timeout or self.settings.request_timeout_s
        if self.process is None or self.process.poll() is not None:
            code = None if self.process is None else self.process.returncode
            raise VLLMEngineError(f"the vLLM engine is not running (exit code {code}) for {path}; "
                                  f"log: {self.log_path}\n{self._tail()}")
        request = urllib.request.Request(self.url + path, data=json.dumps(body).encode(),
                                         headers={"Content-Type": "application/json"})
        try:
            with urllib.request.urlopen(request, timeout=timeout) as r:
                return json.loads(r.read())
        except urllib.error.HTTPError as e:
            detail = json.loads(e.read() or b"{}").get("error", str(e))
            raise VLLMEngineError(f"the vLLM engine failed {path}: {detail}; log: {self.log_path}") from None
        except (urllib.error.URLError, ConnectionError, TimeoutError, OSError) as e:
            if self.process.poll() is not None:
                raise VLLMEngineError(f"the vLLM engine died during {path} (exit code {self.process.returncode}); "
                                      f"log: {self.log_path}\n{self._tail()}") from None
            if isinstance(e, TimeoutError) or "timed out" in str(e):
                self._kill()
                raise VLLMEngineError(f"the vLLM engine did not answer {path} within rollout.vllm.request_timeout_s="
                                      f"{timeout:g} (hung); stopped it; log: {self.log_path}") from None
            raise VLLMEngineError(f"cannot reach the vLLM engine for {path}: {e}; log: {self.log_path}") from None

    # ------------------------------------------------------------------ weights
    def push_weights(self, module: torch.nn.Module, label: str, repack: bool = True) -> float:
        """Send `module`'s weights: safetensors buckets of about `bucket_mb`, each with its
        digest, loaded by the engine in one in-place reload (vLLM re-processes a layer once all its
        tensors arrived within that call, so every bucket is written before it starts). Returns the
        seconds it took end to end."""
        from safetensors.torch import save
        from student.vllm_engine.worker_extension import digest_of

        start = time.perf_counter()
        limit = self.settings.bucket_mb << 20
        buckets, current, size = [], {}, 0
        for name, t in checkpoint_tensors(module).items():
            if current and size + t.numel() * t.element_size() > limit:
                buckets.append(current)
                current, size = {}, 0
            current[name] = t
            size += t.numel() * t.element_size()
        buckets.append(current)
        files = []
        for i, bucket in enumerate(buckets):
            data = save(bucket)
            path = self.shm / f"weights-{i:03d}.safetensors"
            path.write_bytes(data)
            files.append({"path": str(path), "digest": digest_of(data)})
        try:
            self.post("/weights", {"files": files, "label": label, "repack": repack})
        finally:
            for f in files:
                Path(f["path"]).unlink(missing_ok=True)
        return time.perf_counter() - start


class VLLMPolicy:
    """The policy interface over a `VLLMEngine`; `local` (the trainer's no-gradient policy on the
    same weights) answers what the engine cannot."""

    def __init__(self, engine: VLLMEngine, local, *, pad_id: int, banned_ids: tuple[int, ...] = ()):
        self.engine, self.local, self.pad_id = engine, local, pad_id
        self.banned_ids = tuple(banned_ids)
        self.dist = Distribution(banned_ids)
        self.num_routed_layers = local.num_routed_layers

    @property
    def device(self) -> torch.device:
        return self.local.device

    def take_replay_mismatch(self) -> float:
        return self.local.take_replay_mismatch()

    # ------------------------------------------------------------------ generation
    def _request(self, prompts: list[list[int]], max_tokens: list[int], sampling: Sampling) -> list[dict]:
        seeds = torch.randint(0, 2**31 - 1, (len(prompts),)).tolist()
        return self.engine.post("/generate", {
            "prompts": prompts, "max_tokens": max_tokens, "seeds": seeds, "temperature": sampling.temperature,
            "greedy": sampling.greedy, "eos_id": sampling.eos_id, "banned_ids": list(self.banned_ids)})["rows"]

    def generate(self, prompts: list[list[int]], sampling: Sampling, turns: Turns | None = None) -> Rollout:
        n = len(prompts)
        completion = [[] for _ in range(n)]
        logps = [[] for _ in range(n)]
        sampled = [[] for _ in range(n)]
        routes: list[np.ndarray | None] = [None] * n     # (layers, fed tokens, K) of each row's last request
        budget = sampling.max_new_tokens if turns is None else turns.max_tokens
        active = list(range(n))
        while active:
            limits = [min(sampling.max_new_tokens, budget - len(completion[i])) for i in active]
            rows = self._request([prompts[i] + completion[i] for i in active], limits, sampling)
            still = []
            for i, limit, row in zip(active, limits, rows):
                completion[i] += row["ids"]
                logps[i] += row["logprobs"]
                sampled[i] += [True] * len(row["ids"])
                routes[i] = _unpack(row["routes"])
                if turns is None or (not row["eos"] and len(row["ids"]) < sampling.max_new_tokens):
                    continue                        # one message, or the episode's token budget ran out
                reply = turns.after_message(i, list(row["ids"]), row["eos"])
                if not reply:
                    continue
                reply = reply[:budget - len(completion[i])]
                completion[i] += reply
                logps[i] += [0.0] * len(reply)
                sampled[i] += [False] * len(reply)
                if len(completion[i]) < budget:
                    still.append(i)
            active = still
        return self._rollout(prompts, completion, logps, sampled, routes, sampling.pad_id)

    def _rollout(self, prompts, completion, logps, sampled, routes, pad_id) -> Rollout:
        n, dev = len(prompts), self.device
        width = max(1, max(len(c) for c in completion))
        ids_NC = torch.full((n, width), pad_id, dtype=torch.long)
        logp_NC = torch.zeros((n, width))
        mask_NC = torch.zeros((n, width), dtype=torch.bool)
        for i in range(n):
            c = len(completion[i])
            ids_NC[i, :c] = torch.tensor(completion[i], dtype=torch.long)
            logp_NC[i, :c] = torch.tensor(logps[i])
            mask_NC[i, :c] = torch.tensor(sampled[i], dtype=torch.bool)
        # Routes: per layer (U, P, K) for the distinct prompts, left-padded (a prompt's first row's
        # routes), and (N, C-1, K) for each row's fed completion tokens. A token the engine never
        # ran (padding, a reply cut by the token budget) is free (-1).
        distinct, of_row = distinct_prompts(prompts)
        first_row = {}
        for i, u in enumerate(of_row.tolist()):
            first_row.setdefault(u, i)
        p = max(len(q) for q in distinct)
        layers, k = self.num_routed_layers, routes[0].shape[-1]
        prompt_LUPK = np.full((layers, len(distinct), p, k), -1, dtype=np.int64)
        for u, q in enumerate(distinct):
            prompt_LUPK[:, u, p - len(q):] = routes[first_row[u]][:, :len(q)]
        comp_LNCK = np.full((layers, n, max(0, width - 1), k), -1, dtype=np.int64)
        for i, r in enumerate(routes):
            fed = r[:, len(prompts[i]):len(prompts[i]) + width - 1]
            comp_LNCK[:, i, :fed.shape[1]] = fed
        routes_out = Routes(of_row.to(dev), [torch.from_numpy(x).to(dev) for x in prompt_LUPK],
                            [torch.from_numpy(x).to(dev) for x in comp_LNCK])
        return Rollout(prompts, ids_NC.to(dev), mask_NC.to(dev), logp_NC.to(dev), routes_out)

    # ------------------------------------------------------------------ scoring
    def score(self, prompts: list[list[int]], completion_NC: torch.Tensor, *, temperature: float = 1.0,
              need: str = "logprobs", k: int = 0, routes: Routes | None = None, router_aux: bool = False) -> Scores:
        if (torch.is_grad_enabled() or routes is not None or router_aux or need == "full"
                or self.engine.vocab_size > self.engine.settings.max_engine_vocab):
            return self.local.score(prompts, completion_NC, temperature=temperature, need=need, k=k,
                                    routes=routes, router_aux=router_aux)
        out = self.engine.post("/score", {"prompts": [list(map(int, p)) for p in prompts],
                                          "completions": completion_NC.tolist()})
        logp_NCV = torch.from_numpy(_unpack(out["logp"]).copy()).to(self.device)
        # The raw log-probs act as logits: their softmax at temperature T with the banned ids
        # removed is the policy's distribution exactly.
        return self.dist.scores(logp_NCV, lambda x: x, logp_NCV.size(-1), completion_NC, temperature, need, k)



__all__ = ["EngineSettings", "VLLMEngine", "VLLMEngineError", "VLLMPolicy", "checkpoint_tensors"]


class VLLMRollout:
    """rollout.engine=vllm (student/rollout_engine.py): the engine process on the request's weights
    (settings: `rollout.vllm`), and the policy over it."""
    pushes_weights = True

    def __init__(self, request: EngineRequest):
        self.engine = VLLMEngine(request.module, request.settings.vllm, request.log_path, dtype=request.dtype,
                                 seed=request.seed)
        self.policy = VLLMPolicy(self.engine, request.local, pad_id=request.pad_id, banned_ids=request.banned_ids)

    def push_weights(self, module: torch.nn.Module, label: str) -> float:
        return self.engine.push_weights(module, label)

    def close(self) -> None:
        self.engine.close()
