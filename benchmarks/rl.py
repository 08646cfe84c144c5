"""RL step-throughput benchmark: `python -m benchmarks.rl` (or `scripts/bench.sh rl`).

One workload for every contender: a randomly initialised student of StudentConfig's defaults (a
Qwen3-MoE causal LM of 3.4M parameters; the record states its shape), fp32, the byte-level
tokenizer, reasoning-gym `basic_arithmetic` with two one-digit terms and `+`/`-` scored by its own
verifier, 8 prompts x 8 samples per step, at most 16 new tokens, 20 optimizer steps, CPU, 2
threads, one seed. The initial weights are saved once (an HF folder) and every contender loads
them; every contender sees the same problems in the same order.

Contenders: our methods (`OURS`: `grpo`; `hint_distill` with the rule teacher, live and with an
EMA self-teacher; `corrected_replay`, its corrections taking their attempts' places as Guide does
(the default) or joining their groups as extra rows (`corrected_replay_join`); `self_distill` shown the
verifier's feedback as well as any successful sibling, so every failed attempt is scored;
`teacher_distill` from a second random model of the same size), TRL `GRPOTrainer`, and TRL's SDPO trainer fed the same per-attempt hints
(benchmarks/_trl.py). Each runs in its own subprocess, so
peak RSS (ru_maxrss) is its own. A step is timed wall to wall: for ours the trainer's `rl_step`
plus its metrics logging, for TRL the time between consecutive `on_step_end` callbacks (its
per-step logging included). Reported: median seconds per step over steps 5-20 (the first four
carry warm-up: allocator growth, lazy inits), generated tokens per second over the same steps,
peak RSS, and for ours the median time of each stage of the step.

Rounds (--rounds, default 2): every contender runs once per round, the order reversed in every
other round (A B C, C B A, ...), and its figures pool the measured steps of all its runs. A shared
machine drifts by tens of percent over minutes; a contender run only at the start or only at the
end of a several-minute benchmark would carry that drift into the ratios.

Writes benchmarks/results/rl-<device>.{json,md} and the results table in benchmarks/README.md
when the full workload runs with every contender; a partial run (--steps, --contenders, --rounds, --tiny)
writes its files into its work folder instead, so quick checks never overwrite the record.
"""
from __future__ import annotations

import argparse
import dataclasses
import json
import os
import platform
import resource
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
RESULTS = ROOT / "benchmarks" / "results"
README = ROOT / "benchmarks" / "README.md"
# trl_grpo_gc: TRL GRPO with its own default, activation (gradient) checkpointing on; reported
# beside trl_grpo (checkpointing off, TRL's faster setting and the baseline of the ratios).
# Our methods and their overrides ({teacher}: the folder of the separate teacher model).
OURS = {
    "grpo": ["method.name=grpo"],
    "hint_distill": ["method.name=hint_distill"],
    "hint_distill_ema": ["method.name=hint_distill", "method.teacher_weights=ema"],
    "corrected_replay": ["method.name=corrected_replay"],
    "corrected_replay_join": ["method.name=corrected_replay", "method.place=join"],
    "self_distill": ["method.name=self_distill", "method.context=solution_and_feedback"],
    "teacher_distill": ["method.name=teacher_distill", "method.teacher_path={teacher}"],
}
CONTENDERS = (*OURS, "trl_grpo", "trl_sdpo", "trl_grpo_gc")
FIRST_MEASURED_STEP = 5
ROUNDS = 2
# Our stages, in step order, as the trainer logs them (rl/trainer.py `rl_step`, `_accumulate`).
STAGES = {"generation": "time/rollout_s", "verification": "time/verify_s", "teacher": "time/teacher_s",
          "regeneration": "time/regenerate_s", "hinted / teacher scoring": "time/hinted_scoring_s",
          "forward + loss": "time/forward_s", "backward": "time/backward_s", "optimizer": "time/optimizer_s"}
# Our tokens per step by what they went through (rl/budget.py): a method's extra time is extra tokens
# (a second generation pass, longer teacher contexts, more trained rows) or a dearer token; the
# second table tells which.
TOKENS = {"generated": "budget/generated_tokens", "scored": "budget/scored_tokens",
          "trained": "budget/trained_tokens"}
# Every method's step within 1.3x our grpo's: its extra stages may not cost more than that.
STEP_VS_GRPO = 1.3


@dataclasses.dataclass
class Workload:
    model: dict = dataclasses.field(default_factory=dict)   # StudentConfig keys to change: {} = the default student
    prompts: int = 8                 # per step
    samples: int = 8                 # per prompt (the group)
    max_new_tokens: int = 16
    steps: int = 20
    threads: int = 2
    seed: int = 0
    lr: float = 1e-4
    task: str = "basic_arithmetic"
    render: str = "expression"       # the prompt is the bare expression, "3 + 4"
    task_config: dict = dataclasses.field(default_factory=lambda: dict(
        min_terms=2, max_terms=2, min_digits=1, max_digits=1, operators=["+", "-"],
        allow_parentheses=False, allow_negation=False))


# Seconds-long shape for the harness test (tests/test_bench_rl.py); not a measurement.
TINY = dict(model=dict(hidden_size=32, num_layers=1, num_heads=2, num_kv_heads=1, num_experts=4, expert_width=16),
            prompts=2, samples=4, max_new_tokens=4, threads=1)


def student_config(w: Workload, checkpoint: str = ""):
    """The benchmarked student: StudentConfig's defaults (the default experiment's model), fp32 on
    the CPU, with the workload's changes."""
    from student import StudentConfig
    return StudentConfig(**{"dtype": "float32", **w.model, "checkpoint": checkpoint})


def task_config(w: Workload):
    from rl.config import TaskConfig
    return TaskConfig(name=w.task, config=dict(w.task_config), render=w.render)


def save_initial_weights(w: Workload, folder: Path, seed_offset: int = 0) -> int:
    """The one random initialisation every contender loads (TRL needs a folder, not a module); with
    seed_offset 1, teacher_distill's teacher (another random model, with the tokenizer files).

    Returns the parameter count."""
    import torch

    from student import ByteTokenizer, build_student, count_parameters
    torch.manual_seed(w.seed + seed_offset)
    tok = ByteTokenizer()
    model = build_student(student_config(w), tok)
    model.save_pretrained(folder)
    if seed_offset:
        tok.to_transformers().save_pretrained(folder)
    return count_parameters(model)


# ---------------------------------------------------------------------- contenders (child side)
def run_ours(method: str, w: Workload, init_dir: str, out_dir: Path, on_step) -> dict:
    from rl.configure import load_config
    from rl.trainer import Trainer

    s = student_config(w, init_dir)
    teacher = str(Path(init_dir).with_name("teacher-weights"))
    overrides = [f"seed={w.seed}", f"output_dir={out_dir}", *[o.format(teacher=teacher) for o in OURS[method]],
                 f"rollout.prompts_per_step={w.prompts}", f"rollout.attempts_per_prompt={w.samples}",
                 f"rollout.max_new_tokens={w.max_new_tokens}", "warmstart.steps=0",
                 f"trainer.steps={w.steps}", f"trainer.lr={w.lr}", f"trainer.threads={w.threads}",
                 "trainer.eval_every=1000000", "trainer.checkpoint_every=1000000",
                 f"task.name={w.task}", f"task.render={w.render}", f"task.config={json.dumps(w.task_config)}"]
    overrides += [f"student.{f.name}={getattr(s, f.name)}" for f in dataclasses.fields(s)
                  if f.name in ("checkpoint", "hidden_size", "num_layers", "num_heads", "num_kv_heads",
                                "num_experts", "top_k", "expert_width", "dtype")]
    cfg = load_config(None, overrides)
    trainer = Trainer(cfg, out_dir / method)
    steps = []
    for k in range(w.steps):
        start, cpu = time.perf_counter(), time.process_time()
        metrics = trainer.rl_step()
        trainer.step += 1
        metrics.update(trainer.budget.close_step())      # as the training loop does after each step
        trainer.log.log_metrics(trainer.step, metrics)
        metrics["time/step_s"] = time.perf_counter() - start
        metrics["cpu_s"] = time.process_time() - cpu
        metrics["tokens"] = metrics["train/completion_tokens"] * w.prompts * w.samples
        steps.append(metrics)
        on_step(k + 1, metrics["time/step_s"])
    trainer.log.close()
    for m in steps:       # one column for a method's no-gradient scoring, whatever the method calls it
        m["time/hinted_scoring_s"] = sum(m.get(f"time/{name}_s", 0.0)
                                         for name in ("hinted_scoring", "teacher_scoring", "correction_scoring"))
    keys = ["time/step_s", "cpu_s", "tokens", "train/reward_mean", "hint/rate", *STAGES.values()]
    out = {k: [m.get(k, 0.0) for m in steps] for k in keys}
    return {"step_s": out.pop("time/step_s"), "cpu_s": out.pop("cpu_s"), "tokens": out.pop("tokens"),
            "reward_mean": out.pop("train/reward_mean"), "hint_rate": out.pop("hint/rate"),
            "stages": out, "budget": {kind: [m.get(key, 0.0) for m in steps] for kind, key in TOKENS.items()},
            "experts_implementation": cfg.student.experts_implementation,
            "router_replay": cfg.student.router_replay}


def child_main(name: str, w: Workload, init_dir: str, out_dir: Path) -> None:
    import torch
    torch.set_num_threads(w.threads)

    def on_step(k, seconds):
        print(f"STEP {k} {seconds:.4f}", flush=True)

    if name in OURS:
        res = run_ours(name, w, init_dir, out_dir, on_step)
    else:
        from benchmarks._trl import run_trl
        from rl.tasks import TaskSource
        source = TaskSource(task_config(w), w.seed)   # the stream our trainer draws from, in order
        problems = source.next_batch(w.prompts * w.steps)
        res = run_trl(name.removeprefix("trl_"), w, init_dir, problems, source.train, str(out_dir / name),
                      on_step)
    res["peak_rss_mib"] = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024   # KiB on Linux
    res["threads"] = torch.get_num_threads()
    print("RESULT " + json.dumps(res), flush=True)


# ---------------------------------------------------------------------- parent side
def run_contender(name: str, w_path: Path, init_dir: Path, work: Path, steps: int, round_: int = 1) -> dict:
    """Runs one contender in a fresh process, showing its steps as they finish."""
    from tqdm import tqdm

    env = dict(os.environ, OMP_NUM_THREADS=str(json.loads(w_path.read_text())["threads"]),
               DS_ACCELERATOR="cpu", TOKENIZERS_PARALLELISM="false", PYTHONPATH=str(ROOT))
    log = work / f"{name}-round{round_}.log"
    cmd = [sys.executable, "-m", "benchmarks.rl", "--child", name, "--workload", str(w_path),
           "--init", str(init_dir), "--work", str(work / f"round{round_}")]
    load_before = os.getloadavg()[0]
    result = None
    with open(log, "w") as err, tqdm(total=steps, desc=f"{name:>12} r{round_}", unit="step", leave=True,
                                     dynamic_ncols=True) as bar:
        proc = subprocess.Popen(cmd, cwd=ROOT, env=env, stdout=subprocess.PIPE, stderr=err, text=True)
        for line in proc.stdout:
            if line.startswith("STEP "):
                _, k, sec = line.split()
                bar.update(int(k) - bar.n)
                bar.set_postfix(last=f"{float(sec):.2f}s")
            elif line.startswith("RESULT "):
                result = json.loads(line[len("RESULT "):])
        proc.wait()
    if proc.returncode != 0 or result is None:
        tail = log.read_text()[-3000:]
        print(f"[{name}] failed (exit {proc.returncode}); log {log}:\n{tail}", file=sys.stderr)
        return {"contender": name, "error": tail[-800:]}
    result.update(contender=name, load_avg_1min_before=load_before, load_avg_1min_after=os.getloadavg()[0])
    return result


def summarise(runs: list[dict]) -> dict:
    """One contender's figures over its runs (one per round): median step time, CPU time and
    stages over the pooled steps 5..N of every run (all steps when a quick check runs fewer),
    tokens/s over the same steps, the highest peak RSS. `runs` keeps each run's own record."""
    failed = [r for r in runs if "error" in r]
    if failed:
        return {"contender": runs[0]["contender"], "error": failed[0]["error"], "runs": runs}
    steps = len(runs[0]["step_s"])
    first = FIRST_MEASURED_STEP - 1 if steps >= FIRST_MEASURED_STEP else 0

    def pooled(get):
        return [x for r in runs for x in get(r)[first:]]

    step_s, tokens = pooled(lambda r: r["step_s"]), pooled(lambda r: r["tokens"])
    out = {k: v for k, v in runs[0].items() if not isinstance(v, (list, dict))}   # settings, versions
    out.update(rounds=len(runs), measured_steps=[first + 1, steps], runs=runs,
               median_step_s=statistics.median(step_s),
               median_cpu_s=statistics.median(pooled(lambda r: r["cpu_s"])),
               tokens_per_s=sum(tokens) / sum(step_s), tokens_per_step=sum(tokens) / len(tokens),
               peak_rss_mib=max(r["peak_rss_mib"] for r in runs),
               load_avg_1min_before=runs[0]["load_avg_1min_before"],
               load_avg_1min_after=runs[-1]["load_avg_1min_after"])
    if "stages" in runs[0]:
        out["median_stage_s"] = {label: statistics.median(pooled(lambda r, k=key: r["stages"][k]))
                                 for label, key in STAGES.items()}
    if "budget" in runs[0]:
        out["median_tokens"] = {kind: statistics.median(pooled(lambda r, k=kind: r["budget"][k])) for kind in TOKENS}
    return out


def versions() -> dict:
    import torch
    import transformers
    out = {"python": platform.python_version(), "torch": torch.__version__,
           "transformers": transformers.__version__}
    for name in ("deepspeed", "trl", "accelerate", "reasoning_gym"):
        try:
            out[name] = __import__(name).__version__
        except Exception:          # not installed (trl is the `bench` extra): recorded as absent
            out[name] = None
    return out


def targets(rows: dict) -> dict:
    def med(name):
        return rows[name]["median_step_s"] if name in rows and "error" not in rows[name] else None
    out = {}
    if med("grpo") and med("trl_grpo"):
        out["grpo_step_vs_trl_grpo"] = {"value": med("grpo") / med("trl_grpo"), "target": "<= 0.5"}
    for name in OURS:
        if name != "grpo" and med("grpo") and med(name):
            out[f"{name}_step_vs_grpo"] = {"value": med(name) / med("grpo"), "target": f"<= {STEP_VS_GRPO}"}
    if med("self_distill"):
        # The top-k scoring need not cost more than a forward; per token, against the
        # training forward (which keeps its activations for the backward).
        score, forward = per_kilotoken(rows["self_distill"])
        if score and forward:
            out["self_distill_scoring_vs_training_forward_per_token"] = {"value": score / forward, "target": "<= 1.0"}
    ours = [rows[n]["peak_rss_mib"] for n in ("grpo", "hint_distill") if med(n)]
    trl = [rows[n]["peak_rss_mib"] for n in ("trl_grpo", "trl_sdpo") if med(n)]
    if ours and trl:
        out["peak_rss_ours_max_vs_trl_min"] = {"value": max(ours) / min(trl), "target": "<= 1.0"}
    return out


def per_kilotoken(row: dict) -> tuple[float | None, float | None]:
    """Milliseconds per 1000 tokens of the hinted / teacher scoring (over the scored tokens) and of
    the training forward + loss (over the trained tokens), from the medians; None where none ran."""
    stages, tokens = row.get("median_stage_s"), row.get("median_tokens")
    if not stages or not tokens:
        return None, None
    per_k = 1e3 * 1e3                                   # seconds per token -> ms per 1000 tokens
    score = stages["hinted / teacher scoring"] / tokens["scored"] * per_k if tokens["scored"] else None
    forward = stages["forward + loss"] / tokens["trained"] * per_k if tokens["trained"] else None
    return score, forward


def markdown(meta: dict, rows: dict) -> str:
    w, v, m = meta["workload"], meta["versions"], meta["student"]
    lines = [f"Workload: {m['arch']} {meta['params_m']:.2f}M params (hidden {m['hidden_size']}, {m['num_layers']} "
             f"layers, {m['num_experts']} experts top-{m['top_k']}, width {m['expert_width']}, {m['dtype']}), "
             f"{w['prompts']} prompts x {w['samples']} samples, <= {w['max_new_tokens']} new tokens, "
             f"{w['steps']} steps x {meta.get('rounds', 1)} rounds per contender (order reversed every other round), "
             f"{w['threads']} threads, {meta['device']}. torch {v['torch']}, "
             f"transformers {v['transformers']}, deepspeed {v['deepspeed']}, trl {v['trl']}. "
             f"Load average (1 min) {meta['load_avg_1min_start']:.2f} at start, "
             f"{meta['load_avg_1min_end']:.2f} at end.", "",
             f"| contender | s/step (median, steps {FIRST_MEASURED_STEP}-{w['steps']}) | vs TRL GRPO | CPU s/step | "
             "gen tokens/s | peak RSS MiB | "
             + " | ".join(STAGES) + " |",
             "|---|---|---|---|---|---|" + "---|" * len(STAGES)]
    base = rows.get("trl_grpo", {}).get("median_step_s")
    for name in CONTENDERS:
        r = rows.get(name)
        if r is None:
            continue
        if "error" in r:
            lines.append(f"| {name} | failed | | | | |" + " |" * len(STAGES))
            continue
        ratio = f"{r['median_step_s'] / base:.2f}x" if base else "-"
        stages = r.get("median_stage_s")
        cells = [f"{stages[s]:.3f}" for s in STAGES] if stages else ["-"] * len(STAGES)
        lines.append(f"| {name} | {r['median_step_s']:.3f} | {ratio} | {r['median_cpu_s']:.3f} | {r['tokens_per_s']:.0f} | "
                     f"{r['peak_rss_mib']:.0f} | " + " | ".join(cells) + " |")
    ours = [n for n in OURS if n in rows and "error" not in rows[n] and rows[n].get("median_tokens")]
    if ours:
        lines += ["", "Tokens per step (median over the measured steps; rl/budget.py) and the cost of a token: "
                  "generated (rollouts and regenerations), scored (no-gradient hinted or teacher forwards, "
                  "context + completion), trained (training forward), and milliseconds per 1000 tokens of the "
                  "scoring and of the training forward + loss.", "",
                  "| contender | generated | scored | trained | scoring ms / 1k scored | forward ms / 1k trained |",
                  "|---|---|---|---|---|---|"]
        for name in ours:
            t = rows[name]["median_tokens"]
            score, forward = per_kilotoken(rows[name])
            lines.append(f"| {name} | {t['generated']:.0f} | {t['scored']:.0f} | {t['trained']:.0f} | "
                         + (f"{score:.1f}" if score else "-") + " | " + (f"{forward:.1f}" if forward else "-") + " |")
    lines += ["", "Targets: " + "; ".join(
        f"{k} = {t['value']:.2f} (target {t['target']})" for k, t in meta["targets"].items())]
    return "\n".join(lines) + "\n"


def update_readme(table: str) -> None:
    start, end = "<!-- rl-results:start -->", "<!-- rl-results:end -->"
    text = README.read_text()
    if start not in text or end not in text:
        raise SystemExit(f"{README} lacks the {start} ... {end} markers for the results table")
    head, rest = text.split(start, 1)
    README.write_text(head + start + "\n" + table + end + rest.split(end, 1)[1])


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--contenders", default=",".join(CONTENDERS), help=f"comma list of {', '.join(CONTENDERS)}")
    p.add_argument("--steps", type=int, default=Workload.steps, help="optimizer steps per contender")
    p.add_argument("--rounds", type=int, default=ROUNDS,
                   help="runs per contender, the order reversed every other round (figures pool them)")
    p.add_argument("--tiny", action="store_true", help="seconds-long model and batch (harness checks only)")
    p.add_argument("--work", default=None, help="work folder (default: a new temporary one)")
    p.add_argument("--child", choices=CONTENDERS, help=argparse.SUPPRESS)
    p.add_argument("--workload", help=argparse.SUPPRESS)
    p.add_argument("--init", help=argparse.SUPPRESS)
    args = p.parse_args()
    if args.child:
        w = Workload(**json.loads(Path(args.workload).read_text()))
        return child_main(args.child, w, args.init, Path(args.work))

    if args.rounds < 1:
        raise SystemExit(f"--rounds must be at least 1, got {args.rounds}")
    names = [n.strip() for n in args.contenders.split(",") if n.strip()]
    unknown = set(names) - set(CONTENDERS)
    if unknown:
        raise SystemExit(f"unknown contenders {sorted(unknown)}; choose from {', '.join(CONTENDERS)}")
    w = Workload(steps=args.steps, **(TINY if args.tiny else {}))
    work = Path(args.work or tempfile.mkdtemp(prefix="hintrl-bench-rl-"))
    work.mkdir(parents=True, exist_ok=True)
    w_path = work / "workload.json"
    w_path.write_text(json.dumps(dataclasses.asdict(w)))
    init_dir = work / "initial-weights"
    n_params = save_initial_weights(w, init_dir)
    if "teacher_distill" in names:
        save_initial_weights(w, work / "teacher-weights", seed_offset=1)
    meta = {"device": "cpu", "workload": dataclasses.asdict(w), "student": dataclasses.asdict(student_config(w)),
            "params_m": n_params / 1e6,
            "versions": versions(), "cpu_count": os.cpu_count(),
            "date": time.strftime("%Y-%m-%d %H:%M:%S"), "load_avg_1min_start": os.getloadavg()[0],
            "command": "python -m benchmarks.rl " + " ".join(sys.argv[1:]),
            "timing": f"median wall seconds per optimizer step over steps {FIRST_MEASURED_STEP}-{w.steps}; "
                      "tokens/s = generated tokens / wall time over the same steps; CPU s/step = process CPU "
                      "time (all threads) per step, median; peak RSS = ru_maxrss of the contender's own process"}
    meta["rounds"] = args.rounds
    runs: dict[str, list[dict]] = {n: [] for n in names}
    for k in range(args.rounds):
        for name in (names if k % 2 == 0 else names[::-1]):
            if name.startswith("trl_") and meta["versions"]["trl"] is None:
                if k == 0:
                    print(f"[{name}] skipped: trl is not installed (pip install -e '.[bench]')", file=sys.stderr)
                runs[name].append({"contender": name, "error": "trl not installed"})
                continue
            runs[name].append(run_contender(name, w_path, init_dir, work, w.steps, round_=k + 1))
    rows = {name: summarise(runs[name]) for name in names}
    meta["load_avg_1min_end"] = os.getloadavg()[0]
    meta["targets"] = targets(rows)
    full = not args.tiny and w.steps == Workload.steps and names == list(CONTENDERS) and args.rounds == ROUNDS
    out_dir = RESULTS if full else work
    out_dir.mkdir(parents=True, exist_ok=True)
    data = {"meta": meta, "contenders": [rows[n] for n in names]}
    (out_dir / "rl-cpu.json").write_text(json.dumps(data, indent=1))
    table = markdown(meta, rows)
    (out_dir / "rl-cpu.md").write_text(f"# RL step benchmark (cpu)\n\n{table}")
    if full:
        update_readme(table)
    print(table)
    print(f"results: {out_dir / 'rl-cpu.json'}" + ("" if full else "  (partial run: the record is untouched)"))
    if not args.work:
        shutil.rmtree(work / "initial-weights", ignore_errors=True)
        shutil.rmtree(work / "teacher-weights", ignore_errors=True)


if __name__ == "__main__":
    main()
