"""Peak memory of one hinted teacher-scoring pass at a real vocabulary: `python -m benchmarks.scoring_memory`
(or `scripts/bench.sh scoring_memory`).

Teacher scoring (rl/methods/hint_distill.py) scores the student's own sampled tokens with the hint
in context, without gradient. Rather than the whole (rows x tokens x vocabulary) fp32
log-distribution whatever the estimator needs, the policy interface (student/policy.py) computes
what `need` asks for, projecting to the vocabulary in chunks of positions:

    full      the whole log-distribution (what every teacher scoring computed before)
    argmax    sampled token's log-prob + the teacher's argmax (sampled estimator, first-divergence span)
    topk      + the 20 most likely tokens and the tail mass
    logprobs  the sampled token's log-prob only (sampled estimator, span "all")

Workload: a Qwen3-MoE student shaped like the RL benchmark's (hidden 128, 4 layers, 8 experts
top-2) but with Qwen3's vocabulary, 151,936 tokens; 64 hinted rows (8 prompts x 8 attempts, each
prompt with its own hint) x 16 completion tokens, through the lean policy. Each `need` runs in its
own process; peak memory is the process's peak resident set (VmHWM) during the scoring call minus
its resident set just before (the peak is reset first through /proc/self/clear_refs), so model
weights and imports are not counted. Writes benchmarks/results/scoring-memory-cpu.{json,md}.
"""
from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
RESULTS = ROOT / "benchmarks" / "results"
NEEDS = ("full", "argmax", "topk", "logprobs")
VOCAB = 151_936


def _status_kib(field: str) -> int:
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith(field + ":"):
            return int(line.split()[1])
    raise RuntimeError(f"/proc/self/status has no {field}")


def child(need: str, rows: int, tokens: int, vocab: int) -> dict:
    import time

    import torch
    import transformers

    from student.lean_policy import LeanPolicy

    torch.manual_seed(0)
    torch.set_num_threads(2)
    cfg = transformers.Qwen3MoeConfig(vocab_size=vocab, hidden_size=128, num_hidden_layers=4, num_attention_heads=4,
                                      num_key_value_heads=2, head_dim=32, num_experts=8, num_experts_per_tok=2,
                                      moe_intermediate_size=256, intermediate_size=256, tie_word_embeddings=True)
    model = transformers.AutoModelForCausalLM.from_config(cfg, experts_implementation="hintrl").eval()
    policy = LeanPolicy(model, pad_id=0)
    prompts = [[1] + [10 + (r // 8)] * 12 + [2, 3 + r % 8] for r in range(rows)]   # 8 groups, a hint each
    completion = torch.randint(4, 256, (rows, tokens), generator=torch.Generator().manual_seed(1))
    with torch.no_grad():
        policy.score(prompts[:2], completion[:2, :2], need=need, k=20)             # warm-up: lazy inits
    Path("/proc/self/clear_refs").write_text("5")                                   # reset the peak (VmHWM)
    before = _status_kib("VmRSS")
    start = time.perf_counter()
    with torch.no_grad():
        scores = policy.score(prompts, completion, need=need, k=20)
    seconds = time.perf_counter() - start
    peak = _status_kib("VmHWM")
    kept = sum(t.numel() * t.element_size() for t in vars(scores).values() if isinstance(t, torch.Tensor))
    return {"need": need, "peak_mib": (peak - before) / 1024, "result_mib": kept / 2**20, "seconds": seconds}


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rows", type=int, default=64)
    parser.add_argument("--tokens", type=int, default=16)
    parser.add_argument("--vocab", type=int, default=VOCAB)
    parser.add_argument("--child", choices=NEEDS, help=argparse.SUPPRESS)
    parser.add_argument("--out", type=Path, default=RESULTS, help="folder for scoring-memory-cpu.{json,md}")
    args = parser.parse_args(argv)
    if args.child:
        print("RESULT " + json.dumps(child(args.child, args.rows, args.tokens, args.vocab)), flush=True)
        return 0
    results = []
    for need in NEEDS:
        out = subprocess.run([sys.executable, "-m", "benchmarks.scoring_memory", "--child", need, "--rows",
                              str(args.rows), "--tokens", str(args.tokens), "--vocab", str(args.vocab)],
                             cwd=ROOT, capture_output=True, text=True, env={**os.environ, "PYTHONPATH": str(ROOT)})
        line = [l for l in out.stdout.splitlines() if l.startswith("RESULT ")]
        if out.returncode or not line:
            raise SystemExit(f"need={need} failed:\n{out.stderr[-3000:]}")
        results.append(json.loads(line[0][len("RESULT "):]))
        r = results[-1]
        print(f"{need:9s} peak {r['peak_mib']:8.1f} MiB  result {r['result_mib']:8.2f} MiB  {r['seconds']:.3f} s",
              flush=True)
    record = {"rows": args.rows, "tokens": args.tokens, "vocab": args.vocab, "results": results}
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "scoring-memory-cpu.json").write_text(json.dumps(record, indent=1) + "\n")
    full = results[0]["peak_mib"]
    lines = [f"One hinted scoring pass, {args.rows} rows x {args.tokens} tokens, vocabulary {args.vocab:,} "
             "(`python -m benchmarks.scoring_memory`)", "",
             "| need | peak MiB | vs full | result MiB | seconds |", "|---|---|---|---|---|"]
    lines += [f"| {r['need']} | {r['peak_mib']:.1f} | {r['peak_mib'] / full:.3f} | {r['result_mib']:.2f} | "
              f"{r['seconds']:.3f} |" for r in results]
    (args.out / "scoring-memory-cpu.md").write_text("\n".join(lines) + "\n")
    print("\n".join(lines))
    return 0


if __name__ == "__main__":
    sys.exit(main())
