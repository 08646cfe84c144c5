"""MoE layer benchmark: `python -m benchmarks.moe` (or `scripts/bench.sh moe`).

Times one transformers Qwen3-MoE sparse block, forward + backward (input and all parameters), with
the same weights under three experts implementations: ours ("hintrl" experts + kernels topk_gating
router), transformers "eager" and transformers "grouped_mm". Separately times the routing steps
alone (gating, counts, permute, unpermute-combine; expert GEMMs replaced by identity) for ours
and for the same steps as transformers' grouped_mm path writes them. Each implementation runs in its
own subprocess so peak memory (CUDA: max allocated; CPU: peak RSS above the resident weights) is
its own. Writes benchmarks/results/moe-<device>.json and .md (or into --out), again after every row, so
a run stopped by a time limit keeps every row it measured. `--profile` adds, per layer row, where
its forward + backward spends its time: torch.profiler's per-operator self time (CUDA kernels on a
GPU), the top operators in the row and the whole table in moe-<device>-profile-<shape>-<impl>.txt.

Shape legend: T tokens, D hidden, E experts, K top-k, F expert width.
"""
from __future__ import annotations

import argparse
import json
import os
import resource
import subprocess
import sys
import time
from pathlib import Path

import torch

RESULTS = Path(__file__).resolve().parent / "results"
SHAPES = {  # name: (D, E, K, F, T on cpu, T on cuda)
    "small": (256, 16, 2, 128, 1024, 8192),
    "qwen3-30b-a3b": (2048, 128, 8, 768, 512, 16384),
    "tiny": (32, 4, 2, 16, 64, 64),           # seconds: for checking the harness, not a measurement
}
PROFILE_TOP = 8                               # operators kept in a row's profile summary
IMPLS = ("hintrl", "grouped_mm", "eager")


def _rss_bytes() -> int:
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")


def _sync(device: str) -> None:
    if device == "cuda":
        torch.cuda.synchronize()


def _block(D, E, K, F, device, dtype):
    from transformers import Qwen3MoeConfig
    from transformers.models.qwen3_moe.modeling_qwen3_moe import Qwen3MoeSparseMoeBlock

    import student.experts  # noqa: F401  (registers "hintrl")

    cfg = Qwen3MoeConfig(hidden_size=D, num_experts=E, num_experts_per_tok=K, moe_intermediate_size=F,
                         norm_topk_prob=True, num_hidden_layers=1, num_attention_heads=4, num_key_value_heads=4)
    torch.manual_seed(0)
    with torch.device(device):
        block = Qwen3MoeSparseMoeBlock(cfg).to(dtype)
    with torch.no_grad():  # in place: no temporaries, so CPU peak RSS reflects the run, not init
        for p in block.parameters():
            p.normal_(0, 0.02)
    return cfg, block


def _time(fn, device, iters, warmup=1):
    for _ in range(warmup):
        fn()
    _sync(device)
    times = []
    for _ in range(iters):
        t0 = time.perf_counter()
        fn()
        _sync(device)
        times.append(time.perf_counter() - t0)
    return min(times)  # least-disturbed run: the CPU is shared with other jobs


def run_layer(shape: str, impl: str, device: str, dtype: torch.dtype, iters: int, profile: Path | None = None) -> dict:
    D, E, K, F, t_cpu, t_cuda = SHAPES[shape]
    T = t_cuda if device == "cuda" else t_cpu
    cfg, block = _block(D, E, K, F, device, dtype)
    cfg._experts_implementation = impl
    if impl == "hintrl":
        from student.experts import use_hintrl_gating
        assert use_hintrl_gating(block) == 1
    g = torch.Generator(device=device).manual_seed(1)
    x = torch.randn(1, T, D, device=device, dtype=dtype, generator=g).requires_grad_(True)
    grad = torch.randn(1, T, D, device=device, dtype=dtype, generator=g)

    def step():
        block.zero_grad(set_to_none=True)
        x.grad = None
        block(x).backward(grad)

    rss0 = _rss_bytes()
    if device == "cuda":
        torch.cuda.reset_peak_memory_stats()
        base = torch.cuda.memory_allocated()
    # eager at the large shape takes minutes per step on a CPU: its first step is the measurement
    sec = _time(step, device, iters, warmup=0 if (impl == "eager" and device == "cpu") else 1)
    peak = (torch.cuda.max_memory_allocated() - base) if device == "cuda" else (
        resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024 - rss0)
    row = {"shape": shape, "impl": impl, "tokens": T, "seconds": sec, "tokens_per_s": T / sec,
           "peak_mem_mib": max(peak, 0) / 2**20}
    if profile is not None:
        row["profile_top"] = _profile(step, device, profile)
    return row


def _profile(step, device: str, table_path: Path) -> list[dict]:
    """One more forward + backward under torch.profiler: the whole per-operator table to
    `table_path`, and the PROFILE_TOP operators by self time (device time on CUDA) as
    [{"op", "self_ms", "calls"}]."""
    from torch.profiler import ProfilerActivity, profile

    activities = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if device == "cuda" else [])
    with profile(activities=activities) as prof:
        step()
        _sync(device)
    events = prof.key_averages()
    key = "self_device_time_total" if device == "cuda" else "self_cpu_time_total"
    table_path.write_text(events.table(sort_by=key, row_limit=40) + "\n")
    top = sorted(events, key=lambda e: getattr(e, key), reverse=True)[:PROFILE_TOP]
    return [{"op": e.key, "self_ms": getattr(e, key) / 1e3, "calls": e.count} for e in top]


def _routing_hf(x_TD, logits_TE, K, E):
    # transformers' Qwen3MoeTopKRouter + grouped_mm_experts_forward, expert GEMMs left out.
    probs = torch.softmax(logits_TE, dtype=torch.float, dim=-1)
    w_TK, ids_TK = torch.topk(probs, K, dim=-1)
    w_TK = (w_TK / w_TK.sum(dim=-1, keepdim=True)).to(logits_TE.dtype)
    ids_S, perm = torch.sort(ids_TK.reshape(-1))
    xs = x_TD[perm // K]
    w_S = w_TK.reshape(-1)[perm]
    hist_in = ids_S.float() if x_TD.device.type == "cpu" else ids_S.int()
    counts = torch.histc(hist_in, bins=E, min=0, max=E - 1)
    _offsets = torch.cumsum(counts, dim=0, dtype=torch.int32)
    weighted = xs * w_S.unsqueeze(-1)
    inv = torch.empty_like(perm)
    inv[perm] = torch.arange(perm.size(0), device=perm.device)
    return weighted[inv].view(x_TD.size(0), K, -1).sum(dim=1)


def _routing_ours(x_TD, logits_TE, K, E):
    from kernels import ops
    w_TK, ids_TK = ops.topk_gating(logits_TE, K, True)
    _counts, offsets = ops.expert_counts(ids_TK, E)
    xs, pos = ops.permute(x_TD, ids_TK, offsets)
    return ops.unpermute_combine(xs, pos, w_TK)


def run_routing(shape: str, impl: str, device: str, dtype: torch.dtype, iters: int) -> dict:
    D, E, K, F, t_cpu, t_cuda = SHAPES[shape]
    T = t_cuda if device == "cuda" else t_cpu
    g = torch.Generator(device=device).manual_seed(2)
    x = torch.randn(T, D, device=device, dtype=dtype, generator=g).requires_grad_(True)
    logits = torch.randn(T, E, device=device, dtype=dtype, generator=g).requires_grad_(True)
    grad = torch.randn(T, D, device=device, dtype=dtype, generator=g)
    fn = _routing_ours if impl == "hintrl" else _routing_hf

    def step():
        x.grad = logits.grad = None
        fn(x, logits, K, E).backward(grad)

    out = {"shape": shape, "impl": impl, "tokens": T, "seconds": _time(step, device, iters)}
    if device == "cuda" and impl == "hintrl":
        out.update(_bandwidth(x.detach(), logits.detach(), K, E))
    return out


def _bandwidth(x_TD, logits_TE, K, E) -> dict:
    """Achieved bandwidth of permute and unpermute-combine (forward) against a device copy."""
    from kernels import ops
    w, ids = ops.topk_gating(logits_TE, K, True)
    _c, off = ops.expert_counts(ids, E)
    xs, pos = ops.permute(x_TD, ids, off)
    elt = x_TD.element_size()
    t_perm = _time(lambda: ops.permute(x_TD, ids, off), "cuda", 20)
    t_comb = _time(lambda: ops.unpermute_combine(xs, pos, w), "cuda", 20)
    big = torch.empty(256 * 2**20, dtype=torch.uint8, device="cuda")
    t_copy = _time(lambda: big.clone(), "cuda", 20)
    copy_gbs = 2 * big.numel() / t_copy / 1e9
    perm_gbs = (x_TD.numel() * K * 2 * elt) / t_perm / 1e9  # each of the T*K rows read once, written once
    comb_gbs = (xs.numel() + x_TD.numel()) * elt / t_comb / 1e9
    return {"copy_gbs": copy_gbs, "permute_gbs": perm_gbs, "combine_gbs": comb_gbs,
            "permute_frac_of_copy": perm_gbs / copy_gbs, "combine_frac_of_copy": comb_gbs / copy_gbs}


def _child(args) -> None:
    torch.set_num_threads(args.threads)
    dtype = getattr(torch, args.dtype)
    iters = args.iters if args.impl != "eager" else max(1, args.iters // 2)
    if args.child == "layer":
        profile = (Path(args.out) / f"moe-{args.device}-profile-{args.shape}-{args.impl}.txt") if args.profile else None
        row = run_layer(args.shape, args.impl, args.device, dtype, iters, profile)
    else:
        row = run_routing(args.shape, args.impl, args.device, dtype, iters)
    print(json.dumps(row))


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    p.add_argument("--dtype", default=None, help="default: bfloat16 on cuda, float32 on cpu")
    p.add_argument("--shapes", default=",".join(SHAPES))
    p.add_argument("--iters", type=int, default=3)
    p.add_argument("--threads", type=int, default=torch.get_num_threads(),
                   help="CPU threads (default: torch's); on cores shared with other jobs 1 can beat 2")
    p.add_argument("--out", default=str(RESULTS), help="where the results go (default benchmarks/results)")
    p.add_argument("--profile", action="store_true", help="per-operator time of each layer row (torch.profiler)")
    p.add_argument("--child", choices=["layer", "routing"], help=argparse.SUPPRESS)
    p.add_argument("--shape", help=argparse.SUPPRESS)
    p.add_argument("--impl", help=argparse.SUPPRESS)
    args = p.parse_args()
    args.dtype = args.dtype or ("bfloat16" if args.device == "cuda" else "float32")
    if args.child:
        return _child(args)
    Path(args.out).mkdir(parents=True, exist_ok=True)
    rows = []
    for shape in args.shapes.split(","):
        for kind, impls in (("layer", IMPLS), ("routing", ("hintrl", "grouped_mm"))):
            for impl in impls:
                cmd = [sys.executable, "-m", "benchmarks.moe", "--child", kind, "--shape", shape, "--impl", impl,
                       "--device", args.device, "--dtype", args.dtype, "--iters", str(args.iters),
                       "--threads", str(args.threads), "--out", args.out] + (["--profile"] if args.profile else [])
                res = subprocess.run(cmd, capture_output=True, text=True)
                if res.returncode != 0:
                    print(res.stderr[-3000:], file=sys.stderr)
                    rows.append({"kind": kind, "shape": shape, "impl": impl, "error": res.stderr[-500:]})
                else:
                    rows.append({"kind": kind, **json.loads(res.stdout.strip().splitlines()[-1])})
                write_results(rows, args)         # after every row: a time limit loses only the rows not reached
                print(json.dumps(rows[-1]), flush=True)
    print("\n".join(markdown(rows, args)))


def write_results(rows: list[dict], args) -> None:
    """The json and markdown of the rows so far (each by rename, so a kill leaves the last whole pair)."""
    out = Path(args.out)
    meta = {"device": args.device, "dtype": args.dtype, "torch": torch.__version__, "threads": args.threads,
            "gpu": torch.cuda.get_device_name() if args.device == "cuda" else None, "iters": args.iters,
            "timing": "min over iters after one warm-up, forward+backward"}
    _write(out / f"moe-{args.device}.json", json.dumps({"meta": meta, "rows": rows}, indent=1))
    _write(out / f"moe-{args.device}.md", "\n".join(markdown(rows, args)) + "\n")


def _write(path: Path, text: str) -> None:
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_text(text)
    os.replace(tmp, path)


def markdown(rows: list[dict], args) -> list[str]:
    md = [f"# MoE benchmark ({args.device}, {args.dtype}, torch {torch.__version__}, {args.threads} threads)", "",
          "| shape | impl | tokens | layer fwd+bwd tokens/s | peak mem MiB | routing steps ms | vs hf |",
          "|---|---|---|---|---|---|---|"]
    for shape in args.shapes.split(","):
        layer = {r["impl"]: r for r in rows if r["kind"] == "layer" and r["shape"] == shape and "error" not in r}
        routing = {r["impl"]: r for r in rows if r["kind"] == "routing" and r["shape"] == shape and "error" not in r}
        best_hf = max((layer[i]["tokens_per_s"] for i in ("eager", "grouped_mm") if i in layer), default=None)
        for impl in IMPLS:
            if impl not in layer:
                continue
            r = layer[impl]
            rout = routing.get(impl if impl == "hintrl" else "grouped_mm") if impl != "eager" else None
            ratio = ""
            if impl == "hintrl" and best_hf:
                ratio = f"layer {r['tokens_per_s'] / best_hf:.2f}x best hf"
                if "grouped_mm" in routing and "hintrl" in routing:
                    ratio += f"; routing {routing['grouped_mm']['seconds'] / routing['hintrl']['seconds']:.2f}x"
            md.append(f"| {shape} | {impl} | {r['tokens']} | {r['tokens_per_s']:.0f} | {r['peak_mem_mib']:.0f} | "
                      f"{rout['seconds'] * 1e3:.1f} | {ratio} |" if rout else
                      f"| {shape} | {impl} | {r['tokens']} | {r['tokens_per_s']:.0f} | {r['peak_mem_mib']:.0f} | - | "
                      f"{ratio} |")
        if "hintrl" in routing and "copy_gbs" in routing["hintrl"]:
            b = routing["hintrl"]
            md.append(f"| {shape} | bandwidth | | permute {b['permute_gbs']:.0f} GB/s ({b['permute_frac_of_copy']:.0%} of "
                      f"copy), combine {b['combine_gbs']:.0f} GB/s ({b['combine_frac_of_copy']:.0%}) | | | |")
    md += ["", "routing steps = gating + counts + permute + unpermute-combine, fwd+bwd, expert GEMMs left out; "
           "the grouped_mm row times the same steps as transformers writes them. "
           "CPU peak mem = peak RSS above the resident weights."]
    profiled = [r for r in rows if r.get("profile_top")]
    if profiled:
        md += ["", "Profile (one forward + backward under torch.profiler; top operators by self time, ms):", ""]
        for r in profiled:
            top = ", ".join(f"{p['op']} {p['self_ms']:.2f}" for p in r["profile_top"])
            md.append(f"- {r['shape']} {r['impl']}: {top}")
    return md


if __name__ == "__main__":
    main()
