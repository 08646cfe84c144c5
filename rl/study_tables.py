"""What a study's summary.json (rl/study.py `summarize`) becomes: the README tables, the figure, and
the top-level README's overview line. Functions of the summary dict alone, so that an overview can
be rebuilt from the committed summaries without any run.

Every "±" is rl/stats.py's: mean ± sample std over seeds, n shown ("n=1" alone for one seed); every
"[low, high]" is a paired per-seed difference against the baseline arm (`target.arm`) with its 95%
Student-t interval.
"""
from __future__ import annotations

import json
import re
import statistics
from pathlib import Path

from rl.stats import fmt, fmt_interval, paired_difference

BEGIN, END = "<!-- reproduce:begin -->", "<!-- reproduce:end -->"
OVERVIEW_BEGIN, OVERVIEW_END = "<!-- studies:begin -->", "<!-- studies:end -->"


def _pm(s: dict | None, scale: float = 1.0, digits: int = 3) -> str:
    """A spread with n left to the table's seeds column ("(n=1)" still shown for one value)."""
    return "—" if s is None else fmt(s, scale, digits, show_n=False)


def _provenance(summary: dict) -> str:
    commit = summary.get("commit")
    code = "commit unknown (not a git checkout)" if not commit else (
        f"commit `{commit[:12]}`" + (" with uncommitted changes" if summary.get("dirty") else ""))
    sets = summary.get("eval_sets") or {}
    named = "; eval sets " + ", ".join(f"`{name}` {s.get('digest') or 'differ between runs'}"
                                       for name, s in sets.items()) if sets else ""
    return code + named


def results_markdown(summary: dict) -> str:
    buckets, target = summary["buckets"], summary["target"]
    tb, base = target["bucket"], target["arm"]
    arms = summary["arms"]
    extra = [m for m in ("reference_logprob", "pass@k") if any(m in a for a in arms.values())]
    lines = [f"Made by `scripts/reproduce.sh` on {summary['made']} ({_provenance(summary)}); data: "
             "`results/summary.json`, figure: `results.png`. Held-out accuracy (greedy, per bucket), mean ± sample std "
             "over seeds (the seeds column is n; one seed shows n=1, no std); tokens are the RL phase's (M = millions)."
             + (" `reference_logprob`: mean log p(reference answer) per problem, nats; `pass@k`: share of problems with "
                "a correct one of k samples (final evaluation)." if extra else "")
             + (" The `oracle` arm trains on the reference answers instead of rollouts (rl/methods/oracle.py): it "
                "generates nothing, so its to-reach token columns read 0." if any(a.get("kind") == "oracle"
                                                                                   for a in arms.values()) else ""), ""]
    extra_heads = [f"{m} {b}" for m in extra for b in buckets]
    lines += ["| arm | seeds | " + " | ".join(f"final {b}" for b in buckets) + f" | peak {tb} | "
              + "".join(f"{h} | " for h in extra_heads) + "generated | scored | "
              f"to reach {target['accuracy'] or 0:.3f} on {tb}: steps | generated | × {base}'s tokens | s/step |",
              "|---|---|" + "---|" * (len(buckets) + len(extra_heads)) + "---|---|---|---|---|---|---|"]
    for name, a in arms.items():
        t = a["to_target"].get(tb, {})
        n = len(a["seeds"])
        extra_cells = [_pm((a.get(m) or {}).get("final", {}).get(b), digits=2 if m == "reference_logprob" else 3)
                       for m in extra for b in buckets]
        lines.append(
            f"| `{name}` | {n} | " + " | ".join(_pm(a["final"][b]) for b in buckets) + f" | {_pm(a['peak'][tb])} | "
            + "".join(f"{c} | " for c in extra_cells)
            + f"{_pm(a['tokens']['generated'], 1e-6, 2)}M | {_pm(a['tokens']['scored'], 1e-6, 2)}M | "
            + (f"{_pm(t['steps'], 1, 0)} ({t['reached']}/{n}) | {_pm(t['generated'], 1e-6, 2)}M | "
               f"{_pm(t['fraction_of_reference_tokens'], 1, 2)} |" if t else "— | — | — |")
            + f" {_pm(a['rl_seconds'], 1 / max(1, summary['rl_steps']), 2)} |")
    lines += _paired_table(summary)
    lines += _forgetting(summary)
    if target["accuracy"] is not None and not target["meaningful"]:
        lines += ["", f"No target: `{base}` ends at {target['accuracy']:.3f} on `{tb}`, no better than where "
                  f"warm-start left it ({target['reference_warmstart_end']:.3f}), so reaching its final accuracy means "
                  "nothing and the to-reach columns are empty."]
    lines += _other_targets(summary)
    if summary.get("prepared"):
        lines += ["", "Prepared runs (`prepare` in study.yaml), final held-out accuracy per bucket: " + "; ".join(
            f"`{name}` " + ", ".join(f"{b} {acc:.3f}" for b, acc in r.items() if b != "step")
            for name, r in summary["prepared"].items()) + "."]
    lines += _gate(summary.get("gate"))
    lines += _teacher_gap(summary["teacher_gap"])
    return "\n".join(lines)


def _gate(gate: dict | None) -> list[str]:
    """study.yaml's gate, seed by seed: the warm-starts it stopped are part of the result."""
    if not gate or not gate["seeds"]:
        return []
    show = lambda seeds: ("seeds " + ", ".join(f"{s} ({gate['seeds'][s]['over_none']:+.3f})" for s in seeds)  # noqa: E731
                          if seeds else "none")
    passed = [s for s, g in gate["seeds"].items() if g["passed"]]
    failed = [s for s, g in gate["seeds"].items() if not g["passed"]]
    return ["", f"Gate (study.yaml), checked on each seed's warm-start before RL: the `{gate['kind']}` retry must beat "
            f"the plain retry on `{gate['bucket']}` by ≥ {gate['min_over_none']:g}. Passed: {show(passed)}; "
            f"stopped: {show(failed)}" + (" (their arms did not run)." if failed else ".")]


PAIRED = (("first", "acc. at 1st RL eval"), ("final", "final acc."), ("peak", "peak acc."),
          ("reference_logprob_final", "final reference_logprob"), ("reference_logprob_peak", "peak reference_logprob"))


def _forgetting(summary: dict) -> list[str]:
    """Each arm's final accuracy minus where its own warm-start left it, per bucket, paired per seed:
    what RL cost (or gained) on the buckets it does not train."""
    buckets, arms = summary["buckets"], summary["arms"]
    if not arms or not all("curves" in a for a in arms.values()):
        return []
    lines = ["", "Forgetting: final accuracy minus the same seed's warm-start accuracy, per bucket, mean [95% "
             "Student-t interval] (n seeds).", "", "| arm | " + " | ".join(buckets) + " |", "|---|" + "---|" * len(buckets)]
    for name, a in arms.items():
        cells = [fmt_interval(paired_difference({s: c[b][-1] for s, c in a["curves"].items()},
                                                {s: c[b][0] for s, c in a["curves"].items()})) for b in buckets]
        lines.append(f"| `{name}` | " + " | ".join(cells) + " |")
    return lines


def _paired_table(summary: dict) -> list[str]:
    """Per arm and bucket, the arm minus the baseline on the seeds both ran (they share each seed's
    warm-start, so the seed's luck cancels): mean [95% interval] (n)."""
    base = summary["target"]["arm"]
    versus = {name: a["vs_baseline"] for name, a in summary["arms"].items() if a.get("vs_baseline")}
    if not versus:
        return []
    fields = [(f, head) for f, head in PAIRED if any(f in v for v in versus.values())]
    lines = ["", f"Paired difference vs `{base}`, per seed, 95% interval: the arm minus `{base}` on each seed both "
             "ran (the arms of a seed share its warm-start), mean [Student-t 95% interval] (n seeds); an interval that "
             "excludes 0 is a difference these seeds resolve.", "",
             "| arm | bucket | " + " | ".join(head for _, head in fields) + " |", "|---|---|" + "---|" * len(fields)]
    for name, v in versus.items():
        for b in summary["buckets"]:
            cells = [fmt_interval(v[f][b], digits=2 if f.startswith("reference") else 3) if f in v and b in v[f]
                     else "—" for f, _ in fields]
            lines.append(f"| `{name}` | {b} | " + " | ".join(cells) + " |")
    return lines


def _other_targets(summary: dict) -> list[str]:
    target = summary["target"]
    others = [b for b, t in target["per_bucket"].items() if b != target["bucket"] and t["meaningful"]]
    if not others:
        return []
    lines = ["", f"Every bucket where `{target['arm']}` improved on warm-start: generated tokens to reach its mean "
             f"final accuracy there, as a multiple of its own generated tokens (seeds that reached it / seeds).", "",
             "| arm | " + " | ".join(f"{b} (≥ {target['per_bucket'][b]['accuracy']:.3f})" for b in others) + " |",
             "|---|" + "---|" * len(others)]
    for name, a in summary["arms"].items():
        cells = [f"{_pm(a['to_target'][b]['fraction_of_reference_tokens'], 1, 2)} "
                 f"({a['to_target'][b]['reached']}/{len(a['seeds'])})" for b in others]
        lines.append(f"| `{name}` | " + " | ".join(cells) + " |")
    return lines


def _teacher_gap(per_seed: dict) -> list[str]:
    """The warm-started student's teacher gap, mean over seeds. A gap JSON with a `none` kind (a
    plain retry, no context) is read against it: each kind's rescue over the plain retry."""
    if not per_seed:
        return []
    gaps = list(per_seed.values())
    first = next(iter(gaps[0].values()))
    over_none = "none" in first
    kinds = [k for k in first if k not in ("plain", "none")]
    mean = lambda b, kind, key: statistics.fmean(g[b][kind][key] for g in gaps)   # noqa: E731
    if over_none:
        caption = ("per kind the accuracy its hinted retry adds over a plain retry (`none`: each failed attempt "
                   "sampled once more, no context; its own column is its gain over the first attempt), mean over "
                   "seeds of the per-seed mean over problems (in brackets: the share of all-fail problems the kind's "
                   "retry solves).")
        heads = ["none: gap"] + [f"{k} over none" for k in kinds]
        cell = lambda b, k: (f"{mean(b, k, 'gap'):+.3f}" if k == "none"   # noqa: E731
                             else f"{statistics.fmean(g[b][k]['over_none']['mean'] for g in gaps):+.3f}") \
            + f" ({mean(b, k, 'rescued_all_fail'):.2f})"
        kinds = ["none"] + kinds
    else:
        caption = ("per hint kind the accuracy gained when each failed attempt is retried once with that hint (in "
                   "brackets: the share of all-fail problems a hinted retry solves).")
        heads = kinds
        cell = lambda b, k: f"{mean(b, k, 'gap'):+.3f} ({mean(b, k, 'rescued_all_fail'):.2f})"   # noqa: E731
    lines = ["", f"Teacher gap of the warm-started student (`rl/teacher_gap.py`, before RL), mean over {len(gaps)} "
             "seed(s): plain accuracy and pass@G of sampled attempts, the share of problems whose attempts all fail, "
             "and " + caption, "",
             "| bucket | plain | pass@G | all-fail | " + " | ".join(heads) + " |", "|---|---|---|---|" + "---|" * len(heads)]
    for b in gaps[0]:
        lines.append(f"| {b} | {mean(b, 'plain', 'accuracy'):.3f} | {mean(b, 'plain', 'pass@G'):.3f} | "
                     f"{mean(b, 'plain', 'all_fail'):.3f} | " + " | ".join(cell(b, k) for k in kinds) + " |")
    return lines


def write_readme(folder: Path, table: str, begin: str = BEGIN, end: str = END, heading: str = "Results") -> None:
    """The table between the README's begin/end markers; a new `## heading` section where it has none."""
    readme = folder / "README.md"
    text = readme.read_text() if readme.is_file() else f"# {folder.name}\n"
    block = f"{begin}\n{table}\n{end}"
    if begin in text and end in text:
        head, rest = text.split(begin, 1)
        text = head + block + rest.split(end, 1)[1]
    else:
        text = text.rstrip("\n") + f"\n\n## {heading}\n\n{block}\n"
    readme.write_text(text)


def plot(summary: dict, path: Path) -> None:
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    import numpy as np

    buckets = summary["buckets"]
    fig, axes = plt.subplots(1, len(buckets), figsize=(4.5 * len(buckets), 3.6), squeeze=False)
    for ax, b in zip(axes[0], buckets):
        for name, a in summary["arms"].items():
            curves = list(a["curves"].values())
            width = min(len(c["step"]) for c in curves)
            x = np.mean([c["generated"][:width] for c in curves], axis=0) / 1e6
            y = np.array([c[b][:width] for c in curves])
            ax.plot(x, y.mean(0), label=f"{name} ({len(curves)})")
            if len(curves) > 1:
                ax.fill_between(x, y.mean(0) - y.std(0, ddof=1), y.mean(0) + y.std(0, ddof=1), alpha=0.15)
        ax.set_title(f"{summary['experiment']}: {b}")
        ax.set_xlabel("generated tokens, RL phase (M)")
        ax.set_ylabel("held-out accuracy")
    axes[0][-1].legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def overview(folders: list[Path]) -> str:
    """One line per study folder for the top-level README: the reference arm and each other arm's
    final accuracy on the target bucket (mean ± sample std over seeds, n), and the folder's verdict
    (the bold start of its README's line "**Verdict: ...** why")."""
    lines = ["| study | target bucket | arms: final accuracy (mean ± std over seeds, n) | verdict |", "|---|---|---|---|"]
    for folder in folders:
        path = folder / "results" / "summary.json"
        if not path.is_file():
            continue
        summary = json.loads(path.read_text())
        bucket = summary["target"]["bucket"]
        # Summaries written before rl/stats.py hold std 0.0 for one seed: read that as no std.
        one = lambda s: {**s, "std": None} if s.get("n", 0) <= 1 else s   # noqa: E731
        arms = "; ".join(f"`{name}` {fmt(one(a['final'][bucket]))}" for name, a in summary["arms"].items())
        readme = (folder / "README.md").read_text() if (folder / "README.md").is_file() else ""
        # The bold verdict may wrap over several lines of the README.
        found = re.search(r"^\*\*Verdict:?\s*(.*?)\*\*", readme, re.MULTILINE | re.DOTALL)
        verdict = " ".join(found.group(1).split()).strip(" .") if found else ""
        lines.append(f"| [{folder.name}](experiments/{folder.name}/) | {bucket} | {arms} | {verdict} |")
    return "\n".join(lines)
