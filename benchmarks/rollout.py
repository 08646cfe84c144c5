"""Rollout throughput: `python -m benchmarks.rollout` (or `scripts/bench.sh rollout`).

Tokens per second of sampling 64 prompts x 32 new tokens from an MoE student, three ways, at
three student sizes built from config (random weights; throughput does not depend on them):

    lean     our policy's generate (student/lean_policy.py): what rollout.engine=local runs
    hf       transformers' `generate` (do_sample, its default experts implementation), the baseline
             most RL libraries start from
    vllm     rollout.engine=vllm end to end: VLLMPolicy.generate, i.e. the vLLM engine process plus
             the HTTP round trip and the routes it returns (student/vllm_policy.py)

Every row gets exactly 32 tokens (the stop id is one the policy never samples), so all three do
the same work. Each contender runs once to warm up, then `--repeats` times; the median counts.
Both engines use the same cores (all of them by default). Writes
benchmarks/results/rollout-<device>.json and .md.
"""
from __future__ import annotations

import argparse
import json
import os
import statistics
import tempfile
import time
from pathlib import Path

import torch

RESULTS = Path(__file__).resolve().parent / "results"
# name: StudentConfig overrides (qwen3_moe); parameter counts are measured and reported
SIZES = {
    "1m": dict(hidden_size=128, num_layers=4, num_heads=4, num_kv_heads=2, num_experts=8, top_k=2, expert_width=64),
    "30m": dict(hidden_size=512, num_layers=4, num_heads=8, num_kv_heads=4, num_experts=16, top_k=2, expert_width=256),
    "200m": dict(hidden_size=1024, num_layers=8, num_heads=16, num_kv_heads=8, num_experts=16, top_k=2,
                 expert_width=448),
}
CONTENDERS = ("lean", "hf", "vllm")


def _prompts(tok, n: int) -> list[list[int]]:
    import random

    rng = random.Random(0)
    return [tok.encode(f"{rng.randint(0, 99)} {rng.choice('+-')} {rng.randint(0, 99)}") for _ in range(n)]


def _timed(fn, repeats: int) -> float:
    fn()                                             # warm-up (allocations, engine caches)
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        fn()
        if torch.cuda.is_available():
            torch.cuda.synchronize()
        times.append(time.perf_counter() - start)
    return statistics.median(times)


def bench_size(name: str, prompts_n: int, new_tokens: int, repeats: int, contenders, device: str,
               log_dir: Path) -> dict:
    from student import ByteTokenizer, StudentConfig, build_student, count_parameters
    from student.build import build_policy
    from student.policy import Sampling

    tok = ByteTokenizer()
    torch.manual_seed(0)
    cfg = StudentConfig(**SIZES[name], max_positions=128)
    model = build_student(cfg, tok).to(device).eval()
    prompts = _prompts(tok, prompts_n)
    never = tok.pad_id                               # banned, so every row runs the full length
    sampling = Sampling(max_new_tokens=new_tokens, eos_id=never, pad_id=tok.pad_id, temperature=1.0)
    tokens = prompts_n * new_tokens
    row = {"size": name, "parameters": count_parameters(model), "prompts": prompts_n, "new_tokens": new_tokens}
    local = build_policy(model, pad_id=tok.pad_id, banned_ids=tok.never_sampled)
    if "lean" in contenders:
        row["lean_s"] = _timed(lambda: local.generate(prompts, sampling), repeats)
    if "hf" in contenders:
        from transformers import AutoModelForCausalLM

        hf = AutoModelForCausalLM.from_config(model.config, dtype=torch.float32).to(device).eval()
        hf.load_state_dict(model.state_dict())
        ids = torch.nn.utils.rnn.pad_sequence([torch.tensor(p[::-1]) for p in prompts], batch_first=True,
                                              padding_value=tok.pad_id).flip(1).to(device)
        mask = (ids != tok.pad_id).long()

        def hf_generate():
            with torch.no_grad():
                out = hf.generate(input_ids=ids, attention_mask=mask, do_sample=True, max_new_tokens=new_tokens,
                                  min_new_tokens=new_tokens, pad_token_id=tok.pad_id, eos_token_id=never,
                                  suppress_tokens=list(tok.never_sampled), top_k=0, top_p=1.0)
            assert out.shape[1] == ids.shape[1] + new_tokens
        row["hf_s"] = _timed(hf_generate, repeats)
    if "vllm" in contenders:
        from student.vllm_policy import EngineSettings, VLLMEngine, VLLMPolicy

        threads = torch.get_num_threads()
        engine = VLLMEngine(model, EngineSettings(threads=threads, kv_cache_gb=2), log_dir / f"vllm-{name}.log")
        try:
            policy = VLLMPolicy(engine, local, pad_id=tok.pad_id, banned_ids=tok.never_sampled)

            def vllm_generate():
                roll = policy.generate(prompts, sampling)
                assert int(roll.mask_NC.sum()) == tokens
            row["vllm_s"] = _timed(vllm_generate, repeats)
        finally:
            engine.close()
    for c in contenders:
        row[f"{c}_tokens_per_s"] = tokens / row[f"{c}_s"]
    return row


def to_markdown(result: dict) -> str:
    lines = [f"# Rollout throughput ({result['device']}, {result['threads']} threads)", "",
             f"`scripts/bench.sh rollout` on {result['date']}: {result['prompts']} prompts x "
             f"{result['new_tokens']} new tokens, sampled at temperature 1, median of {result['repeats']} "
             "after a warm-up (1-minute load average "
             f"{result['load_average_start']:.2f} at the start, {result['load_average_end']:.2f} at the end). "
             "Tokens per second (higher is better); `vllm` is end to end through the engine process "
             "(HTTP, routes included).", "",
             "| student | parameters | lean | transformers generate | vLLM | vLLM / lean |",
             "|---|---|---|---|---|---|"]
    for r in result["rows"]:
        cell = lambda c: f"{r[c + '_tokens_per_s']:,.0f}" if c + "_tokens_per_s" in r else "—"
        ratio = (f"{r['vllm_tokens_per_s'] / r['lean_tokens_per_s']:.2f}x"
                 if "vllm_tokens_per_s" in r and "lean_tokens_per_s" in r else "—")
        lines.append(f"| {r['size']} | {r['parameters'] / 1e6:.1f}M | {cell('lean')} | {cell('hf')} | "
                     f"{cell('vllm')} | {ratio} |")
    return "\n".join(lines) + "\n"


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.rollout", description=__doc__.splitlines()[0])
    parser.add_argument("--sizes", default=",".join(SIZES), help=f"comma-separated, of {list(SIZES)}")
    parser.add_argument("--contenders", default=",".join(CONTENDERS))
    parser.add_argument("--prompts", type=int, default=64)
    parser.add_argument("--new-tokens", type=int, default=32)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--out", default=str(RESULTS), help="folder for rollout-<device>.json/.md")
    args = parser.parse_args(argv)
    device = "cuda" if torch.cuda.is_available() else "cpu"
    contenders = args.contenders.split(",")
    unknown = set(contenders) - set(CONTENDERS) or set(args.sizes.split(",")) - set(SIZES)
    if unknown:
        parser.error(f"unknown {sorted(unknown)}; contenders {CONTENDERS}, sizes {list(SIZES)}")
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    rows, logs = [], Path(tempfile.mkdtemp(prefix="bench-rollout-"))      # the engine's logs
    load_start = os.getloadavg()[0]
    for name in args.sizes.split(","):
        print(f"[rollout] {name} ...", flush=True)
        rows.append(bench_size(name, args.prompts, args.new_tokens, args.repeats, contenders, device, logs))
        print(json.dumps(rows[-1]), flush=True)
    result = {"device": device, "threads": torch.get_num_threads(), "date": time.strftime("%Y-%m-%d"),
              "load_average_start": load_start, "load_average_end": os.getloadavg()[0],
              "prompts": args.prompts, "new_tokens": args.new_tokens, "repeats": args.repeats, "rows": rows}
    (out / f"rollout-{device}.json").write_text(json.dumps(result, indent=1))
    (out / f"rollout-{device}.md").write_text(to_markdown(result))
    print(to_markdown(result))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
