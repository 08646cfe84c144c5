"""The vLLM rollout engine's process: `python student/vllm_engine/server.py --model DIR --port-file F`.

Runs in the vLLM environment (`.venv-vllm`), started and stopped by the trainer
(student/vllm_policy.py), one engine per training rank. It holds one in-process `vllm.LLM`
(`VLLM_ENABLE_V1_MULTIPROCESSING=0`: loads in seconds, one process to watch) and answers plain
HTTP with JSON on 127.0.0.1, one request at a time (the engine is not thread-safe; the trainer asks
in turn anyway):

    GET  /health     {"ok": true, "weights": <label of the last weights loaded>}
    POST /generate   token-id prompts in; per row the sampled ids, each one's log-prob, whether it
                     ended at <eos>, and (routes=true) each fed token's top-k experts per layer
    POST /score      log-probs over the whole vocabulary of given completion tokens after prompts
    POST /weights    load safetensors buckets the trainer wrote (digest-checked), then repack
    POST /shutdown

Log-probs are vLLM's `processed_logprobs`: after temperature and the allowed-token mask, the
distribution the engine samples from, which is the policy's own (student/policy.py). Prefix
caching is off so every prompt token runs through the model and gets routes.
"""
from __future__ import annotations

import argparse
import base64
import json
import logging
import os
import sys
import time
import traceback
from http.server import BaseHTTPRequestHandler, HTTPServer
from pathlib import Path

os.environ.setdefault("VLLM_ENABLE_V1_MULTIPROCESSING", "0")

import numpy as np  # noqa: E402


def pack(array: np.ndarray) -> dict:
    return {"dtype": str(array.dtype), "shape": list(array.shape),
            "data": base64.b64encode(np.ascontiguousarray(array).tobytes()).decode()}


class _ExpectedReloadWarnings(logging.Filter):
    """Every weight push makes vLLM's layer-wise reload warn that two kinds of layer got no
    weights: rotary embeddings have none, and a tied LM head's weight is the embedding's (the
    worker extension re-packs it). Expected, so kept out of the log the trainer's errors point to."""

    def filter(self, record: logging.LogRecord) -> bool:
        return not (record.getMessage().endswith("Failed to load weights")
                    and record.args and record.args[0] in ("RotaryEmbedding", "ParallelLMHead"))


class Engine:
    def __init__(self, args):
        import torch
        from vllm import LLM

        torch.set_num_threads(args.threads)
        logging.getLogger("vllm.model_executor.model_loader.reload.layerwise").addFilter(_ExpectedReloadWarnings())
        self.llm = LLM(model=args.model, dtype=args.dtype, seed=args.seed, max_model_len=args.max_model_len,
                       skip_tokenizer_init=True, enable_prefix_caching=False, enforce_eager=True,
                       logprobs_mode="processed_logprobs", max_logprobs=-1,
                       max_num_seqs=args.max_num_seqs,
                       **({"gpu_memory_utilization": args.gpu_memory_utilization} if torch.cuda.is_available() else {}),
                       worker_extension_cls="worker_extension.HintrlWorkerExtension")
        config = self.llm.llm_engine.model_config.hf_config
        self.vocab_size = config.vocab_size
        self.top_k = config.num_experts_per_tok
        self.layers = self.llm.collective_rpc("hintrl_capture_routes", args=(self.top_k,))[0]
        self.reload_problem = self.llm.collective_rpc("hintrl_reload_problem")[0]
        self.weights = "initial"

    def _allowed(self, banned: list[int]) -> list[int] | None:
        if not banned:
            return None
        banned = set(banned)                 # once: a pretrained vocabulary has ~10^5 ids to filter
        return [i for i in range(self.vocab_size) if i not in banned]

    def generate(self, req: dict) -> dict:
        from vllm import SamplingParams, TokensPrompt

        prompts, greedy = req["prompts"], req.get("greedy", False)
        params = [SamplingParams(
            n=1, max_tokens=max_tokens, temperature=0.0 if greedy else req["temperature"],
            seed=seed, stop_token_ids=[req["eos_id"]], ignore_eos=True,   # the caller's <eos> ends a row, as locally
            logprobs=0, flat_logprobs=True, detokenize=False,
            allowed_token_ids=self._allowed(req.get("banned_ids", [])), skip_special_tokens=False)
            for max_tokens, seed in zip(req["max_tokens"], req["seeds"])]
        self.llm.collective_rpc("hintrl_take_routes")          # drop anything stale
        outs = self.llm.generate([TokensPrompt(prompt_token_ids=p) for p in prompts], params, use_tqdm=False)
        routes = self.llm.collective_rpc("hintrl_take_routes")[0]
        by_external = {req_id.rsplit("-", 1)[0]: layers for req_id, layers in routes.items()}
        rows = []
        for out in outs:
            sample = out.outputs[0]
            ids = list(sample.token_ids)
            flat = sample.logprobs           # one entry per position: the sampled token, first
            logps = [flat.logprobs[start] for start in flat.start_indices]
            row = {"ids": ids, "logprobs": logps, "eos": bool(ids) and ids[-1] == req["eos_id"]}
            if req.get("routes", True):
                layers = by_external[out.request_id]
                row["routes"] = pack(np.stack([l.numpy() for l in layers]))   # (layers, tokens, K)
            rows.append(row)
        return {"rows": rows}

    def score(self, req: dict) -> dict:
        """log p(v | prefix) for every completion position and every vocabulary entry (temperature
        1, nothing masked: prompt log-probs are raw), so the caller can apply any temperature and
        mask exactly."""
        from vllm import SamplingParams, TokensPrompt

        prompts, completions = req["prompts"], req["completions"]
        params = SamplingParams(max_tokens=1, prompt_logprobs=-1, flat_logprobs=True, detokenize=False,
                                temperature=1.0)
        outs = self.llm.generate([TokensPrompt(prompt_token_ids=p + c) for p, c in zip(prompts, completions)],
                                 params, use_tqdm=False)
        self.llm.collective_rpc("hintrl_take_routes")
        width = max(len(c) for c in completions)
        logp = np.zeros((len(prompts), width, self.vocab_size), dtype=np.float32)
        for i, (out, p, c) in enumerate(zip(outs, prompts, completions)):
            flat = out.prompt_logprobs       # flat lists over (position, vocabulary entry)
            # position len(p) + j of the sequence holds log p(completion token j | prefix); each
            # position's entries are the given token first, then the whole vocabulary by rank
            first, last = len(p), len(p) + len(c)
            starts = np.asarray(flat.start_indices[first:last])
            counts = np.asarray(flat.end_indices[first:last]) - starts
            begin, end = int(starts[0]), int(starts[-1] + counts[-1])
            tokens = np.asarray(flat.token_ids[begin:end])
            values = np.asarray(flat.logprobs[begin:end], dtype=np.float32)
            position = np.repeat(np.arange(len(c)), counts)
            logp[i, position, tokens] = values
        return {"logp": pack(logp)}

    def load_weights(self, req: dict) -> dict:
        start = time.perf_counter()
        n = self.llm.collective_rpc("hintrl_load_weights", args=(req["files"], req.get("repack", True)))[0]
        self.weights = req.get("label", "?")
        return {"tensors": n, "seconds": time.perf_counter() - start}


def serve(engine_factory, port: int, port_file: str | None) -> None:
    """Bind first, then build the engine, then tell the trainer the port: the socket is held from
    the start, so nothing started meanwhile (vLLM's own process group, another run's rendezvous)
    can take the port the trainer was told (a port picked early and bound late can be taken)."""
    server = HTTPServer(("127.0.0.1", port), BaseHTTPRequestHandler)
    port = server.server_address[1]
    engine = engine_factory()

    class Handler(BaseHTTPRequestHandler):
        def _reply(self, code: int, body: dict) -> None:
            data = json.dumps(body).encode()
            self.send_response(code)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(data)))
            self.end_headers()
            self.wfile.write(data)

        def do_GET(self):
            if self.path == "/health":
                self._reply(200, {"ok": True, "weights": engine.weights, "layers": engine.layers,
                                  "reload_problem": engine.reload_problem})
            else:
                self._reply(404, {"error": f"no such path {self.path}"})

        def do_POST(self):
            route = {"/generate": engine.generate, "/score": engine.score, "/weights": engine.load_weights}
            try:
                req = json.loads(self.rfile.read(int(self.headers.get("Content-Length", 0))) or b"{}")
                if self.path == "/shutdown":
                    self._reply(200, {"ok": True})
                    raise SystemExit(0)
                if self.path not in route:
                    return self._reply(404, {"error": f"no such path {self.path}"})
                self._reply(200, route[self.path](req))
            except SystemExit:
                raise
            except Exception as e:                # the trainer shows this; the log keeps the trace
                traceback.print_exc()
                self._reply(500, {"error": f"{type(e).__name__}: {e}"})

        def log_message(self, *args):             # one line per request would drown the log
            pass

    server.RequestHandlerClass = Handler
    if port_file:                                 # written whole, then renamed: never read half-written
        tmp = Path(port_file).with_suffix(".tmp")
        tmp.write_text(str(port))
        tmp.replace(port_file)
    print(f"[hintrl vllm engine] serving on 127.0.0.1:{port}", flush=True)
    try:
        server.serve_forever()
    except SystemExit:
        pass
    finally:
        server.server_close()


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", required=True, help="HF folder (config.json + safetensors)")
    parser.add_argument("--port", type=int, default=0, help="0 = one the system picks (see --port-file)")
    parser.add_argument("--port-file", default=None, help="where to write the port once serving")
    parser.add_argument("--dtype", default="float32")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--max-model-len", type=int, default=None, help="default: the model's max_position_embeddings")
    parser.add_argument("--max-num-seqs", type=int, default=256)
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--gpu-memory-utilization", type=float, default=0.3,
                        help="GPU only: the share of GPU memory the engine may take (the trainer needs the rest)")
    args = parser.parse_args()
    serve(lambda: Engine(args), args.port, args.port_file)
    return 0


if __name__ == "__main__":
    sys.exit(main())
